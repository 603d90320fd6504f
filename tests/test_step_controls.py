"""Step controls (design 9.5): fire a timer or a retry backoff now, reset an activity's attempts, pause and unpause
its retries, change its retry policy or timeouts; each audited, each refused with a reason when it no longer
applies. Through the handle, the API and ``weft_runs step``."""

from __future__ import annotations

import io
from datetime import timedelta

import pytest
from django.core.management import call_command

import django_weft as weft
from django_weft.models import AsyncActivity, RunAction, RunStatus
from tests.api_helpers import error_of

pytestmark = pytest.mark.django_db

failures = {"left": 0, "calls": 0}


@weft.activity(name="controls.flaky", retry=weft.RetryPolicy(max_attempts=2, initial_backoff=3600,
                                                                     max_backoff=3600))
def flaky() -> str:
    failures["calls"] += 1
    if failures["left"]:
        failures["left"] -= 1
        raise ConnectionError("503 from the provider")
    return "ok"


@weft.workflow(name="controls.retrying")
def retrying(ctx: weft.Context) -> str:
    try:
        return ctx.run(flaky)
    except weft.ActivityError as exc:
        return f"gave up after {exc.attempts}"


@weft.workflow(name="controls.sleeps")
def sleeps(ctx: weft.Context) -> str:
    ctx.sleep(timedelta(days=1))
    return "woke"


@weft.activity(name="controls.ask", schedule_to_close_timeout=timedelta(days=3))
def ask() -> str:
    weft.complete_async()


@weft.workflow(name="controls.asks")
def asks(ctx: weft.Context) -> str:
    try:
        return ctx.run(ask)
    except weft.ActivityError as exc:
        return exc.error_type


def start_failing(times: int) -> weft.WorkflowHandle:
    failures.update(left=times, calls=0)
    return weft.start("controls.retrying")


def test_fire_a_sleep_now_and_it_is_audited(weft_env):
    handle = weft.start("controls.sleeps", workflow_id="sleeper")
    weft_env.drive()
    handle.fire_timer_now(1, requested_by="ops@example.com")
    weft_env.drive()
    assert handle.result() == "woke"
    action = RunAction.objects.get()
    assert (action.seq, action.action, action.requested_by) == (1, "fire_timer_now", "ops@example.com")
    with pytest.raises(weft.TransitionNotAllowed, match="completed: no step of it waits"):
        handle.fire_timer_now(1)


def test_fire_a_retry_backoff_now(weft_env):
    handle = start_failing(1)
    weft_env.drive()
    [waiting] = handle.pending_activities()
    assert waiting.state == "waiting_for_retry"
    handle.fire_timer_now(1)
    weft_env.drive()
    assert handle.result() == "ok" and failures["calls"] == 2
    with pytest.raises(weft.TransitionNotAllowed):
        handle.fire_timer_now(1)


def test_without_a_reset_the_policy_gives_up_and_with_one_it_starts_over(weft_env):
    plain = start_failing(2)
    weft_env.advance_until_idle()
    assert plain.result() == "gave up after 2"
    reset = start_failing(2)
    weft_env.drive()
    reset.reset_activity_attempts(1)
    weft_env.advance_until_idle()
    assert reset.result() == "ok" and failures["calls"] == 3  # attempts 2 and 3 counted as the first and second


def test_paused_retries_wait_until_unpaused(weft_env):
    handle = start_failing(1)
    weft_env.drive()
    handle.pause_activity_retries(1)
    assert [p.state for p in handle.pending_activities()] == ["retries_paused"]
    assert "paused by an operator" in handle.refresh().wait_reason
    weft_env.advance(timedelta(hours=3))  # its backoff passed: nothing happens
    assert handle.status == RunStatus.WAITING and failures["calls"] == 1
    with pytest.raises(weft.TransitionNotAllowed, match="paused"):
        handle.fire_timer_now(1)
    with pytest.raises(weft.TransitionNotAllowed, match="paused already"):
        handle.pause_activity_retries(1)
    handle.unpause_activity_retries(1)
    weft_env.drive()
    assert handle.result() == "ok" and failures["calls"] == 2
    assert list(RunAction.objects.values_list("action", flat=True)) == ["pause_retries", "unpause_retries"]


def test_a_new_retry_policy_applies_from_the_next_attempt(weft_env):
    handle = start_failing(3)
    weft_env.drive()
    handle.set_activity_options(1, retry={"max_attempts": 5, "initial_backoff": 1})
    weft_env.advance_until_idle()
    assert handle.result() == "ok" and failures["calls"] == 4


def test_a_new_schedule_to_close_timeout_moves_an_async_waits_deadline(weft_env):
    handle = weft.start("controls.asks")
    weft_env.drive()
    handle.set_activity_options(1, schedule_to_close_timeout=60)
    weft_env.advance(timedelta(seconds=61))
    assert handle.result() == "django_weft.exceptions.ActivityTimeout"
    assert AsyncActivity.objects.get().status == "timed_out"


def test_controls_that_do_not_apply_are_refused_with_the_reason(weft_env):
    handle = weft.start("controls.sleeps")
    weft_env.drive()
    with pytest.raises(weft.TransitionNotAllowed, match="not an activity step"):
        handle.reset_activity_attempts(1)
    with pytest.raises(weft.TransitionNotAllowed, match="no timer waiting to fire"):
        handle.fire_timer_now(7)
    with pytest.raises(weft.InvalidArgument, match="int >= 1"):
        handle.fire_timer_now(0)
    with pytest.raises(weft.InvalidArgument, match="not colour"):
        handle.set_activity_options(1, retry={"colour": "red"})
    with pytest.raises(weft.InvalidArgument, match="max_attempts"):
        handle.set_activity_options(1, retry={"max_attempts": 0})
    with pytest.raises(weft.InvalidArgument, match="nothing to change"):
        handle.set_activity_options(1)
    assert not RunAction.objects.exists()  # nothing refused was recorded


def test_the_api_and_the_cli(api, key_with, weft_env):
    handle = start_failing(1)
    weft.start("controls.sleeps", workflow_id="api-sleeper")
    weft_env.drive()
    run_id = handle.workflow_id
    assert error_of(key_with("view_workflow").post(f"runs/{run_id}/steps/1/pause_retries")) == (403, "forbidden")
    assert api.post(f"runs/{run_id}/steps/1/pause_retries").json() == {"done": "pause_retries", "seq": 1}
    assert error_of(api.post(f"runs/{run_id}/steps/1/pause_retries")) == (409, "transition_not_allowed")
    assert api.post(f"runs/{run_id}/steps/1/options", {"retry": {"max_attempts": 3}}).status_code == 200
    assert error_of(api.post(f"runs/{run_id}/steps/1/options", {})) == (422, "invalid_argument")
    out = io.StringIO()
    call_command("weft_runs", "step", run_id, "1", "unpause-retries", stdout=out)
    assert "unpause_retries" in out.getvalue()
    call_command("weft_runs", "step", "api-sleeper", "1", "fire-now", stdout=out)
    weft_env.advance_until_idle()
    assert handle.result() == "ok" and weft.get_handle("api-sleeper").result() == "woke"
    assert RunAction.objects.count() == 4


def test_the_admin_links_the_controls_that_apply_and_applies_them(staff_client, client, weft_env):
    from django.contrib.auth import get_user_model
    from django.urls import reverse

    handle = start_failing(1)
    weft_env.drive()
    page = staff_client.get(reverse("admin:django_weft_workflow_change", args=[handle.run_id])).content.decode()
    panel = page.split('id="weft-in-flight"', 1)[1].split("</fieldset>", 1)[0]
    assert "waiting to retry" in panel and "step-control/?seq=1&amp;control=pause_retries" in panel
    url = reverse("admin:django_weft_workflow_step_control", args=[handle.run_id])
    assert staff_client.get(url, {"seq": 1, "control": "pause_retries"}).status_code == 200
    response = staff_client.post(url, {"seq": 1, "control": "pause_retries"})
    assert response.status_code == 302
    assert [p.state for p in handle.pending_activities()] == ["retries_paused"]
    refused = staff_client.post(url, {"seq": 1, "control": "pause_retries"})
    assert refused.status_code == 200 and "paused already" in refused.content.decode()
    mixed = staff_client.post(url, {"seq": 1, "control": "unpause_retries", "max_attempts": 3})
    assert "Only “change its retry policy or timeouts” takes these fields" in mixed.content.decode()
    assert staff_client.post(url, {"seq": 1, "control": "set_activity_options", "max_attempts": 4}).status_code == 302
    page = staff_client.get(reverse("admin:django_weft_workflow_change", args=[handle.run_id])).content.decode()
    assert "set_activity_options" in page and "pause_retries" in page  # the operator actions inline
    viewer = get_user_model().objects.create_user("viewer", password="pw", is_staff=True)
    from django.contrib.auth.models import Permission

    viewer.user_permissions.add(Permission.objects.get(codename="view_workflow"))
    client.force_login(viewer)
    assert client.post(url, {"seq": 1, "control": "unpause_retries"}).status_code == 403
    page = client.get(reverse("admin:django_weft_workflow_change", args=[handle.run_id])).content.decode()
    assert "step-control/" not in page  # no links to controls it may not use


# --- schedules that pause on a failure; the operator's signals ----------------------------------------------


@weft.workflow(name="controls.fails")
def fails(ctx: weft.Context) -> None:
    raise RuntimeError("broken")


def test_a_schedule_with_pause_on_failure_pauses_when_a_run_fails(weft_env, key_with):
    api = key_with("view_schedule", "change_schedule")
    paused = weft.create_schedule("pauses", "controls.fails", every=60, pause_on_failure=True)
    goes_on = weft.create_schedule("goes-on", "controls.fails", every=60)
    weft_env.advance(timedelta(seconds=61))
    paused.refresh_from_db()
    goes_on.refresh_from_db()
    assert paused.status == "paused" and "pause_on_failure" in paused.note
    assert goes_on.status == "active"
    body = api.get("schedules/pauses").json()
    assert body["pause_on_failure"] is True, body
    assert api.patch("schedules/goes-on", {"pause_on_failure": True}).json()["pause_on_failure"] is True
    with pytest.raises(weft.InvalidArgument, match="pause_on_failure"):
        weft.create_schedule("bad", "controls.fails", every=60, pause_on_failure="yes")  # type: ignore[arg-type]


def test_suspend_and_resume_send_signals_after_their_commit(weft_env, django_capture_on_commit_callbacks):
    from django_weft import signals

    seen: list[tuple[str, dict]] = []

    def receiver(signal_name):
        def receive(sender, run, signal, **kwargs):
            seen.append((signal_name, {"run": run.workflow_id, **kwargs}))
        return receive

    on_suspend, on_resume = receiver("suspended"), receiver("resumed")
    signals.workflow_suspended.connect(on_suspend)
    signals.workflow_resumed.connect(on_resume)
    try:
        handle = weft.start("controls.sleeps", workflow_id="susp")
        weft_env.drive()
        with django_capture_on_commit_callbacks(execute=True):
            handle.suspend("maintenance window")
            handle.resume()
    finally:
        signals.workflow_suspended.disconnect(on_suspend)
        signals.workflow_resumed.disconnect(on_resume)
    assert seen == [("suspended", {"run": "susp", "reason": "maintenance window"}), ("resumed", {"run": "susp"})]
