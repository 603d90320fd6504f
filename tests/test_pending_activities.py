"""Work in flight (design 9.5): ``handle.pending_activities()``, the API route and ``weft_runs show`` list the attempts
that have not settled; an attempt is published only once it has run for a second, so fast steps write nothing."""

from __future__ import annotations

import io
import threading
import time
from datetime import timedelta

import pytest
from django.core.management import call_command
from django.db.backends.signals import connection_created

import django_weft as weft
from django_weft.models import AttemptInFlight, RunStatus

pytestmark = pytest.mark.django_db(transaction=True)

release = threading.Event()


@weft.activity(name="inflight.slow", heartbeat_timeout=60)
def slow(label: str) -> str:
    for done in range(200):
        weft.heartbeat({"done": done, "label": label})
        if release.wait(0.02):
            return f"{label} done"
    return f"{label} gave up waiting"


@weft.workflow(name="inflight.slow")
def slow_workflow(ctx: weft.Context, label: str) -> str:
    return ctx.run(slow, label)


@weft.activity(name="inflight.quick")
def quick(n: int) -> int:
    return n


@weft.workflow(name="inflight.quick")
def quick_workflow(ctx: weft.Context, n: int) -> int:
    return ctx.run(quick, n) + ctx.run(quick, n)


def executor_thread(stop: threading.Event) -> threading.Thread:
    def loop() -> None:
        from django.db import connection

        try:
            while not stop.is_set():
                weft.run_maintenance()
                time.sleep(0.02)
        finally:
            connection.close()

    thread = threading.Thread(target=loop, daemon=True)
    thread.start()
    return thread


def wait_for(predicate, seconds: float = 20.0):
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError("timed out")


@pytest.mark.usefixtures("row_locks")
def test_a_running_heartbeating_attempt_is_listed_with_its_details_while_it_runs(api, staff_client):
    release.clear()
    stop = threading.Event()
    handle = weft.start("inflight.slow", "video", workflow_id="inflight-1")
    thread = executor_thread(stop)
    try:
        listed = wait_for(lambda: [p for p in handle.pending_activities()
                                   if p.state == "running" and p.heartbeat_details is not None])
        item = listed[0]
        assert (item.seq, item.activity, item.attempt) == (1, "inflight.slow", 1)
        assert item.executor and item.started_at is not None and item.last_heartbeat_at is not None
        assert item.heartbeat_details["label"] == "video"
        body = api.get("runs/inflight-1/pending_activities").json()
        assert body["pending_activities"][0]["state"] == "running"
        assert body["pending_activities"][0]["heartbeat_details"]["label"] == "video"
        page = staff_client.get(f"/admin/django_weft/workflow/{handle.run_id}/change/").content.decode()
        panel = page.split('id="weft-in-flight"', 1)[1].split("</fieldset>", 1)[0]
        assert "inflight.slow" in panel and "running" in panel and "&quot;label&quot;: &quot;video&quot;" in panel
        assert page.index("weft-in-flight") < page.lower().index("journal (timeline)")  # first on the page
        out = io.StringIO()
        call_command("weft_runs", "show", "inflight-1", stdout=out)
        assert "in flight" in out.getvalue() and "inflight.slow" in out.getvalue()
        release.set()
        wait_for(lambda: handle.refresh().status == RunStatus.COMPLETED)
        assert handle.pending_activities() == []
        wait_for(lambda: not AttemptInFlight.objects.exists())  # withdrawn by the keeper once it ended
    finally:
        release.set()
        stop.set()
        thread.join(30)


def test_steps_that_finish_within_a_second_publish_nothing():
    writes: list[str] = []

    def count(execute, sql, params, many, context):
        if "attemptinflight" in sql.lower() and not sql.lstrip().upper().startswith(("SELECT", "DELETE")):
            writes.append(sql)
        return execute(sql, params, many, context)

    def watch(sender, connection, **kwargs):
        connection.execute_wrappers.append(count)

    from django.db import connections

    for conn in connections.all():
        conn.execute_wrappers.append(count)
    connection_created.connect(watch)
    try:
        handles = [weft.start("inflight.quick", n) for n in range(20)]
        weft.run_maintenance()
        assert [h.result() for h in handles] == [2 * n for n in range(20)]
        time.sleep(1.5)  # the keeper ticked meanwhile
    finally:
        connection_created.disconnect(watch)
        for conn in connections.all():
            if count in conn.execute_wrappers:
                conn.execute_wrappers.remove(count)
    assert writes == []
    assert not AttemptInFlight.objects.exists()


# --- waiting attempts (no executor needed) ------------------------------------------------------------------


@weft.activity(name="inflight.async", schedule_to_close_timeout=timedelta(hours=1))
def ask() -> str:
    weft.complete_async()


failures = {"left": 0}


@weft.activity(name="inflight.flaky", retry=weft.RetryPolicy(max_attempts=5, initial_backoff=30))
def flaky() -> str:
    if failures["left"]:
        failures["left"] -= 1
        raise ConnectionError("the provider answered 503")
    return "ok"


@weft.workflow(name="inflight.waits")
def waits(ctx: weft.Context) -> list[str]:
    return [ctx.run(ask), ctx.run(flaky)]


def test_waiting_attempts_are_listed_with_their_timeout_next_retry_and_last_error(weft_env):
    failures["left"] = 1
    handle = weft.start("inflight.waits")
    weft_env.drive()
    [waiting] = handle.pending_activities()
    assert (waiting.seq, waiting.activity, waiting.state, waiting.attempt) == (1, "inflight.async",
                                                                               "waiting_for_completion", 1)
    assert waiting.timeout_at is not None and waiting.timeout_at > waiting.started_at
    token = weft.get_handle(handle.workflow_id)  # the token is the record's; complete through the public API
    from django_weft.models import AsyncActivity

    weft.complete_async_activity(AsyncActivity.objects.get(run_id=token.run_id).token, "yes")
    weft_env.drive()
    [retry] = handle.pending_activities()
    assert (retry.seq, retry.state, retry.attempt) == (2, "waiting_for_retry", 2)
    assert retry.next_retry_at is not None and "503" in retry.last_error["message"]
    weft_env.advance(timedelta(seconds=31))
    assert handle.result() == ["yes", "ok"]
    assert handle.pending_activities() == []


def test_a_row_left_by_a_dead_executor_goes_once_its_step_settled(weft_env):
    handle = weft.start("inflight.quick", 3)
    assert handle.result() == 6
    from django_weft.common import clock

    AttemptInFlight.objects.create(run_id=handle.run_id, seq=1, attempt=1, activity="inflight.quick",
                                   executor="dead", started_at=clock.now(), published_at=clock.now())
    assert handle.pending_activities() == []  # a finished run has none in flight
    weft.run_maintenance()
    assert not AttemptInFlight.objects.exists()


def test_a_running_run_with_nothing_in_flight_says_what_it_is_doing(staff_client):
    # One executor thread busy with another run's long activity: this run is claimed, and nothing of it runs.
    handle = weft.start("inflight.quick", 1, workflow_id="claimed-behind")
    from django_weft.models import Workflow

    Workflow.objects.filter(pk=handle.run_id).update(status=RunStatus.RUNNING, lease_owner="worker-7:4242")
    page = staff_client.get(f"/admin/django_weft/workflow/{handle.run_id}/change/").content.decode()
    panel = page.split('id="weft-in-flight"', 1)[1].split("</fieldset>", 1)[0]
    assert "No activity attempt of this run has been running for over a second" in panel
    assert "claimed by worker-7:4242" in panel and "waiting for a free thread" in panel
    Workflow.objects.filter(pk=handle.run_id).update(status=RunStatus.WAITING, lease_owner="")
    page = staff_client.get(f"/admin/django_weft/workflow/{handle.run_id}/change/").content.decode()
    assert 'id="weft-in-flight"' not in page  # a waiting run says what it waits for elsewhere


def test_an_attempt_whose_executor_went_silent_says_so(staff_client, api):
    # What the page showed for 30 s after a kill -9 of weft_maintenance: "running", on a dead process.
    from datetime import timedelta as td

    from django.utils import timezone

    from django_weft.models import Executor, ExecutorKind, Workflow

    handle = weft.start("inflight.slow", "silent", workflow_id="silent-executor")
    now = timezone.now()
    Workflow.objects.filter(pk=handle.run_id).update(status=RunStatus.RUNNING, lease_owner="worker-7:4242:99")
    AttemptInFlight.objects.create(run_id=handle.run_id, seq=1, attempt=1, activity="inflight.slow",
                                   executor="worker-7:4242:99", started_at=now - td(seconds=50), published_at=now)
    executor = Executor.objects.create(kind=ExecutorKind.LOOP, host="worker-7", pid=4242, threads=1,
                                       started_at=now - td(minutes=5), last_seen=now - td(seconds=45),
                                       expires_at=now - td(seconds=15))
    [item] = handle.pending_activities()
    assert (item.state, item.executor_silent, item.executor_last_seen) == ("running", True, executor.last_seen)
    assert api.get("runs/silent-executor/pending_activities").json()["pending_activities"][0]["executor_silent"]
    panel = staff_client.get(f"/admin/django_weft/workflow/{handle.run_id}/change/").content.decode()
    assert "its executor has not been seen since" in panel and "takes the run over" in panel
    Executor.objects.filter(pk=executor.pk).update(last_seen=timezone.now())  # it was only slow to beat
    assert [p.executor_silent for p in handle.pending_activities()] == [False]
    AttemptInFlight.objects.update(executor="in-caller")  # no process row to tell by: not guessed
    assert [p.executor_silent for p in handle.pending_activities()] == [None]


def test_a_running_attempts_timeout_is_its_heartbeat_deadline(weft_env):
    """inflight.slow has heartbeat_timeout=60 and no timeout: silent 60 s after its last beat (or its start), it
    fails; that is the moment the in-flight list shows as its timeout."""
    from datetime import timedelta as td

    from django_weft.common import clock
    from django_weft.models import ActivityHeartbeat

    handle = weft.start("inflight.slow", "deadline", workflow_id="heartbeat-deadline")
    began = clock.now() - td(seconds=20)
    AttemptInFlight.objects.create(run_id=handle.run_id, seq=1, attempt=1, activity="inflight.slow",
                                   executor="worker-7:4242:99", started_at=began, published_at=clock.now())
    assert [p.timeout_at for p in handle.pending_activities()] == [began + td(seconds=60)]
    ActivityHeartbeat.objects.create(run_id=handle.run_id, seq=1, attempt=1, beat_at=began + td(seconds=15))
    assert [p.timeout_at for p in handle.pending_activities()] == [began + td(seconds=75)]
    AttemptInFlight.objects.update(timeout_at=began + td(seconds=30))  # its own timeout comes first
    assert [p.timeout_at for p in handle.pending_activities()] == [began + td(seconds=30)]
