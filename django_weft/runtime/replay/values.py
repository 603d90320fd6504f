"""Recorded values: ``ctx.now()``, ``ctx.uuid4()``, ``ctx.random()``, ``ctx.side_effect(fn)``, computed once per run
and returned from the journal on every replay.
"""

from __future__ import annotations

import random as _random
import uuid
from collections.abc import Callable
from datetime import datetime
from typing import Any

from django_weft.common import clock
from django_weft.common.codec import decode, encode
from django_weft.models import StepKind, StepStatus
from django_weft.runtime.replay.core import ReplayCore, durable


class RecordedValues(ReplayCore):
    """The replay context's values (mixed into runtime.context.Context)."""

    def _recorded_value(self, kind: str, name: str, produce: Callable[[], Any], *, side_effects: bool) -> Any:
        """Run ``produce`` once per run and journal its value; replays return the recorded value."""
        seq, step = self._next(kind, name)
        if step is not None:
            return decode(step.result)
        self._before_new_work(side_effects=side_effects)
        value = produce()
        data = encode(value, what=f"value of {kind} {name!r}")
        now = clock.now()
        self._defer(self._record(
            self._step(seq, kind, name, StepStatus.COMPLETED, result=data, started=now, finished=now), None,
        ))
        return value

    @durable
    def now(self) -> datetime:
        """The current time, recorded on first execution so replays see the same value."""
        return self._recorded_value(StepKind.NOW, "now", clock.now, side_effects=False)

    @durable
    def uuid4(self) -> uuid.UUID:
        return self._recorded_value(StepKind.UUID, "uuid4", uuid.uuid4, side_effects=False)

    @durable
    def random(self) -> float:
        return self._recorded_value(StepKind.RANDOM, "random", _random.random, side_effects=False)

    @durable
    def side_effect(self, fn: Callable[[], Any]) -> Any:
        """Call ``fn`` once for this run and record its (encodable) return value."""
        name = getattr(fn, "__qualname__", "side_effect")
        return self._recorded_value(StepKind.SIDE_EFFECT, name, fn, side_effects=True)
