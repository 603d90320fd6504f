"""Every admin page fits the screen (design 9.5): at 1280, 1440 and 1920 pixels no list, inline or panel hides a
column behind a horizontal scroll and the page itself does not scroll sideways, measured from the DOM in
Chromium with every folded section opened. Each page is photographed at 1280 and 1920 pixels for the docs
(``docs/screenshots/<page>-<width>.png``, refreshed with WEFT_UPDATE_DOCS_SCREENSHOTS=1).

The data is what makes tables wide: long workflow ids and types, child runs, a schedule with a description,
search attributes, signals, updates, branches and attempts retried."""

from __future__ import annotations

import time
from collections.abc import Iterator
from datetime import timedelta

import pytest
from django.contrib.auth import get_user_model
from django.utils import timezone

import django_weft as weft
from django_weft.models import BulkOperation, Executor, ExecutorKind, Schedule, Workflow
from django_weft.services import api_keys
from tests.browser_kit import PASSWORD, ROOT, USERNAME, Browser, browser_marks, chromium, expect, log_in, run_path

__all__ = ["chromium"]  # a fixture, imported for pytest

pytestmark = browser_marks

STYLESHEET = ROOT / "django_weft" / "static" / "django_weft" / "admin.css"
WIDTHS = (1280, 1440, 1920)
PHOTOGRAPHED = (1280, 1920)
LONG_ID = "order-2026-12-05-customer-4f9c1e2a-7d3b-4c11-9e0f-0a1b2c3d4e5f"

# Each table's nearest box that scrolls sideways (a changelist's .results, an inline's fieldset), or the page:
# by how many pixels its content is wider than what it shows. Folded sections are opened first.
MEASURE = """() => {
  document.querySelectorAll('details').forEach(d => { d.open = true; });
  document.querySelectorAll('fieldset.collapsed').forEach(f => f.classList.remove('collapsed'));
  const found = [];
  const root = document.documentElement;
  if (root.scrollWidth > window.innerWidth + 1) found.push(['page', root.scrollWidth - window.innerWidth]);
  for (const table of document.querySelectorAll('table')) {
    if (!table.offsetParent) continue;
    let box = table.parentElement;
    while (box && box !== document.body && !['auto', 'scroll', 'hidden'].includes(getComputedStyle(box).overflowX)) {
      box = box.parentElement;
    }
    const name = table.id || (table.closest('[id]') || {}).id || table.className || 'table';
    if (box && box !== document.body) {
      if (box.scrollWidth > box.clientWidth + 1) found.push([name, box.scrollWidth - box.clientWidth]);
    } else if (table.getBoundingClientRect().right > window.innerWidth + 1) {
      found.push([name, Math.round(table.getBoundingClientRect().right - window.innerWidth)]);
    }
  }
  return found;
}"""


@weft.activity(retry=weft.RetryPolicy(max_attempts=3, initial_backoff=0.01, max_backoff=0.01))
def fit_charge(order: str, fail_before: int) -> dict:
    info = weft.activity_info()
    if info.attempt < fail_before:
        raise ConnectionError(f"payment gateway timed out for {order} (attempt {info.attempt})")
    return {"order": order, "charged": "150.00", "currency": "EUR", "gateway_reference": "ch_" + "9" * 40}


@weft.activity
def fit_pack(order: str, parcel: int) -> str:
    return f"{order}/parcel-{parcel}"


def fit_ship(ctx: weft.Context, order: str, parcel: int) -> str:
    return ctx.run(fit_pack, order, parcel)


@weft.workflow(name="operator.fulfil_customer_order_with_a_long_type_name")
def fulfil(ctx: weft.Context, order: dict) -> dict:
    ctx.set_search_attributes(region="eu-west", amount=order["amount"], labels=["paid", "priority"])
    ctx.set_query_handler("progress", lambda: {"order": order["id"], "stage": "shipping"})
    charged = ctx.run(fit_charge, order["id"], 3)
    parcels = ctx.gather(*(ctx.start_branch(fit_ship, order["id"], n) for n in range(4)))
    ctx.run_child("operator.notify", {"order": order["id"], "parcels": parcels},
                  workflow_id=f"{order['id']}-notify-customer-by-email-and-sms")
    approval = ctx.wait_for_signal("approval", timeout=timedelta(days=3))
    return {"charged": charged, "parcels": parcels, "approval": approval}


@weft.workflow(name="operator.notify")
def notify(ctx: weft.Context, message: dict) -> str:
    return f"notified about {message['order']}"


@weft.workflow(name="operator.fails")
def fails(ctx: weft.Context, order: str) -> None:
    ctx.run(fit_charge, order, 99)


def seed() -> dict[str, str]:
    """The data of every page; returns the paths of the object pages photographed."""
    order = weft.start(fulfil, {"id": LONG_ID, "amount": "150.00"}, workflow_id=LONG_ID, tags=["vip", "eu"])
    for n in range(3):
        weft.start(fulfil, {"id": f"order-{n}", "amount": f"{n}9.90"}, workflow_id=f"order-{n}")
    failed = weft.start(fails, f"{LONG_ID}-refund", workflow_id=f"{LONG_ID}-refund")
    for _ in range(50):  # the retries' backoffs are durable timers of 10 ms
        weft.run_maintenance()
        if order.status == "waiting" and failed.status == "failed":
            break
        time.sleep(0.02)
    assert (order.status, failed.status) == ("waiting", "failed"), order.refresh().error
    weft.signal(order.workflow_id, "note", {"from": "support", "text": "customer called twice about delivery"})
    cart = weft.start("updates.cart", "user-with-a-rather-long-name@example.com", workflow_id="cart-" + "x" * 40)
    weft.run_maintenance()
    cart.start_update("add_item", "A1", update_id="first-item-from-the-mobile-app")
    weft.run_maintenance()
    child = Workflow.objects.get(workflow_id=f"{LONG_ID}-notify-customer-by-email-and-sms")

    schedule = weft.create_schedule(
        "nightly-reconciliation-of-payments-with-the-bank", "operator.notify", {"order": "batch", "parcels": []},
        cron="15 2 * * 1-5", timezone="Europe/Amsterdam", pause_on_failure=True)
    weft.create_schedule("every-five-minutes", "operator.notify", {"order": "tick", "parcels": []},
                         every=timedelta(minutes=5))
    now = timezone.now()
    executor = Executor.objects.create(
        kind=ExecutorKind.LOOP, host="ip-10-0-12-34.eu-west-1.compute.internal", pid=424242, threads=8,
        version="0.1.0", started_at=now - timedelta(hours=3), last_seen=now, expires_at=now + timedelta(seconds=30))
    for n in range(2):
        weft.start("test.collect", 1, workflow_id=f"duplicate-charge-{n}")
    reason = "incident 42: the payment provider double-charged"
    preview = weft.bulk.cancel(reason, dry_run=True, workflow_id_prefix="duplicate-charge-")
    weft.bulk.cancel(reason, confirmation_token=preview.confirmation_token, workflow_id_prefix="duplicate-charge-")
    weft.set_queue_limits("emails", concurrency=3)
    weft.pause_type("operator.notify", "the mail provider is down, see incident 42")
    key, _ = api_keys.create("billing-service-production-readonly",
                             ["django_weft.view_workflow", "django_weft.view_payloads", "django_weft.signal_workflow"])
    return {
        "run-waiting": run_path(order.run_id),
        "run-failed": run_path(failed.run_id),
        "run-child": run_path(child.pk),
        "run-updates": run_path(cart.run_id),
        "schedule": f"/admin/django_weft/schedule/{Schedule.objects.get(schedule_id=schedule.schedule_id).pk}/change/",
        "executor": f"/admin/django_weft/executor/{executor.pk}/change/",
        "bulk-operation": f"/admin/django_weft/bulkoperation/{BulkOperation.objects.get().pk}/change/",
        "api-key": f"/admin/django_weft/apikey/{key.pk}/change/",
        "step-control": run_path(order.run_id, "step-control"),
        "signal-form": run_path(order.run_id, "signal"),
    }


LISTS = {
    "runs-list": "/admin/django_weft/workflow/",
    "schedules-list": "/admin/django_weft/schedule/",
    "executors-list": "/admin/django_weft/executor/",
    "bulk-operations-list": "/admin/django_weft/bulkoperation/",
    "queues-list": "/admin/django_weft/queuestate/",
    "paused-types-list": "/admin/django_weft/pausedtype/",
    "api-keys-list": "/admin/django_weft/apikey/",
}


@pytest.fixture
def seeded(chromium, live_server) -> Iterator[tuple[dict[str, str], dict[int, Browser]]]:
    get_user_model().objects.create_superuser(USERNAME, "fit@example.com", PASSWORD)
    paths = {**LISTS, **seed()}
    contexts, browsers = [], {}
    for width in WIDTHS:
        context, browser = log_in(chromium, str(live_server), f"fit-{width}", USERNAME, PASSWORD, width=width)
        contexts.append(context)
        browsers[width] = browser
    try:
        yield paths, browsers
    finally:
        for context in contexts:
            context.close()


def test_every_admin_page_fits_at_1280_1440_and_1920_pixels(seeded) -> None:
    paths, browsers = seeded
    # The rules of django_weft's stylesheet all take effect: a brace left open swallows the rest silently.
    browsers[1280].goto(paths["runs-list"])
    loaded = browsers[1280].page.evaluate(
        "() => [...document.styleSheets].find(s => (s.href || '').endsWith('django_weft/admin.css')).cssRules.length")
    assert loaded == STYLESHEET.read_text().count("{")
    # The filter sidebar keeps its width whatever its longest choice (the seeded schedule ids are long).
    assert browsers[1280].page.evaluate(
        "() => document.getElementById('changelist-filter').getBoundingClientRect().width") <= 240
    overflowing: list[str] = []
    for width, browser in browsers.items():
        for name, path in paths.items():
            browser.goto(path)
            expect(browser.page.locator("#content")).to_be_visible()
            assert "Server Error" not in browser.page.title(), (name, path)
            if width in PHOTOGRAPHED:
                browser.shot(f"{name}-{width}", docs=True)
            overflowing += [f"{name} at {width} px: {what} by {by} px"
                            for what, by in browser.page.evaluate(MEASURE)]
    assert overflowing == [], "\n".join(overflowing)
