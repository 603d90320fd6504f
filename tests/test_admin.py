"""The run admin: read-only pages, payloads decoded and escaped."""

from __future__ import annotations

import pytest
from django.contrib.auth import get_user_model
from django.urls import reverse

import django_weft as weft

pytestmark = pytest.mark.django_db


def test_changelist_and_detail_show_runs(staff_client, weft_env):
    handle = weft.start("test.steps", {"key": "adm", "count": 2}, workflow_id="order-adm")
    weft_env.drive()
    page = staff_client.get(reverse("admin:django_weft_workflow_changelist"))
    assert page.status_code == 200 and b"order-adm" in page.content
    page = staff_client.get(reverse("admin:django_weft_workflow_changelist"), {"status__exact": "completed"})
    assert b"order-adm" in page.content
    detail = staff_client.get(reverse("admin:django_weft_workflow_change", args=[handle.run_id]))
    assert detail.status_code == 200
    body = detail.content.decode()
    assert "ADM:0" in body and "tests.testapp.workflows.record" in body


def test_payload_with_markup_is_shown_as_text(staff_client):
    handle = weft.start("test.steps", {"key": "<script>alert(1)</script>", "count": 0})
    body = staff_client.get(reverse("admin:django_weft_workflow_change", args=[handle.run_id])).content.decode()
    assert "<script>alert(1)</script>" not in body
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in body


def test_runs_cannot_be_added_or_edited(staff_client):
    handle = weft.start("test.steps", {"key": "ro", "count": 0})
    assert staff_client.get(reverse("admin:django_weft_workflow_add")).status_code == 403
    page = staff_client.post(reverse("admin:django_weft_workflow_change", args=[handle.run_id]),
                             {"status": "completed"})
    assert page.status_code == 403
    assert handle.status == "pending"


def test_anonymous_users_are_sent_to_login(client):
    page = client.get(reverse("admin:django_weft_workflow_changelist"))
    assert page.status_code == 302 and "/login/" in page["Location"]


def test_detail_shows_signals_and_async_tokens(staff_client, weft_env):
    from django_weft.models import AsyncActivity

    signalled = weft.start("test.collect", 2, workflow_id="sig-adm")
    weft.signal("sig-adm", "item", "<b>bold</b>", signal_id="id-1")
    body = staff_client.get(reverse("admin:django_weft_workflow_change", args=[signalled.run_id])).content.decode()
    assert "id-1" in body and "&lt;b&gt;bold&lt;/b&gt;" in body and "<b>bold</b>" not in body
    parked = weft.start("test.async", "adm")
    weft_env.drive()
    token = AsyncActivity.objects.get(run_id=parked.run_id).token
    body = staff_client.get(reverse("admin:django_weft_workflow_change", args=[parked.run_id])).content.decode()
    assert token in body


def test_schedule_pages(staff_client):
    schedule = weft.create_schedule("adm-sched", "test.collect", 0, cron="*/5 * * * *", timezone="UTC")
    page = staff_client.get(reverse("admin:django_weft_schedule_changelist"))
    assert page.status_code == 200 and b"adm-sched" in page.content
    page = staff_client.get(reverse("admin:django_weft_schedule_change", args=[schedule.pk]))
    assert page.status_code == 200 and b"*/5 * * * *" in page.content


# --- helpers --------------------------------------------------------------------------------------------

from datetime import timedelta  # noqa: E402

from django.contrib.admin.models import CHANGE, DELETION, LogEntry  # noqa: E402
from django.contrib.auth.models import Permission  # noqa: E402

from django_weft.admin.describe import describe_cron, describe_interval  # noqa: E402
from django_weft.exceptions import TransitionNotAllowed  # noqa: E402
from django_weft.models import (  # noqa: E402
    AsyncActivity,
    Schedule,
    ScheduleOccurrence,
    Workflow,
    WorkflowStep,
)
from django_weft.store import repairs  # noqa: E402
from tests.testapp.workflows import executions  # noqa: E402

RUNS = "admin:django_weft_workflow_changelist"
SCHEDULES = "admin:django_weft_schedule_changelist"


def run_url(run_id, what="change"):
    return reverse(f"admin:django_weft_workflow_{what}", args=[run_id])


def schedule_url(pk, what="change"):
    return reverse(f"admin:django_weft_schedule_{what}", args=[pk])


def user_with(client, *codenames, username="operator"):
    user = get_user_model().objects.create_user(username, password="pw", is_staff=True)
    user.user_permissions.add(*Permission.objects.filter(content_type__app_label="django_weft",
                                                         codename__in=codenames))
    client.force_login(user)
    return user


def act(client, action, ids, *, changelist=RUNS, confirm=True):
    data = {"action": action, "_selected_action": [str(i) for i in ids], "index": "0"}
    page = client.post(reverse(changelist), data)
    if not confirm:
        return page
    assert page.status_code == 200, page.status_code
    return client.post(reverse(changelist), {**data, "post": "yes"}, follow=True)


def messages_of(page):
    return [str(m) for m in page.context["messages"]]


def fail_run(weft_env, key):
    """A test.retry run whose flaky activity used up its three attempts."""
    handle = weft.start("test.retry", {"key": key, "failures": 3}, workflow_id=key)
    weft_env.drive()
    for _ in range(5):
        weft_env.advance(timedelta(seconds=10))
    assert handle.status == "failed"
    return handle


# --- runs: changelist --------------------------------------------------------------------------------------


def test_changelist_columns_counts_and_badges(staff_client, weft_env):
    weft.start("test.steps", {"key": "c1", "count": 1}, workflow_id="done-1")
    weft_env.drive()
    weft.start("test.collect", 1, workflow_id="waiting-1")
    weft_env.drive()
    page = staff_client.get(reverse(RUNS))
    body = page.content.decode()
    assert page.context["cl"].show_full_result_count is False
    counts = {c["value"]: c["count"] for c in page.context["status_counts"]}
    assert counts["completed"] == "1" and counts["waiting"] == "1" and counts["failed"] == "0"
    assert "weft-badge weft-completed" in body and "weft-status-counts" in body
    assert "?status__exact=waiting" in body


def test_status_counts_are_capped(staff_client, monkeypatch):
    from django_weft.admin import runs

    monkeypatch.setattr(runs, "STATUS_COUNT_CAP", 2)
    for i in range(3):
        weft.start("test.collect", 1, workflow_id=f"cap-{i}")
    page = staff_client.get(reverse(RUNS))
    counts = {c["value"]: c["count"] for c in page.context["status_counts"]}
    assert counts["pending"] == "2+"


def test_changelist_count_and_journal_are_bounded(staff_client, monkeypatch, weft_env):
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from django_weft.admin import common

    monkeypatch.setattr(common.BoundedPaginator, "count_cap", 2)
    monkeypatch.setattr(common, "MAX_INLINE_ROWS", 2)
    for i in range(3):
        weft.start("test.collect", 1, workflow_id=f"bounded-{i}")
    with CaptureQueriesContext(connection) as captured:
        page = staff_client.get(reverse(RUNS))
    assert page.context["cl"].result_count == 2 and "2+ workflow runs" in page.content.decode()
    counts = [q["sql"] for q in captured.captured_queries if "COUNT(" in q["sql"].upper()]
    assert counts and all("LIMIT" in sql.upper() for sql in counts)
    handle = weft.start("test.steps", {"key": "bj", "count": 4}, workflow_id="bounded-journal")
    weft_env.drive()
    detail = staff_client.get(reverse("admin:django_weft_workflow_change", args=[handle.run_id]))
    journal = next(f for f in detail.context["inline_admin_formsets"] if f.formset.model.__name__ == "WorkflowStep")
    assert len(journal.formset.forms) == 2


def test_search_is_exact_on_ids(staff_client):
    handle = weft.start("test.collect", 1, workflow_id="Search-Me")
    keyed = weft.start("test.collect", 1, idempotency_key="idem-search")

    def ids(q):
        return {r.workflow_id for r in staff_client.get(reverse(RUNS), {"q": q}).context["cl"].result_list}

    assert ids("Search-Me") == ids(str(handle.run_id)) == {"Search-Me"}
    assert ids("idem-search") == {keyed.workflow_id}
    assert ids("search-me") == set() and ids("Search") == set()


def test_changelist_filters_and_search(staff_client, weft_env):
    schedule = weft.create_schedule("filter-sched", "test.collect", 0, every=60)
    scheduled = schedule.trigger()
    plain = weft.start("test.collect", 1, workflow_id="plain-run")
    keyed = weft.start("test.collect", 1, idempotency_key="idem-123")
    url = reverse(RUNS)

    def ids(params):
        page = staff_client.get(url, params)
        assert page.status_code == 200
        return {r.workflow_id for r in page.context["cl"].result_list}

    assert ids({"schedule__id__exact": schedule.pk}) == {scheduled.workflow_id}
    assert ids({"type": "test.collect"}) == {scheduled.workflow_id, "plain-run", keyed.workflow_id}
    assert ids({"type": "test.steps"}) == set()
    assert ids({"status__exact": "pending"}) == {scheduled.workflow_id, "plain-run", keyed.workflow_id}
    assert len(ids({"created_at__gte": "2000-01-01 00:00+00:00"})) == 3
    assert ids({"created_at__lt": "2000-01-01 00:00+00:00"}) == set()
    assert ids({"q": "plain-run"}) == {"plain-run"}
    assert ids({"q": str(plain.run_id)}) == {"plain-run"}
    assert ids({"q": "idem-123"}) == {keyed.workflow_id}
    assert ids({"q": "nothing-like-it"}) == set()
    body = staff_client.get(url).content.decode()
    assert schedule_url(schedule.pk) in body  # the schedule column links to the schedule


# --- runs: detail -------------------------------------------------------------------------------------------


def test_detail_shows_timeline_lineage_and_links(staff_client, weft_env):
    parent = weft.start("test.parent", {"key": "lin", "sleep": 30}, workflow_id="lin-parent")
    weft_env.drive()
    child = Workflow.objects.get(parent_id=parent.run_id)
    body = staff_client.get(run_url(parent.run_id)).content.decode()
    assert "journal (timeline)" in body.lower() or "Journal (timeline)" in body
    assert run_url(child.pk) in body  # children
    body = staff_client.get(run_url(child.pk)).content.decode()
    assert run_url(parent.run_id) in body  # parent
    weft_env.advance(60)
    body = staff_client.get(run_url(parent.run_id)).content.decode()
    assert "LIN:PARENT-AFTER" in body  # result preview in the timeline
    assert " ms<" in body or " s<" in body  # step durations


def test_async_token_is_shown_for_copying(staff_client, weft_env):
    parked = weft.start("test.async", "tok")
    weft_env.drive()
    token = AsyncActivity.objects.get(run_id=parked.run_id).token
    body = staff_client.get(run_url(parked.run_id)).content.decode()
    assert f"value='{token}'" in body or f'value="{token}"' in body
    assert "weft-token" in body


# --- runs: actions ------------------------------------------------------------------------------------------


def test_cancel_action_confirms_then_cancels_and_logs(staff_client, weft_env):
    open_run = weft.start("test.collect", 1, workflow_id="to-cancel")
    done = weft.start("test.steps", {"key": "fin", "count": 0}, workflow_id="finished")
    weft_env.drive()
    page = act(staff_client, "cancel_selected", [open_run.run_id, done.run_id], confirm=False)
    assert page.status_code == 200 and b"Yes, Cancel" in page.content
    assert "to-cancel" in page.content.decode() and page.context["ineligible_count"] == 1
    assert open_run.status == "waiting"  # nothing happened yet
    page = act(staff_client, "cancel_selected", [open_run.run_id, done.run_id])
    assert open_run.cancel_requested and not done.cancel_requested
    weft_env.drive()  # the run's code sees the cancel
    assert open_run.status == "cancelled" and done.status == "completed"
    assert any("1 workflow run cancelled" in m and "1 skipped" in m for m in messages_of(page))
    entry = LogEntry.objects.get(object_id=str(open_run.run_id))
    assert entry.action_flag == CHANGE and "Cancelled" in entry.change_message
    assert "admin" in Workflow.objects.get(pk=open_run.run_id).error["message"]


def test_retry_action_reruns_the_failed_step(staff_client, weft_env):
    handle = fail_run(weft_env, "retry-adm")
    assert executions("retry-adm") == 3
    page = act(staff_client, "retry_selected", [handle.run_id])
    assert any("1 workflow run retried" in m for m in messages_of(page))
    weft_env.drive()
    assert handle.status == "completed" and handle.result() == "ok"
    step = WorkflowStep.objects.get(run_id=handle.run_id, seq=1)
    assert step.status == "completed" and step.attempt == 1
    assert LogEntry.objects.filter(object_id=str(handle.run_id), change_message__contains="Retried").exists()


def test_suspend_and_resume_actions(staff_client, weft_env):
    handle = weft.start("test.collect", 1, workflow_id="susp")
    weft_env.drive()
    page = act(staff_client, "suspend_selected", [handle.run_id])
    assert handle.status == "suspended" and any("suspended" in m for m in messages_of(page))
    weft.signal("susp", "item", "x")
    weft_env.drive()
    assert handle.status == "suspended"
    page = act(staff_client, "resume_selected", [handle.run_id])
    assert any("1 workflow run resumed" in m for m in messages_of(page))
    weft_env.drive()
    assert handle.status == "completed" and handle.result() == ["x"]


def test_purge_action_deletes_finished_runs_only(staff_client, weft_env):
    done = weft.start("test.steps", {"key": "pg", "count": 2}, workflow_id="purge-me")
    open_run = weft.start("test.collect", 1, workflow_id="keep-me")
    weft_env.drive()
    page = act(staff_client, "purge_selected", [done.run_id, open_run.run_id])
    assert any("1 workflow run purged" in m for m in messages_of(page))
    assert not Workflow.objects.filter(pk=done.run_id).exists()
    assert not WorkflowStep.objects.filter(run_id=done.run_id).exists()
    assert Workflow.objects.filter(pk=open_run.run_id).exists()
    assert LogEntry.objects.filter(object_id=str(done.run_id), action_flag=DELETION).exists()


def test_detail_buttons_follow_state_and_confirm(staff_client, weft_env):
    handle = weft.start("test.collect", 1, workflow_id="buttons")
    weft_env.drive()
    body = staff_client.get(run_url(handle.run_id)).content.decode()
    for name in ("cancel", "suspend", "signal"):
        assert run_url(handle.run_id, name) in body
    assert run_url(handle.run_id, "retry") not in body and run_url(handle.run_id, "resume") not in body
    page = staff_client.get(run_url(handle.run_id, "suspend"))
    assert page.status_code == 200 and b"Yes, Suspend" in page.content and handle.status == "waiting"
    page = staff_client.post(run_url(handle.run_id, "suspend"), {"post": "yes"})
    assert page.status_code == 302 and page["Location"] == run_url(handle.run_id)
    assert handle.status == "suspended"
    body = staff_client.get(run_url(handle.run_id)).content.decode()
    assert run_url(handle.run_id, "resume") in body
    staff_client.post(run_url(handle.run_id, "resume"), {"post": "yes"})
    assert handle.status == "running"
    staff_client.post(run_url(handle.run_id, "cancel"), {"post": "yes"})
    weft_env.drive()
    assert handle.status == "cancelled"
    body = staff_client.get(run_url(handle.run_id)).content.decode()
    assert run_url(handle.run_id, "cancel") not in body and run_url(handle.run_id, "purge") in body
    staff_client.post(run_url(handle.run_id, "purge"), {"post": "yes"})
    assert not Workflow.objects.filter(pk=handle.run_id).exists()


def test_retry_button_on_a_failed_run(staff_client, weft_env):
    handle = fail_run(weft_env, "retry-btn")
    assert run_url(handle.run_id, "retry") in staff_client.get(run_url(handle.run_id)).content.decode()
    staff_client.post(run_url(handle.run_id, "retry"), {"post": "yes"})
    assert handle.status == "running"
    weft_env.drive()
    assert handle.result() == "ok"


def test_operation_on_an_ineligible_run_does_nothing(staff_client, weft_env):
    handle = weft.start("test.steps", {"key": "inel", "count": 0})
    weft_env.drive()
    page = staff_client.get(run_url(handle.run_id, "retry"))
    assert b"nothing to do" in page.content
    page = staff_client.post(run_url(handle.run_id, "retry"), {"post": "yes"}, follow=True)
    assert any("0 workflow runs retried" in m for m in messages_of(page))
    assert handle.status == "completed"


# --- runs: signal and async forms ---------------------------------------------------------------------------


def test_send_signal_form(staff_client, weft_env):
    handle = weft.start("test.collect", 2, workflow_id="sig-form")
    weft_env.drive()
    url = run_url(handle.run_id, "signal")
    assert staff_client.get(url).status_code == 200
    page = staff_client.post(url, {"name": "item", "payload": '{"a": "<script>x</script>"}', "signal_id": "s1"})
    assert page.status_code == 302
    page = staff_client.post(url, {"name": "item", "payload": "{}", "signal_id": "s1"}, follow=True)
    assert any("stored once" in m for m in messages_of(page))
    page = staff_client.post(url, {"name": "item", "payload": "not json"})
    assert page.status_code == 200 and page.context["form"].errors["payload"]
    page = staff_client.post(url, {"name": "", "payload": "1"})
    assert page.context["form"].errors["name"]
    staff_client.post(url, {"name": "item", "payload": "2"})
    weft_env.drive()
    assert handle.result() == [{"a": "<script>x</script>"}, 2]
    body = staff_client.get(run_url(handle.run_id)).content.decode()
    assert "<script>x</script>" not in body and "&lt;script&gt;x&lt;/script&gt;" in body
    assert LogEntry.objects.filter(object_id=str(handle.run_id), change_message__contains="Signal").count() == 3
    # A finished run takes no signal: the form says why.
    page = staff_client.post(url, {"name": "item", "payload": "3"})
    assert page.status_code == 200 and "completed" in " ".join(page.context["form"].non_field_errors())


def test_complete_and_fail_async_activity_forms(staff_client, weft_env):
    handle = weft.start("test.async", "frm")
    other = weft.start("test.async", "other")
    weft_env.drive()
    token = AsyncActivity.objects.get(run_id=handle.run_id).token
    other_token = AsyncActivity.objects.get(run_id=other.run_id).token
    url = run_url(handle.run_id, "async")
    page = staff_client.get(url, {"token": token})
    assert page.status_code == 200 and token in page.content.decode()
    page = staff_client.post(url, {"token": "forged", "outcome": "complete", "result": "1"})
    assert page.context["form"].errors["token"]
    page = staff_client.post(url, {"token": other_token, "outcome": "complete", "result": "1"})
    assert "another run" in page.context["form"].errors["token"][0]
    page = staff_client.post(url, {"token": token, "outcome": "fail", "error_message": ""})
    assert page.context["form"].errors["error_message"]
    page = staff_client.post(url, {"token": token, "outcome": "fail", "error_message": "said no"}, follow=True)
    assert any("failed" in m for m in messages_of(page))
    weft_env.drive()  # attempt 1 failed: backoff
    weft_env.advance(60)  # attempt 2 parks
    token2 = AsyncActivity.objects.get(run_id=handle.run_id, attempt=2).token
    page = staff_client.post(url, {"token": token, "outcome": "complete", "result": "1"})
    assert "already" in page.context["form"].errors["token"][0]
    staff_client.post(url, {"token": token2, "outcome": "complete", "result": '{"ok": true}'})
    weft_env.drive()
    assert handle.result() == {"ok": True}


# --- runs: permissions --------------------------------------------------------------------------------------


def test_view_only_users_see_everything_and_change_nothing(client, weft_env):
    user_with(client, "view_workflow", "view_schedule")
    handle = weft.start("test.async", "view")
    weft_env.drive()
    page = client.get(reverse(RUNS))
    assert page.status_code == 200 and b"action-checkbox" not in page.content
    body = client.get(run_url(handle.run_id)).content.decode()
    assert "ask_human" in body  # the journal is visible without a separate step permission
    assert AsyncActivity.objects.get(run_id=handle.run_id).token not in body  # a bearer credential (issue 10)
    for name in ("cancel", "suspend", "signal", "async"):
        assert run_url(handle.run_id, name) not in body
        assert client.get(run_url(handle.run_id, name)).status_code == 403
        assert client.post(run_url(handle.run_id, name), {"post": "yes"}).status_code == 403
    client.post(reverse(RUNS), {"action": "cancel_selected", "_selected_action": [str(handle.run_id)],
                                "post": "yes"})
    assert handle.status == "waiting"
    assert client.post(run_url(handle.run_id), {}).status_code == 403


def test_each_operation_needs_its_own_permission(client, weft_env):
    user_with(client, "view_workflow", "cancel_workflow")
    handle = weft.start("test.collect", 1)
    weft_env.drive()
    body = client.get(run_url(handle.run_id)).content.decode()
    assert run_url(handle.run_id, "cancel") in body and run_url(handle.run_id, "suspend") not in body
    assert client.post(run_url(handle.run_id, "suspend"), {"post": "yes"}).status_code == 403
    actions = [value for value, _label in client.get(reverse(RUNS)).context["action_form"].fields["action"].choices]
    assert "cancel_selected" in actions and "purge_selected" not in actions and "retry_selected" not in actions
    client.post(run_url(handle.run_id, "cancel"), {"post": "yes"})
    weft_env.drive()
    assert handle.status == "cancelled"


def test_anonymous_users_are_sent_to_login_everywhere(client, weft_env):
    handle = weft.start("test.collect", 1)
    schedule = weft.create_schedule("anon", "test.collect", 0, every=60)
    for url in (run_url(handle.run_id), run_url(handle.run_id, "cancel"), run_url(handle.run_id, "signal"),
                run_url(handle.run_id, "async"), reverse(SCHEDULES), schedule_url(schedule.pk),
                schedule_url(schedule.pk, "pause"), reverse("admin:django_weft_schedule_add")):
        page = client.post(url, {"post": "yes"})
        assert page.status_code == 302 and "/login/" in page["Location"], url
    assert handle.status == "pending" and Schedule.objects.get(pk=schedule.pk).status == "active"


# --- retry_failed, directly --------------------------------------------------------------------------------


def test_retry_failed_deletes_the_failed_step_and_keeps_the_rest(weft_env):
    handle = fail_run(weft_env, "retry-direct")
    before = Workflow.objects.get(pk=handle.run_id)
    run = repairs.retry_failed(handle.run_id, weft_env.now())
    assert run.status == "running" and run.error is None and run.finished_at is None
    assert run.fence == before.fence + 1 and run.runnable_at == weft_env.now()
    assert not WorkflowStep.objects.filter(run_id=handle.run_id).exists()
    weft_env.drive()
    assert handle.result() == "ok" and executions("retry-direct") == 4


def test_retry_failed_replays_a_run_that_failed_outside_a_step(weft_env):
    parent = weft.start("test.parent", {"key": "rf", "fail": True}, workflow_id="rf-parent")
    weft_env.drive()
    child = Workflow.objects.get(parent_id=parent.run_id)
    assert child.status == "failed" and not WorkflowStep.objects.filter(run=child).exists()
    repairs.retry_failed(child.pk, weft_env.now())
    weft_env.drive()
    assert Workflow.objects.get(pk=child.pk).status == "failed"  # same code, same failure
    assert executions("rf:child") == 2


def test_retry_failed_refuses_other_states_and_a_newer_open_run(weft_env):
    open_run = weft.start("test.collect", 1, workflow_id="rf-open")
    with pytest.raises(TransitionNotAllowed):
        repairs.retry_failed(open_run.run_id, weft_env.now())
    handle = fail_run(weft_env, "rf-dup")
    weft.start("test.collect", 1, workflow_id="rf-dup", on_terminal_conflict="start_new")
    with pytest.raises(TransitionNotAllowed, match="another run"):
        repairs.retry_failed(handle.run_id, weft_env.now())
    assert handle.status == "failed"


# --- schedules ----------------------------------------------------------------------------------------------


def test_schedule_changelist_describes_the_spec(staff_client):
    weft.create_schedule("daily", "test.collect", 0, cron="30 9 * * 1-5", timezone="Europe/Berlin")
    weft.create_schedule("often", "test.collect", 0, every=timedelta(minutes=15))
    body = staff_client.get(reverse(SCHEDULES)).content.decode()
    assert "At 09:30 AM, Monday through Friday" in body and "Every 15 minutes" in body  # cron-descriptor, ours
    assert "Europe/Berlin" in body and "weft-badge weft-active" in body


def test_schedule_detail_previews_occurrences_and_history(staff_client, weft_env):
    schedule = weft.create_schedule("hist", "test.collect", 0, cron="0 12 * * *", timezone="America/New_York",
                                    overlap="skip")
    run = schedule.trigger()
    schedule.trigger()  # skipped: the first run is still open
    body = staff_client.get(schedule_url(schedule.pk)).content.decode()
    assert body.count("12:00:00 E") >= 10  # ten occurrences at noon New York time (EST/EDT)
    assert run_url(run.pk) in body and "Skipped: a run was still open" in body
    assert ScheduleOccurrence.objects.filter(schedule=schedule).count() == 2


def test_schedule_add_form_creates_through_the_engine(staff_client):
    page = staff_client.post(reverse("admin:django_weft_schedule_add"), {
        "schedule_id": "from-admin", "workflow_type": "test.collect", "input_json": "2", "cron": "*/5 * * * *",
        "every": "", "timezone": "UTC", "overlap": "skip", "catchup_window": "", "jitter": ""})
    assert page.status_code == 302, page.context["adminform"].form.errors
    schedule = Schedule.objects.get(schedule_id="from-admin")
    assert schedule.next_fire_at is not None and schedule.cron == "*/5 * * * *"
    from django_weft.common.codec import decode

    assert decode(schedule.input) == 2
    assert LogEntry.objects.filter(object_id=str(schedule.pk)).exists()


@pytest.mark.parametrize(("changes", "field", "text"), [
    ({"cron": "61 * * * *"}, "cron", "invalid cron"),
    ({"cron": "* * *"}, "cron", "fields"),
    ({"cron": ""}, "cron", "cron expression or an interval"),
    ({"every": "3600"}, "every", "not both"),
    ({"cron": "", "every": "0"}, "every", "at least one second"),
    ({"timezone": "Mars/Olympus"}, "timezone", "unknown time zone"),
    ({"input_json": "{nope"}, "input_json", "JSON"),
    ({"workflow_type": "no.such"}, "workflow_type", "valid choice"),
])
def test_schedule_form_errors_are_on_their_fields(staff_client, changes, field, text):
    data = {"schedule_id": "bad", "workflow_type": "test.collect", "input_json": "0", "cron": "0 * * * *",
            "every": "", "timezone": "UTC", "overlap": "skip", **changes}
    page = staff_client.post(reverse("admin:django_weft_schedule_add"), data)
    assert page.status_code == 200
    errors = page.context["adminform"].form.errors
    assert field in errors and text in " ".join(errors[field]), errors
    assert not Schedule.objects.filter(schedule_id="bad").exists()


def test_schedule_edit_form_updates_through_the_engine(staff_client):
    schedule = weft.create_schedule("edit-me", "test.collect", {"n": 1}, cron="0 * * * *", timezone="UTC")
    page = staff_client.get(schedule_url(schedule.pk))
    assert page.status_code == 200 and "0 * * * *" in page.content.decode()
    page = staff_client.post(schedule_url(schedule.pk), {
        "input_json": '{"n": 2}', "cron": "", "every": "00:10:00", "timezone": "Europe/Paris", "overlap": "allow_all"})
    assert page.status_code == 302, page.context["adminform"].form.errors
    schedule.refresh_from_db()
    assert schedule.cron == "" and schedule.every == timedelta(minutes=10) and schedule.timezone == "Europe/Paris"
    assert schedule.overlap == "allow_all" and schedule.schedule_id == "edit-me"
    page = staff_client.post(schedule_url(schedule.pk), {
        "input_json": "{}", "cron": "bad cron", "every": "", "timezone": "UTC", "overlap": "skip"})
    assert page.status_code == 200 and "cron" in page.context["adminform"].form.errors


def test_schedule_actions_pause_resume_trigger_cancel(staff_client):
    schedule = weft.create_schedule("ops", "test.collect", 0, every=60)
    page = act(staff_client, "pause_selected", [schedule.pk], changelist=SCHEDULES)
    assert any("1 schedule paused" in m for m in messages_of(page))
    assert Schedule.objects.get(pk=schedule.pk).status == "paused"
    act(staff_client, "resume_selected", [schedule.pk], changelist=SCHEDULES)
    assert Schedule.objects.get(pk=schedule.pk).status == "active"
    page = act(staff_client, "trigger_selected", [schedule.pk], changelist=SCHEDULES)
    assert Workflow.objects.filter(schedule=schedule).count() == 1
    assert any("started run" in m for m in messages_of(page))
    page = act(staff_client, "cancel_selected", [schedule.pk], changelist=SCHEDULES)
    assert Schedule.objects.get(pk=schedule.pk).status == "cancelled"
    page = act(staff_client, "trigger_selected", [schedule.pk], changelist=SCHEDULES, confirm=False)
    assert b"nothing to do" in page.content
    assert LogEntry.objects.filter(object_id=str(schedule.pk)).count() == 4


def test_schedule_buttons_and_view_only_users(client, staff_client):
    schedule = weft.create_schedule("btn", "test.collect", 0, every=60)
    body = staff_client.get(schedule_url(schedule.pk)).content.decode()
    assert schedule_url(schedule.pk, "pause") in body and schedule_url(schedule.pk, "resume") not in body
    assert staff_client.post(schedule_url(schedule.pk, "pause"), {"post": "yes"}).status_code == 302
    assert Schedule.objects.get(pk=schedule.pk).status == "paused"
    user_with(client, "view_schedule", username="viewer")
    page = client.get(schedule_url(schedule.pk))
    assert page.status_code == 200 and schedule_url(schedule.pk, "resume") not in page.content.decode()
    assert client.post(schedule_url(schedule.pk, "resume"), {"post": "yes"}).status_code == 403
    assert client.post(schedule_url(schedule.pk), {"cron": "", "every": "30", "timezone": "UTC",
                                                   "overlap": "skip"}).status_code == 403
    assert client.get(reverse("admin:django_weft_schedule_add")).status_code == 403
    assert Schedule.objects.get(pk=schedule.pk).status == "paused"


def test_schedule_input_with_markup_is_escaped(staff_client):
    schedule = weft.create_schedule("xss", "test.collect", {"k": "<script>alert(1)</script>"}, every=60)
    body = staff_client.get(schedule_url(schedule.pk)).content.decode()
    assert "<script>alert(1)</script>" not in body and "&lt;script&gt;" in body


@pytest.mark.parametrize(("expression", "text"), [  # cron-descriptor's words (English: the test language)
    ("* * * * *", "Every minute"),
    ("*/5 * * * *", "Every 5 minutes"),
    ("15 * * * *", "At 15 minutes past the hour"),
    ("0 */2 * * *", "Every 2 hours"),
    ("30 9 * * *", "At 09:30 AM"),
    ("0 8 * * 1", "At 08:00 AM, only on Monday"),
    ("0 8 * * sat,sun", "At 08:00 AM, only on Saturday and Sunday"),
    ("0 0 1 * *", "At 12:00 AM, on day 1 of the month"),
    ("0 6 25 12 *", "At 06:00 AM, on day 25 of the month, only in December"),
    ("*/10 * * * * *", "Every 10 seconds"),  # six fields: seconds first, as croniter reads them here
    ("0 30 9 * * *", "At 09:30 AM"),
    ("5,35 1-3 * * *", "At 5 and 35 minutes past the hour, between 01:00 AM and 03:59 AM"),
    ("H 9 * * *", None),  # croniter's hashed field: not described rather than misread
])
def test_describe_cron(expression, text):
    assert describe_cron(expression) == text


def test_describe_interval():
    assert describe_interval(timedelta(hours=1)) == "Every hour"
    assert describe_interval(timedelta(days=2)) == "Every 2 days"
    assert describe_interval(timedelta(seconds=90)) == "Every 90 seconds"
