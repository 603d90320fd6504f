"""Helpers for testing your own workflows without a running loop.

``WeftTestEnv`` drives runs synchronously in the test's thread and moves a fake clock, so a workflow that
sleeps for two days is tested in milliseconds::

    from django_weft.testing import WeftTestEnv

    def test_checkout(db):
        with WeftTestEnv() as env:
            handle = weft.start("checkout", {"order_id": 1})
            env.drive()                      # runs until every run is parked or finished
            env.advance(timedelta(days=2))   # moves the clock and drives again
            assert handle.result() == {...}

With pytest, add ``pytest_plugins = ["django_weft.testing"]`` to your conftest.py and use the
``weft_env`` fixture (it needs database access, e.g. the ``db`` fixture of pytest-django).
"""

from __future__ import annotations

from contextlib import nullcontext
from datetime import datetime, timedelta
from typing import Any

from django.test.utils import override_settings
from django.utils import timezone

from . import clock
from .maintenance import MaintenanceReport, run_maintenance

try:
    import pytest
except ImportError:  # pytest is optional
    pytest = None  # type: ignore[assignment]


class WeftTestEnv:
    """A fake clock plus a synchronous driver. Use as a context manager (restores the real clock).

    It drives runs itself, so with ``WEFT_EXECUTOR = "celery"`` it sends no Celery tasks (no broker is
    needed, and none is contacted) unless ``send_celery_tasks=True``, for testing that wiring itself.
    """

    def __init__(self, start: datetime | None = None, *, send_celery_tasks: bool = False) -> None:
        self.start_time = start or timezone.now()
        if timezone.is_naive(self.start_time):
            raise ValueError("WeftTestEnv(start=...) needs an aware datetime")
        self._executor = nullcontext() if send_celery_tasks else override_settings(WEFT_EXECUTOR="loop")

    def __enter__(self) -> WeftTestEnv:
        self._executor.__enter__()
        clock.set_frozen(self.start_time)
        return self

    def __exit__(self, *exc: Any) -> None:
        clock.set_frozen(None)
        self._executor.__exit__(None, None, None)

    def now(self) -> datetime:
        return clock.now()

    def drive(self, max_passes: int = 100) -> MaintenanceReport:
        """Run maintenance passes at the fake time until nothing more happens; return the summed report."""
        total = MaintenanceReport()
        for _ in range(max_passes):
            report = run_maintenance()
            if not (report.claimed or report.timed_out or report.purged or report.schedules_fired):
                return total
            total.claimed += report.claimed
            total.started += report.started
            total.woken += report.woken
            total.recovered += report.recovered
            total.timed_out += report.timed_out
            total.schedules_fired += report.schedules_fired
            total.purged += report.purged
            total.outcomes.update(report.outcomes)
        raise RuntimeError(f"runs still runnable after {max_passes} passes: a workflow may loop forever")

    def advance(self, delta: timedelta | float) -> MaintenanceReport:
        """Move the fake clock forward and drive everything that became due."""
        step = delta if isinstance(delta, timedelta) else timedelta(seconds=float(delta))
        if step < timedelta(0):
            raise ValueError("the clock only moves forward")
        clock.set_frozen(clock.now() + step)
        return self.drive()


if pytest is not None:

    @pytest.fixture
    def weft_env(db: Any) -> Any:
        """A :class:`WeftTestEnv` with a fake clock, active for the test."""
        with WeftTestEnv() as env:
            yield env
