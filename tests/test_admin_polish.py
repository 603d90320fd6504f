"""Admin polish (issue 11): status chips without bullets, WEFT_SCHEDULES schedules read-only, cleared timers
labelled as cleared, schedule descriptions from cron-descriptor in the user's language."""

from __future__ import annotations

import html
import os
import re
from datetime import timedelta
from pathlib import Path

import cron_descriptor
import pytest
from django.contrib.auth import get_user_model
from django.contrib.staticfiles import finders
from django.core.management import call_command
from django.test.utils import override_settings
from django.urls import reverse
from django.utils import translation

import django_weft as weft
from django_weft.admin.describe import cron_locale, describe_cron, describe_interval
from django_weft.common import clock as weft_clock
from django_weft.models import AsyncActivity, RunStatus, Schedule, Timer, Workflow

pytestmark = pytest.mark.django_db

RUNS = "admin:django_weft_workflow_changelist"
SCHEDULES = "admin:django_weft_schedule_changelist"
SETTINGS_NOTE = ("Defined in settings.WEFT_SCHEDULES; change it there and it is synced when weft_maintenance "
                 "starts or by manage.py weft_schedules sync.")
SYNCED = {"nightly": {"workflow": "test.collect", "input": 3, "cron": "0 2 * * *", "timezone": "Europe/Berlin",
                      "overlap": "buffer_one"}}


def run_url(run_id):
    return reverse("admin:django_weft_workflow_change", args=[run_id])


def schedule_url(pk, what="change"):
    return reverse(f"admin:django_weft_schedule_{what}", args=[pk])


# --- status-count chips -------------------------------------------------------------------------------------

CHIP_RULE = re.compile(r"\.weft-status-counts\s*>\s*li\s*\{[^}]*list-style(-type)?\s*:\s*none", re.S)


def test_the_chips_stylesheet_takes_the_bullet_off_each_item(staff_client):
    weft.start("test.collect", 1, workflow_id="chips")
    body = staff_client.get(reverse(RUNS)).content.decode()
    assert '<ul class="weft-status-counts">' in body
    assert "/static/django_weft/admin.css" in body  # the changelist loads the stylesheet ...
    path = finders.find("django_weft/admin.css")
    assert path, "django_weft/static/django_weft/admin.css is missing"
    # ... whose rule is on the items: Django's `ul > li { list-style-type: square }` is on the items too, so a
    # `list-style: none` on the list alone leaves the bullets.
    assert CHIP_RULE.search(Path(path).read_text())


@pytest.mark.browser
@pytest.mark.django_db(transaction=True)  # live_server's thread must see the test's rows
def test_the_chips_have_no_bullet_in_a_browser(live_server, monkeypatch):
    sync_api = pytest.importorskip("playwright.sync_api", reason="needs the playwright package")
    chromium = os.environ.get("WEFT_CHROMIUM", "/usr/bin/chromium")
    if not os.access(chromium, os.X_OK):
        pytest.skip(f"needs Chromium at {chromium} (apt-get install chromium)")
    monkeypatch.setenv("DJANGO_ALLOW_ASYNC_UNSAFE", "true")  # Playwright's loop runs in this thread
    get_user_model().objects.create_superuser("chips", "chips@example.com", "chips-pw")
    weft.start("test.collect", 1, workflow_id="chips-browser")
    with sync_api.sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=chromium, headless=True,
                                             args=["--headless", "--no-sandbox", "--disable-gpu"])
        try:
            page = browser.new_page()
            page.set_default_timeout(15_000)
            page.goto(f"{live_server.url}/admin/login/?next=/admin/django_weft/workflow/")
            page.fill("#id_username", "chips")
            page.fill("#id_password", "chips-pw")
            page.get_by_role("button", name="Log in").click()
            items = page.locator("ul.weft-status-counts > li")
            sync_api.expect(items.first).to_be_visible()
            styles = items.evaluate_all("items => items.map(li => getComputedStyle(li).listStyleType)")
            assert len(styles) == len(RunStatus.choices) and set(styles) == {"none"}, styles  # a chip per status
            assert items.first.evaluate("li => getComputedStyle(li.parentElement).display") == "flex"
        finally:
            browser.close()


# --- schedules defined in WEFT_SCHEDULES ----------------------------------------------------------------------


@override_settings(WEFT_SCHEDULES=SYNCED)
def test_a_weft_schedules_schedule_is_read_only_with_where_it_is_defined(staff_client):
    call_command("weft_schedules", "sync")
    schedule = Schedule.objects.get(schedule_id="nightly")
    page = staff_client.get(schedule_url(schedule.pk))
    assert page.status_code == 200
    body = page.content.decode()
    assert html.escape(SETTINGS_NOTE, quote=False) in body or SETTINGS_NOTE.replace("'", "&#x27;") in body
    form = page.context["adminform"].form
    assert not {"cron", "every", "timezone", "overlap", "input_json", "jitter", "start_at"} & set(form.fields)
    for name in ("cron", "every", "timezone", "overlap", "input_json"):
        assert f'name="{name}"' not in body
    assert "0 2 * * *" in body and "Europe/Berlin" in body and "3" in body  # shown, as text
    assert 'name="_save"' not in body  # nothing to save
    assert schedule_url(schedule.pk, "pause") in body  # the operations stay


@override_settings(WEFT_SCHEDULES=SYNCED)
def test_posting_a_changed_cadence_to_a_weft_schedules_schedule_changes_nothing(staff_client):
    call_command("weft_schedules", "sync")
    schedule = Schedule.objects.get(schedule_id="nightly")
    page = staff_client.post(schedule_url(schedule.pk), {
        "input_json": "4", "cron": "*/5 * * * *", "every": "", "timezone": "UTC", "overlap": "allow_all"})
    assert page.status_code == 403
    fresh = Schedule.objects.get(pk=schedule.pk)
    assert (fresh.cron, fresh.timezone, fresh.overlap, fresh.next_fire_at) == (
        "0 2 * * *", "Europe/Berlin", "buffer_one", schedule.next_fire_at)
    # Pausing is still the admin's to do, and a sync leaves it paused.
    assert staff_client.post(schedule_url(schedule.pk, "pause"), {"post": "yes"}).status_code == 302
    call_command("weft_schedules", "sync")
    assert Schedule.objects.get(pk=schedule.pk).status == "paused"


@override_settings(WEFT_SCHEDULES=SYNCED)
def test_a_schedule_created_in_code_or_the_admin_stays_editable(staff_client):
    call_command("weft_schedules", "sync")
    manual = weft.create_schedule("by-hand", "test.collect", 1, cron="0 * * * *", timezone="UTC")
    page = staff_client.get(schedule_url(manual.pk))
    body = page.content.decode()
    assert 'name="cron"' in body and 'name="_save"' in body and "WEFT_SCHEDULES;" not in body
    page = staff_client.post(schedule_url(manual.pk), {
        "input_json": "2", "cron": "*/5 * * * *", "every": "", "timezone": "UTC", "overlap": "skip"})
    assert page.status_code == 302, page.context["adminform"].form.errors
    assert Schedule.objects.get(pk=manual.pk).cron == "*/5 * * * *"


@override_settings(WEFT_SCHEDULES=SYNCED)
def test_the_add_form_refuses_an_id_that_weft_schedules_defines(staff_client):
    page = staff_client.post(reverse("admin:django_weft_schedule_add"), {
        "schedule_id": "nightly", "workflow_type": "test.collect", "input_json": "0", "cron": "0 * * * *",
        "every": "", "timezone": "UTC", "overlap": "skip"})
    assert page.status_code == 200
    assert "WEFT_SCHEDULES" in " ".join(page.context["adminform"].form.errors["schedule_id"])
    assert not Schedule.objects.filter(schedule_id="nightly").exists()


def test_a_schedule_removed_from_weft_schedules_becomes_editable(staff_client):
    with override_settings(WEFT_SCHEDULES=SYNCED):
        call_command("weft_schedules", "sync")
    schedule = Schedule.objects.get(schedule_id="nightly")
    with override_settings(WEFT_SCHEDULES={}):
        call_command("weft_schedules", "sync")  # pauses it: "removed from WEFT_SCHEDULES"
        body = staff_client.get(schedule_url(schedule.pk)).content.decode()
    assert 'name="cron"' in body and "WEFT_SCHEDULES;" not in body


# --- timers: fired or cleared ---------------------------------------------------------------------------------


def outcomes(client, run_id) -> dict[str, list[str]]:
    """The timers inline of a run's page: purpose label -> outcome texts, in the page's order."""
    page = client.get(run_url(run_id))
    timers = next(f for f in page.context["inline_admin_formsets"] if f.formset.model is Timer)
    assert timers.formset.forms or not Timer.objects.filter(run_id=run_id).exists()
    body = page.content.decode()
    rows = re.findall(r'<td class="field-purpose">(.*?)</td>.*?<td class="field-outcome">(.*?)</td>', body, re.S)
    found: dict[str, list[str]] = {}
    for purpose, outcome in rows:
        text = " ".join(html.unescape(re.sub(r"<[^>]+>", " ", outcome)).split())
        found.setdefault(" ".join(re.sub(r"<[^>]+>", " ", purpose).split()), []).append(text)
    assert sum(map(len, found.values())) == Timer.objects.filter(run_id=run_id).count()
    return found


def test_a_wait_timeout_cleared_by_its_signal_is_labelled_cleared(staff_client, weft_env):
    handle = weft.start("test.approval", "cleared", workflow_id="cleared")
    weft_env.drive()
    assert outcomes(staff_client, handle.run_id) == {"Signal wait timeout": ["pending"]}
    weft.signal("cleared", "approval", "yes")
    weft_env.drive()
    assert handle.result() == "yes"
    timer = Timer.objects.get(run_id=handle.run_id)
    assert timer.fired_at is not None and timer.fired_at < timer.fire_at  # what the engine writes
    [text] = outcomes(staff_client, handle.run_id)["Signal wait timeout"]
    assert text.startswith("cleared at ") and text.endswith(": the signal arrived first"), text
    assert "fired" not in text


def test_a_signal_that_arrives_after_the_timeout_is_due_but_first_still_clears_it(staff_client, weft_env):
    handle = weft.start("test.approval", "late", workflow_id="late")
    weft_env.drive()
    handle.suspend()  # nothing runs it while the timeout falls due ...
    weft_env.advance(timedelta(days=2))
    weft.signal("late", "approval", "late yes")
    handle.resume()  # ... so it wakes after the timeout's time, and the signal is there
    weft_env.drive()
    assert handle.result() == "late yes"
    timer = Timer.objects.get(run_id=handle.run_id)
    assert timer.fired_at >= timer.fire_at
    [text] = outcomes(staff_client, handle.run_id)["Signal wait timeout"]
    assert text.startswith("cleared at "), text


def test_a_wait_timeout_that_fired_and_a_fired_sleep_show_when_they_fired(staff_client, weft_env):
    timed_out = weft.start("test.approval", "nobody", workflow_id="nobody")
    slept = weft.start("test.steps", {"key": "nap", "count": 2, "sleep": 60}, workflow_id="nap")
    weft_env.drive()
    weft_env.advance(timedelta(days=2))
    assert timed_out.result() == "timed out" and slept.status == "completed"
    [text] = outcomes(staff_client, timed_out.run_id)["Signal wait timeout"]
    assert text.startswith("fired at "), text
    [text] = outcomes(staff_client, slept.run_id)["Sleep"]
    assert text.startswith("fired at ") and "cleared" not in text, text


def test_a_retry_backoff_fired(staff_client, weft_env):
    handle = weft.start("test.retry", {"key": "backoff", "failures": 1}, workflow_id="backoff")
    weft_env.drive()
    for _ in range(3):
        weft_env.advance(timedelta(seconds=10))
    assert handle.status == "completed"
    [text] = outcomes(staff_client, handle.run_id)["Retry backoff"]
    assert text.startswith("fired at "), text


def test_an_async_deadline_is_cleared_by_the_completion_and_fires_without_one(staff_client, weft_env):
    answered = weft.start("test.async_deadline", "answered", workflow_id="answered")
    ignored = weft.start("test.async_deadline", "ignored", workflow_id="ignored")
    weft_env.drive()
    weft.complete_async_activity(AsyncActivity.objects.get(run_id=answered.run_id).token, "ok")
    weft_env.drive()
    assert answered.result() == "ok"
    [text] = outcomes(staff_client, answered.run_id)["Async activity timeout"]
    assert text.startswith("cleared at ") and text.endswith("completed or failed first"), text
    weft_env.advance(timedelta(hours=2))
    assert ignored.status == "completed" and str(ignored.result()).startswith("gave up")
    [text] = outcomes(staff_client, ignored.run_id)["Async activity timeout"]
    assert text.startswith("fired at "), text


def test_the_timers_inline_is_one_query(staff_client, weft_env):
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    handle = weft.start("test.approval", "q", workflow_id="q")
    weft_env.drive()
    weft.signal("q", "approval", 1)
    weft_env.drive()
    with CaptureQueriesContext(connection) as captured:
        staff_client.get(run_url(handle.run_id))
    timer_queries = [q["sql"] for q in captured.captured_queries if "weft_timer" in q["sql"].lower()
                     or "django_weft_timer" in q["sql"].lower()]
    assert len(timer_queries) == 1, timer_queries


# --- schedule descriptions ------------------------------------------------------------------------------------


def test_descriptions_are_cron_descriptors(staff_client):
    assert describe_cron("0 9 * * 1-5") == "At 09:00 AM, Monday through Friday"
    assert describe_cron("0 9 * * 1-5") == cron_descriptor.get_description("0 9 * * 1-5")
    assert describe_cron("0 0 L * *") == "At 12:00 AM, on the last day of the month"  # no longer "custom"
    weft.create_schedule("weekdays", "test.collect", 0, cron="0 9 * * 1-5", timezone="UTC")
    weft.create_schedule("often", "test.collect", 0, every=timedelta(seconds=90))
    body = staff_client.get(reverse(SCHEDULES)).content.decode()
    assert "At 09:00 AM, Monday through Friday" in body and "Every 90 seconds" in body


def test_descriptions_follow_the_active_language():
    with translation.override("de"):
        german = describe_cron("0 9 * * 1-5")
    assert german is not None and "09:00" in german and "AM" not in german  # a 24-hour clock
    assert "Montag" in german and "Freitag" in german and "Monday" not in german  # day names translated too
    with translation.override("fr"):
        assert "lundi" in describe_cron("0 9 * * 1-5").lower()
    with translation.override("en-gb"):
        assert describe_cron("0 9 * * 1-5") == "At 09:00 AM, Monday through Friday"
    assert describe_interval(timedelta(seconds=90)) == "Every 90 seconds"


@pytest.mark.parametrize(("language", "locale"), [
    ("en-us", "en_US"), ("de", "de_DE"), ("de-at", "de_DE"), ("fr-ca", "fr_FR"), ("pt-br", "pt_PT"),
    ("zh-hans", "zh_CN"), ("nb", "nb_NO"), ("xx", "en_US"), (None, "en_US"),
])
def test_django_languages_map_to_cron_descriptor_locales(language, locale):
    assert cron_locale(language) == locale


def test_the_schedule_page_describes_in_the_active_language(staff_client):
    schedule = weft.create_schedule("localized", "test.collect", 0, cron="30 18 * * 5", timezone="UTC")
    with translation.override("de"):
        body = staff_client.get(schedule_url(schedule.pk)).content.decode()
    assert "18:30" in body and "Freitag" in body


# --- the stalled-runs banner ---------------------------------------------------------------------------


def test_the_runs_changelist_warns_when_runs_wait_for_an_executor_that_is_not_there(admin_client):
    handle = weft.start("test.collect", 1)
    Workflow.objects.filter(pk=handle.run_id).update(runnable_at=weft_clock.now() - timedelta(minutes=6))
    page = admin_client.get(reverse("admin:django_weft_workflow_changelist")).content.decode()
    assert "pending for over 5 minutes" in page and "is weft_maintenance running?" in page


def test_no_banner_when_nothing_is_overdue(admin_client):
    weft.start("test.collect", 1)
    page = admin_client.get(reverse("admin:django_weft_workflow_changelist"))
    assert "is weft_maintenance running?" not in page.content.decode()
