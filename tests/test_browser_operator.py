"""The operator's view in a real browser (design 9.5): the work-in-flight panel shows a heartbeating activity's
details while it runs, each step control changes the run as described (and is refused, with the reason, once it
no longer applies), and a user without ``django_weft.view_payloads`` sees no payload anywhere: the admin in
Chromium, the HTTP API with a key of the same permissions, ``weft_runs`` as that user."""

from __future__ import annotations

import io
import json
import re
import threading
import time
from collections.abc import Iterator
from datetime import timedelta

import pytest
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Permission
from django.core.management import call_command
from django.test import Client
from django.utils import timezone

import django_weft as weft
from django_weft.models import RunAction, RunStatus
from django_weft.services import api_keys
from tests.browser_kit import Browser, admin, browser_marks, chromium, expect, log_in, run_path

__all__ = ["admin", "chromium"]  # fixtures, imported for pytest

pytestmark = browser_marks

release = threading.Event()
SECRET = "card-4242-4242-4242-4242"


# --- work in flight -----------------------------------------------------------------------------------------------


@weft.activity(name="browserop.transcode", heartbeat_timeout=60)
def transcode(video: str) -> str:
    for frame in range(1, 2000):
        weft.heartbeat({"frames_done": frame, "video": video})
        if release.wait(0.05):
            return f"{video} transcoded"
    return f"{video} gave up"


@weft.workflow(name="browserop.transcodes")
def transcodes(ctx: weft.Context, video: str) -> str:
    return ctx.run(transcode, video)


def executor_thread(stop: threading.Event) -> threading.Thread:
    """An executor in this process: it claims and runs the test's runs while the browser looks at them."""

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


def frames_shown(browser: Browser) -> int:
    details = browser.page.locator("#weft-in-flight pre.weft-heartbeat-details").inner_text()
    return json.loads(details)["frames_done"]


@pytest.mark.usefixtures("row_locks")
def test_the_in_flight_panel_shows_a_heartbeating_activity_while_it_runs(admin: Browser) -> None:
    release.clear()
    stop = threading.Event()
    handle = weft.start("browserop.transcodes", "launch-video.mp4", workflow_id="transcode-launch-video")
    thread = executor_thread(stop)
    try:
        page = admin.page
        admin.goto(run_path(handle.run_id))
        panel = page.locator("#weft-in-flight")
        for _ in range(40):  # an attempt is published once it has run for a second
            if panel.count() and "heartbeat" in panel.inner_text() and page.locator(
                    "#weft-in-flight pre.weft-heartbeat-details").count():
                break
            time.sleep(0.25)
            page.reload()
        expect(panel).to_contain_text("browserop.transcode")
        expect(panel.locator("tr.weft-in-flight-row")).to_contain_text("running")
        expect(panel).to_contain_text('"video": "launch-video.mp4"')
        first = frames_shown(admin)
        # The panel is first on the page: above the summary's fields and the journal.
        order = page.evaluate("""() => [...document.querySelectorAll('#weft-in-flight, fieldset.module')]
            .map(e => e.id || (e.querySelector('h2') || {}).textContent || '')""")
        assert order[0] == "weft-in-flight", order
        for width in (1280, 1920):
            page.set_viewport_size({"width": width, "height": 900})
            admin.shot(f"run-in-flight-{width}", docs=True)
        time.sleep(1.5)
        page.reload()
        assert frames_shown(admin) > first  # later heartbeats replace the details shown
        release.set()
        deadline = time.monotonic() + 30
        while handle.refresh().status != RunStatus.COMPLETED and time.monotonic() < deadline:
            time.sleep(0.1)
        assert handle.result() == "launch-video.mp4 transcoded"
        page.reload()
        expect(page.locator("#weft-in-flight")).to_have_count(0)  # nothing in flight once it settled
    finally:
        release.set()
        stop.set()
        thread.join(30)


# --- step controls ------------------------------------------------------------------------------------------------


failures = {"left": 0}


@weft.activity(name="browserop.charge", retry=weft.RetryPolicy(max_attempts=2, initial_backoff=3600,
                                                                       max_backoff=7200))
def charge() -> str:
    if failures["left"]:
        failures["left"] -= 1
        raise ConnectionError("503 from the payment provider")
    return "charged"


@weft.workflow(name="browserop.charges")
def charges(ctx: weft.Context) -> str:
    try:
        return ctx.run(charge)
    except weft.ActivityError as exc:
        return f"gave up after {exc.attempts}"


@weft.workflow(name="browserop.sleeps")
def sleeps(ctx: weft.Context) -> str:
    ctx.sleep(timedelta(days=1))
    return "woke"


def use_control(admin: Browser, run_id: object, label: str, **fields: str) -> None:
    """Follow the in-flight panel's link for a control, fill the form, apply it; back on the run's page."""
    admin.goto(run_path(run_id))
    admin.page.locator("#weft-in-flight .weft-step-controls").get_by_role("link", name=label, exact=True).click()
    expect(admin.page).to_have_url(re.compile(r"/step-control/\?seq=1&control="))
    for name, value in fields.items():
        admin.page.fill(f"#id_{name}", value)
    admin.page.get_by_role("button", name="Apply").click()
    expect(admin.page).to_have_url(re.compile(re.escape(run_path(run_id)) + "$"))


def states(handle: weft.WorkflowHandle) -> list[tuple[str, int]]:
    return [(item.state, item.attempt) for item in handle.pending_activities()]


def test_each_step_control_changes_the_run(admin: Browser) -> None:
    failures["left"] = 1
    handle = weft.start("browserop.charges", workflow_id="charge-order-7")
    weft.run_maintenance()
    assert states(handle) == [("waiting_for_retry", 2)]  # attempt 2 is an hour's backoff ahead
    panel = admin.page.locator("#weft-in-flight")

    use_control(admin, handle.run_id, "pause retries")
    assert states(handle) == [("retries_paused", 2)]
    expect(panel).to_contain_text("retries paused by an operator")
    admin.shot("step-control-paused")

    use_control(admin, handle.run_id, "unpause retries")
    assert states(handle) == [("waiting_for_retry", 2)]

    # Attempt 2 fails too: of two attempts allowed it is the last, unless the count is reset.
    failures["left"] = 1
    use_control(admin, handle.run_id, "change policy", max_attempts="2", initial_backoff="7200")
    use_control(admin, handle.run_id, "reset attempts")
    use_control(admin, handle.run_id, "retry now")
    weft.run_maintenance()  # attempt 2 fails, counted as the first: it waits two hours (the new backoff) for 3
    assert states(handle) == [("waiting_for_retry", 3)]
    retry_at = handle.pending_activities()[0].next_retry_at
    assert retry_at is not None and retry_at - timezone.now() > timedelta(minutes=100)
    use_control(admin, handle.run_id, "retry now")
    weft.run_maintenance()
    assert handle.result() == "charged"
    actions = list(RunAction.objects.filter(run_id=handle.run_id).order_by("at", "id").values_list("action", flat=True))
    assert actions == ["pause_retries", "unpause_retries", "set_activity_options", "reset_attempts",
                       "fire_timer_now", "fire_timer_now"]
    admin.goto(run_path(handle.run_id))
    expect(admin.page.locator(".inline-group").filter(has_text="operator actions")).to_contain_text(
        "set_activity_options")

    # Once the step settled, a control is refused with the reason, and nothing is recorded.
    admin.goto(run_path(handle.run_id, "step-control") + "?seq=1&control=pause_retries")
    admin.page.get_by_role("button", name="Apply").click()
    expect(admin.page.locator("p.errornote")).to_be_visible()
    assert RunAction.objects.filter(run_id=handle.run_id).count() == 6

    # A durable sleep fired now.
    sleeper = weft.start("browserop.sleeps", workflow_id="sleeps-a-day")
    weft.run_maintenance()
    assert sleeper.status == "waiting"
    admin.goto(run_path(sleeper.run_id, "step-control") + "?seq=1&control=fire_timer_now")
    expect(admin.page.locator("#id_control")).to_have_value("fire_timer_now")
    admin.page.get_by_role("button", name="Apply").click()
    assert "Fire its timer or retry backoff now" in admin.messages()
    weft.run_maintenance()
    assert sleeper.result() == "woke"


# --- payload privacy ----------------------------------------------------------------------------------------------


@weft.activity(name="browserop.echo")
def echo(value: str) -> str:
    return f"{value}!"


@weft.workflow(name="browserop.carries")
def carries(ctx: weft.Context, value: str) -> str:
    ctx.set_query_handler("state", lambda: value)
    ctx.set_event("progress", value)
    ctx.write_stream("log", value)
    echoed = ctx.run(echo, value)
    got = ctx.wait_for_signal("go")
    return f"{echoed}{got}"


VIEWER, VIEWER_PASSWORD = "payload-blind", "blind-pw"
CODENAMES = ("view_workflow", "view_schedule", "view_bulkoperation", "view_executor", "view_apikey")


@pytest.fixture
def viewer(chromium, live_server) -> Iterator[Browser]:
    """Staff who may view every django_weft page but not payloads, logged in through the login form."""
    user = get_user_model().objects.create_user(VIEWER, password=VIEWER_PASSWORD, is_staff=True)
    user.user_permissions.add(*Permission.objects.filter(content_type__app_label="django_weft",
                                                         codename__in=CODENAMES))
    context, browser = log_in(chromium, str(live_server), "payload-blind", VIEWER, VIEWER_PASSWORD)
    try:
        yield browser
    finally:
        context.close()


def test_a_user_without_view_payloads_sees_no_payload_anywhere(viewer: Browser) -> None:
    done = weft.start("browserop.carries", SECRET, workflow_id="private-done")
    weft.run_maintenance()
    done.signal("go", SECRET)
    weft.run_maintenance()
    assert done.result() == f"{SECRET}!{SECRET}"
    waiting = weft.start("browserop.carries", SECRET, workflow_id="private-waiting")
    weft.run_maintenance()
    waiting.signal("go-later", SECRET)  # unconsumed: shown in the signals inline
    schedule = weft.create_schedule("private-schedule", "browserop.carries", SECRET, every=3600)

    pages = ["/admin/django_weft/workflow/", run_path(done.run_id), run_path(waiting.run_id),
             run_path(waiting.run_id) + "?weft_query=state#weft-queries", "/admin/django_weft/schedule/",
             f"/admin/django_weft/schedule/{schedule.pk}/change/"]
    seen = []
    for path in pages:
        viewer.goto(path)
        expect(viewer.page.locator("#content")).to_be_visible()
        seen.append(viewer.page.content())
    everything = "\n".join(seen)
    assert "private-done" in everything and "browserop.carries" in everything  # the pages are there
    assert SECRET not in everything
    assert "hidden" in everything.lower()
    viewer.goto(run_path(done.run_id))
    viewer.shot("run-without-view-payloads", docs=True)

    # The API with a key of the same permissions, and weft_runs as the same user.
    _, key = api_keys.create("blind-key", [f"django_weft.{name}" for name in ("view_workflow", "view_schedule")])
    client = Client(HTTP_AUTHORIZATION=f"Bearer {key}")
    answers = [client.get(f"/weft/api/runs/{wid}") for wid in ("private-done", "private-waiting")]
    answers += [client.get(f"/weft/api/runs/{wid}/{what}") for wid in ("private-done", "private-waiting")
                for what in ("steps", "events", "pending_activities")]
    answers += [client.get(path) for path in ("/weft/api/runs/private-done/result", "/weft/api/runs",
                                              "/weft/api/schedules/private-schedule")]
    assert [a.status_code for a in answers if a.status_code != 200] == []
    api_text = "\n".join(a.content.decode() for a in answers)
    assert "private-done" in api_text and SECRET not in api_text
    out = io.StringIO()
    call_command("weft_runs", "show", "private-done", "--user", VIEWER, stdout=out)
    call_command("weft_runs", "show", "private-waiting", "--user", VIEWER, "--json", stdout=out)
    assert "private-done" in out.getvalue() and SECRET not in out.getvalue()

    # Given the permission, the same user sees them.
    user = get_user_model().objects.get(username=VIEWER)
    user.user_permissions.add(Permission.objects.get(content_type__app_label="django_weft", codename="view_payloads"))
    viewer.goto(run_path(done.run_id))
    expect(viewer.page.locator("#content")).to_contain_text(SECRET)
