"""Limited activities (design 9.3): ``@weft.activity(concurrency=, rate=, key=)`` bounds the attempts of an
activity (per key) across executors; an attempt over its limit waits without holding a thread, its timeouts
not started, and begins when a slot frees, in start order. Real processes: test_processes_flow_control.py."""

from __future__ import annotations

import time
from datetime import datetime, timedelta
from io import StringIO

import pytest

import django_weft as weft
from django_weft.models import ActivitySlot, RunStatus
from tests.testapp.models import Execution
from tests.testapp.queue_workflows import accounts, fan_out, leaves_a_branch, rated, rated_calls

pytestmark = pytest.mark.django_db(transaction=True)


def intervals(prefix: str = "") -> dict[str, tuple[datetime, datetime]]:
    begins = dict(Execution.objects.filter(key__startswith=f"begin:{prefix}").values_list("key", "created_at"))
    ends = dict(Execution.objects.filter(key__startswith=f"end:{prefix}").values_list("key", "created_at"))
    return {key.removeprefix("begin:"): (at, ends[f"end:{key.removeprefix('begin:')}"]) for key, at in begins.items()}


def most_at_once(spans) -> int:
    events = sorted([(b, 1) for b, _ in spans] + [(e, -1) for _, e in spans], key=lambda e: (e[0], e[1]))
    now = most = 0
    for _, step in events:
        now += step
        most = max(most, now)
    return most


def test_a_gather_runs_at_most_the_activitys_concurrency_at_once(weft_env):
    handle = weft.start(fan_out, {"prefix": "g", "count": 6, "seconds": 0.15})
    weft_env.drive()
    assert handle.result() == [f"g{i}" for i in range(6)]
    spans = intervals("g")
    assert len(spans) == 6
    assert most_at_once(spans.values()) == 2, "two at once: the limit, and used"
    # In start order, two at a time: the first two began first, the next two as those ended, then the last two.
    # Two slots freed at once are granted in order, but the two attempts then begin in threads of their own, so
    # which of a pair writes its begin first is not the grant order.
    starts = sorted(spans, key=lambda label: spans[label][0])
    assert [set(starts[i:i + 2]) for i in (0, 2, 4)] == [{"g0", "g1"}, {"g2", "g3"}, {"g4", "g5"}]
    assert not ActivitySlot.objects.filter(run_id=handle.run_id).exists(), "the run's slots went with it"


def test_a_key_limits_each_key_on_its_own(weft_env):
    handle = weft.start(accounts, {"accounts": ["a", "a", "b"], "seconds": 0.15})
    weft_env.drive()
    assert handle.result() == ["a/0", "a/1", "b/2"]
    spans = intervals()
    assert most_at_once([spans["a/0"], spans["a/1"]]) == 1, "one attempt of account a at a time"
    assert most_at_once([spans["a/0"], spans["b/2"]]) == 2, "account b does not wait for account a"


def test_a_rate_limit_parks_the_run_until_its_window_lets_the_next_attempt_in(weft_env):
    handle = weft.start(rated_calls, 12)
    weft_env.drive()
    run = handle.refresh()
    assert run.status == RunStatus.WAITING and "waiting for a slot of activity flowctl.rated" in run.wait_reason
    assert "rate 5/s" in run.wait_reason
    weft_env.advance_until_idle()
    moments = sorted(datetime.fromisoformat(at) for at in handle.result())
    assert len(moments) == 12
    worst = max(sum(1 for m in moments if start <= m < start + timedelta(seconds=1)) for start in moments)
    assert worst == 5
    assert moments[-1] - moments[0] >= timedelta(seconds=2), "12 attempts at 5 a second take two windows more"


@weft.activity(name="flowctl.timed", concurrency=1, timeout=0.5, retry=weft.RetryPolicy(max_attempts=1))
def timed(label: str) -> str:
    Execution.objects.create(key=f"begin:{label}")
    time.sleep(0.3)
    Execution.objects.create(key=f"end:{label}")
    return label


@weft.workflow(name="flowctl.timed_fan_out")
def timed_fan_out(ctx: weft.Context) -> list:
    return ctx.gather(*(ctx.start_activity(timed, f"w{i}") for i in range(3)))


def test_waiting_for_a_slot_does_not_start_an_attempts_timeout(weft_env):
    # One at a time, 0.3 s each: the third waits 0.6 s for its slot, longer than the 0.5 s an attempt may take;
    # its timeout counts from when it begins.
    handle = weft.start(timed_fan_out)
    weft_env.drive()
    assert handle.result() == ["w0", "w1", "w2"]
    spans = intervals("w")
    assert most_at_once(spans.values()) == 1
    assert spans["w2"][1] - spans["w0"][0] > timedelta(seconds=0.5)


def test_bad_limits_are_refused_when_the_activity_is_declared():
    with pytest.raises(weft.InvalidArgument, match="concurrency must be a positive int"):
        weft.activity(concurrency=0)
    with pytest.raises(weft.InvalidArgument, match="must be a rate such as"):
        weft.activity(rate="lots")
    with pytest.raises(weft.InvalidArgument, match="give one of them"):
        weft.activity(key=lambda *a: "k")
    with pytest.raises(weft.InvalidArgument, match="must be a function"):
        weft.activity(concurrency=1, key="account")


@weft.activity(name="flowctl.bad_key", concurrency=1, key=lambda n: n)
def bad_key(n: int) -> int:
    return n


@weft.workflow(name="flowctl.uses_bad_key")
def uses_bad_key(ctx: weft.Context) -> int:
    return ctx.run(bad_key, 7)


def test_a_key_that_is_not_a_string_fails_the_run_naming_the_activity(weft_env):
    handle = weft.start(uses_bad_key)
    weft_env.drive()
    run = handle.refresh()
    assert run.status == RunStatus.FAILED
    assert "the key of activity 'flowctl.bad_key' must be a non-empty string" in run.error["message"]


def test_a_slot_request_the_database_aborts_over_a_deadlock_is_made_again(weft_env, monkeypatch):
    # InnoDB rolls back one transaction of a deadlock (seen with executors killed mid-attempt on MariaDB): the
    # request decides from what it reads under the activity's lock, so it is made again, not the run failed.
    from django.db import OperationalError

    from django_weft.store import activity_slots, lock_retries

    real_line, calls = activity_slots._line, []

    def deadlocked_once(*args, **kwargs):
        calls.append(1)
        if len(calls) == 1:
            raise OperationalError(lock_retries.MYSQL_DEADLOCK, "Deadlock found when trying to get lock")
        return real_line(*args, **kwargs)

    monkeypatch.setattr(activity_slots, "_line", deadlocked_once)
    before = lock_retries.RETRIES[("slot_acquire", "deadlock")]
    handle = weft.start(fan_out, {"prefix": "dl", "count": 1})
    weft_env.drive()
    assert handle.result() == ["dl0"]
    assert lock_retries.RETRIES[("slot_acquire", "deadlock")] == before + 1


@weft.workflow(name="flowctl.one_rated_call")
def one_rated_call(ctx: weft.Context, i: int) -> str:
    return ctx.run(rated, i)


def test_a_rate_limit_holds_across_runs_that_have_ended(weft_env):
    # Each run makes one attempt and ends at once: the attempts of ended runs still count in the window.
    handles = [weft.start(one_rated_call, i) for i in range(12)]
    weft_env.drive()
    assert sum(h.refresh().status == RunStatus.COMPLETED for h in handles) == 5
    weft_env.advance_until_idle()
    moments = sorted(datetime.fromisoformat(h.result()) for h in handles)
    worst = max(sum(1 for m in moments if start <= m < start + timedelta(seconds=1)) for start in moments)
    assert worst == 5


@pytest.mark.parametrize("cache_rows", [0, 100], ids=["journal read again", "journal kept"])
def test_a_run_that_ends_in_a_later_execution_drops_the_slot_an_earlier_one_asked_for(weft_env, settings,
                                                                                       cache_rows):
    # Its branch asked for a slot while the window was full and waits; the run parks at a signal, and its next
    # execution ends it without polling the branch again: the waiting slot goes with the run.
    settings.WEFT_EXECUTOR_CACHE_ROWS = cache_rows
    for i in range(5):
        weft.start(one_rated_call, i)
    weft_env.drive()
    handle = weft.start(leaves_a_branch)
    weft_env.drive()
    assert ActivitySlot.objects.filter(run_id=handle.run_id).exists(), "its branch waits for a slot"
    handle.signal("go", "went")
    weft_env.drive()
    assert handle.result() == "went"
    assert not ActivitySlot.objects.filter(run_id=handle.run_id).exists(), "the slot went with the run"


def test_a_suspended_run_gives_back_the_slots_it_has_not_begun_and_asks_again_when_resumed(weft_env):
    # Seven runs each make one attempt at 5 a second: five begin, two wait for the next window.
    handles = [weft.start(one_rated_call, i) for i in range(7)]
    weft_env.drive()
    slots = {str(slot.run_id): slot for slot in ActivitySlot.objects.all()}
    first, second = sorted((h for h in handles if str(h.run_id) in slots),
                           key=lambda h: slots[str(h.run_id)].requested_at)
    assert [p.state for p in first.pending_activities()] == ["waiting_for_slot"]
    first.suspend("paused by a test")
    assert not ActivitySlot.objects.filter(run_id=first.run_id).exists(), "its place in the line went to others"
    assert first.pending_activities() == []
    weft_env.advance_until_idle()
    assert second.refresh().status == RunStatus.COMPLETED and first.refresh().status == RunStatus.SUSPENDED
    first.resume()
    assert [p.state for p in first.pending_activities()] == []  # it asks again when it runs
    weft_env.advance_until_idle()
    assert first.refresh().status == RunStatus.COMPLETED
    assert not ActivitySlot.objects.exists()


def test_an_operator_sees_a_slot_granted_to_a_parked_run_until_its_attempt_begins(weft_env):
    from django.core.management import call_command

    from django_weft.common import clock

    handles = [weft.start(one_rated_call, i) for i in range(6)]
    weft_env.drive()
    (last,) = [h for h in handles if h.refresh().status == RunStatus.WAITING]
    assert [p.state for p in last.pending_activities()] == ["waiting_for_slot"]
    # The window moves on and a maintenance pass that executes nothing grants the slot: the run is woken, not run.
    clock.set_frozen(clock.now() + timedelta(seconds=1.1))
    call_command("weft_maintenance", "--once", "--no-execute", stdout=StringIO(), stderr=StringIO())
    assert [p.state for p in last.pending_activities()] == ["slot_granted"]
    weft_env.drive()
    assert last.refresh().status == RunStatus.COMPLETED and last.pending_activities() == []
