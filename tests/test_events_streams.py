"""Events and streams (design 9.4): ``ctx.set_event`` / ``handle.get_event``, ``ctx.write_stream`` /
``handle.read_stream``, through the public API, with real executors in threads where a reader must wait."""

from __future__ import annotations

import threading
import time

import pytest

import django_weft as weft
from django_weft.models import RunStatus, StepKind, StreamEntry, WorkflowEvent, WorkflowStep

pytestmark = pytest.mark.django_db(transaction=True)


@weft.workflow(name="pub.progress")
def progress(ctx: weft.Context, total: int) -> str:
    for done in range(1, total + 1):
        ctx.set_event("progress", {"done": done, "of": total})
        ctx.write_stream("log", f"step {done}")
        ctx.sleep(10)
    ctx.close_stream("log")
    ctx.set_event("finished", True)
    return "ok"


def test_events_keep_the_latest_value_and_streams_every_value_in_order(weft_env):
    handle = weft.start("pub.progress", 3)
    weft_env.drive()
    assert handle.get_event("progress", timeout=0) == {"done": 1, "of": 3}
    assert handle.get_event("finished", timeout=0) is None  # not set yet
    weft_env.advance_until_idle()
    assert handle.result() == "ok"
    assert handle.events() == {"progress": {"done": 3, "of": 3}, "finished": True}
    assert list(handle.read_stream("log")) == ["step 1", "step 2", "step 3"]
    assert list(handle.read_stream("log", start=2)) == ["step 3"]
    assert WorkflowEvent.objects.filter(run_id=handle.run_id).count() == 2  # one row per key
    kinds = list(WorkflowStep.objects.filter(run_id=handle.run_id).values_list("kind", flat=True).order_by("seq"))
    assert kinds.count(StepKind.EVENT) == 4 and kinds.count(StepKind.STREAM) == 4  # journaled: replays write nothing
    assert StreamEntry.objects.filter(run_id=handle.run_id).count() == 4


def test_get_event_returns_none_once_the_run_ended_without_setting_it(weft_env):
    handle = weft.start("pub.progress", 0)
    assert handle.result() == "ok"
    assert handle.get_event("never") is None  # no timeout: the ended run will not set it


@weft.workflow(name="pub.bad_values")
def bad_values(ctx: weft.Context) -> list[str]:
    seen = []
    for call in (lambda: ctx.set_event("k", object()), lambda: ctx.set_event("", 1),
                 lambda: ctx.write_stream("s", b"\xff" * (11 * 1024 * 1024))):
        try:
            call()
        except (weft.PayloadError, weft.InvalidArgument) as exc:
            seen.append(type(exc).__name__)
    ctx.close_stream("s")
    try:
        ctx.write_stream("s", "late")
    except weft.InvalidArgument as exc:
        seen.append(str(exc))
    return seen


def test_bad_keys_and_values_are_refused_in_the_workflow_and_nothing_is_written(weft_env):
    handle = weft.start("pub.bad_values")
    seen = handle.result()
    assert seen[:3] == ["PayloadNotSerializable", "InvalidArgument", "PayloadTooLarge"]
    assert "was closed by this run" in seen[3]
    assert not WorkflowEvent.objects.exists()
    assert list(StreamEntry.objects.values_list("closed", flat=True)) == [True]


@weft.workflow(name="pub.chain")
def chain(ctx: weft.Context, round: int) -> int:
    ctx.set_event("round", round)
    ctx.write_stream("rounds", round)
    if round < 3:
        ctx.continue_as_new(round + 1)
    ctx.close_stream("rounds")
    return round


def test_events_and_streams_follow_continue_as_new(weft_env):
    first = weft.start("pub.chain", 1, workflow_id="chain-1")
    weft_env.drive()
    assert first.result() == 3
    assert first.get_event("round") == 3  # set by the chain's last run
    assert list(first.read_stream("rounds")) == [1, 2, 3]
    assert list(weft.get_handle("chain-1").read_stream("rounds", start=1)) == [2, 3]
    assert weft.get_handle("chain-1").events() == {"round": 3}


@weft.workflow(name="pub.waits")
def waits(ctx: weft.Context, count: int) -> None:
    ctx.wait_for_signal("go")
    ctx.set_event("ready", "yes")
    for n in range(count):
        ctx.write_stream("numbers", n)
        if n % 10 == 9:
            ctx.sleep(0.01)
    ctx.close_stream("numbers")


def in_thread(target, *args) -> threading.Thread:
    def body() -> None:
        from django.db import connection

        try:
            target(*args)
        finally:
            connection.close()

    thread = threading.Thread(target=body, daemon=True)
    thread.start()
    return thread


def execute_until(handle: weft.WorkflowHandle, stop: threading.Event) -> None:
    """An executor in a thread of its own, as a weft_maintenance process would be."""
    while not stop.is_set() and not handle.refresh().is_finished:
        weft.run_maintenance()
        time.sleep(0.005)


@pytest.mark.usefixtures("row_locks")
def test_readers_wait_for_values_an_executor_writes_meanwhile():
    handle = weft.start("pub.waits", 50)
    got: dict[str, object] = {}

    def read() -> None:
        got["event"] = handle.get_event("ready", timeout=30)
        got["stream"] = list(handle.read_stream("numbers", timeout=30))

    reader = in_thread(read)
    time.sleep(0.3)
    assert reader.is_alive(), "the reader waits for the event"
    stop = threading.Event()
    executor = in_thread(execute_until, handle, stop)
    handle.signal("go")
    reader.join(60)
    stop.set()
    executor.join(60)
    assert not reader.is_alive()
    assert got == {"event": "yes", "stream": list(range(50))}
    assert handle.refresh().status == RunStatus.COMPLETED


def test_get_event_times_out_with_none_and_read_stream_with_timeout_error(weft_env):
    handle = weft.start("pub.waits", 5)
    weft_env.drive()
    assert handle.get_event("ready", timeout=0.05) is None
    with pytest.raises(TimeoutError, match="no more values yet"):
        list(handle.read_stream("numbers"))


@weft.workflow(name="pub.markup")
def markup(ctx: weft.Context) -> None:
    ctx.set_event("status", "<script>alert(1)</script>")
    ctx.write_stream("lines", "<b>bold</b>")
    ctx.close_stream("lines")


def test_the_admin_run_page_shows_events_and_streams_escaped(weft_env, staff_client):
    from django.urls import reverse

    handle = weft.start("pub.markup")
    assert handle.result() is None
    page = staff_client.get(reverse("admin:django_weft_workflow_change", args=[handle.run_id])).content.decode()
    assert "events (latest value per key)" in page.lower() and "Streams" in page
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page and "<script>alert(1)" not in page
    assert "&lt;b&gt;bold&lt;/b&gt;" in page and "(stream closed)" in page
