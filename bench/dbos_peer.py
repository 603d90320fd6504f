"""The peer of ``weft_bench --in-caller``: DBOS Transact running N three-step workflows in T threads.

Run by ``bench/compare_dbos.py`` with the interpreter of a virtualenv of its own (``make bench-dbos`` makes
it): DBOS is never a dependency of django_weft. Each thread calls the workflow function, which DBOS starts
and executes to completion in that thread, then the next: the shape ``weft.run()`` has. Prints one JSON line.

Usage: python dbos_peer.py POSTGRES_URL N [THREADS]
"""

import json
import sys
import threading
import time

from dbos import DBOS, DBOSConfig

WARM_UP = 20

url, total = sys.argv[1], int(sys.argv[2])
threads = int(sys.argv[3]) if len(sys.argv) > 3 else 1
config: DBOSConfig = {"name": "weft-peer-bench", "system_database_url": url, "run_admin_server": False}
DBOS(config=config)


@DBOS.step()
def first(x: int) -> int:
    return x + 1


@DBOS.step()
def second(x: int) -> int:
    return x * 2


@DBOS.step()
def third(x: int) -> int:
    return x - 3


@DBOS.workflow()
def three_steps(x: int) -> int:
    return third(second(first(x)))


DBOS.launch()
for i in range(WARM_UP):
    three_steps(i)
shares = [total // threads + (1 if i < total % threads else 0) for i in range(threads)]
done: list[int] = []


def caller(count: int) -> None:
    for i in range(count):
        if three_steps(i) != (i + 1) * 2 - 3:
            raise SystemExit("wrong result")
        done.append(1)


workers = [threading.Thread(target=caller, args=(count,)) for count in shares]
cpu_began, began = time.process_time(), time.perf_counter()
for worker in workers:
    worker.start()
for worker in workers:
    worker.join()
seconds, cpu = time.perf_counter() - began, time.process_time() - cpu_began
DBOS.destroy()
print(json.dumps({"peer": "dbos", "workflows": len(done), "threads": threads, "seconds": round(seconds, 3),
                  "workflows_per_second": round(len(done) / seconds, 1),
                  "cpu_ms_per_workflow": round(cpu * 1000 / len(done), 3)}))
