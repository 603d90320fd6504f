"""``weft_bench --events``: what events, streams and transaction steps cost (design 9.4).

Beside the raw single-connection commit rate of the same run, it measures:

* **get_event wake-up latency**: a reader blocked in ``handle.get_event`` while an executor thread resumes the run
  that sets the event; the latency is from the moment the event's commit landed (an activity that begins right
  after it stamps the time) to the reader's return. With NOTIFY (PostgreSQL) and with polling (WEFT_NOTIFY off),
  each over M samples, the reader having waited a random 50-300 ms first.
* **an SSE stream of 1,000 values** read by a real HTTP client (http.client over TCP, from a threaded WSGI server
  in this process) while an executor thread runs the workflow that writes them, one commit per value.
* **transaction steps**: N workflows of K ``@weft.transaction`` steps (each incrementing a row) against the same
  workflows of plain activities, executed in the caller (``weft.run``): workflows per second.

The runs it made are deleted afterwards (unless --keep).
"""

from __future__ import annotations

import http.client
import json
import os
import random
import statistics
import threading
import time
from collections.abc import Callable
from functools import partial
from typing import Any

from django.db import connection, connections, router
from django.test.utils import override_settings

from bench.core import BenchError, delete_bench_runs, load_average, measure_commit_rate
from django_weft import activity, transaction, workflow

EVENT_WORKFLOW = "weft.bench.event"
STREAM_WORKFLOW = "weft.bench.stream"
TX_WORKFLOW = "weft.bench.transactions"
ACTIVITY_WORKFLOW = "weft.bench.activities"
COUNTER_TABLE = "weft_bench_counter"

# When the event's commit landed, per run (stamped by the activity that begins right after it).
_committed_at: dict[str, float] = {}


@activity(name="weft.bench.stamp")
def stamp(run_id: str) -> None:
    _committed_at[run_id] = time.perf_counter()


@workflow(name=EVENT_WORKFLOW)
def event_workflow(ctx: Any) -> None:
    ctx.wait_for_signal("go")
    ctx.set_event("ready", True)
    ctx.run(stamp, str(ctx.run_id))  # the deferred event commits before an activity begins


@activity(name="weft.bench.tick")
def tick() -> None:
    return None


@workflow(name=STREAM_WORKFLOW)
def stream_workflow(ctx: Any, count: int) -> int:
    for i in range(count):
        ctx.write_stream("values", i)
        ctx.run(tick)  # one commit per value: the reader sees each as it is written
    ctx.close_stream("values")
    return count


def _bump() -> int:
    with connection.cursor() as cursor:
        cursor.execute(f"UPDATE {COUNTER_TABLE} SET v = v + 1")
    return 1


@transaction(name="weft.bench.tx_step")
def tx_step() -> int:
    return _bump()


@activity(name="weft.bench.activity_step")
def activity_step() -> int:
    return _bump()


@workflow(name=TX_WORKFLOW)
def tx_workflow(ctx: Any, steps: int) -> int:
    return sum(ctx.run(tx_step) for _ in range(steps))


@workflow(name=ACTIVITY_WORKFLOW)
def activity_workflow(ctx: Any, steps: int) -> int:
    return sum(ctx.run(activity_step) for _ in range(steps))


def _percentiles(samples: list[float]) -> dict[str, float]:
    ordered = sorted(samples)
    return {"p50_ms": round(statistics.median(ordered) * 1000, 2),
            "p95_ms": round(ordered[min(len(ordered) - 1, int(len(ordered) * 0.95))] * 1000, 2),
            "max_ms": round(ordered[-1] * 1000, 2)}


def _in_thread(target: Callable[[], Any]) -> tuple[threading.Thread, dict[str, Any]]:
    out: dict[str, Any] = {}

    def body() -> None:
        try:
            out["value"] = target()
        except BaseException as exc:  # reported by the caller
            out["error"] = exc
        finally:
            connections.close_all()

    thread = threading.Thread(target=body, daemon=True)
    thread.start()
    return thread, out


def event_latencies(samples: int, run_ids: list) -> list[float]:
    import django_weft as weft

    latencies = []
    for _ in range(samples):
        handle = weft.start(EVENT_WORKFLOW)
        run_ids.append(handle.run_id)
        weft.run_maintenance()  # it waits for the signal now
        key = str(handle.run_id)
        reader, got = _in_thread(lambda h=handle: (h.get_event("ready", timeout=10), time.perf_counter()))
        time.sleep(random.uniform(0.05, 0.3))
        handle.signal("go")
        executor, result = _in_thread(weft.run_maintenance)
        reader.join(15)
        executor.join(15)
        if "error" in got or "error" in result:
            raise BenchError(f"get_event sample failed: {got.get('error') or result.get('error')}")
        value, returned = got["value"]
        committed = _committed_at.pop(key, None)
        if value is not True or committed is None:
            raise BenchError(f"run {handle.run_id}: the event was not seen ({value!r})")
        latencies.append(max(0.0, returned - committed))
    return latencies


class _Server:
    """The project's WSGI application on a free local port, in a thread."""

    def __init__(self) -> None:
        from django.core.handlers.wsgi import WSGIHandler
        from django.core.servers.basehttp import ThreadedWSGIServer, WSGIRequestHandler

        class Quiet(WSGIRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

        self.httpd = ThreadedWSGIServer(("127.0.0.1", 0), Quiet)
        self.httpd.set_app(WSGIHandler())
        self.port = self.httpd.server_address[1]
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def sse_stream(count: int, run_ids: list) -> dict[str, Any]:
    import django_weft as weft
    from django_weft.models import ApiKey
    from django_weft.services import api_keys

    record, key = api_keys.create(f"weft_bench {os.getpid()}",
                                  ["django_weft.view_workflow", "django_weft.view_payloads"])  # it reads the values
    server = _Server()
    try:
        handle = weft.start(STREAM_WORKFLOW, count, workflow_id=f"weft-bench-stream-{os.getpid()}-{time.time_ns()}")
        run_ids.append(handle.run_id)
        began = time.perf_counter()
        executor, result = _in_thread(lambda: weft.run_maintenance())
        client = http.client.HTTPConnection("127.0.0.1", server.port, timeout=60)
        client.request("GET", f"/weft/api/runs/{handle.workflow_id}/streams/values",
                       headers={"Authorization": f"Bearer {key}", "Accept": "text/event-stream"})
        response = client.getresponse()
        if response.status != 200:
            raise BenchError(f"the stream answered {response.status}: {response.read()[:300]!r}")
        values, first_at, ended = [], None, False
        event = ""
        for raw in response:
            line = raw.decode().rstrip("\n")
            if line.startswith("event: "):
                event = line[7:]
            elif line.startswith("data: ") and event == "value":
                values.append(json.loads(line[6:]))
                first_at = first_at or time.perf_counter()
            elif line.startswith("data: ") and event == "end":
                ended = True
                break
        seconds = time.perf_counter() - began
        client.close()
        executor.join(60)
        if "error" in result:
            raise BenchError(f"the stream's run failed: {result['error']}")
        if values != list(range(count)) or not ended:
            raise BenchError(f"the stream gave {len(values)} values (ended: {ended}), not 0..{count - 1} in order")
        return {"sse_values": count, "sse_seconds": round(seconds, 2),
                "sse_values_per_second": round(count / seconds, 1),
                "sse_first_value_ms": round(((first_at or began) - began) * 1000, 1)}
    finally:
        server.close()
        ApiKey.objects.filter(pk=record.pk).delete()


def transaction_steps(workflows: int, steps: int, run_ids: list) -> dict[str, float]:
    import django_weft as weft

    with connection.cursor() as cursor:
        cursor.execute(f"DROP TABLE IF EXISTS {COUNTER_TABLE}")
        cursor.execute(f"CREATE TABLE {COUNTER_TABLE} (v integer)")
        cursor.execute(f"INSERT INTO {COUNTER_TABLE} VALUES (0)")
    figures = {}
    try:
        for name, label in ((ACTIVITY_WORKFLOW, "activities"), (TX_WORKFLOW, "transactions")):
            began = time.perf_counter()
            for _ in range(workflows):
                handle = weft.run(name, steps)
                run_ids.append(handle.run_id)
                if handle.result() != steps:
                    raise BenchError(f"a {name} run did not complete")
            figures[f"{label}_workflows_per_second"] = round(workflows / (time.perf_counter() - began), 1)
        with connection.cursor() as cursor:
            cursor.execute(f"SELECT v FROM {COUNTER_TABLE}")
            total = cursor.fetchone()[0]
        if total != 2 * workflows * steps:
            raise BenchError(f"the counter reads {total}, not {2 * workflows * steps}")
    finally:
        with connection.cursor() as cursor:
            cursor.execute(f"DROP TABLE IF EXISTS {COUNTER_TABLE}")
    return figures


def run_events_bench(*, samples: int, workflows: int, steps: int, stream_values: int, probe_seconds: float = 2.0,
                     keep: bool = False, progress: Callable[[str], None] = lambda line: None) -> dict[str, Any]:
    from django_weft.common import clock
    from django_weft.models import Workflow
    from django_weft.store.wakeups import can_listen

    using = router.db_for_write(Workflow)
    raw_rate, probe_commits = measure_commit_rate(probe_seconds, using)
    progress(f"raw commits: {raw_rate:.0f}/s")
    since = clock.now()
    run_ids: list = []
    figures: dict[str, Any] = {}
    try:
        if can_listen(using):
            figures["get_event_notify"] = _percentiles(event_latencies(samples, run_ids))
            progress(f"get_event with NOTIFY: {figures['get_event_notify']}")
        with override_settings(WEFT_NOTIFY=False):
            figures["get_event_polling"] = _percentiles(event_latencies(samples, run_ids))
        progress(f"get_event polling: {figures['get_event_polling']}")
        figures.update(sse_stream(stream_values, run_ids))
        progress(f"SSE: {stream_values} values in {figures['sse_seconds']}s")
        figures.update(transaction_steps(workflows, steps, run_ids))
        progress(f"steps: {figures}")
    finally:
        if not keep:
            for name in (EVENT_WORKFLOW, STREAM_WORKFLOW, TX_WORKFLOW, ACTIVITY_WORKFLOW):
                delete_bench_runs(run_ids, name, since)
    return {"mode": "events", "vendor": connections[using].vendor, "cpus": os.cpu_count(),
            "load_average": load_average(), "raw_commits_per_second": round(raw_rate, 1),
            "probe_commits": probe_commits, "samples": samples, "workflows": workflows, "steps": steps, **figures}


# --- the command's side -------------------------------------------------------------------------------------

HELP = (" With --events it times events, streams and transaction steps: get_event's wake-up latency with NOTIFY "
        "and with polling (M samples, --latency M, default 50), an SSE stream of 1,000 values read over HTTP while "
        "its run writes them, and N workflows of K @weft.transaction steps against K activities (see "
        "bench.published_bench).")


def add_arguments(parser: Any) -> None:
    parser.add_argument("--events", action="store_true", dest="event_costs",
                        help="Time get_event wake-ups, an SSE stream and transaction steps.")


def chosen(options: dict[str, Any]) -> bool:
    return bool(options.get("event_costs"))


def mode(options: dict[str, Any]) -> tuple[Callable[..., dict], Callable[[dict], list[str]]]:
    from django.core.management.base import CommandError

    workflows = 200 if options.get("workflows") is None else options["workflows"]
    samples = 50 if options.get("latency") is None else options["latency"]
    if workflows < 1 or samples < 2:
        raise CommandError("--workflows must be at least 1 and --latency at least 2")
    return partial(run_events_bench, samples=samples, workflows=workflows, steps=options["steps"],
                   stream_values=1000, probe_seconds=options["probe_seconds"], keep=options["keep"]), format_table


def format_table(f: dict[str, Any]) -> list[str]:
    lines = [f"weft_bench --events: {f['vendor']}, raw commits {f['raw_commits_per_second']:.0f}/s"]
    for label, key in (("NOTIFY", "get_event_notify"), ("polling", "get_event_polling")):
        if key in f:
            lines.append(f"get_event wake-up ({label}, {f['samples']} samples): p50 {f[key]['p50_ms']} ms, "
                         f"p95 {f[key]['p95_ms']} ms")
    lines.append(f"SSE stream: {f['sse_values']} values read over HTTP in {f['sse_seconds']} s "
                 f"({f['sse_values_per_second']:.0f}/s, one commit each)")
    lines.append(f"{f['workflows']} workflows of {f['steps']} steps in the caller: "
                 f"{f['activities_workflows_per_second']:.0f}/s with activities, "
                 f"{f['transactions_workflows_per_second']:.0f}/s with @weft.transaction steps")
    return lines
