"""End-to-end tests of the admin in a real browser: Debian's Chromium driven by Playwright.

The test project is served by pytest-django's ``live_server`` (a thread of this process, on the test
database), a superuser logs in through the real login form, and every click is checked in the database
afterwards. Skipped when the ``playwright`` package or the Chromium binary is missing (tests/browser_kit.py).

Screenshots go to ``artifacts/screenshots/``. The README's ``docs/images/run-detail.png`` is written when it
is missing, or refreshed with ``WEFT_UPDATE_DOCS_SCREENSHOTS=1``.
"""

from __future__ import annotations

import json
import os
import re

import django_weft as weft
from django_weft.common.codec import decode
from django_weft.models import Schedule, Signal, Workflow
from tests.browser_kit import ROOT, Browser, admin, browser_marks, chromium, expect, run_path

__all__ = ["admin", "chromium"]  # fixtures, imported for pytest

DOCS_SCREENSHOT = ROOT / "docs" / "images" / "run-detail.png"
pytestmark = browser_marks


def parked(workflow: str, input: object, workflow_id: str) -> weft.WorkflowHandle:
    """Start a run and execute it until it waits (the maintenance pass runs here, in the test's thread)."""
    handle = weft.start(workflow, input, workflow_id=workflow_id)
    weft.run_maintenance()
    assert handle.status == "waiting"
    return handle


def test_filter_waiting_runs_and_read_the_timeline(admin: Browser) -> None:
    waiting = parked("test.approval", "e2e-timeline", "e2e-waiting")
    done = weft.start("test.steps", {"key": "e2e-done", "count": 1}, workflow_id="e2e-done")
    weft.run_maintenance()
    assert done.status == "completed"
    page = admin.page

    admin.goto("/admin/django_weft/workflow/")
    results = page.locator("#result_list")
    expect(results).to_contain_text("e2e-done")
    page.locator("#changelist-filter").get_by_role("link", name="Waiting", exact=True).click()
    expect(page).to_have_url(re.compile(r"status__exact=waiting"))
    expect(results).to_contain_text("e2e-waiting")
    expect(results).not_to_contain_text("e2e-done")
    admin.shot("changelist-waiting")

    results.get_by_role("link", name="e2e-waiting").click()
    expect(page).to_have_url(re.compile(re.escape(run_path(waiting.run_id))))
    expect(page.locator("div.field-status_badge")).to_contain_text("Waiting")
    timeline = page.locator(".inline-group").filter(has_text=re.compile("journal", re.IGNORECASE)).first
    rows = timeline.locator("tbody tr.form-row, tbody tr.has_original")
    expect(rows.first).to_be_visible()
    expect(timeline).to_contain_text("tests.testapp.workflows.record")
    expect(timeline).to_contain_text("E2E-TIMELINE:BEFORE")  # the recorded step's result
    admin.shot("detail-waiting")

    # What the page shows is what the journal holds.
    steps = Workflow.objects.get(pk=waiting.run_id).steps.order_by("seq")
    assert steps.count() >= 1 and rows.count() == steps.count()
    for step in steps:
        expect(timeline).to_contain_text(step.name)


def test_send_a_signal_through_the_detail_page(admin: Browser) -> None:
    handle = parked("test.approval", "e2e-signal", "e2e-signal")
    page = admin.page
    admin.goto(run_path(handle.run_id))
    page.locator("a.weft-signal").click()
    expect(page).to_have_url(re.compile(re.escape(run_path(handle.run_id, "signal"))))
    page.fill("#id_name", "approval")
    page.fill("#id_payload", json.dumps({"approved": True, "by": "browser"}))
    page.fill("#id_signal_id", "e2e-sig-1")
    admin.shot("signal-form")
    page.get_by_role("button", name="Send signal").click()

    expect(page).to_have_url(re.compile(re.escape(run_path(handle.run_id)) + "$"))
    assert "Signal 'approval' delivered." in admin.messages()
    signal = Signal.objects.get(run_id=handle.run_id)
    assert (signal.name, signal.signal_id, decode(signal.payload)) == (
        "approval", "e2e-sig-1", {"approved": True, "by": "browser"})
    expect(page.locator(".inline-group").filter(has_text="e2e-sig-1")).to_be_visible()  # the signals inline

    weft.run_maintenance()
    assert handle.status == "completed"
    assert handle.result() == {"approved": True, "by": "browser"}
    page.reload()
    expect(page.locator("div.field-status_badge")).to_contain_text("Completed")
    expect(page.locator("a.weft-signal")).to_have_count(0)  # a finished run takes no signal
    expect(page.locator("body")).to_contain_text("E2E-SIGNAL:AFTER")
    admin.shot("detail-completed", full_page=True)
    if not DOCS_SCREENSHOT.exists() or os.environ.get("WEFT_UPDATE_DOCS_SCREENSHOTS") == "1":
        DOCS_SCREENSHOT.parent.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(DOCS_SCREENSHOT), full_page=True)


def test_cancel_runs_through_the_confirmation_page(admin: Browser) -> None:
    by_action = parked("test.collect", 1, "e2e-cancel-action")
    by_button = parked("test.collect", 1, "e2e-cancel-button")
    bystander = parked("test.collect", 1, "e2e-keep")
    page = admin.page

    # The changelist action: tick the run, choose the action, confirm.
    admin.goto("/admin/django_weft/workflow/")
    row = page.locator("#result_list tbody tr").filter(has_text="e2e-cancel-action")
    row.locator("input.action-select").check()
    page.select_option("select[name=action]", "cancel_selected")
    page.locator("button[name=index]").click()  # "Go"
    expect(page.locator(".weft-confirm-list")).to_contain_text("e2e-cancel-action")
    assert by_action.status == "waiting"  # nothing happens before the confirmation
    admin.shot("cancel-confirmation")
    admin.confirm("Cancel")
    assert "1 workflow run cancelled." in admin.messages()
    assert by_action.cancel_requested  # a request: the run's code sees it when it is next driven
    weft.run_maintenance()
    assert by_action.status == "cancelled"

    # The detail page's button, then the same confirmation page.
    admin.goto(run_path(by_button.run_id))
    page.locator("a.weft-cancel").click()
    admin.confirm("Cancel")
    expect(page.locator("div.field-cancel_requested_at")).not_to_contain_text("-")
    weft.run_maintenance()
    admin.goto(run_path(by_button.run_id))
    expect(page.locator("div.field-status_badge")).to_contain_text("Cancelled")
    admin.shot("cancelled-detail")
    assert by_button.status == "cancelled"
    assert "admin" in Workflow.objects.get(pk=by_button.run_id).error["message"]
    assert bystander.status == "waiting"


def test_pause_and_trigger_a_schedule(admin: Browser) -> None:
    schedule = weft.create_schedule("e2e-sched", "test.collect", 1, cron="0 0 1 1 *", timezone="UTC")
    other = weft.create_schedule("e2e-sched-other", "test.collect", 1, cron="0 0 1 1 *", timezone="UTC")
    page = admin.page
    assert not Workflow.objects.filter(schedule=schedule).exists()

    # Trigger from the detail page's button.
    admin.goto(f"/admin/django_weft/schedule/{schedule.pk}/change/")
    page.locator("a.weft-trigger").click()
    admin.confirm("Trigger now")
    assert "started run" in admin.messages()
    run = Workflow.objects.get(schedule=schedule)
    assert run.workflow_type == "test.collect" and str(run.pk) in admin.messages()
    admin.shot("schedule-triggered")

    # Pause through the changelist action.
    admin.goto("/admin/django_weft/schedule/")
    page.locator("#result_list tbody tr").filter(has_text="e2e-sched").filter(
        has_not_text="e2e-sched-other").locator("input.action-select").check()
    page.select_option("select[name=action]", "pause_selected")
    page.locator("button[name=index]").click()  # "Go"
    admin.confirm("Pause")
    assert "1 schedule paused." in admin.messages()
    assert Schedule.objects.get(pk=schedule.pk).status == "paused"
    assert Schedule.objects.get(pk=other.pk).status == "active"
    expect(page.locator("#result_list tbody tr").filter(has_text="e2e-sched").first).to_contain_text("Paused")
    admin.shot("schedule-paused")


def test_markup_in_an_input_is_shown_as_text(admin: Browser) -> None:
    markup = "<script>alert(1)</script>"
    handle = weft.start("test.steps", {"key": markup, "count": 1}, workflow_id="e2e-xss")
    weft.run_maintenance()
    assert handle.status == "completed"
    page = admin.page

    admin.goto(run_path(handle.run_id))
    expect(page.locator(".field-input_pretty")).to_contain_text(markup)
    expect(page.locator(".inline-group").first).to_contain_text(markup.upper())  # the step's result
    page.wait_for_load_state("load")
    scripts = page.evaluate("() => [...document.scripts].filter(s => s.textContent.includes('alert(')).length")
    assert scripts == 0
    assert page.locator("pre script, td script, .readonly script").count() == 0
    assert admin.dialogs == []
    admin.shot("markup-as-text")


def test_query_a_run_and_send_it_an_update(admin: Browser) -> None:
    handle = parked("updates.cart", "e2e-cart", "e2e-cart")
    page = admin.page
    admin.goto(run_path(handle.run_id))
    panel = page.locator("#weft-queries")
    expect(panel.locator("tr[data-query=items]")).to_be_visible()
    expect(panel).to_contain_text("add_item")

    # The panel's own GET form, not the page's POST form: the answer shows on the run's page.
    panel.get_by_role("button", name="Ask").click()
    expect(page).to_have_url(re.compile(r"weft_query=items.*#weft-queries$"))
    expect(panel.locator("pre.weft-query-answer")).to_have_text("[]")

    page.locator("a.weft-update").click()
    expect(page).to_have_url(re.compile(re.escape(run_path(handle.run_id, "update"))))
    page.fill("#id_name", "add_item")
    page.fill("#id_payload", json.dumps("A1"))
    page.fill("#id_update_id", "e2e-upd-1")
    admin.shot("update-form")
    page.get_by_role("button", name="Send update").click()
    expect(page).to_have_url(re.compile(re.escape(run_path(handle.run_id)) + "$"))
    assert "Update 'add_item' accepted with id 'e2e-upd-1'" in admin.messages()
    updates = page.locator(".inline-group").filter(has_text="e2e-upd-1")
    expect(updates).to_contain_text("Pending")

    weft.run_maintenance()  # the run applies it
    page.reload()
    expect(updates).to_contain_text("Completed")
    page.locator("#weft-queries").get_by_role("button", name="Ask").click()
    expect(page.locator("pre.weft-query-answer")).to_have_text(json.dumps(["A1"], indent=2))
    admin.shot("query-answered")
    assert handle.status == "waiting"
