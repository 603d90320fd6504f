"""Three of Temporal's Python samples in this area, written again for django_weft (issue 31): cancellation with
a cleanup activity, a booking saga that compensates, and a sliding window of children that signal their parent.
Each keeps the sample's shape and checks what the sample shows."""

from __future__ import annotations

import threading
import time
from datetime import timedelta

import pytest
from django.db import connections

import django_weft as weft
from django_weft.models import RunStatus, Workflow, WorkflowStep

pytestmark = pytest.mark.django_db(transaction=True)

log: list[str] = []


@pytest.fixture(autouse=True)
def _clear_log():
    log.clear()
    yield
    log.clear()


# --- hello_cancellation: an activity that never completes on its own, a cleanup activity on cancel ----------


@weft.activity(name="samples.never_complete", heartbeat_timeout=5, retry=weft.RetryPolicy(max_attempts=1))
def never_complete(workflow_id: str) -> None:
    def cancel_soon() -> None:  # the sample's client cancels the workflow a moment after starting it
        try:
            time.sleep(0.3)
            weft.cancel(workflow_id, "the client cancelled")
        finally:
            connections.close_all()

    threading.Thread(target=cancel_soon).start()
    try:
        while True:
            weft.heartbeat()
            time.sleep(0.05)
    except weft.ActivityCancelled:
        log.append("activity saw the cancel")
        raise


@weft.activity(name="samples.cleanup")
def cleanup_activity() -> None:
    log.append("cleanup ran")


@weft.workflow(name="samples.cancellation")
def cancellation_workflow(ctx: weft.Context) -> None:
    try:
        ctx.run(never_complete, ctx.info.workflow_id)
    finally:
        if not ctx.is_parking:
            with ctx.cleanup():
                ctx.run(cleanup_activity)


def test_hello_cancellation(weft_env):
    handle = weft.start(cancellation_workflow, workflow_id="cancellation-sample")
    weft_env.drive()
    with pytest.raises(weft.WorkflowCancelled, match="the client cancelled"):
        handle.result()
    assert log == ["activity saw the cancel", "cleanup ran"]


# --- booking saga: book car, hotel and flight; a failure (or a cancel) undoes what was booked, last first ----


@weft.activity(name="samples.book")
def book(what: str, customer: dict) -> str:
    if what in customer.get("fail", ()):
        raise weft.ApplicationError(f"no {what} available", non_retryable=True)
    log.append(f"booked {what}")
    return f"{what}-{customer['name']}"


@weft.activity(name="samples.undo_booking")
def undo_booking(what: str) -> None:
    log.append(f"undid {what}")


@weft.workflow(name="samples.booking_saga")
def booking_saga(ctx: weft.Context, customer: dict) -> list:
    saga = ctx.saga()
    bookings = []
    try:
        for what in ("car", "hotel", "flight"):
            saga.add(undo_booking, what)  # as in the sample: the compensation is registered before the step
            bookings.append(ctx.run(book, what, customer))
            if what == "hotel" and customer.get("pause"):
                ctx.wait_for_signal("go")
    except (weft.ActivityError, weft.CancelledError) as exc:
        with ctx.cleanup():
            saga.compensate()
        if isinstance(exc, weft.CancelledError):
            raise
        return ["compensated", str(exc.args[0])]
    return bookings


def test_booking_saga_books_everything_when_nothing_fails(weft_env):
    assert weft.start(booking_saga, {"name": "ann"}).result() == ["car-ann", "hotel-ann", "flight-ann"]
    assert log == ["booked car", "booked hotel", "booked flight"]


def test_booking_saga_compensates_in_reverse_order_when_the_flight_fails(weft_env):
    result = weft.start(booking_saga, {"name": "bob", "fail": ["flight"]}).result()
    assert result[0] == "compensated" and "no flight available" in result[1]
    assert log == ["booked car", "booked hotel", "undid flight", "undid hotel", "undid car"]


def test_booking_saga_compensates_when_cancelled_mid_way(weft_env):
    handle = weft.start(booking_saga, {"name": "cy", "pause": True})
    weft_env.drive()
    handle.cancel("the customer changed their mind")
    weft_env.drive()
    assert handle.status == RunStatus.CANCELLED
    assert log == ["booked car", "booked hotel", "undid hotel", "undid car"]


# --- batch_sliding_window: at most `window` children at once, each signals its parent when done; the parent
# continues as new every `per_run` records, carrying the window over ------------------------------------------


@weft.activity(name="samples.process_record")
def process_record(record: int) -> None:
    log.append(f"record {record}")


@weft.workflow(name="samples.record_processor")
def record_processor(ctx: weft.Context, record: int) -> None:
    ctx.run(process_record, record)
    ctx.sleep(timedelta(seconds=record % 3))  # records take different times, so they finish out of order
    ctx.signal_workflow(ctx.info.parent_workflow_id, "report_completion", record)


@weft.workflow(name="samples.sliding_window")
def sliding_window(ctx: weft.Context, state: dict) -> dict:
    current = set(state["current"])
    processed = state["processed"]
    offset = state["offset"]

    def report_completion(record: int) -> None:
        nonlocal processed
        if record in current:  # a signal repeated by a replay or a retry is counted once
            current.remove(record)
            processed += 1

    ctx.set_signal_handler("report_completion", report_completion)
    started_here = 0
    while offset < state["total"] and started_here < state["per_run"]:
        ctx.wait_condition(lambda: len(current) < state["window"])
        ctx.start_child(record_processor, offset, workflow_id=f"record-{offset}", parent_close_policy="abandon")
        current.add(offset)
        offset += 1
        started_here += 1
    if offset < state["total"]:
        ctx.wait_condition(lambda: len(current) < state["window"])
        ctx.continue_as_new({**state, "current": sorted(current), "processed": processed, "offset": offset})
    ctx.wait_condition(lambda: not current)
    return {"processed": processed}


def test_batch_sliding_window(weft_env):
    handle = weft.start(sliding_window, {"total": 12, "window": 3, "per_run": 5, "current": [], "processed": 0,
                                         "offset": 0}, workflow_id="sliding-window")
    weft_env.advance_until_idle()
    # Runs that continued as new carry the children still running into the next run, which counts their signals.
    assert handle.result() == {"processed": 12}
    records = sorted(int(entry.split()[1]) for entry in log)
    assert records == list(range(12)), "every record processed once"
    chain = list(Workflow.objects.filter(workflow_id="sliding-window").order_by("created_at")
                 .values_list("status", flat=True))
    assert chain == ["continued", "continued", "completed"]
    widest = max(_overlap(f"record-{i}") for i in range(12))
    assert widest <= 3, f"{widest} children ran at once"
    assert WorkflowStep.objects.filter(kind="signal_sent", status="completed").count() == 12


def _overlap(workflow_id: str) -> int:
    """How many record children were open at the moment ``workflow_id`` started (itself included)."""
    run = Workflow.objects.get(workflow_id=workflow_id)
    return Workflow.objects.filter(workflow_type="samples.record_processor", created_at__lte=run.created_at,
                                   finished_at__gt=run.created_at).count()
