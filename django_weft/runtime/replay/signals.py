"""Signals: ``ctx.wait_for_signal`` consumes buffered signals in arrival order, or parks (with an optional
durable timeout) until one arrives.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Any, NoReturn, cast

from django.db.models import Q, QuerySet

from django_weft.common import clock
from django_weft.common.codec import decode, encode
from django_weft.common.durations import to_seconds
from django_weft.common.storable import check_text
from django_weft.exceptions import InvalidArgument, WaitTimeout
from django_weft.models import FailureCategory, Signal, StepKind, StepStatus, Timer, TimerPurpose, WorkflowStep
from django_weft.observability import events
from django_weft.runtime.replay.core import ReplayCore, durable
from django_weft.store import journal

# Single signal names that passed Signals._signal_names' checks (which depend on nothing else), so a replay of a
# long loop of waits checks each name once; bounded, since names may be made up at run time.
_STORABLE_NAMES: set[str] = set()
_STORABLE_NAMES_MAX = 4096
_COMPLETED = str(StepStatus.COMPLETED.value)


def _remember_storable(name: str) -> None:
    if len(_STORABLE_NAMES) >= _STORABLE_NAMES_MAX:
        _STORABLE_NAMES.clear()
    _STORABLE_NAMES.add(name)


class Signals(ReplayCore):
    """The replay context's signals (mixed into runtime.context.Context)."""

    @durable
    def wait_for_signal(self, name_or_names: str | Sequence[str],
                        timeout: float | timedelta | None = None) -> Any:
        """Wait for a signal and return its payload (for a list of names: ``(name, payload)``).

        Signals are buffered until consumed and consumed in arrival order, so one sent before the wait
        is returned at once. With ``timeout``, :class:`~django_weft.WaitTimeout` is raised if no
        signal arrives first (a durable timer, like ``sleep``).
        """
        names, several = self._signal_names(name_or_names, "wait_for_signal")
        seconds = None if timeout is None else to_seconds(timeout, "wait_for_signal timeout", allow_zero=True)
        label = "|".join(names) if several else names[0]
        seq, step = self._next(StepKind.SIGNAL, label)
        if step is not None and step.status == _COMPLETED:
            value = decode(step.result)
            return tuple(value) if several else value
        if step is not None and step.status == StepStatus.FAILED:
            raise WaitTimeout((step.error or {}).get("message", "timed out"))
        self._before_new_work(side_effects=False)
        now = clock.now()
        arrived = self._next_signal(names)
        timer = self._timers.get(seq)
        if arrived is not None:
            payload = decode(arrived.payload)
            value = [arrived.name, payload] if several else payload
            self._consumed(arrived)
            self._defer(journal.ConsumeSignal(arrived.pk, now, seq, arrived.name))
            if timer is not None:
                self._defer(journal.FireTimer(timer.pk, now))
            self._defer(self._record(self._step(
                seq, StepKind.SIGNAL, label, StepStatus.COMPLETED, result=encode(value, what="signal payload"),
                started=step.started_at if step else now, finished=now,
            ), step))
            return tuple(value) if several else value
        reason = f"waiting for signal {label}"
        if step is not None:  # parked before and still no signal: did the timeout fire?
            if timer is None or timer.fire_at > now:
                self._park(wake_at=timer.fire_at if timer else None, reason=reason, awaiting_signals=names)
            return self._signal_timed_out(seq, step, label, step.started_at, timer, now)
        waiting = self._step(seq, StepKind.SIGNAL, label, StepStatus.WAITING, started=now, finished=None)
        if seconds is None:
            self._park(wake_at=None, reason=reason, awaiting_signals=names, writes=[self._record(waiting, None)])
        if seconds == 0:
            return self._signal_timed_out(seq, None, label, now, None, now)
        wake_at = now + timedelta(seconds=seconds)
        timer = Timer(run_id=self.run_id, seq=seq, purpose=TimerPurpose.WAIT_TIMEOUT, fire_at=wake_at)
        self._park(wake_at=wake_at, reason=f"{reason} until {wake_at.isoformat()}", awaiting_signals=names,
                   writes=[self._record(waiting, None), journal.InsertTimer(timer)])

    def _signal_names(self, name_or_names: str | Sequence[str], what: str) -> tuple[list[str], bool]:
        """The names a wait takes, checked, and whether it was given a list of them."""
        if name_or_names.__class__ is str and name_or_names in _STORABLE_NAMES:  # a loop's wait: the same name
            if name_or_names in self._signal_handlers:
                raise self._handled_by_handler(what, name_or_names)
            return [name_or_names], False
        several = not isinstance(name_or_names, str)
        names: list[str] = list(name_or_names) if several else [cast(str, name_or_names)]
        if several or name_or_names not in _STORABLE_NAMES:  # a loop's wait asks with the same name every step
            if not names or not all(isinstance(n, str) and n and len(n) <= 255 for n in names):
                raise InvalidArgument(f"{what} needs a signal name or a list of names (each at most 255 "
                                      f"characters), got {name_or_names!r}")
            for name in names:
                check_text(name, "a signal name")
            if not several:
                _remember_storable(cast(str, name_or_names))
        for name in names:
            if name in self._signal_handlers:
                raise self._handled_by_handler(what, name)
        return names, several

    @staticmethod
    def _handled_by_handler(what: str, name: str) -> InvalidArgument:
        return InvalidArgument(f"{what} asks for signal {name!r}, which the code consumes with a handler "
                               "(ctx.set_signal_handler): wait with ctx.wait_condition for what it changes")

    def _next_signal(self, names: list[str]) -> Signal | None:
        return self._unconsumed(names).first()

    def _pending_signals(self, names: list[str]) -> list[Signal]:
        return list(self._unconsumed(names))

    def _unconsumed(self, names: list[str]) -> QuerySet[Signal]:
        pending = Signal.objects.filter(run_id=self.run_id, name__in=names, consumed_at__isnull=True)
        if any(name in self._consumed_up_to for name in names):  # consumed in this execution, not committed yet
            after = Q()
            for name in names:
                after |= Q(name=name, sequence__gt=self._consumed_up_to.get(name, 0))
            pending = pending.filter(after)
        return pending.order_by("sequence")

    def _consumed(self, signal: Signal) -> None:
        events.signal_consumed(signal)  # the execution's span links to the sender's trace
        self._consumed_up_to[signal.name] = max(signal.sequence, self._consumed_up_to.get(signal.name, 0))

    def _signal_timed_out(self, seq: int, step: WorkflowStep | None, label: str, started: datetime,
                          timer: Timer | None, now: datetime) -> NoReturn:
        message = f"no signal {label} arrived before the timeout"
        if timer is not None:
            self._defer(journal.FireTimer(timer.pk, now))
        self._defer(self._record(self._step(
            seq, StepKind.SIGNAL, label, StepStatus.FAILED, error={"type": "WaitTimeout", "message": message},
            started=started, finished=now, failure_category=FailureCategory.TIMEOUT,
        ), step))
        raise WaitTimeout(message)
