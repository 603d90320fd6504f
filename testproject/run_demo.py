"""`make demo`: migrate a SQLite database, seed examples, then serve the admin beside weft_maintenance.

Ctrl-C stops both processes.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
MANAGE = [sys.executable, str(HERE / "manage.py")]


def main() -> int:
    env = {**os.environ}
    env.pop("DATABASE_URL", None)  # the demo always uses its own SQLite file
    subprocess.run([*MANAGE, "migrate", "--verbosity", "0"], check=True, env=env)
    subprocess.run([*MANAGE, "demo_seed"], check=True, env=env)
    # Own sessions: Ctrl-C reaches only this script, which forwards exactly one SIGINT to each child
    # (a second one would make weft_maintenance exit without finishing its current step).
    children = [
        subprocess.Popen([*MANAGE, "weft_maintenance", "--workers", "2"], env=env, start_new_session=True),
        subprocess.Popen([*MANAGE, "runserver", "127.0.0.1:8000", "--noreload"], env=env,
                         start_new_session=True),
    ]
    try:
        while all(child.poll() is None for child in children):
            time.sleep(0.5)
    except KeyboardInterrupt:
        pass
    finally:
        for child in children:
            if child.poll() is None:
                child.send_signal(signal.SIGINT)
        for child in children:
            try:
                child.wait(timeout=15)
            except subprocess.TimeoutExpired:
                child.kill()
    return 0


if __name__ == "__main__":
    sys.exit(main())
