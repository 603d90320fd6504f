"""Durable timers: ``ctx.sleep`` and ``ctx.sleep_until`` park the run until a Timer row fires.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime, timedelta

from django_weft.common import clock
from django_weft.common.durations import check_moment, to_seconds
from django_weft.models import StepKind, StepStatus, Timer, TimerPurpose
from django_weft.runtime.replay.core import ReplayCore, durable
from django_weft.store import journal


class Timers(ReplayCore):
    """The replay context's timers (mixed into runtime.context.Context)."""

    @durable
    def sleep(self, duration: float | int | timedelta) -> None:
        """Wait durably: the run parks and a timer wakes it, across restarts and deploys."""
        seconds = to_seconds(duration, "ctx.sleep duration", allow_zero=True)
        self._sleep(lambda now: now + timedelta(seconds=seconds))

    @durable
    def sleep_until(self, moment: datetime) -> None:
        utc = check_moment(moment, "ctx.sleep_until's moment")
        self._sleep(lambda now: utc)

    def _sleep(self, wake_at_from: Callable[[datetime], datetime]) -> None:
        seq, step = self._next(StepKind.SLEEP, "sleep")
        if step is not None and step.status == StepStatus.COMPLETED:
            return
        now = clock.now()
        if step is not None:
            timer = self._timers.get(seq)
            if timer is None or timer.fire_at <= now:
                # The timer fired: the step's completion rides on the run's next commit.
                step.status, step.finished_at = StepStatus.COMPLETED, now
                self._defer(self._record(step, step))
                if timer is not None:
                    self._defer(journal.FireTimer(timer.pk, now))
                return
            self._park(wake_at=timer.fire_at, reason=f"sleeping until {timer.fire_at.isoformat()}")
        self._before_new_work(side_effects=False)
        wake_at = wake_at_from(now)
        new_step = self._step(seq, StepKind.SLEEP, "sleep", StepStatus.WAITING, started=now, finished=None)
        if wake_at <= now:
            new_step.status, new_step.finished_at = StepStatus.COMPLETED, now
            self._defer(self._record(new_step, None))
            return
        timer = Timer(run_id=self.run_id, seq=seq, purpose=TimerPurpose.SLEEP, fire_at=wake_at)
        self._park(wake_at=wake_at, reason=f"sleeping until {wake_at.isoformat()}",
                   writes=[self._record(new_step, None), journal.InsertTimer(timer)])
