"""The README's "HTTP API" curl examples, run as written with bash against a live server. Each ```sh block of
that section starts with ``# readme-api: <what it does>``; this file prepares what the block needs, runs it with
``WEFT_URL`` and ``WEFT_KEY`` set, and checks that curl succeeded and what JSON it printed. If an example
changes, its check here changes with it."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from django.core.management import call_command

import django_weft as weft
from django_weft.models import Schedule, Workflow
from django_weft.services import api_keys

README = Path(__file__).resolve().parent.parent / "README.md"
MARK = re.compile(r"\A# readme-api: (.+)\n")

pytestmark = [pytest.mark.django_db(transaction=True),  # the live server's thread sees only what is committed
              pytest.mark.skipif(shutil.which("curl") is None, reason="the examples need curl")]


@weft.workflow(name="orders.approve")
def approve(ctx: weft.Context, order_id: int) -> dict:
    decision = ctx.wait_for_signal("approval")
    return {"order": order_id, "approved": decision["ok"]}


@weft.workflow(name="reports.nightly")
def nightly(ctx: weft.Context, options: dict) -> str:
    return options["format"]


def examples() -> dict[str, str]:
    """The ```sh blocks of the README's "HTTP API" section, by their mark."""
    text = README.read_text()
    section = text.split("\n## HTTP API\n", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```sh\n(.*?)```", section, flags=re.DOTALL)
    found = {}
    for block in blocks:
        mark = MARK.match(block)
        assert mark, f"a ```sh block of the HTTP API section has no '# readme-api: ...' first line:\n{block}"
        found[mark.group(1)] = block
    return found


def drive() -> None:
    call_command("weft_maintenance", "--once")


@pytest.fixture
def shell(live_server) -> Callable[[str], Any]:
    _, key = api_keys.create("readme", sorted(api_keys.known_permissions()))
    env = {"WEFT_URL": f"{live_server.url}/weft/api", "WEFT_KEY": key, "PATH": "/usr/bin:/bin"}

    def start(name: str) -> subprocess.Popen:
        return subprocess.Popen(["bash", "-euo", "pipefail", "-c", examples()[name]], env=env,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    def run(name: str, *, while_running: Callable[[], object] | None = None) -> Any:
        proc = start(name)
        if while_running is not None:
            time.sleep(0.5)  # the request is in, waiting
            while_running()
        out, err = proc.communicate(timeout=30)
        assert proc.returncode == 0, f"{name!r} failed ({proc.returncode}): {out} {err}"
        return json.loads(out)

    return run


def test_the_section_holds_the_examples_this_file_checks():
    assert list(examples()) == ["start a run", "get it", "signal it", "wait for its result", "list runs",
                                "count runs", "preview a bulk cancel", "cancel a run", "create a schedule",
                                "pause it"]


def test_the_run_examples(shell):
    started = shell("start a run")
    run = Workflow.objects.get(workflow_id="order-42")
    assert started == {"workflow_id": "order-42", "run_id": str(run.run_id), "status": "pending"}
    drive()
    got = shell("get it")
    assert (got["workflow_id"], got["status"], got["result"], got["error"]) == ("order-42", "waiting", None, None)
    assert shell("signal it") == {"workflow_id": "order-42", "run_id": str(run.run_id), "delivered": True}
    assert shell("signal it")["delivered"] is False  # the same signal_id again: nothing new stored
    drive()
    listed = shell("list runs")
    assert [(r["workflow_id"], r["result"]) for r in listed["results"]] == [("order-42", {"order": 42,
                                                                                          "approved": True})]
    assert listed["next"] is None
    assert shell("count runs") == {"counts": [{"key": "completed", "count": 1}], "total": 1}

    waiting = weft.start("orders.approve", 43, workflow_id="order-43")
    drive()
    preview = shell("preview a bulk cancel")
    assert (preview["matched"], preview["sample_ids"]) == (1, [str(waiting.run_id)])
    assert preview["confirmation_token"] and waiting.status == "waiting"  # a dry run changes nothing
    cancelled = shell("cancel a run")
    assert (cancelled["workflow_id"], cancelled["status"], cancelled["changed"], cancelled["cancel_requested"]) == (
        "order-43", "waiting", True, True)
    drive()
    assert waiting.status == "cancelled"


def test_the_long_poll_example_answers_when_the_run_ends(shell):
    weft.start("orders.approve", 42, workflow_id="order-42")
    drive()
    weft.get_handle("order-42").signal("approval", {"ok": True})
    # The request waits while the run is open; driving the run ends it and the answer comes.
    out = shell("wait for its result", while_running=drive)
    assert out["status"] == "completed" and out["result"] == {"order": 42, "approved": True}


def test_the_schedule_examples(shell):
    created = shell("create a schedule")
    assert (created["schedule_id"], created["workflow"], created["status"]) == ("nightly-report",
                                                                              "reports.nightly", "active")
    assert (created["cron"], created["timezone"], created["input"]) == ("0 3 * * *", "Europe/Berlin",
                                                                        {"format": "pdf"})
    assert created["next_fire_at"].endswith(("T01:00:00Z", "T02:00:00Z"))  # 03:00 in Berlin, summer or winter
    paused = shell("pause it")
    assert (paused["status"], paused["note"], paused["next_fire_at"]) == ("paused", "quarter close", None)
    assert Schedule.objects.get().status == "paused"


def test_a_failing_example_fails(shell):
    # What --fail-with-body is there for: an error status fails the block, and its JSON still comes out.
    with pytest.raises(AssertionError, match=r'"code": ?"schedule_not_found"'):
        shell("pause it")
