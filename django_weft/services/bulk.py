"""Acting on many runs: ``weft.bulk.cancel / terminate / signal / retry_failed / purge`` (and ``suspend`` and
``resume``, which the admin also offers on "all runs matching this filter").

Every operation takes the filters of :func:`weft.list_runs <.visibility.runs_matching>` as keywords and
is called twice:

* ``dry_run=True`` changes nothing and returns a :class:`BulkPreview`: how many runs it would act on, a sample
  of their ids, and a ``confirmation_token``;
* ``confirmation_token=preview.confirmation_token`` acts and returns a :class:`BulkResult`. If the set of runs
  matching the filter is not the one previewed (a run was started, finished or changed meanwhile), it raises
  :class:`~django_weft.exceptions.BulkConfirmationError` and changes nothing: preview again.

Called with neither, an operation raises InvalidArgument.

**Only the runs an operation applies to are matched**: the filter is narrowed to them (cancel, terminate and
signal: open runs; suspend: pending, running and waiting ones; resume: suspended ones; retry_failed: failed
ones; purge: finished ones), so ``matched`` counts the runs it will act on, not every run the filter names.

The token is signed (``django.core.signing``, with ``SECRET_KEY``) and holds the operation, the filters, the
arguments that shape what is done (reason, signal name; a signal's payload only as a digest, so the token
confirms that payload and no other without showing it) and a digest of the matched run ids,
computed page by page; the same set gives the same token. Acting goes through the confirmed ids in batches of
``BATCH_SIZE``, each run by the same fenced single-run transition as a single call (its own transaction:
no lock is held from one run to the next, so executors and single calls racing the operation wait at most
for one run), and a run that changed state meanwhile is skipped, not an error. Runs that came to match the
filter after the confirmation are left alone. A :class:`~django_weft.models.BulkOperation` audit row is
written before the first batch, its count updated after each batch, and it ends completed or failed.

Call it outside a transaction: inside one, the whole operation is part of yours.
"""

from __future__ import annotations

import hashlib
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from decimal import Decimal
from typing import Any, Literal, overload

from django.core import signing
from django.db import OperationalError, transaction
from django.db.models import QuerySet

from django_weft.common import clock
from django_weft.exceptions import BulkConfirmationError, InvalidArgument, TransitionNotAllowed, WorkflowNotFound
from django_weft.models import BulkOperation, BulkOperationStatus, RunStatus, Workflow
from django_weft.services.client import check_signal
from django_weft.services.maintenance import delete_finished_runs
from django_weft.services.visibility import FILTERS, runs_matching, type_names
from django_weft.store import inbox, repairs, terminations, transitions
from django_weft.store.starts import check_reason

# Runs acted on between two updates of the audit row (and two progress reports).
BATCH_SIZE = 500
# Run ids read per query while the matched set is digested.
DIGEST_PAGE = 2000
SAMPLE_SIZE = 10
# A run whose transition hit a deadlock or a lock timeout is tried again this many times.
ATTEMPTS = 3
SALT = "django_weft.bulk"
TOKEN_VERSION = 2  # 2: the token binds a signal's payload (digest)
# A token confirms for this long (seconds): an old preview is not taken as today's intent (a suspend token
# replayed after a resume, say).
TOKEN_MAX_AGE = 3600

S = RunStatus
# The runs each operation applies to: the filter is narrowed to them.
APPLIES_TO: dict[str, list[str]] = {
    "cancel": S.open_values(),
    "terminate": S.open_values(),
    "signal": S.open_values(),
    "suspend": [S.PENDING, S.RUNNING, S.WAITING],
    "resume": [S.SUSPENDED],
    "retry_failed": [S.FAILED],
    "purge": S.terminal_values(),
}

# progress(done, total): called once the set is confirmed (done = 0) and after every batch.
Progress = Callable[[int, int], None]


@dataclass(frozen=True)
class BulkPreview:
    """What an operation would do: ``matched`` runs (``sample_ids``: the newest of them); pass
    ``confirmation_token`` to the same call to do it."""

    matched: int
    sample_ids: list[uuid.UUID]
    confirmation_token: str


@dataclass(frozen=True)
class BulkResult:
    """What an operation did: ``count`` runs changed; ``skipped`` of the ``matched`` ones had changed meanwhile
    (finished, retried, ...); ``operation_id`` is its BulkOperation audit row."""

    count: int
    matched: int = 0
    skipped: int = 0
    operation_id: int | None = None


@dataclass
class _Operation:
    name: str
    arguments: dict[str, Any]
    apply_one: Callable[[uuid.UUID], bool] | None = None
    apply_many: Callable[[list[uuid.UUID]], int] | None = None
    # Bound by the token but not written to the audit row (a signal's payload digest).
    sealed: dict[str, Any] = field(default_factory=dict)


# --- the operations --------------------------------------------------------------------------------------


@overload
def cancel(reason: str = "", *, dry_run: Literal[True], confirmation_token: None = None,
           requested_by: str = "", progress: Progress | None = None, **filters: Any) -> BulkPreview: ...
@overload
def cancel(reason: str = "", *, dry_run: Literal[False] = False, confirmation_token: str,
           requested_by: str = "", progress: Progress | None = None, **filters: Any) -> BulkResult: ...
def cancel(reason: str = "", *, dry_run: bool = False, confirmation_token: str | None = None,
           requested_by: str = "", progress: Progress | None = None,
           **filters: Any) -> BulkPreview | BulkResult:
    """Cancel the open runs matching ``filters`` (as ``handle.cancel(reason)`` does each)."""
    reason = check_reason(reason)
    op = _Operation("cancel", {"reason": reason},
                    apply_one=lambda run_id: transitions.cancel(run_id, clock.now(), reason))
    return _perform(op, filters, dry_run, confirmation_token, requested_by, progress)


@overload
def terminate(reason: str = "", *, dry_run: Literal[True], confirmation_token: None = None,
              requested_by: str = "", progress: Progress | None = None, **filters: Any) -> BulkPreview: ...
@overload
def terminate(reason: str = "", *, dry_run: Literal[False] = False, confirmation_token: str,
              requested_by: str = "", progress: Progress | None = None, **filters: Any) -> BulkResult: ...
def terminate(reason: str = "", *, dry_run: bool = False, confirmation_token: str | None = None,
              requested_by: str = "", progress: Progress | None = None,
              **filters: Any) -> BulkPreview | BulkResult:
    """End the open runs matching ``filters`` at once, as ``timed_out`` with ``termination_reason="terminated"``
    (their children follow their parent_close_policy)."""
    reason = check_reason(reason)
    op = _Operation("terminate", {"reason": reason}, apply_one=lambda run_id: _terminate_one(run_id, reason))
    return _perform(op, filters, dry_run, confirmation_token, requested_by, progress)


@overload
def signal(name: str, payload: Any = None, *, signal_id: str | None = None, dry_run: Literal[True],
           confirmation_token: None = None, requested_by: str = "", progress: Progress | None = None,
           **filters: Any) -> BulkPreview: ...
@overload
def signal(name: str, payload: Any = None, *, signal_id: str | None = None, dry_run: Literal[False] = False,
           confirmation_token: str, requested_by: str = "", progress: Progress | None = None,
           **filters: Any) -> BulkResult: ...
def signal(name: str, payload: Any = None, *, signal_id: str | None = None, dry_run: bool = False,
           confirmation_token: str | None = None, requested_by: str = "", progress: Progress | None = None,
           **filters: Any) -> BulkPreview | BulkResult:
    """Send signal ``name`` with ``payload`` to each open run matching ``filters``. A signal does not change which
    runs match, so the same token confirms again: pass ``signal_id`` to make a repeat deliver once per run
    (``count`` then leaves out the runs that had it)."""
    data = check_signal(name, payload, signal_id)
    arguments: dict[str, Any] = {"name": name}
    if signal_id is not None:
        arguments["signal_id"] = signal_id
    op = _Operation("signal", arguments, apply_one=lambda run_id: _signal_one(run_id, name, data, signal_id),
                    sealed={"payload_sha256": hashlib.sha256(data).hexdigest()})
    return _perform(op, filters, dry_run, confirmation_token, requested_by, progress)


@overload
def retry_failed(*, dry_run: Literal[True], confirmation_token: None = None,
                 requested_by: str = "", progress: Progress | None = None, **filters: Any) -> BulkPreview: ...
@overload
def retry_failed(*, dry_run: Literal[False] = False, confirmation_token: str,
                 requested_by: str = "", progress: Progress | None = None, **filters: Any) -> BulkResult: ...
def retry_failed(*, dry_run: bool = False, confirmation_token: str | None = None, requested_by: str = "",
                 progress: Progress | None = None, **filters: Any) -> BulkPreview | BulkResult:
    """Retry the failed runs matching ``filters`` from their failed step (see ``repairs.retry_failed``); a run
    whose workflow id has another open run is skipped."""
    op = _Operation("retry_failed", {}, apply_one=lambda run_id: _changed(repairs.retry_failed, run_id))
    return _perform(op, filters, dry_run, confirmation_token, requested_by, progress)


@overload
def suspend(reason: str = "", *, dry_run: Literal[True], confirmation_token: None = None,
            requested_by: str = "", progress: Progress | None = None, **filters: Any) -> BulkPreview: ...
@overload
def suspend(reason: str = "", *, dry_run: Literal[False] = False, confirmation_token: str,
            requested_by: str = "", progress: Progress | None = None, **filters: Any) -> BulkResult: ...
def suspend(reason: str = "", *, dry_run: bool = False, confirmation_token: str | None = None,
            requested_by: str = "", progress: Progress | None = None,
            **filters: Any) -> BulkPreview | BulkResult:
    """Suspend the pending, running and waiting runs matching ``filters``."""
    reason = check_reason(reason)
    op = _Operation("suspend", {"reason": reason},
                    apply_one=lambda run_id: _changed(repairs.suspend, run_id, reason))
    return _perform(op, filters, dry_run, confirmation_token, requested_by, progress)


@overload
def resume(*, dry_run: Literal[True], confirmation_token: None = None,
           requested_by: str = "", progress: Progress | None = None, **filters: Any) -> BulkPreview: ...
@overload
def resume(*, dry_run: Literal[False] = False, confirmation_token: str,
           requested_by: str = "", progress: Progress | None = None, **filters: Any) -> BulkResult: ...
def resume(*, dry_run: bool = False, confirmation_token: str | None = None, requested_by: str = "",
           progress: Progress | None = None, **filters: Any) -> BulkPreview | BulkResult:
    """Resume the suspended runs matching ``filters``."""
    op = _Operation("resume", {}, apply_one=lambda run_id: _changed(repairs.resume, run_id))
    return _perform(op, filters, dry_run, confirmation_token, requested_by, progress)


@overload
def purge(*, dry_run: Literal[True], confirmation_token: None = None,
          requested_by: str = "", progress: Progress | None = None, **filters: Any) -> BulkPreview: ...
@overload
def purge(*, dry_run: Literal[False] = False, confirmation_token: str,
          requested_by: str = "", progress: Progress | None = None, **filters: Any) -> BulkResult: ...
def purge(*, dry_run: bool = False, confirmation_token: str | None = None, requested_by: str = "",
          progress: Progress | None = None, **filters: Any) -> BulkPreview | BulkResult:
    """Delete the finished runs matching ``filters`` with their journal, timers, signals and async records (as
    retention does; one transaction per batch). Cannot be undone."""
    op = _Operation("purge", {}, apply_many=lambda ids: len(delete_finished_runs(ids)))
    return _perform(op, filters, dry_run, confirmation_token, requested_by, progress)


# The permission each operation needs ("django_weft.<codename>"), the one the admin asks for the same action on
# one run; the admin's "all matching" and the HTTP API check it.
PERMISSIONS: dict[str, str] = {
    "cancel": "cancel_workflow", "terminate": "cancel_workflow", "signal": "signal_workflow",
    "retry_failed": "retry_workflow", "suspend": "suspend_workflow", "resume": "suspend_workflow",
    "purge": "purge_workflow",
}

# Every operation by its name (the admin and the weft_runs command look them up here).
OPERATIONS: dict[str, Callable[..., BulkPreview | BulkResult]] = {
    "cancel": cancel, "terminate": terminate, "signal": signal, "retry_failed": retry_failed,
    "suspend": suspend, "resume": resume, "purge": purge,
}


def _changed(transition: Callable[..., Any], run_id: uuid.UUID, *args: Any) -> bool:
    try:
        transition(run_id, clock.now(), *args)
    except TransitionNotAllowed:
        return False
    return True


def _signal_one(run_id: uuid.UUID, name: str, data: bytes, signal_id: str | None) -> bool:
    """As ``client.signal`` delivers it, to this run only (not the run its chain continued to)."""
    with transaction.atomic():
        run = Workflow.objects.select_for_update().filter(pk=run_id).first()
        if run is None or run.is_finished:
            return False
        return inbox.deliver_signal(run, name, data, signal_id, clock.now())


def _terminate_one(run_id: uuid.UUID, reason: str) -> bool:
    # This run only: its chain's next run was not in the confirmed set (nor, maybe, in the filter).
    return terminations.terminate(run_id, clock.now(), reason, follow_chain=False)


# --- preview, confirmation, batches ----------------------------------------------------------------------


def _perform(op: _Operation, filters: dict[str, Any], dry_run: bool, token: str | None, requested_by: str,
             progress: Progress | None) -> BulkPreview | BulkResult:
    if dry_run and token is not None:
        raise InvalidArgument("pass dry_run=True (to preview) or confirmation_token= (to act), not both")
    if not dry_run and token is None:
        raise InvalidArgument(f"bulk {op.name} needs dry_run=True (a preview, changing nothing) or the "
                              "confirmation_token of that preview (to act)")
    if not isinstance(requested_by, str) or len(requested_by) > 255:
        raise InvalidArgument("requested_by must be a string of at most 255 characters")
    described = describe_filters(filters)
    runs = applicable(op.name, filters)
    if dry_run:
        count, digest, _ids = _digest(runs, keep=False)
        sample = list(runs.order_by("-created_at", "-run_id").values_list("pk", flat=True)[:SAMPLE_SIZE])
        return BulkPreview(matched=count, sample_ids=sample,
                           confirmation_token=_token(op, described, count, digest))
    assert token is not None
    claimed = _read_token(token, op, described)
    count, digest, ids = _digest(runs, keep=True)
    if digest != claimed["digest"]:
        raise BulkConfirmationError(
            f"the runs matching this bulk {op.name} changed since the preview ({claimed['matched']} then, {count} "
            "now); nothing was done: preview again")
    return _act(op, described, ids, count, requested_by, progress)


def applicable(operation: str, filters: dict[str, Any]) -> QuerySet[Workflow]:
    """The runs matching ``filters`` that ``operation`` applies to (unordered)."""
    if operation not in APPLIES_TO:
        raise InvalidArgument(f"unknown bulk operation {operation!r}; the operations are {', '.join(APPLIES_TO)}")
    unknown = sorted(set(filters) - set(FILTERS))
    if unknown:
        raise InvalidArgument(f"unknown filter(s) {unknown}; the filters are {', '.join(FILTERS)}")
    return runs_matching(**filters).filter(status__in=APPLIES_TO[operation])


def describe_filters(filters: dict[str, Any]) -> dict[str, Any]:
    """``filters`` as JSON (datetimes as ISO strings, workflow types by name, runs and schedules by id), keys
    and lists in a fixed order: what the token and the audit row hold."""
    described: dict[str, Any] = {}
    for key in sorted(filters):
        value = filters[key]
        if value is None:
            continue
        if key == "type":
            value = type_names(value)
        elif key == "schedule":
            value = getattr(value, "schedule_id", value)
        elif key == "parent":
            value = getattr(value, "run_id", value)
            try:
                value = uuid.UUID(str(value))
            except ValueError:
                pass  # runs_matching says what is wrong with it
        elif key in ("status", "tags", "failure_category") and isinstance(value, str):
            value = [value]
        described[key] = _jsonable(value)
    return described


def _jsonable(value: Any) -> Any:
    if isinstance(value, dict):
        return {str(k): _jsonable(value[k]) for k in sorted(value, key=str)}
    if isinstance(value, list | tuple | set | frozenset):
        items = [_jsonable(item) for item in value]
        return sorted(items, key=repr) if isinstance(value, set | frozenset) or _plain(items) else items
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, Decimal | uuid.UUID):
        return str(value)
    if value is None or isinstance(value, bool | int | float | str):
        return value
    return str(value)


def _plain(items: list[Any]) -> bool:
    """A list of strings or of numbers (whose order means nothing to a filter): sorted."""
    return all(isinstance(item, str) for item in items) or all(
        isinstance(item, int | float) and not isinstance(item, bool) for item in items)


def _digest(runs: QuerySet[Workflow], *, keep: bool) -> tuple[int, str, bytearray]:
    """How many runs ``runs`` holds and a digest of their ids, read in pages by primary key; with ``keep``, the
    ids too (16 bytes each: 100,000 runs take 1.6 MB)."""
    hasher = hashlib.sha256()
    ids = bytearray()
    count = 0
    last: uuid.UUID | None = None
    while True:
        page = runs.order_by("pk")
        if last is not None:
            page = page.filter(pk__gt=last)
        chunk = list(page.values_list("pk", flat=True)[:DIGEST_PAGE])
        for run_id in chunk:
            hasher.update(run_id.bytes)
            if keep:
                ids += run_id.bytes
        count += len(chunk)
        if len(chunk) < DIGEST_PAGE:
            return count, hasher.hexdigest(), ids
        last = chunk[-1]


def _token(op: _Operation, described: dict[str, Any], count: int, digest: str) -> str:
    return signing.dumps({"v": TOKEN_VERSION, "operation": op.name, "filters": described,
                          "arguments": op.arguments, "sealed": op.sealed, "matched": count, "digest": digest},
                         salt=SALT)


def _read_token(token: Any, op: _Operation, described: dict[str, Any]) -> dict[str, Any]:
    if not isinstance(token, str) or not token:
        raise InvalidArgument(f"confirmation_token must be the token of a preview, got {token!r}")
    try:
        claimed = signing.loads(token, salt=SALT, max_age=TOKEN_MAX_AGE)
    except signing.SignatureExpired:
        raise BulkConfirmationError(f"this confirmation token is over {TOKEN_MAX_AGE // 60} minutes old: what it "
                                    "previewed may no longer be what its operator meant; preview again") from None
    except signing.BadSignature:
        raise BulkConfirmationError("this confirmation token was not issued by a bulk preview here (forged, "
                                    "altered or signed with another SECRET_KEY); preview again") from None
    if not isinstance(claimed, dict) or claimed.get("v") != TOKEN_VERSION:
        raise BulkConfirmationError("this confirmation token is of another version; preview again")
    if claimed.get("operation") != op.name:
        raise BulkConfirmationError(f"this confirmation token confirms a bulk {claimed.get('operation')}, not a "
                                    f"bulk {op.name}")
    if claimed.get("filters") != described:
        raise BulkConfirmationError(f"this confirmation token was issued for other filters ({claimed.get('filters')}"
                                    f", not {described}); preview again")
    if claimed.get("arguments") != op.arguments:
        raise BulkConfirmationError(f"this confirmation token was issued for other arguments "
                                    f"({claimed.get('arguments')}, not {op.arguments}); preview again")
    if claimed.get("sealed") != op.sealed:
        raise BulkConfirmationError(f"this confirmation token was issued for another payload of the bulk {op.name}; "
                                    "preview again")
    return claimed


def _act(op: _Operation, described: dict[str, Any], ids: bytearray, matched: int, requested_by: str,
         progress: Progress | None) -> BulkResult:
    audit = BulkOperation.objects.create(operation=op.name, filters=described, arguments=op.arguments,
                                         requested_by=requested_by, matched=matched, started_at=clock.now())
    changed = [0]  # so far, also when a batch fails midway
    try:
        if progress is not None:
            progress(0, matched)
        for start in range(0, matched, BATCH_SIZE):
            batch = [uuid.UUID(bytes=bytes(ids[i * 16:(i + 1) * 16]))
                     for i in range(start, min(start + BATCH_SIZE, matched))]
            _batch(op, batch, changed)
            BulkOperation.objects.filter(pk=audit.pk).update(count=changed[0])
            if progress is not None:
                progress(min(start + BATCH_SIZE, matched), matched)
    except BaseException as exc:  # KeyboardInterrupt included: the row says how far it got
        BulkOperation.objects.filter(pk=audit.pk).update(
            count=changed[0], status=BulkOperationStatus.FAILED, finished_at=clock.now(),
            error={"type": type(exc).__name__, "message": str(exc)[:2000]})
        raise
    count = changed[0]
    BulkOperation.objects.filter(pk=audit.pk).update(count=count, status=BulkOperationStatus.COMPLETED,
                                                     finished_at=clock.now())
    return BulkResult(count=count, matched=matched, skipped=matched - count, operation_id=audit.pk)


def _batch(op: _Operation, batch: list[uuid.UUID], changed: list[int]) -> None:
    """Apply ``op`` to each run of ``batch``, counting the runs it changed in ``changed[0]``."""
    apply_many = op.apply_many
    if apply_many is not None:
        changed[0] += _retrying(lambda: apply_many(batch))
        return
    apply_one = op.apply_one
    assert apply_one is not None
    for run_id in batch:
        changed[0] += _retrying(_one(apply_one, run_id))


def _one(apply_one: Callable[[uuid.UUID], bool], run_id: uuid.UUID) -> Callable[[], int]:
    def action() -> int:
        try:
            return int(apply_one(run_id))
        except WorkflowNotFound:  # purged meanwhile
            return 0

    return action


def _retrying(action: Callable[[], int]) -> int:
    """``action`` (one transaction), tried again after a deadlock or a lock timeout (it was rolled back)."""
    for attempt in range(ATTEMPTS):
        try:
            return action()
        except OperationalError:
            if attempt == ATTEMPTS - 1 or transaction.get_connection().in_atomic_block:
                raise
    raise AssertionError("unreachable")
