"""The replay check: stored journals replayed against the workflow code loaded now, executing nothing and
writing nothing, to find the runs a deploy would break before it breaks them.

A dry replay returns every recorded result as a normal replay does and stops at the first operation the
journal has no row for (where the run is now), or at a step it waits on. What it reports is what the
executor would raise: :class:`~django_weft.NonDeterminismError` (the code asks for another step than the
journal recorded), or a run whose version is no longer registered (it would be held).
"""

from __future__ import annotations

import base64
import uuid
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django_weft.common.registry import get_workflow
from django_weft.exceptions import CancelledError, NonDeterminismError, WorkflowNotRegistered
from django_weft.models import Timer, Workflow, WorkflowStep
from django_weft.models.instances import loaded
from django_weft.runtime.context import Context
from django_weft.runtime.errors import HistoryLimitReached, ReplayFrontier, StopExecution, Suspend
from django_weft.runtime.replay.core import run_workflow_code
from django_weft.store import transitions

# Runs whose journals are read in one query.
BATCH = 500
HISTORY_FORMAT = "django_weft.history/1"


@dataclass(frozen=True)
class ReplayProblem:
    """A run the code now loaded cannot continue."""

    run_id: uuid.UUID
    workflow_id: str
    workflow_type: str
    version: int
    message: str
    seq: int | None = None
    recorded: str = ""
    requested: str = ""

    def line(self) -> str:
        where = f" step {self.seq}: recorded {self.recorded}, the code asks for {self.requested}" if self.seq else ""
        return (f"run {self.run_id} ({self.workflow_type} v{self.version}, workflow id {self.workflow_id!r}){where}"
                f"{'' if where else ': ' + self.message}")


def replay_dry(run: Workflow, steps: Iterable[WorkflowStep],
               timers: Iterable[Timer] = ()) -> tuple[Context, BaseException | None]:
    """Run the workflow's code over the run's journal, executing and writing nothing, up to where the run is
    now (or to its end); the context it built (its query handlers, its state) and what stopped it early
    (``None`` when it reached the run's frontier or returned). Raises WorkflowNotRegistered."""
    definition = get_workflow(run.workflow_type, version=run.version)
    claim = transitions.Claim(run=run, fence=run.fence, owner="weft_replay", previous_status=run.status)
    ctx = Context(claim, {step.seq: step for step in steps}, {int(t.seq or 0): t for t in timers if t.seq},
                  dry=True)
    stopped: BaseException | None = None
    try:
        run_workflow_code(ctx, definition, run.input)
        ctx.assert_journal_consumed()
    except (ReplayFrontier, Suspend, StopExecution, CancelledError):
        pass  # reached where the run is now (or the cancel it ended with): everything before matched
    except (Exception, HistoryLimitReached) as exc:
        stopped = exc
    finally:
        ctx.close_branches()
    return ctx, stopped


def replay(run: Workflow, steps: Iterable[WorkflowStep], timers: Iterable[Timer] = ()) -> ReplayProblem | None:
    """Replay one run's journal dry; the problem it would hit, or None when it replays cleanly."""
    try:
        _, stopped = replay_dry(run, steps, timers)
    except WorkflowNotRegistered as exc:
        return ReplayProblem(run.run_id, run.workflow_id, run.workflow_type, run.version,
                             f"it would be held: {exc}")
    if isinstance(stopped, NonDeterminismError):
        return ReplayProblem(run.run_id, run.workflow_id, run.workflow_type, run.version, str(stopped),
                             stopped.seq, stopped.recorded, stopped.requested)
    if isinstance(stopped, HistoryLimitReached):
        return ReplayProblem(run.run_id, run.workflow_id, run.workflow_type, run.version,
                             f"it would time out: its next step {stopped.seq} passes WEFT_MAX_HISTORY "
                             f"({stopped.limit})")
    if stopped is not None and not run.is_finished:
        # A finished run may replay to the error it failed with; an open run's code raising before it gets
        # to where the run is means the run would fail.
        return ReplayProblem(run.run_id, run.workflow_id, run.workflow_type, run.version,
                             f"its code raises {type(stopped).__name__} while replaying: {stopped}")
    return None


def check_runs(runs: Iterable[Workflow]) -> Iterator[tuple[Workflow, ReplayProblem | None]]:
    """Replay each run dry, reading journals and timers a batch of runs at a time."""
    batch: list[Workflow] = []
    for run in runs:
        batch.append(run)
        if len(batch) == BATCH:
            yield from _check_batch(batch)
            batch = []
    if batch:
        yield from _check_batch(batch)


def _check_batch(runs: list[Workflow]) -> Iterator[tuple[Workflow, ReplayProblem | None]]:
    ids = [run.pk for run in runs]
    steps: dict[Any, list[WorkflowStep]] = {pk: [] for pk in ids}
    for step in loaded(WorkflowStep.objects.filter(run_id__in=ids)):  # the replay check's journals: 10,000s of rows
        steps[step.run_id].append(step)
    timers: dict[Any, list[Timer]] = {pk: [] for pk in ids}
    for timer in Timer.objects.filter(run_id__in=ids, fired_at__isnull=True, seq__isnull=False):
        timers[timer.run_id].append(timer)
    for run in runs:
        yield run, replay(run, steps[run.pk], timers[run.pk])


# --- exported histories --------------------------------------------------------------------------------


def _bytes(data: bytes | memoryview | None) -> str | None:
    return None if data is None else base64.b64encode(bytes(data)).decode("ascii")


def _moment(value: datetime | None) -> str | None:
    return None if value is None else value.isoformat()


def export_history(run: Workflow) -> dict[str, Any]:
    """A run's journal (and its unfired timers) as JSON-able data, payloads kept byte for byte (base64 of
    their msgpack encoding) so that :func:`history_run` rebuilds exactly what the engine replays."""
    steps = WorkflowStep.objects.filter(run=run).order_by("seq")
    timers = Timer.objects.filter(run=run, fired_at__isnull=True, seq__isnull=False).order_by("seq")
    return {
        "format": HISTORY_FORMAT,
        "run": {"run_id": str(run.run_id), "workflow_id": run.workflow_id, "workflow_type": run.workflow_type,
                "version": run.version, "status": run.status, "input": _bytes(run.input),
                "created_at": _moment(run.created_at)},
        "steps": [{"seq": s.seq, "kind": s.kind, "name": s.name, "status": s.status, "attempt": s.attempt,
                   "result": _bytes(s.result), "error": s.error, "started_at": _moment(s.started_at),
                   "finished_at": _moment(s.finished_at)} for s in steps],
        "timers": [{"seq": t.seq, "purpose": t.purpose, "fire_at": _moment(t.fire_at)} for t in timers],
    }


def _unbytes(text: str | None) -> bytes | None:
    return None if text is None else base64.b64decode(text)


def _unmoment(text: str | None) -> datetime | None:
    return None if text is None else datetime.fromisoformat(text)


def _required_moment(text: str | None, what: str) -> datetime:
    if text is None:
        raise ValueError(f"the history has no {what}")
    return datetime.fromisoformat(text)


def history_run(history: dict[str, Any]) -> tuple[Workflow, list[WorkflowStep], list[Timer]]:
    """The (unsaved) run, steps and timers of an exported history."""
    if not isinstance(history, dict) or history.get("format") != HISTORY_FORMAT:
        raise ValueError(f"not a django_weft history (its 'format' must be {HISTORY_FORMAT!r})")
    head = history["run"]
    run = Workflow(run_id=uuid.UUID(head["run_id"]), workflow_id=head["workflow_id"],
                   workflow_type=head["workflow_type"], version=int(head.get("version", 1)),
                   status=head.get("status", "waiting"), input=_unbytes(head.get("input")),
                   created_at=_required_moment(head.get("created_at"), "created_at of its run"))
    steps = [WorkflowStep(run_id=run.run_id, seq=s["seq"], kind=s["kind"], name=s["name"], status=s["status"],
                          attempt=s.get("attempt", 1), result=_unbytes(s.get("result")), error=s.get("error"),
                          started_at=_required_moment(s.get("started_at"), f"started_at of step {s['seq']}"),
                          finished_at=_unmoment(s.get("finished_at")))
             for s in history.get("steps", [])]
    timers = [Timer(run_id=run.run_id, seq=t["seq"], purpose=t["purpose"],
                    fire_at=_required_moment(t.get("fire_at"), f"fire_at of the timer of step {t['seq']}"))
              for t in history.get("timers", [])]
    return run, steps, timers
