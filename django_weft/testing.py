"""Helpers for testing your own workflows without a running loop.

``WeftTestEnv`` drives runs synchronously in the test's thread and skips time on a fake clock, so a
workflow that retries, sleeps for two days and waits a week for a signal is tested in milliseconds::

    from django_weft.testing import WeftTestEnv

    def test_checkout(db):
        with WeftTestEnv() as env:
            charge = env.mock_activity(charge_card, side_effect=[CardDeclined(), "ch_1"])
            handle = weft.start("checkout", {"order_id": 1})
            env.advance(timedelta(days=2))   # every timer due in those two days fires, in time order
            assert handle.result() == {...}  # never hangs: raises at once if the run cannot finish
            assert charge.call_count == 2

With pytest, add ``pytest_plugins = ["django_weft.testing"]`` to your conftest.py and use the
``weft_env`` fixture. It asks for pytest-django's ``db`` fixture, and works as well when the test asks
for ``transactional_db`` (or ``@pytest.mark.django_db(transaction=True)``).
"""

from __future__ import annotations

import json
import os
import unittest.mock
from collections.abc import Callable, Iterable
from contextlib import nullcontext
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any
from uuid import UUID

from django.db.models import Min
from django.test.utils import override_settings
from django.utils import timezone

from django_weft.common import clock
from django_weft.exceptions import NonDeterminismError, WeftError
from django_weft.models import RunStatus, Workflow
from django_weft.runtime.activities import activity_info, definition_of, replace_activity
from django_weft.services import client, result_waiters
from django_weft.services.maintenance import MaintenanceReport, run_maintenance
from django_weft.services.replay_check import history_run
from django_weft.services.replay_check import replay as replay_run
from django_weft.services.schedules import due_schedules
from django_weft.store import admissions

try:
    import pytest
except ImportError:  # pytest is optional
    pytest = None  # type: ignore[assignment]

# advance() fires at most this many distinct timer moments (a schedule every second for a day is 86,400).
DEFAULT_MAX_STEPS = 10_000
# advance_until_idle() skips to at most this many timer moments by default.
DEFAULT_IDLE_LIMIT = 1_000
# Open runs and schedules named in an error message, at most.
SHOWN_PENDING = 10


class StillWaiting(WeftError, TimeoutError):
    """``handle.result()`` in a :class:`WeftTestEnv`: the run cannot finish without time passing or an
    outside event (a signal, an async completion). A ``TimeoutError``, like ``result(timeout=0)``'s."""


class NotIdle(WeftError, RuntimeError):
    """:meth:`WeftTestEnv.advance_until_idle` (or :meth:`~WeftTestEnv.advance`) reached its limit with
    timers still pending: a workflow that never ends, or a schedule that keeps starting runs."""


def _duration(value: timedelta | float, what: str) -> timedelta:
    step = value if isinstance(value, timedelta) else timedelta(seconds=float(value))
    if step < timedelta(0):
        raise ValueError(f"{what} must not be negative: the clock only moves forward")
    return step


def _moment(value: datetime) -> str:
    return value.isoformat(timespec="seconds") if value.microsecond == 0 else value.isoformat()


class WeftTestEnv:
    """A fake clock plus a synchronous driver. Use as a context manager (restores the real clock).

    * :meth:`drive` executes everything runnable now; :meth:`advance` lets time pass, firing every
      timer and schedule occurrence that falls due on the way, in time order; :meth:`advance_until_idle`
      skips from timer to timer until no run has one left.
    * ``handle.result()`` (without a timeout) drives the run and, if it still cannot finish, raises
      :class:`StillWaiting` at once, naming what the run waits for, instead of blocking.
    * :meth:`mock_activity` replaces an activity for the life of the environment and records its calls.

    It drives runs itself, so with ``WEFT_EXECUTOR = "celery"`` it sends no Celery tasks (no broker is
    needed, and none is contacted) unless ``send_celery_tasks=True``, for testing that wiring itself.
    """

    def __init__(self, start: datetime | None = None, *, send_celery_tasks: bool = False) -> None:
        self.start_time = start or timezone.now()
        if timezone.is_naive(self.start_time):
            raise ValueError("WeftTestEnv(start=...) needs an aware datetime")
        self._executor = nullcontext() if send_celery_tasks else override_settings(WEFT_EXECUTOR="loop")
        self._mocks: list[ActivityMock] = []
        self._previous_waiter: Any = None

    def __enter__(self) -> WeftTestEnv:
        self._executor.__enter__()
        clock.set_frozen(self.start_time)
        self._previous_waiter = result_waiters.set_result_waiter(self._finish_or_explain, self.drive)
        return self

    def __exit__(self, *exc: Any) -> None:
        for mock in reversed(self._mocks):
            mock.stop()
        self._mocks.clear()
        result_waiters.restore_result_waiter(self._previous_waiter)
        clock.set_frozen(None)
        self._executor.__exit__(None, None, None)

    def now(self) -> datetime:
        return clock.now()

    # --- driving and time ------------------------------------------------------------------------------

    def drive(self, max_passes: int = 100) -> MaintenanceReport:
        """Run maintenance passes at the fake time until nothing more happens; return the summed report.

        The clock does not move: a run waiting for a timer stays parked (see :meth:`advance`)."""
        total = MaintenanceReport()
        for _ in range(max_passes):
            report = run_maintenance()
            if not (report.claimed or report.timed_out or report.purged or report.schedules_fired or report.admitted):
                return total
            total.add(report)
        raise NotIdle(f"runs still runnable after {max_passes} passes at {_moment(clock.now())}: a workflow may "
                      f"loop forever\n{self._describe_pending()}")

    def advance(self, delta: timedelta | float, *, max_steps: int = DEFAULT_MAX_STEPS) -> MaintenanceReport:
        """Let ``delta`` (a timedelta or seconds) pass, as a running ``weft_maintenance`` would see it.

        Every moment something falls due within it — a sleep, a retry backoff, a signal wait's timeout,
        an async activity's deadline, a delayed start, an execution timeout, a schedule occurrence,
        including those created on the way — is visited in time order: the clock is set there and
        everything due is driven. The clock ends at exactly ``now + delta``. Raises :class:`NotIdle`
        after ``max_steps`` such moments (a schedule every second for a week is 604,800 of them).
        """
        target = clock.now() + _duration(delta, "advance()'s delta")
        total = self.drive()
        steps = 0
        while (moment := self._next_due(until=target)) is not None:
            steps += 1
            if steps > max_steps:
                raise NotIdle(
                    f"advance() visited {max_steps} moments with timers due by {_moment(target)} and there are "
                    f"more (next at {_moment(moment)}); advance in smaller steps, pause the schedule, or raise "
                    f"max_steps\n{self._describe_pending()}"
                )
            clock.set_frozen(moment)
            total.add(self.drive())
        clock.set_frozen(target)
        total.add(self.drive())
        return total

    def advance_until_idle(self, limit: int = DEFAULT_IDLE_LIMIT, *,
                           max_duration: timedelta | float | None = None) -> MaintenanceReport:
        """Skip from timer to timer (as :meth:`advance` does) until no open run has one left; return the
        summed report. The clock stays at the last timer that fired.

        Runs that then still wait, wait for something time alone does not bring (a signal, an async
        completion, a child run). Schedules fire on the way but keep nothing going by themselves (a
        schedule never ends; step through one with :meth:`advance`). Raises :class:`NotIdle`, naming
        what is still pending, after ``limit`` timers or once the next one is more than
        ``max_duration`` ahead of where the clock started.
        """
        if not isinstance(limit, int) or limit < 0:
            raise ValueError(f"limit must be an int >= 0, got {limit!r}")
        horizon = None if max_duration is None else clock.now() + _duration(max_duration, "max_duration")
        total = self.drive()
        for steps in range(limit + 1):
            moment = self._next_due(until=None, schedules=False)
            if moment is None:
                return total
            if horizon is not None and moment > horizon:
                raise NotIdle(f"advance_until_idle(): the next timer, at {_moment(moment)}, is past max_duration "
                              f"(until {_moment(horizon)})\n{self._describe_pending()}")
            if steps == limit:
                break
            total.add(self.advance(moment - clock.now()))
        raise NotIdle(f"advance_until_idle() skipped to the next timer {limit} times and runs still have timers "
                      f"pending at {_moment(clock.now())} (a workflow that never ends?)\n{self._describe_pending()}")

    def _next_due(self, *, until: datetime | None, schedules: bool = True) -> datetime | None:
        """The soonest moment after now, and not after ``until``, at which something falls due: a run's
        ``runnable_at`` (its timer, delayed start or lease expiry), an open run's execution deadline, or
        (with ``schedules``) an active schedule's next occurrence."""
        now = clock.now()

        def bounded(moments: Any, name: str) -> Any:
            moments = moments.filter(**{f"{name}__gt": now})
            return moments if until is None else moments.filter(**{f"{name}__lte": until})

        candidates = [
            bounded(Workflow.objects.filter(runnable_at__isnull=False), "runnable_at")
            .aggregate(at=Min("runnable_at"))["at"],
            # A queued run's start time (delayed, debounced); a rate limit's window reopening is
            # admitted_at + its period.
            bounded(Workflow.objects.filter(status=RunStatus.QUEUED), "admit_at").aggregate(at=Min("admit_at"))["at"],
            *self._rate_windows(now, until),
            bounded(Workflow.objects.filter(execution_deadline__isnull=False, finished_at__isnull=True),
                    "execution_deadline").aggregate(at=Min("execution_deadline"))["at"],
        ]
        if schedules:
            candidates.append(bounded(due_schedules(), "due_at").values_list("due_at", flat=True).first())
        found = [moment for moment in candidates if moment is not None]
        return min(found) if found else None

    def _rate_windows(self, now: datetime, until: datetime | None) -> list[datetime | None]:
        """For each queue with ready queued runs held back by a rate limit: when its oldest admission in the
        window leaves it (an admission pass then admits more)."""
        moments: list[datetime | None] = []
        for queue in admissions.queues_with_ready_runs(now):
            limits = admissions.current_limits(queue)
            rates = [r for r in (limits.rate, limits.rate_per_key) if r is not None]
            for rate in rates:
                period = timedelta(seconds=rate.period)
                oldest = (Workflow.objects.filter(queue=queue, admitted_at__gt=now - period)
                          .aggregate(at=Min("admitted_at"))["at"])
                if oldest is not None and (until is None or oldest + period <= until):
                    moments.append(oldest + period + timedelta(microseconds=1))
        return moments

    # --- what runs wait for -----------------------------------------------------------------------------

    def _finish_or_explain(self, handle: client.WorkflowHandle) -> None:
        """``handle.result()`` inside the environment: drive, and raise at once if the run cannot finish."""
        self.drive()
        run = handle.refresh()
        if run.is_finished:
            return
        raise StillWaiting(
            f"run {run.run_id} of {run.workflow_id!r} ({run.workflow_type}) cannot finish at "
            f"{_moment(clock.now())}: {_describe_wait(run)}. Let time pass with weft_env.advance(...) or "
            "weft_env.advance_until_idle(), or send what it waits for."
        )

    def _describe_pending(self) -> str:
        runs = list(Workflow.objects.open().order_by("runnable_at", "created_at")[: SHOWN_PENDING + 1])
        lines = [f"  run {run.run_id} of {run.workflow_id!r} ({run.workflow_type}): {_describe_wait(run)}"
                 for run in runs[:SHOWN_PENDING]]
        if len(runs) > SHOWN_PENDING:
            lines.append("  ... and more open runs")
        for schedule in due_schedules()[:SHOWN_PENDING]:
            lines.append(f"  schedule {schedule.schedule_id!r}: next occurrence due at {_moment(schedule.due_at)}")
        return "pending:\n" + "\n".join(lines) if lines else "nothing is pending"

    # --- activity mocks ---------------------------------------------------------------------------------

    def mock_activity(self, activity: Callable[..., Any] | str, *, return_value: Any = None,
                      side_effect: Any = None) -> ActivityMock:
        """Replace ``activity`` (the function, decorated or not, or its activity name) for this environment.

        Each attempt calls the mock instead, with the arguments ``ctx.run`` got, and is recorded in
        :attr:`ActivityMock.calls` (arguments and attempt number). What it returns (``return_value``,
        default None) or raises is journaled and retried like the real activity's outcome. As with
        ``unittest.mock``, ``side_effect`` may be an exception (class or instance) to raise, an iterable
        of values and exceptions (one per call), or a function called with the activity's arguments
        (returning its result; it may call ``weft.activity_info()`` or ``weft.complete_async()``).

        The mock is undone when the environment exits, or before by ``mock.stop()`` or by using it as a
        context manager. It applies to runs this process executes (not to ``weft_maintenance``
        subprocesses).
        """
        mock = ActivityMock(activity, return_value=return_value, side_effect=side_effect)
        self._mocks.append(mock)
        return mock


def _describe_wait(run: Workflow) -> str:
    """What an open run waits for, in a few words: ``waiting: retrying charge_card (attempt 3) at ...``."""
    status = run.status
    if status == RunStatus.QUEUED:
        queue = f"on queue {run.queue!r}" if run.queue else "of a paused type, or debounced"
        return f"queued {queue}, from {_moment(run.admit_at)} (see weft.queue_info)" if run.admit_at else \
            f"queued {queue}"
    if status == RunStatus.PENDING:
        when = f"starts at {_moment(run.runnable_at)}" if run.runnable_at else "not started"
        return f"pending: {when}"
    if status == RunStatus.RUNNING:
        until = f" until {_moment(run.runnable_at)}" if run.runnable_at else ""
        owner = run.lease_owner or "an executor"
        return f"running: held by {owner}{until}"
    reason = run.wait_reason or "no reason recorded"
    if status == RunStatus.WAITING and run.runnable_at is None and run.awaiting_signals:
        reason = f"{reason} (no timeout)"
    if run.execution_deadline is not None:
        reason = f"{reason}; execution timeout at {_moment(run.execution_deadline)}"
    return f"{status}: {reason}"


@dataclass(frozen=True)
class ActivityCall:
    """One attempt that called an :class:`ActivityMock`."""

    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    attempt: int
    workflow_id: str
    run_id: UUID
    seq: int


class ActivityMock:
    """A stand-in for an activity (see :meth:`WeftTestEnv.mock_activity`).

    ``calls`` lists every attempt (:class:`ActivityCall`: args, kwargs, attempt, workflow_id, run_id,
    seq). ``mock`` is the ``unittest.mock`` object behind it, specced like the activity (a call with
    arguments the activity does not take fails as the activity would); its assertion helpers are
    available here too: ``assert_called_once_with(...)``, ``assert_not_called()``, ``call_count``,
    ``call_args_list`` ...
    """

    def __init__(self, activity: Callable[..., Any] | str, *, return_value: Any = None,
                 side_effect: Any = None) -> None:
        if isinstance(activity, str):
            self.name, spec = activity, None
        else:
            definition = definition_of(activity)
            self.name, spec = definition.name, definition.fn
        self.calls: list[ActivityCall] = []
        self._counted_values = _is_value_list(side_effect)
        self.mock: Any = (unittest.mock.Mock(name=self.name) if spec is None
                          else unittest.mock.create_autospec(spec, name=self.name))
        self.mock.return_value = return_value
        self.mock.side_effect = side_effect
        self._undo: Callable[[], None] | None = replace_activity(self.name, self._call)

    def __repr__(self) -> str:
        return f"<ActivityMock {self.name} calls={len(self.calls)}{'' if self.active else ' stopped'}>"

    @property
    def active(self) -> bool:
        return self._undo is not None

    @property
    def return_value(self) -> Any:
        return self.mock.return_value

    @return_value.setter
    def return_value(self, value: Any) -> None:
        self.mock.return_value = value

    @property
    def side_effect(self) -> Any:
        return self.mock.side_effect

    @side_effect.setter
    def side_effect(self, value: Any) -> None:
        self._counted_values = _is_value_list(value)
        self.mock.side_effect = value

    @property
    def call_count(self) -> int:
        return len(self.calls)

    @property
    def attempts(self) -> list[int]:
        """The attempt number of each call, in order: ``[1, 2, 3]`` for an activity retried twice."""
        return [call.attempt for call in self.calls]

    def __getattr__(self, name: str) -> Any:
        if name.startswith("assert_") or name in ("call_args", "call_args_list", "called", "mock_calls"):
            return getattr(self.mock, name)
        raise AttributeError(name)

    def reset_mock(self) -> None:
        """Forget the calls so far (``return_value`` and ``side_effect`` stay)."""
        self.calls.clear()
        self.mock.reset_mock()

    def _call(self, *args: Any, **kwargs: Any) -> Any:
        info = activity_info()
        self.calls.append(ActivityCall(args=args, kwargs=dict(kwargs), attempt=info.attempt,
                                       workflow_id=info.workflow_id, run_id=info.run_id, seq=info.seq))
        try:
            return self.mock(*args, **kwargs)
        except StopIteration:
            if not self._counted_values:
                raise
            raise AssertionError(f"the mock of activity {self.name} was called {len(self.calls)} times, more "
                                 "often than its side_effect has values") from None

    def stop(self) -> None:
        """Undo the mock: the activity's own function runs again (or the mock installed before this one)."""
        if self._undo is not None:
            self._undo()
            self._undo = None

    def __enter__(self) -> ActivityMock:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()


def replay(history: dict[str, Any] | str | os.PathLike[str]) -> None:
    """Replay a history exported with ``manage.py weft_export_history`` against the workflow code loaded
    now, executing nothing; raises :class:`~django_weft.NonDeterminismError` (naming the step, what was
    recorded and what the code asks for) where the code no longer matches, as the executor would.

    ``history`` is the exported JSON (parsed) or the path of its file. Keep a few exported histories of
    real runs in your tests, and a change that would break open runs fails there first.
    """
    data = history if isinstance(history, dict) else json.loads(Path(history).read_text(encoding="utf-8"))
    run, steps, timers = history_run(data)
    problem = replay_run(run, steps, timers)
    if problem is not None:
        raise NonDeterminismError(problem.message, seq=problem.seq, recorded=problem.recorded,
                                  requested=problem.requested)


def _is_value_list(side_effect: Any) -> bool:
    if side_effect is None or callable(side_effect) or isinstance(side_effect, BaseException):
        return False
    return isinstance(side_effect, Iterable)


if pytest is not None:

    @pytest.fixture
    def weft_env(db: Any) -> Any:
        """A :class:`WeftTestEnv` with a fake clock, active for the test.

        It asks for pytest-django's ``db`` (the test runs in one transaction, rolled back at the end); a
        test that asks for ``transactional_db`` gets that instead, and the environment works the same.
        """
        with WeftTestEnv() as env:
            yield env
