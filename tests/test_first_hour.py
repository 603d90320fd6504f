"""A Django developer's first hour: a checkout workflow with a retried charge, a sleep, a signal wait
with a timeout, an async approval completed with its token and a nightly schedule, tested with the
public testing API alone (``weft_env.advance``, ``advance_until_idle``, ``mock_activity``,
``handle.result()``); plus the hints that hour needs: warnings for retries in ``weft_maintenance``'s
output, ``start_or_signal``'s ``delivered``, and types a checker can use."""

from __future__ import annotations

import datetime as dt
import importlib.util
import logging
import os
import re
import subprocess
import sys
from datetime import timedelta

import pytest
from django.core.mail import send_mail

import django_weft as weft
from django_weft.testing import StillWaiting
from tests.procs import REPO_ROOT, run_once

pytestmark = pytest.mark.django_db


class PaymentProviderDown(Exception):
    pass


# --- the code under test: what the developer wrote in shop/workflows.py ---------------------------------

@weft.activity(retry=weft.RetryPolicy(max_attempts=5, initial_backoff=2, backoff_multiplier=3,
                                      non_retryable=(ValueError,)), timeout=30)
def charge_card(order_id: int) -> str:
    raise AssertionError("tests mock the payment provider")


@weft.activity(schedule_to_close_timeout=timedelta(days=3))
def ask_for_approval(order_id: int) -> dict:
    token = weft.activity_info().task_token
    send_mail(f"Approve order {order_id}", f"https://shop.example/approve?token={token}", "shop@example.com",
              ["ops@example.com"])
    weft.complete_async()


@weft.workflow(name="first_hour.checkout")
def checkout(ctx: weft.Context, order_id: int) -> dict:
    charge = ctx.run(charge_card, order_id)
    ctx.sleep(timedelta(minutes=5))
    try:
        decision = ctx.wait_for_signal("approval", timeout=timedelta(days=2))
    except weft.WaitTimeout:
        decision = {"approved": False, "why": "no answer"}
    decided_at = ctx.now()
    approval = ctx.run(ask_for_approval, order_id)
    return {"charge": charge, "decision": decision, "decided_at": decided_at, "approval": approval}


def token_in(mail: object) -> str:
    return re.search(r"token=(\S+)", mail.body).group(1)  # type: ignore[attr-defined, union-attr]


def at(moment: dt.datetime) -> str:
    """How wait reasons write a moment, as a pattern."""
    return re.escape(moment.isoformat())


@pytest.fixture
def payments(weft_env):
    """The payment provider fails twice, then charges."""
    return weft_env.mock_activity(charge_card, side_effect=[PaymentProviderDown("503"), PaymentProviderDown("503"),
                                                            "ch_42"])


# --- the tests the developer writes -----------------------------------------------------------------

def test_checkout_approved_by_signal_and_by_the_approver(weft_env, payments, mailoutbox):
    t0 = weft_env.now()
    handle = weft.start(checkout, 42, workflow_id="order-42")
    weft_env.advance(timedelta(seconds=8))  # attempts at 0 s, 2 s (backoff 2 s) and 8 s (backoff 6 s)
    assert payments.attempts == [1, 2, 3]
    payments.assert_called_with(42)
    with pytest.raises(StillWaiting, match="waiting: sleeping until " + at(t0 + timedelta(minutes=5, seconds=8))):
        handle.result()

    weft_env.advance(timedelta(minutes=5))
    with pytest.raises(StillWaiting, match="waiting for signal approval until "
                                           + at(t0 + timedelta(days=2, minutes=5, seconds=8))):
        handle.result()

    weft_env.advance(timedelta(hours=3))
    weft.signal("order-42", "approval", {"approved": True})
    with pytest.raises(StillWaiting, match=r"waiting for async activity tests\.test_first_hour\.ask_for_approval"):
        handle.result()
    [mail] = mailoutbox
    weft.complete_async_activity(token_in(mail), {"approver": "ops"})
    assert handle.result() == {"charge": "ch_42", "decision": {"approved": True},
                               "decided_at": t0 + timedelta(hours=3, minutes=5, seconds=8),
                               "approval": {"approver": "ops"}}


def test_checkout_when_nobody_answers_the_signal_in_two_days(weft_env, payments, mailoutbox):
    t0 = weft_env.now()
    handle = weft.start(checkout, 42)
    weft_env.advance(timedelta(days=3))
    [mail] = mailoutbox  # sent when the wait timed out, two days after the sleep
    weft.complete_async_activity(token_in(mail), {"approver": "ops"})
    result = handle.result()
    assert result["decision"] == {"approved": False, "why": "no answer"}
    assert result["decided_at"] == t0 + timedelta(days=2, minutes=5, seconds=8)


def test_checkout_when_nobody_answers_at_all(weft_env, payments):
    t0 = weft_env.now()
    handle = weft.start(checkout, 42)
    weft_env.advance_until_idle()  # the wait times out, then the approval's three days run out
    with pytest.raises(weft.WorkflowFailed, match="not completed within its 259200s schedule_to_close_timeout"):
        handle.result()
    assert weft_env.now() == t0 + timedelta(days=5, minutes=5, seconds=8), "the clock stops at the last timer"


def test_a_declined_card_fails_the_checkout_at_once(weft_env):
    payments = weft_env.mock_activity(charge_card, side_effect=ValueError("card declined"))
    handle = weft.start(checkout, 7)
    with pytest.raises(weft.WorkflowFailed, match="card declined"):
        handle.result()
    assert payments.attempts == [1]


def test_the_nightly_schedule_fires_the_checkout_at_three(weft_env, payments, mailoutbox):
    t0 = weft_env.now()
    three = t0.astimezone(dt.UTC).replace(hour=3, minute=0, second=0, microsecond=0)
    three += timedelta(days=1) if three <= t0 else timedelta(0)
    schedule = weft.create_schedule("nightly-checkout", checkout, 99, cron="0 3 * * *", timezone="UTC")
    weft_env.advance(timedelta(days=1))  # the clock passes 03:00 once
    schedule.refresh_from_db()
    run = schedule.current_run
    assert run is not None and run.scheduled_for == three
    assert run.started_at == three and schedule.missed_fire_count == 0, "on time, not missed"
    assert payments.attempts == [1, 2, 3] and payments.calls[0].args == (99,)
    handle = weft.get_handle(run.workflow_id)
    weft.signal(run.workflow_id, "approval", {"approved": True})
    with pytest.raises(StillWaiting, match="waiting for async activity"):
        handle.result()  # the approval mail goes out
    weft.complete_async_activity(token_in(mailoutbox[0]), {"approver": "night shift"})
    assert handle.result()["approval"] == {"approver": "night shift"}


# --- weft_maintenance says what failed, in Django's default logging setup --------------------------

def test_failed_attempts_log_warnings_and_failed_runs_log_errors(weft_env, caplog):
    weft_env.mock_activity(charge_card, side_effect=[PaymentProviderDown("503 from the provider"),
                                                     ValueError("card declined")])
    retry_at = (weft_env.now() + timedelta(seconds=2)).isoformat(timespec="seconds")
    handle = weft.start(checkout, 5)
    with caplog.at_level(logging.WARNING, logger="django_weft"):
        weft_env.advance(timedelta(seconds=2))
    with pytest.raises(weft.WorkflowFailed):
        handle.result()
    records = [(r.levelname, r.getMessage()) for r in caplog.records if r.name.startswith("django_weft")]
    assert records == [
        ("WARNING", f"run {handle.run_id} of first_hour.checkout: activity tests.test_first_hour.charge_card "
                    "attempt 1 of 5 failed: tests.test_first_hour.PaymentProviderDown: 503 from the provider; "
                    f"retrying at {retry_at}"),
        ("WARNING", f"run {handle.run_id} of first_hour.checkout: activity tests.test_first_hour.charge_card "
                    "attempt 2 of 5 failed: ValueError: card declined; giving up: ActivityError is raised in the "
                    "workflow"),
        ("ERROR", f"run {handle.run_id} of first_hour.checkout failed: django_weft.exceptions.ActivityError: "
                  "activity 'tests.test_first_hour.charge_card' failed after 2 attempt(s): ValueError: card declined"),
    ]


@pytest.mark.django_db(transaction=True)  # the weft_maintenance process must see the runs
def test_weft_maintenance_prints_retries_and_failures_without_any_logging_setup(tmp_path):
    """No LOGGING setting at all: Python's last-resort handler prints WARNING and above to stderr."""
    (tmp_path / "default_logging_settings.py").write_text("from tests.settings import *  # noqa: F403\n"
                                                          "del LOGGING  # noqa: F821\n")
    retried = weft.start("test.retry", {"key": "log-retry", "failures": 1})  # tests/testapp/workflows.py
    failed = weft.start("test.uncaught", "log-fail")
    proc = run_once("maintenance", tmp_path, DJANGO_SETTINGS_MODULE="default_logging_settings",
                    PYTHONPATH=str(tmp_path))
    stderr = proc.stderr()
    assert re.search(rf"run {retried.run_id} of test\.retry: activity tests\.testapp\.workflows\.flaky attempt 1 "
                     r"of 3 failed: tests\.testapp\.workflows\.Flaky: failure 1 of log-retry; retrying at \S+", stderr)
    assert (f"run {failed.run_id} of test.uncaught: activity tests.testapp.workflows.refuses attempt 1 of 5 failed: "
            "ValueError: bad value for log-fail; giving up") in stderr
    assert (f"run {failed.run_id} of test.uncaught failed: django_weft.exceptions.ActivityError: activity "
            "'tests.testapp.workflows.refuses' failed after 1 attempt(s): ValueError: bad value for log-fail") in stderr


# --- start_or_signal tells a duplicate signal apart ----------------------------------------------------

def test_start_or_signal_says_whether_the_signal_was_delivered(weft_env):
    first = weft.start_or_signal(checkout, 1, signal="approval", payload={"approved": True}, workflow_id="order-1",
                                 signal_id="mail-1")
    again = weft.start_or_signal(checkout, 1, signal="approval", payload={"approved": True}, workflow_id="order-1",
                                 signal_id="mail-1")
    other = weft.start_or_signal(checkout, 1, signal="approval", payload={"approved": False}, workflow_id="order-1",
                                 signal_id="mail-2")
    assert (first.outcome, first.delivered) == ("started", True)
    assert (again.outcome, again.delivered) == ("signalled", False)
    assert (other.outcome, other.delivered) == ("signalled", True)
    handle, outcome = again  # still a (handle, outcome) pair
    assert (handle, outcome) == (first.handle, "signalled")
    assert "delivered=False" in repr(again)


# --- types: a user's mypy catches a wrong argument to ctx.run ------------------------------------------

@pytest.mark.skipif(importlib.util.find_spec("mypy") is None, reason="mypy is not installed")
def test_mypy_sees_the_activity_types_through_ctx_run(tmp_path):
    source = REPO_ROOT / "tests" / "typing_check.py"
    completed = subprocess.run(
        [sys.executable, "-m", "mypy", "--cache-dir", str(tmp_path / "cache"), "--no-error-summary",
         "--hide-error-context", str(source.relative_to(REPO_ROOT))],
        cwd=REPO_ROOT, capture_output=True, text=True, timeout=300,
        env={**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO_ROOT), str(REPO_ROOT / "testproject")])},
    )
    reported = {"error": {}, "note": {}}
    for line in completed.stdout.splitlines():
        found = re.match(r"tests/typing_check\.py:(\d+): (error|note): (.*)", line)
        if found:
            reported[found[2]].setdefault(int(found[1]), []).append(found[3])
    expected = {"error": {}, "note": {}}
    for number, line in enumerate(source.read_text().splitlines(), start=1):
        marker = re.search(r"# ([EN]): (.*)$", line)
        if marker:
            expected["error" if marker[1] == "E" else "note"][number] = marker[2]
    assert expected["error"] and expected["note"], "typing_check.py lost its markers"
    problems = [f"line {n}: expected {kind} containing {text!r}, mypy said {reported[kind].get(n)}"
                for kind in ("error", "note") for n, text in expected[kind].items()
                if not any(text in said for said in reported[kind].get(n, []))]
    problems += [f"line {n}: unexpected error {said}" for n, said in reported["error"].items()
                 if n not in expected["error"]]
    assert not problems, "\n".join(problems) + f"\n--- mypy output:\n{completed.stdout}{completed.stderr}"
