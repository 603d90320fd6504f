"""The journal writes an executor folds into its fenced commits, and the two ways of applying them.

Writes are plain data, so a commit can merge them (a step result rides on the run's completion) and,
on PostgreSQL, send the fenced run update and the new journal rows as one statement.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime
from functools import cache, lru_cache
from operator import attrgetter
from typing import Any, cast

from django.db import connections, router, transaction
from django.db.models import NOT_PROVIDED, DateField, DateTimeField, Field, Model

from django_weft.models import (
    AsyncActivity,
    Signal,
    StepAttempt,
    Timer,
    UpdateStatus,
    Workflow,
    WorkflowStep,
    WorkflowUpdate,
)
from django_weft.observability import events
from django_weft.store import group_commit, inbox, published, search_rows, wakeups
from django_weft.store.bound_cursor import Converter, bound_cursor, converter


@dataclass
class InsertStep:
    step: WorkflowStep


@dataclass
class UpdateStep:
    step: WorkflowStep  # carries the pk of the existing row


@dataclass
class InsertAttempt:
    """An attempt of a step that took more than one (models.StepAttempt)."""

    attempt: StepAttempt


@dataclass
class InsertTimer:
    timer: Timer


@dataclass
class FireTimer:
    timer_id: int
    at: datetime


@dataclass
class ConsumeSignal:
    signal_pk: int
    at: datetime
    seq: int
    name: str = ""  # for the signal_consumed signal


@dataclass
class InsertChild:
    run: Workflow


@dataclass
class InsertAsync:
    record: AsyncActivity


@dataclass
class ResolveAsync:
    record_pk: int
    status: str
    at: datetime
    error: dict | None = None


@dataclass
class CancelChild:
    """A child whose branch lost its parent's race: closed by its parent_close_policy in the same commit."""

    run_id: Any
    at: datetime
    reason: str
    policy: str


@dataclass
class SendSignal:
    """ctx.signal_workflow: the signal is stored for the other workflow's open run in the commit that records the
    step, so it is sent exactly once (a run that closed in the meantime gets none, as for any late signal)."""

    workflow_id: str
    name: str
    payload: bytes
    signal_id: str
    at: datetime


@dataclass
class ApplyUpdate:
    """An update the run applied: its reply (or error) and the position it ran at, for the caller."""

    update_pk: int
    status: str
    seq: int | None  # None: failed without being applied (the code had no handler for it)
    result: bytes | None
    error: dict | None
    at: datetime


@dataclass
class SetSearchAttributes:
    """``ctx.set_search_attributes``: the run row shows ``shown``; the indexed rows of the names in ``values``
    (checked; None removes one) are replaced."""

    run_id: Any
    created_at: datetime
    values: dict[str, Any]
    shown: dict[str, Any]


@dataclass
class SetEvent:
    """ctx.set_event: the key's latest value (callers waiting for it are told once the commit lands)."""

    run_id: Any
    key: str
    value: bytes
    seq: int
    at: datetime


@dataclass
class AppendStream:
    """ctx.write_stream (or, ``closed``, ctx.close_stream): one entry after the stream's others."""

    run_id: Any
    key: str
    value: bytes | None
    seq: int
    at: datetime
    closed: bool = False


JournalWrite = (InsertStep | UpdateStep | InsertAttempt | InsertTimer | FireTimer | ConsumeSignal | InsertChild
                | InsertAsync | ResolveAsync | CancelChild | ApplyUpdate | SetSearchAttributes | SendSignal
                | SetEvent | AppendStream)


def announce(run: Workflow, writes: Sequence[JournalWrite], *, committed: bool = False) -> None:
    """Inside the transaction that applied ``writes`` to ``run`` (or once the statement that applied them
    committed: ``committed``): tell the observability hooks what it recorded (they count finished steps and
    send the activity and signal signals after it commits)."""
    if not events.watching_steps():
        return
    steps = [w.step for w in writes if isinstance(w, InsertStep | UpdateStep)]
    consumed = [(w.signal_pk, w.name, w.seq) for w in writes if isinstance(w, ConsumeSignal)]
    if steps or consumed:
        events.steps_committed(run, steps, consumed, committed=committed)


def apply(writes: Iterable[JournalWrite], children: Callable[[InsertChild | CancelChild], None]) -> None:
    """Apply writes with the ORM, inside the caller's transaction; a child's start or cancel is a transition of
    that child, which ``children`` (the state writer's) makes."""
    for write in writes:
        if isinstance(write, InsertStep):
            write.step.save(force_insert=True)
        elif isinstance(write, UpdateStep):
            s = write.step
            WorkflowStep.objects.filter(pk=s.pk).update(
                status=s.status, attempt=s.attempt, result=s.result, error=s.error, finished_at=s.finished_at,
                failure_category=s.failure_category,
            )
        elif isinstance(write, InsertAttempt):
            write.attempt.save(force_insert=True)
        elif isinstance(write, InsertTimer):
            write.timer.save(force_insert=True)
        elif isinstance(write, FireTimer):
            Timer.objects.filter(pk=write.timer_id).update(fired_at=write.at)
        elif isinstance(write, ConsumeSignal):
            Signal.objects.filter(pk=write.signal_pk).update(consumed_at=write.at, consumed_by_seq=write.seq)
        elif isinstance(write, InsertChild | CancelChild):
            children(write)
        elif isinstance(write, InsertAsync):
            record = write.record
            # The outside system may have answered before the park (see resolutions.resolve_async).
            early = AsyncActivity.objects.filter(run_id=record.run_id, seq=record.seq, attempt=record.attempt)
            if not early.update(activity=record.activity):
                record.save(force_insert=True)
                _announce_async(record)
        elif isinstance(write, ApplyUpdate):
            running = write.status == UpdateStatus.RUNNING  # its handler waits: no reply yet
            WorkflowUpdate.objects.filter(pk=write.update_pk, status__in=UpdateStatus.open_values()).update(
                status=write.status, applied_seq=write.seq, result=write.result, error=write.error,
                finished_at=None if running else write.at,
            )
            if not running:
                wakeups.update_settled(write.update_pk)
        elif isinstance(write, SetSearchAttributes):
            search_rows.replace(write.run_id, write.created_at, write.values, write.shown)
        elif isinstance(write, ResolveAsync):
            AsyncActivity.objects.filter(pk=write.record_pk).update(
                status=write.status, resolved_at=write.at, error=write.error
            )
        elif isinstance(write, SendSignal):
            target = inbox.lock_open_run(write.workflow_id)
            if target is not None:
                inbox.deliver_signal(target, write.name, write.payload, write.signal_id, write.at)
        elif isinstance(write, SetEvent):
            published.set_event(write.run_id, write.key, write.value, write.seq, write.at)
        elif isinstance(write, AppendStream):
            published.append_stream(write.run_id, write.key, write.value, write.seq, write.at, closed=write.closed)


def _announce_async(record: AsyncActivity) -> None:
    from django_weft import signals

    def send() -> None:
        signals.async_activity_pending.send_robust(
            sender=Workflow, run=record.run, activity=record.activity, seq=record.seq, attempt=record.attempt,
            task_token=record.token,
        )

    transaction.on_commit(send)


_STEP_COLUMNS = ("seq", "kind", "name", "status", "result", "error", "attempt", "failure_category", "started_at",
                 "finished_at")
_STEP_TYPES = ("integer", "varchar", "varchar", "varchar", "bytea", "jsonb", "integer", "varchar", "timestamptz",
               "timestamptz")


def insert_row(obj: Model) -> None:
    """Insert ``obj`` (a new row whose primary key is set) in the caller's transaction, if any.

    On PostgreSQL one server-bound INSERT, without the ORM's save(): a run's start is on every run's path, and
    save() costs more than the statement. Model signals (pre_save, post_save) are not sent for it; the engine
    has signals of its own (``workflow_started``). Elsewhere, save().
    """
    model = type(obj)
    alias = router.db_for_write(model, instance=obj)
    connection = connections[alias]
    if connection.vendor != "postgresql":
        obj.save(force_insert=True, using=alias)
        return
    # Columns left NULL are left out: fewer parameters to adapt and send (a new run leaves a dozen unset).
    present, params = [], []
    for field, read, convert, optional in _insertable(model):
        value = read(obj)
        if value is None and optional:
            continue
        present.append(field)
        params.append(convert(value, connection))
    sql = _insert_statement(model, tuple(present))
    with bound_cursor(connection, statement=sql) as cursor:
        cursor.execute(sql, params)
    obj._state.adding, obj._state.db = False, alias


@cache
def _insertable(model: type[Model]) -> tuple[tuple[Field, Callable[[Model], Any], Converter, bool], ...]:
    """Per column: the field, how to read its value for an insert, how to make it a parameter, and whether a
    NULL may be left out. A field that sets its value on save (auto_now, a pk default) is asked through
    pre_save(); the others' value is their attribute."""
    def reader(field: Field) -> Callable[[Model], Any]:
        plain_date = (type(field).pre_save in (DateField.pre_save, DateTimeField.pre_save)
                      and not getattr(field, "auto_now", False) and not getattr(field, "auto_now_add", False))
        if type(field).pre_save is not Field.pre_save and not plain_date:
            return lambda obj: field.pre_save(obj, True)
        return attrgetter(field.attname)  # a date field without auto_now(_add) saves its attribute as it is
    return tuple((f, reader(f), converter(f), f.null and f.db_default is NOT_PROVIDED)
                 for f in model._meta.concrete_fields if not getattr(f, "generated", False))


@lru_cache(maxsize=64)
def _insert_statement(model: type[Model], fields: tuple[Field, ...]) -> str:
    columns = ", ".join(f'"{field.column}"' for field in fields)
    return f'INSERT INTO "{model._meta.db_table}" ({columns}) VALUES ({", ".join(["%s"] * len(fields))})'


@cache
def _fields(model: type[Model], names: tuple[str, ...]) -> tuple[Field, ...]:
    """``model``'s concrete fields of ``names`` (typed as Fields, which every column written here is)."""
    return tuple(cast(Field, model._meta.get_field(name)) for name in names)


@cache
def _step_columns() -> tuple[tuple[Callable[[Any], Any], Converter], ...]:
    return tuple((attrgetter(field.attname), converter(field)) for field in _fields(WorkflowStep, _STEP_COLUMNS))


@lru_cache(maxsize=64)
def _run_assignments(names: tuple[str, ...]) -> tuple[tuple[str, ...], tuple[Converter, ...], Converter]:
    """For a step commit that sets the run fields ``names``: their columns, their converters, and the run id's
    (looked up once per shape: a field's hash is computed at each lookup)."""
    fields = _fields(Workflow, names)
    return (tuple(str(field.column) for field in fields), tuple(converter(field) for field in fields),
            converter(Workflow._meta.pk))


@cache
def _tables() -> group_commit.Tables:
    return group_commit.Tables(run=Workflow._meta.db_table, step=WorkflowStep._meta.db_table,
                               step_columns=_STEP_COLUMNS, step_types=_STEP_TYPES)


def write_in_one_statement(run_id: Any, fence: int, status: str, fields: dict[str, Any],
                           writes: Sequence[JournalWrite]) -> bool | None:
    """PostgreSQL, outside any transaction: the fenced run UPDATE plus new steps as one statement.

    One round trip and one implicit commit instead of BEGIN, UPDATE, INSERT..., COMMIT: the executor's
    hot path; with other runs' commits of the same moment, one statement for all (group_commit). Returns
    None when it does not apply (another database, an open transaction, writes other than step inserts),
    else whether the fence held (False: nothing was written).
    """
    connection = connections[router.db_for_write(Workflow)]
    if connection.vendor != "postgresql" or connection.in_atomic_block or not connection.get_autocommit():
        return None  # the statement would not commit on its own
    if not all(isinstance(w, InsertStep) for w in writes):
        return None
    if any(hasattr(value, "resolve_expression") for value in fields.values()):
        return None
    columns, converters, run_id_converter = _run_assignments(tuple(fields))
    values = [convert(value, connection) for convert, value in zip(converters, fields.values(), strict=True)]
    steps = [w.step for w in writes]  # type: ignore[union-attr]
    step_columns = _step_columns()
    rows = [[convert(read(step), connection) for read, convert in step_columns] for step in steps]
    request = group_commit.StepCommit(
        run_id=run_id_converter(run_id, connection), fence=fence, status=status,
        assignments=columns, values=values, rows=rows)
    group_commit.commit(connection, request, _tables())
    if not request.held:
        return False
    for step in steps:
        step.pk = request.ids[step.seq]
    return True
