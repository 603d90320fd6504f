"""Flow control (design 9.3): queues that admit runs by concurrency, per-key concurrency, rate and priority;
debounce and on_conflict; paused workflow types; what operators see. The process tests with many executors
and SIGKILLs are in test_processes_flow_control.py."""

from __future__ import annotations

import io
import json
from datetime import timedelta

import pytest
from django.core.checks import run_checks
from django.core.management import CommandError, call_command
from django.test import override_settings

import django_weft as weft
from django_weft.models import QueueState, RunStatus, Workflow
from tests.testapp import queue_workflows as qw

pytestmark = pytest.mark.django_db(transaction=True)

ADMITTED = RunStatus.admitted_values()


def statuses(handles) -> list[str]:
    return [h.refresh().status for h in handles]


def admitted(queue: str) -> int:
    return Workflow.objects.filter(queue=queue, status__in=ADMITTED).count()


# --- concurrency ------------------------------------------------------------------------------------------


def test_a_queue_admits_up_to_its_concurrency_and_the_rest_wait_queued(weft_env):
    handles = [weft.start(qw.waiter, queue="emails") for _ in range(5)]
    # Admitted after each start's commit, in start order: the queue's concurrency is 2.
    assert statuses(handles) == ["pending", "pending", "queued", "queued", "queued"]
    weft_env.drive()
    assert statuses(handles) == ["waiting", "waiting", "queued", "queued", "queued"]
    assert handles[2].refresh().runnable_at is None, "a queued run is not claimable"
    handles[0].signal("go", 1)
    weft_env.drive()
    assert statuses(handles) == ["completed", "waiting", "waiting", "queued", "queued"]
    assert admitted("emails") == 2


@pytest.mark.parametrize("end", ["cancel", "terminate", "timeout", "fail"])
def test_every_way_an_admitted_run_ends_frees_its_slot(weft_env, end):
    first = weft.start(qw.fails_on_go if end == "fail" else qw.waiter, queue="emails", execution_timeout=60)
    second = weft.start(qw.waiter, queue="emails")
    third = weft.start(qw.waiter, queue="emails")
    weft_env.drive()
    assert statuses([first, second, third]) == ["waiting", "waiting", "queued"]
    if end == "cancel":
        first.cancel("no longer needed")
    elif end == "terminate":
        first.terminate("stuck")
    elif end == "timeout":
        weft_env.advance(61)
    else:
        first.signal("go")
    weft_env.drive()
    assert first.refresh().is_finished
    assert third.refresh().status == RunStatus.WAITING, f"the slot {end} freed went to the queued run"


def test_a_run_that_continues_as_new_keeps_its_slot(weft_env):
    chains = [weft.start(qw.chain, 3, queue="emails") for _ in range(2)]
    behind = weft.start(qw.waiter, queue="emails")
    weft_env.drive()
    assert behind.refresh().status == RunStatus.QUEUED, "continuing as new did not free a slot"
    assert admitted("emails") == 2
    for chain in chains:
        run = Workflow.objects.get(workflow_id=chain.workflow_id, status=RunStatus.WAITING)
        assert run.queue == "emails" and run.admitted_at is None  # carried on, not admitted again
        weft.signal(chain.workflow_id, "done", 1)
    weft_env.drive()
    assert behind.refresh().status == RunStatus.WAITING


def test_a_type_default_queue_and_children_on_a_queue(weft_env):
    handles = [weft.start(qw.email, f"user{i}@example.com") for i in range(3)]
    assert [h.refresh().queue for h in handles] == ["emails"] * 3
    parent = weft.start(qw.parent, 3)
    weft_env.drive()
    assert all(h.refresh().status == RunStatus.COMPLETED for h in handles)
    assert parent.result() == ["child-0", "child-1", "child-2"]
    children = Workflow.objects.filter(parent_id=parent.run_id)
    assert {c.queue for c in children} == {"emails"} and all(c.admitted_at for c in children)


def test_weft_run_of_a_queued_type_leaves_it_to_its_queue(weft_env):
    blockers = [weft.start(qw.waiter, queue="emails") for _ in range(2)]
    handle = weft.run(qw.email, "late@example.com")
    assert handle.status == RunStatus.QUEUED, "weft.run() does not execute a run its queue has not admitted"
    blockers[0].signal("go")
    weft_env.drive()
    assert handle.result() == "sent to late@example.com"


# --- per key, priority, fairness ----------------------------------------------------------------------------


def test_concurrency_per_key_admits_one_run_per_key(weft_env):
    a = [weft.start(qw.waiter, queue="tenants", concurrency_key="tenant-a") for _ in range(3)]
    b = weft.start(qw.waiter, queue="tenants", concurrency_key="tenant-b")
    weft_env.drive()
    assert statuses([*a, b]) == ["waiting", "queued", "queued", "waiting"]
    a[0].signal("go")
    weft_env.drive()
    assert statuses(a) == ["completed", "waiting", "queued"]


def test_lower_priority_first_and_first_in_first_out_within_one(weft_env):
    blockers = [weft.start(qw.waiter, queue="emails") for _ in range(2)]
    late = weft.start(qw.waiter, queue="emails", priority=5)
    urgent = weft.start(qw.waiter, queue="emails", priority=0)
    urgent_too = weft.start(qw.waiter, queue="emails", priority=0)
    normal = weft.start(qw.waiter, queue="emails", priority=-1 + 2)
    weft_env.drive()
    names = {urgent.run_id: "urgent", urgent_too.run_id: "urgent_too", normal.run_id: "normal", late.run_id: "late"}
    order = []
    for release in (blockers[0], blockers[1], urgent, urgent_too):
        before = set(Workflow.objects.filter(admitted_at__isnull=False).values_list("pk", flat=True))
        release.signal("go")
        weft_env.advance(1)
        after = set(Workflow.objects.filter(admitted_at__isnull=False).values_list("pk", flat=True))
        order.extend(names[pk] for pk in after - before)
    assert order == ["urgent", "urgent_too", "normal", "late"]


def test_keys_take_turns_so_a_hot_key_does_not_starve_the_others(weft_env):
    weft.set_queue_limits("open", concurrency=1)
    blocker = weft.start(qw.waiter, queue="open")
    hot = [weft.start(qw.waiter, queue="open", concurrency_key="hot") for _ in range(10)]
    cold = [weft.start(qw.waiter, queue="open", concurrency_key=key) for key in ("b", "c")]
    weft.set_queue_limits("open", concurrency=4)  # three slots free at once
    first = Workflow.objects.filter(queue="open", admitted_at__isnull=False).exclude(pk=blocker.run_id)
    assert sorted(first.values_list("concurrency_key", flat=True)) == ["b", "c", "hot"]
    assert statuses(hot).count("queued") == 9 and set(statuses(cold)) == {"pending"}


# --- rate limits --------------------------------------------------------------------------------------------


def test_a_rate_limit_is_never_exceeded_over_any_window_of_its_period(weft_env):
    handles = [weft.start(qw.job, {"label": f"r{i}"}, queue="limited") for i in range(130)]
    assert admitted("limited") == 50
    assert QueueState.objects.get(name="limited").rate_limited == 80
    info = weft.queue_info("limited")
    assert (info.backlog, info.rate_limited, info.limits["rate"]) == (80, 80, "50/s")
    weft_env.advance(0.5)
    assert Workflow.objects.filter(queue="limited", admitted_at__isnull=False).count() == 50
    weft_env.advance(3)
    assert all(h.refresh().status == RunStatus.COMPLETED for h in handles)
    moments = sorted(Workflow.objects.filter(queue="limited").values_list("admitted_at", flat=True))
    worst = max(sum(1 for m in moments if start <= m < start + timedelta(seconds=1)) for start in moments)
    assert worst == 50


def test_rate_per_key(weft_env):
    weft.set_queue_limits("open", rate_per_key="2/m")
    handles = [weft.start(qw.job, {"label": f"k{i}"}, queue="open", concurrency_key="k") for i in range(5)]
    other = weft.start(qw.job, {"label": "other"}, queue="open", concurrency_key="other")
    weft_env.drive()
    assert statuses(handles) == ["completed", "completed", "queued", "queued", "queued"]
    assert other.refresh().status == RunStatus.COMPLETED
    weft_env.advance(61)
    assert statuses(handles) == ["completed"] * 4 + ["queued"]


# --- debounce, on_conflict ---------------------------------------------------------------------------------


def test_debounce_collapses_starts_into_one_run_with_the_last_input(weft_env):
    first = weft.start(qw.job, {"label": "v1"}, idempotency_key="sync-42", debounce=timedelta(seconds=30))
    assert first.status == RunStatus.QUEUED
    weft_env.advance(10)
    again = weft.start(qw.job, {"label": "v2"}, idempotency_key="sync-42", debounce=timedelta(seconds=30))
    assert again == first, "a start within the window joins the pending run"
    weft_env.advance(25)
    assert first.status == RunStatus.QUEUED, "the second start moved the window's end"
    weft_env.advance(10)
    assert first.result() == "v2"
    assert Workflow.objects.filter(workflow_type="flowctl.job").count() == 1
    later = weft.start(qw.job, {"label": "v3"}, idempotency_key="sync-42", debounce=timedelta(seconds=30))
    assert later == first, "after its window the key still names the run it started (idempotency)"


def test_debounce_by_concurrency_key(weft_env):
    handles = [weft.start(qw.job, {"label": f"edit {i}"}, queue="tenants", concurrency_key="doc-7",
                          debounce=5) for i in range(20)]
    assert len(set(handles)) == 1
    weft_env.advance(6)
    assert handles[0].result() == "edit 19"


def test_on_conflict_skip_returns_the_open_run_and_replace_cancels_it(weft_env):
    first = weft.start(qw.cleans_up, queue="tenants", concurrency_key="t1")
    weft_env.drive()
    skipped = weft.start(qw.cleans_up, queue="tenants", concurrency_key="t1", on_conflict="skip")
    assert skipped == first and Workflow.objects.filter(concurrency_key="t1").count() == 1
    replacing = weft.start(qw.waiter, queue="tenants", concurrency_key="t1", on_conflict="replace")
    assert replacing != first
    assert first.cancel_requested and replacing.status == RunStatus.QUEUED, "queued until the cancelled run ends"
    weft_env.drive()
    assert first.status == RunStatus.CANCELLED and first.refresh().termination_reason == "replaced"
    assert Workflow.objects.filter(status=RunStatus.CANCELLED).count() == 1
    assert replacing.status == RunStatus.WAITING
    queued = weft.start(qw.waiter, queue="tenants", concurrency_key="t1")  # "queue", the default
    assert queued.status == RunStatus.QUEUED


# --- pausing a type ----------------------------------------------------------------------------------------


def test_a_paused_type_queues_new_runs_and_lets_admitted_ones_go_on(weft_env):
    running = weft.start(qw.waiter)
    weft_env.drive()
    assert weft.pause_type("flowctl.waiter") is True
    assert weft.pause_type(qw.waiter) is False
    assert weft.paused_types() == ["flowctl.waiter"]
    held = [weft.start(qw.waiter), weft.start(qw.waiter, queue="emails")]
    weft_env.drive()
    assert statuses(held) == ["queued", "queued"]
    running.signal("go", "on")
    weft_env.drive()
    assert running.result() == "on", "an admitted run of a paused type goes on"
    assert weft.resume_type("flowctl.waiter") is True
    weft_env.drive()
    assert statuses(held) == ["waiting", "waiting"]
    assert weft.resume_type("flowctl.waiter") is False


# --- bad input -------------------------------------------------------------------------------------------


@pytest.mark.parametrize("options, message", [
    ({"queue": "nope"}, "'nope' is not a queue of WEFT_QUEUES"),
    ({"queue": ""}, "is not a queue"),
    ({"queue": "tenants", "concurrency_key": 7}, "concurrency_key must be a non-empty string"),
    ({"queue": "tenants", "concurrency_key": "x" * 300}, "concurrency_key must be a non-empty string"),
    ({"queue": "tenants", "concurrency_key": "a\x00b"}, "concurrency_key"),
    ({"concurrency_key": "k"}, "concurrency_key needs a queue"),
    ({"queue": "emails", "priority": "high"}, "priority must be an int"),
    ({"queue": "emails", "priority": 2**40}, "priority must be an int"),
    ({"debounce": 5}, "debounce needs an idempotency_key or a concurrency_key"),
    ({"idempotency_key": "k", "debounce": -1}, "debounce must be positive"),
    ({"on_conflict": "skip"}, "needs a concurrency_key"),
    ({"queue": "tenants", "concurrency_key": "k", "on_conflict": "merge"}, "on_conflict must be one of"),
])
def test_bad_flow_options_are_refused_and_nothing_is_written(weft_env, options, message):
    with pytest.raises(weft.InvalidArgument, match=message):
        weft.start(qw.waiter, **options)
    assert not Workflow.objects.exists()


@pytest.mark.parametrize("limits, message", [
    ({"rate": "fast"}, "must be a rate such as"),
    ({"rate": "0/s"}, "must be a rate such as"),
    ({"rate": "10/d"}, "must be a rate such as"),
    ({"concurrency": -1}, "must be a positive int"),
    ({"concurrency": 0}, "must be a positive int"),
    ({"concurrency": 2.5}, "must be a positive int"),
    ({"concurency": 3}, "unknown keys"),
])
def test_bad_limits_are_refused_and_nothing_is_written(weft_env, limits, message):
    with pytest.raises(weft.InvalidArgument, match=message):
        weft.set_queue_limits("emails", **limits)
    assert not QueueState.objects.filter(name="emails").exclude(overrides={}).exists()
    with pytest.raises(weft.InvalidArgument, match="not a queue"):
        weft.set_queue_limits("nope", concurrency=1)


def test_a_bad_weft_queues_setting_fails_the_system_check():
    with override_settings(WEFT_QUEUES={"ok": {"concurrency": 1}, "bad": {"rate": "lots"}, "default": {}}):
        errors = [e for e in run_checks() if e.id == "weft.E008"]
    assert len(errors) == 2
    assert "WEFT_QUEUES['bad']['rate']" in errors[0].msg or "WEFT_QUEUES['bad']['rate']" in errors[1].msg


def test_pausing_an_unknown_type_is_refused():
    with pytest.raises(weft.WorkflowNotRegistered):
        weft.pause_type("no.such.type")
    assert weft.paused_types() == []


# --- what operators see -------------------------------------------------------------------------------------


def test_queue_info_and_runtime_limits(weft_env):
    [weft.start(qw.waiter, queue="emails") for _ in range(4)]
    weft_env.advance(30)
    info = weft.queue_info("emails")
    assert (info.backlog, info.ready, info.admitted) == (2, 2, 2)
    assert info.oldest_wait_seconds == pytest.approx(30)
    assert info.limits == {"concurrency": 2, "concurrency_per_key": None, "rate": None, "rate_per_key": None}
    info = weft.set_queue_limits("emails", concurrency=3)
    assert (info.admitted, info.overrides) == (3, {"concurrency": 3})
    info = weft.set_queue_limits("emails", concurrency=None)  # no limit
    assert info.admitted == 4 and info.backlog == 0
    assert weft.set_queue_limits("emails").limits["concurrency"] == 2, "no keyword: the setting's limits again"
    assert [q.name for q in weft.list_queues()] == ["emails", "limited", "open", "tenants"]


def test_weft_runs_queues_pause_and_list_by_queue(weft_env):
    [weft.start(qw.waiter, queue="emails") for _ in range(3)]
    out = io.StringIO()
    call_command("weft_runs", "queues", stdout=out)
    assert "emails" in out.getvalue() and "concurrency=2" in out.getvalue()
    out = io.StringIO()
    call_command("weft_runs", "queues", "--json", stdout=out)
    emails = next(q for q in json.loads(out.getvalue())["queues"] if q["name"] == "emails")
    assert (emails["backlog"], emails["admitted"]) == (1, 2)
    out = io.StringIO()
    call_command("weft_runs", "list", "--queue", "emails", "--status", "queued", "--json", stdout=out)
    assert len(json.loads(out.getvalue())["runs"]) == 1
    out = io.StringIO()
    call_command("weft_runs", "pause-type", "flowctl.waiter", stdout=out)
    assert "paused" in out.getvalue() and weft.paused_types() == ["flowctl.waiter"]
    call_command("weft_runs", "resume-type", "flowctl.waiter", stdout=out)
    assert weft.paused_types() == []
    with pytest.raises(CommandError, match="'nope' not in WEFT_QUEUES"):
        call_command("weft_maintenance", "--queues", "emails,nope")


def test_metrics_show_each_queue(weft_env, staff_client):
    pytest.importorskip("prometheus_client")
    [weft.start(qw.waiter, queue="emails") for _ in range(3)]
    from django_weft.observability import metrics

    text = metrics.render().decode()
    assert 'weft_queue_backlog{queue="emails"} 1.0' in text
    assert 'weft_queue_admitted{queue="emails"} 2.0' in text
    assert 'weft_queue_admissions_total{queue="emails"} 2.0' in text
    assert 'weft_queue_limit{limit="concurrency",queue="emails"} 2.0' in text
    assert 'weft_queue_limit{limit="rate",queue="limited"} 50.0' in text


def test_the_admin_lists_queues_and_changes_limits(weft_env, staff_client):
    [weft.start(qw.waiter, queue="emails") for _ in range(3)]
    page = staff_client.get("/admin/django_weft/queuestate/")
    assert page.status_code == 200
    body = page.content.decode()
    assert "emails" in body and "concurrency=2" in body
    response = staff_client.post("/admin/django_weft/queuestate/emails/change/",
                                 {"concurrency": "3", "concurrency_per_key": "", "rate": "", "rate_per_key": ""})
    assert response.status_code == 302, response.content.decode()[:2000]
    assert weft.queue_info("emails").admitted == 3
    response = staff_client.post("/admin/django_weft/queuestate/emails/change/",
                                 {"concurrency": "", "concurrency_per_key": "", "rate": "lots", "rate_per_key": ""})
    assert response.status_code == 200 and "must be a rate such as" in response.content.decode()
    runs = staff_client.get("/admin/django_weft/workflow/?status__exact=queued")
    assert runs.status_code == 200
    response = staff_client.post("/admin/django_weft/pausedtype/add/",
                                 {"workflow_type": "flowctl.waiter", "reason": "x"})
    assert response.status_code == 302 and weft.paused_types() == ["flowctl.waiter"]
    response = staff_client.post("/admin/django_weft/pausedtype/add/", {"workflow_type": "nope", "reason": ""})
    assert response.status_code == 200 and "nope" in response.content.decode()


def test_the_system_checks_are_registered_when_django_starts():
    # They were written but never registered: nothing imported django_weft.checks in a project (found with the
    # WEFT_QUEUES check). A fresh interpreter, as `manage.py check` starts.
    import os
    import subprocess
    import sys
    from pathlib import Path

    code = ("import django, sys; django.setup(); from django.core.checks import registry; "
            "print(sorted(c.__name__ for c in registry.registry.get_checks() if c.__module__ == 'django_weft.checks'))")
    root = Path(__file__).resolve().parent.parent
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=root,
                          env={**os.environ, "DJANGO_SETTINGS_MODULE": "tests.settings",
                               "PYTHONPATH": os.pathsep.join([str(root), str(root / "testproject")])})
    out = done.stdout + done.stderr
    assert "check_queues" in out and "check_sqlite_transaction_mode" in out, out


def test_a_schedule_starts_its_runs_on_its_queue(weft_env):
    schedule = weft.create_schedule("mail-digest", qw.waiter, every=60, queue="emails", priority=3)
    assert (schedule.queue, schedule.priority) == ("emails", 3)
    [weft.start(qw.waiter, queue="emails") for _ in range(2)]
    weft_env.advance(61)
    run = Workflow.objects.get(schedule=schedule)
    assert (run.queue, run.priority, run.status) == ("emails", 3, RunStatus.QUEUED)
    with pytest.raises(weft.InvalidArgument, match="not a queue of WEFT_QUEUES"):
        weft.create_schedule("bad", qw.waiter, every=60, queue="nope")
    schedule.update(queue="open", priority=0)
    schedule.refresh_from_db()
    assert (schedule.queue, schedule.priority) == ("open", 0)


def test_the_admin_schedule_form_takes_a_queue_and_a_priority(staff_client):
    page = staff_client.post("/admin/django_weft/schedule/add/", {
        "schedule_id": "queued-from-admin", "workflow_type": "flowctl.waiter", "input_json": "null",
        "cron": "*/5 * * * *", "every": "", "timezone": "UTC", "overlap": "skip", "catchup_window": "", "jitter": "",
        "queue": "emails", "priority": "2"})
    assert page.status_code == 302, page.context["adminform"].form.errors
    schedule = weft.get_schedule("queued-from-admin")
    assert (schedule.queue, schedule.priority) == ("emails", 2)
    page = staff_client.post("/admin/django_weft/schedule/add/", {
        "schedule_id": "bad-queue", "workflow_type": "flowctl.waiter", "input_json": "null",
        "cron": "*/5 * * * *", "every": "", "timezone": "UTC", "overlap": "skip", "catchup_window": "", "jitter": "",
        "queue": "nope"})
    assert page.status_code == 200 and "queue" in page.context["adminform"].form.errors


def test_a_retried_run_of_a_queue_waits_for_a_slot_again(weft_env):
    failing = weft.start(qw.fails_on_go, queue="emails")
    blocker = weft.start(qw.waiter, queue="emails")
    weft_env.drive()
    failing.signal("go")
    weft_env.drive()
    assert failing.status == RunStatus.FAILED
    weft.start(qw.waiter, queue="emails")  # takes the slot the failed run freed
    weft_env.drive()
    assert admitted("emails") == 2
    first_admission = failing.refresh().admitted_at
    weft_env.advance(5)
    call_command("weft_runs", "retry", "--type", "flowctl.fails_on_go", "--yes", stdout=io.StringIO())
    assert failing.status == RunStatus.QUEUED, "the retry does not pass its queue's limit"
    weft_env.drive()
    assert failing.status == RunStatus.QUEUED
    blocker.signal("go")
    weft_env.drive()
    run = failing.refresh()
    assert run.admitted_at > first_admission, "admitted again when a slot freed"
    assert run.status == RunStatus.FAILED and run.retries == 1, "it ran again (and its code fails again)"


def test_the_test_env_says_a_run_waits_in_its_queue(weft_env):
    [weft.start(qw.waiter, queue="emails") for _ in range(2)]
    handle = weft.start(qw.waiter, queue="emails")
    with pytest.raises(TimeoutError, match="queued on queue 'emails'"):
        handle.result()
