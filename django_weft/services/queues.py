"""Flow control for operators: each queue's state (backlog, admitted runs, limits, oldest wait), limits changed
at run time, and workflow types paused and resumed. What admits runs is :mod:`django_weft.store.admissions`."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from datetime import datetime
from typing import Any

from django.db import transaction
from django.db.models import Count, Min, Q

from django_weft.common import clock, queues
from django_weft.common.registry import get_workflow
from django_weft.exceptions import InvalidArgument
from django_weft.models import PausedType, QueueState, RunStatus, Workflow
from django_weft.store import admissions
from django_weft.store.starts import check_reason


@dataclass(frozen=True)
class QueueInfo:
    """A queue as an operator sees it (``weft.queue_info``, the admin, ``GET queues``, ``weft_runs queues``)."""

    name: str
    limits: dict[str, Any]  # in force now: the setting's with the overrides over them
    overrides: dict[str, Any]  # what an operator set at run time
    backlog: int  # queued runs
    ready: int  # queued runs whose start time has come (the others wait out a delay or a debounce)
    admitted: int  # admitted runs still open: what its concurrency counts
    oldest_wait_seconds: float | None  # how long the longest-waiting ready run has waited
    rate_limited: int  # ready runs the last admission pass held back only because of a rate limit
    admitted_total: int
    paused_types: list[str]  # paused workflow types with runs queued here

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def queue_names() -> list[str]:
    """The queues of WEFT_QUEUES, and NO_QUEUE when runs without a queue are queued (paused, debounced)."""
    names = sorted(queues.configured())
    if Workflow.objects.filter(queue="", status=RunStatus.QUEUED).exists():
        names.append(queues.NO_QUEUE)
    return names


def _column(name: str) -> str:
    return "" if name == queues.NO_QUEUE else name


def queue_info(name: str) -> QueueInfo:
    """The state of queue ``name`` now; InvalidArgument for a name that is not a queue."""
    if name != queues.NO_QUEUE:
        queues.check_queue_name(name)
    column = _column(name)
    now = clock.now()
    state = QueueState.objects.filter(name=admissions.state_name(column)).first()
    overrides = dict(state.overrides) if state is not None else {}
    counts = Workflow.objects.filter(queue=column).aggregate(
        backlog=Count("pk", filter=Q(status=RunStatus.QUEUED)),
        ready=Count("pk", filter=Q(status=RunStatus.QUEUED, admit_at__lte=now)),
        admitted=Count("pk", filter=Q(status__in=RunStatus.admitted_values())),
        oldest=Min("admit_at", filter=Q(status=RunStatus.QUEUED, admit_at__lte=now)),
    )
    oldest: datetime | None = counts["oldest"]
    paused = sorted(set(Workflow.objects.filter(queue=column, status=RunStatus.QUEUED,
                                                workflow_type__in=PausedType.objects.values("workflow_type"))
                        .values_list("workflow_type", flat=True)))
    return QueueInfo(
        name=name, limits=admissions.limits_of(column, overrides).as_dict(), overrides=overrides,
        backlog=counts["backlog"], ready=counts["ready"], admitted=counts["admitted"],
        oldest_wait_seconds=None if oldest is None else max(0.0, (now - oldest).total_seconds()),
        rate_limited=state.rate_limited if state is not None else 0,
        admitted_total=state.admitted_total if state is not None else 0, paused_types=paused,
    )


def list_queues() -> list[QueueInfo]:
    return [queue_info(name) for name in queue_names()]


def set_queue_limits(name: str, **limits: Any) -> QueueInfo:
    """Change queue ``name``'s limits at run time (stored in the database, over WEFT_QUEUES): each keyword is a
    limit (``concurrency``, ``concurrency_per_key``, ``rate``, ``rate_per_key``); None removes that limit, and
    ``set_queue_limits(name)`` with none goes back to the setting's. Runs it can admit now are admitted."""
    queues.check_queue_name(name)
    overrides = queues.check_limits(limits, f"the limits of queue {name!r}")
    now = clock.now()
    with transaction.atomic():
        admissions.lock_queue(name, now)
        QueueState.objects.filter(name=name).update(overrides=overrides, updated_at=now)
        admissions.admit_after_commit(name)
    return queue_info(name)


def pause_type(workflow_type: Any, reason: str = "") -> bool:
    """Stop admitting runs of ``workflow_type`` (a registered name or the decorated function): its new runs
    and those already queued wait, queued, until :func:`resume_type`; its admitted runs go on. False if it
    was paused already."""
    name = type_name(workflow_type)
    check_reason(reason)
    _, created = PausedType.objects.get_or_create(workflow_type=name,
                                                  defaults={"reason": reason, "paused_at": clock.now()})
    admissions.forget_paused_types()
    return created


def resume_type(workflow_type: Any) -> bool:
    """Admit runs of ``workflow_type`` again; its queued runs are admitted as their queues allow. False if it
    was not paused."""
    name = type_name(workflow_type)
    with transaction.atomic():
        deleted, _ = PausedType.objects.filter(workflow_type=name).delete()
        for queue in (Workflow.objects.filter(workflow_type=name, status=RunStatus.QUEUED).order_by()
                      .values_list("queue", flat=True).distinct()):
            admissions.admit_after_commit(queue)
    admissions.forget_paused_types()
    return bool(deleted)


def paused_types() -> list[str]:
    return sorted(admissions.paused_types(fresh=True))


def type_name(workflow_type: Any) -> str:
    """The registered name of ``workflow_type``; WorkflowNotRegistered (or InvalidArgument) otherwise."""
    if isinstance(workflow_type, str):
        if not workflow_type:
            raise InvalidArgument("a workflow type must be a non-empty name")
        # A type with queued runs may be paused even if this process does not register it (an operator's
        # tool); anything else must name a registered type.
        if Workflow.objects.filter(workflow_type=workflow_type).exists():
            return workflow_type
    return get_workflow(workflow_type).name
