"""django_weft.testing, the way a user tests workflows: time skipping (advance, advance_until_idle),
handle.result() that never hangs, activity mocks, and both pytest-django database fixtures."""

from __future__ import annotations

import datetime as dt
import signal
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta

import pytest

import django_weft as weft
from django_weft.models import ScheduleOccurrence, WorkflowStep
from django_weft.testing import NotIdle, StillWaiting, WeftTestEnv
from tests.testapp.models import Execution

pytestmark = pytest.mark.django_db

T0 = dt.datetime(2030, 1, 1, 10, 0, tzinfo=dt.UTC)


class Declined(Exception):
    pass


# Bodies that must never run in these tests: every test mocks them.
@weft.activity(retry=weft.RetryPolicy(max_attempts=5, initial_backoff=1, backoff_multiplier=2))
def charge(order_id: int) -> str:
    raise AssertionError("the real charge ran: the mock was not applied")


@weft.activity(retry=weft.RetryPolicy(max_attempts=3, non_retryable=(ValueError,)))
def reserve(sku: str, *, quantity: int = 1) -> str:
    return f"reserved {quantity} x {sku}"


@weft.activity(timeout=30, retry=weft.RetryPolicy(max_attempts=1))
def count_orders(key: str) -> int:
    """Reads rows the test wrote and writes one: it must see the test's transaction (``db``) or its commits."""
    Execution.objects.create(key=f"{key}:counted", pid=0)
    return Execution.objects.filter(key=key).count()


@weft.activity(retry=weft.RetryPolicy(max_attempts=2, initial_backoff=5), timeout=0.2)
def dawdle(seconds: float) -> str:
    time.sleep(seconds)
    return "done"


@weft.workflow(name="env.charge")
def charge_workflow(ctx: weft.Context, order_id: int) -> dict:
    return {"charge": ctx.run(charge, order_id), "at": ctx.now()}


@weft.workflow(name="env.sleeper")
def sleeper(ctx: weft.Context, spec: dict) -> str:
    ctx.sleep(spec["seconds"])
    ctx.run(reserve, spec["name"])
    return spec["name"]


@weft.workflow(name="env.wait")
def wait_workflow(ctx: weft.Context, timeout: float | None) -> dict:
    try:
        payload = ctx.wait_for_signal("go", timeout=timeout)
    except weft.WaitTimeout:
        payload = "timed out"
    return {"payload": payload, "at": ctx.now()}


@weft.workflow(name="env.forever")
def forever(ctx: weft.Context) -> None:
    while True:
        ctx.sleep(60)


@weft.workflow(name="env.reserve")
def reserve_workflow(ctx: weft.Context, spec: dict) -> str:
    return ctx.run(reserve, spec["sku"], quantity=spec.get("quantity", 1))


@weft.workflow(name="env.bad_call")
def bad_call(ctx: weft.Context) -> str:
    return ctx.run(reserve, "A1", colour="red")  # type: ignore[call-arg]


@weft.workflow(name="env.count")
def count_workflow(ctx: weft.Context, key: str) -> int:
    return ctx.run(count_orders, key)


@weft.workflow(name="env.dawdle")
def dawdle_workflow(ctx: weft.Context, seconds: float) -> str:
    return ctx.run(dawdle, seconds)


@pytest.fixture
def env() -> Iterator[WeftTestEnv]:
    with WeftTestEnv(start=T0) as env:
        yield env


@contextmanager
def no_hang(seconds: float = 10) -> Iterator[None]:
    """Fail (instead of blocking the test run) if the block takes longer than ``seconds``."""

    def hung(signum: int, frame: object) -> None:
        raise AssertionError(f"still blocked after {seconds}s")

    previous = signal.signal(signal.SIGALRM, hung)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


# --- advance(): every timer within the step fires, in time order -----------------------------------------

def test_a_retry_backoff_created_while_driving_fires_within_the_same_advance(env):
    times: list[dt.datetime] = []
    attempts = iter([Declined("first"), Declined("second"), "ch_1"])

    def flaky(order_id: int) -> str:
        times.append(env.now())
        outcome = next(attempts)
        if isinstance(outcome, Exception):
            raise outcome
        return outcome

    env.mock_activity(charge, side_effect=flaky)
    handle = weft.start("env.charge", 7)
    env.advance(timedelta(seconds=10))
    # Backoffs of 1 s then 2 s: the attempts ran at 0, 1 and 3 seconds, not all at 10.
    assert times == [T0, T0 + timedelta(seconds=1), T0 + timedelta(seconds=3)]
    assert handle.result() == {"charge": "ch_1", "at": T0 + timedelta(seconds=3)}
    assert env.now() == T0 + timedelta(seconds=10)


def test_timers_of_several_runs_fire_in_time_order_with_runs_driven_between(env):
    order: list[tuple[str, dt.datetime]] = []
    env.mock_activity(reserve, side_effect=lambda name: order.append((name, env.now())) or name)
    for name, seconds in (("late", 300), ("early", 30), ("middle", 120)):
        weft.start("env.sleeper", {"name": name, "seconds": seconds})
    env.advance(timedelta(minutes=10))
    assert order == [("early", T0 + timedelta(seconds=30)), ("middle", T0 + timedelta(seconds=120)),
                     ("late", T0 + timedelta(seconds=300))]


def test_a_signal_wait_timeout_fires_at_its_time_not_at_the_end_of_the_step(env):
    handle = weft.start("env.wait", 3600)
    env.advance(timedelta(days=3))
    assert handle.result() == {"payload": "timed out", "at": T0 + timedelta(hours=1)}


def test_a_delayed_start_then_a_sleep_both_fire_within_one_advance(env):
    env.mock_activity(reserve, return_value="ok")
    handle = weft.start("env.sleeper", {"name": "d", "seconds": 3600}, start_after=timedelta(hours=1))
    env.advance(timedelta(hours=3))
    assert handle.result() == "d"
    run = handle.refresh()
    assert run.started_at == T0 + timedelta(hours=1)
    assert run.finished_at == T0 + timedelta(hours=2)


def test_an_execution_timeout_ends_the_run_at_its_deadline(env):
    handle = weft.start("env.wait", None, execution_timeout=timedelta(hours=2))
    env.advance(timedelta(hours=5))
    run = handle.refresh()
    assert run.status == "timed_out" and run.finished_at == T0 + timedelta(hours=2)
    with pytest.raises(weft.WorkflowTimedOut):
        handle.result()


def test_stepping_past_cron_occurrences_fires_each_instead_of_counting_them_missed(env):
    env.mock_activity(reserve, return_value="ok")
    schedule = weft.create_schedule("every-5", "env.sleeper", {"name": "s", "seconds": 1}, cron="*/5 * * * *",
                                    timezone="UTC", overlap="allow_all")
    env.advance(timedelta(hours=1, seconds=1))  # the last run, started at 11:00, sleeps a second
    runs = list(schedule.runs.order_by("scheduled_for"))
    assert [run.scheduled_for for run in runs] == [T0 + timedelta(minutes=5 * i) for i in range(1, 13)]
    assert all(run.status == "completed" for run in runs)
    assert [run.started_at for run in runs] == [run.scheduled_for for run in runs], "each started on time"
    schedule.refresh_from_db()
    assert schedule.missed_fire_count == 0
    assert set(ScheduleOccurrence.objects.filter(schedule=schedule).values_list("outcome", flat=True)) == {"started"}


def test_the_clock_ends_exactly_at_now_plus_delta(env):
    weft.start("env.wait", 10)
    env.advance(timedelta(seconds=7.5))
    assert env.now() == T0 + timedelta(seconds=7.5)
    env.advance(5)  # seconds, across the timeout at 10 s
    assert env.now() == T0 + timedelta(seconds=12.5)
    with pytest.raises(ValueError, match="forward"):
        env.advance(timedelta(seconds=-1))


def test_advance_runs_what_is_runnable_now_before_moving_the_clock(env):
    handle = weft.start("env.charge", 1)
    env.mock_activity(charge, return_value="ch")
    env.advance(timedelta(hours=1))
    assert handle.result()["at"] == T0


def test_advance_is_bounded_and_says_what_keeps_it_busy(env):
    weft.create_schedule("busy", "env.wait", 0, every=timedelta(seconds=1), overlap="allow_all")
    with pytest.raises(NotIdle, match=r"visited 20 moments(.|\n)*schedule 'busy'"):
        env.advance(timedelta(hours=1), max_steps=20)


def test_drive_does_not_move_the_clock(env):
    handle = weft.start("env.wait", 60)
    report = env.drive()
    assert report.claimed == 1 and env.now() == T0
    assert handle.status == "waiting"


# --- advance_until_idle() ----------------------------------------------------------------------------

def test_advance_until_idle_skips_from_timer_to_timer_until_none_is_left(env):
    env.mock_activity(reserve, return_value="ok")
    first = weft.start("env.sleeper", {"name": "a", "seconds": 3600})
    second = weft.start("env.sleeper", {"name": "b", "seconds": timedelta(days=6).total_seconds()})
    env.advance_until_idle()
    assert (first.result(), second.result()) == ("a", "b")
    assert env.now() == T0 + timedelta(days=6), "the clock stops at the last timer"


def test_retention_applies_as_time_passes(env):
    env.mock_activity(reserve, return_value="ok")
    early = weft.start("env.sleeper", {"name": "a", "seconds": 1})
    weft.start("env.sleeper", {"name": "b", "seconds": timedelta(days=8).total_seconds()})
    env.advance_until_idle()
    with pytest.raises(weft.WorkflowNotFound, match="retention"):  # completed runs are kept 7 days
        early.result()


def test_advance_until_idle_leaves_runs_that_wait_for_the_outside_world(env):
    handle = weft.start("env.wait", None)
    env.advance_until_idle()
    assert env.now() == T0 and handle.status == "waiting"
    weft.signal(handle.workflow_id, "go", "now")
    assert handle.result() == {"payload": "now", "at": T0}


def test_advance_until_idle_gives_up_after_its_limit_naming_what_is_pending(env):
    handle = weft.start("env.forever")
    pattern = rf"skipped to the next timer 5 times(.|\n)*run {handle.run_id} of .*sleeping until"
    with pytest.raises(NotIdle, match=pattern):
        env.advance_until_idle(limit=5)
    assert env.now() == T0 + timedelta(minutes=5)


def test_advance_until_idle_stops_at_max_duration(env):
    weft.start("env.sleeper", {"name": "far", "seconds": timedelta(days=400).total_seconds()})
    with pytest.raises(NotIdle, match="past max_duration"):
        env.advance_until_idle(max_duration=timedelta(days=365))
    assert env.now() == T0


def test_a_schedule_alone_does_not_keep_advance_until_idle_going(env):
    schedule = weft.create_schedule("nightly", "env.wait", 0, cron="0 3 * * *", timezone="UTC")
    env.advance_until_idle()
    assert env.now() == T0 and not schedule.runs.exists()


# --- handle.result() never hangs ----------------------------------------------------------------------------

def test_result_of_a_run_waiting_out_a_retry_raises_at_once_saying_so(env):
    env.mock_activity(charge, side_effect=Declined("card declined"))
    handle = weft.start("env.charge", 3)
    env.advance(timedelta(seconds=1))  # attempt 2 fails too: attempt 3 is due 2 s later
    with no_hang(), pytest.raises(StillWaiting) as caught:
        handle.result()
    message = str(caught.value)
    assert "waiting: retrying tests.test_testing_env.charge (attempt 3) at 2030-01-01T10:00:03" in message
    assert "weft_env.advance" in message
    assert isinstance(caught.value, TimeoutError)


def test_result_drives_the_run_first(env):
    env.mock_activity(reserve, return_value="r")
    handle = weft.start("env.reserve", {"sku": "A1"})
    with no_hang():
        assert handle.result() == "r"


def test_result_of_a_run_waiting_for_a_signal_names_the_signal(env):
    handle = weft.start("env.wait", None)
    with no_hang(), pytest.raises(StillWaiting, match="waiting: waiting for signal go"):
        handle.result()


def test_result_of_a_delayed_run_says_when_it_starts(env):
    handle = weft.start("env.wait", None, start_at=T0 + timedelta(days=1))
    with no_hang(), pytest.raises(StillWaiting, match="pending: starts at 2030-01-02T10:00:00"):
        handle.result()


@pytest.mark.django_db(transaction=True)  # the other thread, on its own connection, must see the run
def test_result_in_another_thread_is_not_driven_by_the_env(weft_env):
    """The environment drives in the thread that entered it; elsewhere result() waits as usual."""
    handle = weft.start("env.wait", None)
    outcome: list[object] = []

    def wait() -> None:
        try:
            outcome.append(handle.result(timeout=0.2))
        except BaseException as exc:
            outcome.append(exc)
        finally:
            from django.db import connection

            connection.close()

    thread = threading.Thread(target=wait)
    thread.start()
    thread.join(10)
    assert len(outcome) == 1 and type(outcome[0]) is TimeoutError


def test_the_env_removes_its_result_hook_on_exit():
    with WeftTestEnv(start=T0):
        handle = weft.start("env.wait", None)
    with no_hang(5), pytest.raises(TimeoutError) as caught:
        handle.result(timeout=0.1)
    assert not isinstance(caught.value, StillWaiting)


def test_result_with_a_timeout_names_the_wait_and_a_stalled_engine(env):
    handle = weft.start("env.wait", None, start_at=T0 - timedelta(minutes=10))  # due ten minutes ago
    with pytest.raises(TimeoutError) as caught:
        handle.result(timeout=0)
    assert "is still pending" in str(caught.value)
    assert "1 run pending for over 5 minutes and no live executor; is weft_maintenance running?" in str(caught.value)
    env.drive()
    with pytest.raises(TimeoutError, match=r"still waiting \(waiting for signal go\)$"):
        handle.result(timeout=0)


# --- mocks -----------------------------------------------------------------------------------------

def test_a_mock_returns_its_value_and_the_journal_records_it(env):
    mock = env.mock_activity(reserve, return_value="mocked")
    handle = weft.start("env.reserve", {"sku": "A1", "quantity": 2})
    assert handle.result() == "mocked"
    mock.assert_called_once_with("A1", quantity=2)
    [call] = mock.calls
    assert (call.args, call.kwargs, call.attempt, call.workflow_id, call.seq) == (
        ("A1",), {"quantity": 2}, 1, handle.workflow_id, 1)
    step = WorkflowStep.objects.get(run_id=handle.run_id)
    assert (step.status, step.attempt) == ("completed", 1)


def test_a_side_effect_list_is_one_outcome_per_attempt_through_the_retry_policy(env):
    mock = env.mock_activity(charge, side_effect=[Declined("one"), Declined("two"), "ch_3"])
    handle = weft.start("env.charge", 9)
    env.advance_until_idle()
    assert handle.result()["charge"] == "ch_3"
    assert mock.attempts == [1, 2, 3] and mock.call_count == 3
    assert [c.args for c in mock.calls] == [(9,)] * 3
    step = WorkflowStep.objects.get(run_id=handle.run_id, kind="activity")
    assert step.attempt == 3


def test_a_side_effect_exception_fails_the_attempts_like_the_real_one(env):
    mock = env.mock_activity(reserve, side_effect=ValueError)  # non-retryable for reserve
    handle = weft.start("env.reserve", {"sku": "B2"})
    with pytest.raises(weft.WorkflowFailed, match="ValueError"):
        handle.result()
    assert mock.attempts == [1]
    mock.side_effect = KeyError("B2")  # retryable: three attempts
    handle = weft.start("env.reserve", {"sku": "B2"})
    env.advance_until_idle()
    with pytest.raises(weft.WorkflowFailed, match="after 3 attempt"):
        handle.result()
    assert mock.attempts == [1, 1, 2, 3]


def test_a_side_effect_function_gets_the_arguments_and_the_activity_info(env):
    seen = []
    env.mock_activity(reserve,
                      side_effect=lambda sku, quantity=1: seen.append(weft.activity_info().seq) or sku * quantity)
    assert weft.start("env.reserve", {"sku": "ab", "quantity": 3}).result() == "ababab"
    assert seen == [1]


def test_a_mock_is_specced_like_the_activity(env):
    env.mock_activity(reserve, return_value="x")
    assert weft.start("env.reserve", {"sku": "A1", "quantity": 1}).result() == "x"
    handle = weft.start("env.bad_call")
    env.advance_until_idle()
    with pytest.raises(weft.WorkflowFailed, match="unexpected keyword argument 'colour'"):
        handle.result()


def test_running_out_of_side_effect_values_says_so(env):
    env.mock_activity(reserve, side_effect=["only one"])
    assert weft.start("env.reserve", {"sku": "a"}).result() == "only one"
    handle = weft.start("env.reserve", {"sku": "b"})
    env.advance_until_idle()
    with pytest.raises(weft.WorkflowFailed, match="called 4 times, more often than its side_effect has values"):
        handle.result()


def test_mocks_are_undone_by_stop_by_with_and_when_the_env_exits(env):
    mock = env.mock_activity(reserve, return_value="mocked")
    assert weft.start("env.reserve", {"sku": "s"}).result() == "mocked"
    mock.stop()
    assert weft.start("env.reserve", {"sku": "s"}).result() == "reserved 1 x s"
    with env.mock_activity(reserve, return_value="inner") as inner:
        assert weft.start("env.reserve", {"sku": "s"}).result() == "inner"
    assert not inner.active
    assert weft.start("env.reserve", {"sku": "s"}).result() == "reserved 1 x s"
    with WeftTestEnv(start=T0) as other:
        other.mock_activity(reserve, return_value="other")
        assert weft.start("env.reserve", {"sku": "t"}).result() == "other"
    assert weft.start("env.reserve", {"sku": "t"}).result() == "reserved 1 x t"


def test_a_newer_mock_covers_an_older_one_until_it_stops(env):
    outer = env.mock_activity("tests.test_testing_env.reserve", return_value="outer")  # by activity name
    inner = env.mock_activity(reserve, return_value="inner")
    assert weft.start("env.reserve", {"sku": "s"}).result() == "inner"
    inner.stop()
    assert weft.start("env.reserve", {"sku": "s"}).result() == "outer"
    assert (outer.call_count, inner.call_count) == (1, 1)


def test_reset_mock_forgets_the_calls(env):
    mock = env.mock_activity(reserve, return_value="r")
    weft.start("env.reserve", {"sku": "a"}).result()
    mock.reset_mock()
    assert mock.calls == [] and mock.call_count == 0
    mock.assert_not_called()
    assert weft.start("env.reserve", {"sku": "b"}).result() == "r"
    mock.assert_called_once_with("b", quantity=1)


def test_a_mocked_async_activity_completes_with_its_token(env):
    tokens = []

    def ask(order_id: int) -> None:
        tokens.append(weft.activity_info().task_token)
        weft.complete_async()

    env.mock_activity(charge, side_effect=ask)
    handle = weft.start("env.charge", 5)
    with pytest.raises(StillWaiting, match=r"waiting for async activity tests\.test_testing_env\.charge"):
        handle.result()
    weft.complete_async_activity(tokens[0], "approved")
    assert handle.result()["charge"] == "approved"


# --- either database fixture: activities with a timeout ---------------------------------------------

FIXTURES = [
    pytest.param("db", id="db"),
    pytest.param("transactional_db", id="transactional_db", marks=pytest.mark.django_db(transaction=True)),
]


@pytest.mark.parametrize("fixture", FIXTURES)
def test_an_activity_with_a_timeout_sees_the_tests_rows(fixture, weft_env):
    from django.db import connection

    assert connection.in_atomic_block == (fixture == "db"), "the test runs under the fixture it names"
    Execution.objects.create(key="order-1", pid=0)
    handle = weft.start("env.count", "order-1")
    weft_env.drive()
    assert handle.result() == 1
    assert Execution.objects.filter(key="order-1:counted").count() == 1


@pytest.mark.parametrize("fixture", FIXTURES)
def test_an_activity_over_its_timeout_fails_the_attempt_with_activity_timeout(fixture, weft_env):
    handle = weft.start("env.dawdle", 0.5)
    weft_env.drive()
    step = WorkflowStep.objects.get(run_id=handle.run_id)
    assert step.error["type"] == "django_weft.exceptions.ActivityTimeout"
    assert "ran longer than its 0.2s timeout" in step.error["message"]
    weft_env.advance(timedelta(seconds=5))
    with pytest.raises(weft.WorkflowFailed, match="ActivityTimeout"):
        handle.result()


@pytest.mark.parametrize("fixture", FIXTURES)
def test_an_activity_within_its_timeout_returns(fixture, weft_env):
    handle = weft.start("env.dawdle", 0)
    weft_env.drive()
    assert handle.result() == "done"
