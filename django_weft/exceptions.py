"""Every error django_weft raises derives from :class:`WeftError`.

Each message says what was wrong and, where it helps, what to do about it.
"""

from __future__ import annotations


class WeftError(Exception):
    """Base class of every django_weft error."""


class ConfigurationError(WeftError):
    """A WEFT_* setting or a registration is invalid."""


class WorkflowNotRegistered(WeftError):
    """No workflow (or activity) is registered under that name."""


class WorkflowVersionNotRegistered(WorkflowNotRegistered):
    """The workflow's name is registered, but not the version a run started on: the run is held, not failed."""

    def __init__(self, message: str, *, name: str, version: int) -> None:
        super().__init__(message)
        self.name = name
        self.version = version


class WorkflowAlreadyRegistered(ConfigurationError):
    """Two different functions were registered under one name."""


class InvalidArgument(WeftError, ValueError):
    """An option passed to the client API is invalid."""


class PayloadError(WeftError, ValueError):
    """A payload cannot be stored."""


class PayloadNotSerializable(PayloadError, TypeError):
    """A payload holds a value the codec cannot encode."""


class PayloadTooLarge(PayloadError):
    """An encoded payload is larger than WEFT_MAX_PAYLOAD_BYTES."""


class PayloadTooDeep(PayloadError, InvalidArgument):
    """A payload nests lists, dicts, tuples or sets deeper than ``common.codec.MAX_DEPTH`` levels (the HTTP API
    answers 422 ``payload_too_deep``)."""


class WorkflowNotFound(WeftError, LookupError):
    """No run matches the workflow id (or run id)."""


class WorkflowAlreadyExists(WeftError):
    """A run with this workflow id already exists."""


class IdempotencyKeyPurged(WeftError):
    """The idempotency key started a run that retention or a purge has since deleted: the key stays spent, so
    nothing new is started (a second run could, say, charge a card twice). ``key``, the ``workflow_id`` and
    ``run_id`` it started, and ``spent_at``, when that run was purged."""

    def __init__(self, message: str, *, key: str, workflow_id: str, run_id: object, spent_at: object) -> None:
        super().__init__(message)
        self.key = key
        self.workflow_id = workflow_id
        self.run_id = run_id
        self.spent_at = spent_at


class WorkflowClosed(WeftError):
    """The run is finished; it accepts no more signals or changes."""


class TransitionNotAllowed(WeftError):
    """The run's status does not allow the requested change."""


class BulkConfirmationError(WeftError):
    """A bulk operation's confirmation token does not confirm it: the runs matching its filter changed since the
    preview, or the token is of another operation or filter, or forged. Nothing was done; preview again."""


class TransactionRoutingError(WeftError):
    """A ``@weft.transaction`` function wrote (or declared a model) on another database than the one django_weft
    records its steps on: its writes could not commit with its step, so nothing it did was kept."""


class FencingError(WeftError):
    """A commit was refused because the run was taken from this executor."""


class NonDeterminismError(WeftError):
    """The workflow code no longer matches the journal recorded for this run.

    ``seq`` is the position, ``recorded`` what the journal holds there and ``requested`` what the code
    asks for (where known)."""

    def __init__(self, message: str, *, seq: int | None = None, recorded: str = "", requested: str = "") -> None:
        super().__init__(message)
        self.seq = seq
        self.recorded = recorded
        self.requested = requested


class ApplicationError(WeftError):
    """A business failure the code raises on purpose: from a workflow it always fails the run (even with
    ``on_error="hold"``); from an activity with ``non_retryable=True`` it is not retried."""

    def __init__(self, message: str, *, non_retryable: bool = False) -> None:
        super().__init__(message)
        self.non_retryable = non_retryable


class ActivityError(WeftError):
    """An activity failed for good (retries exhausted or a non-retryable error).

    Raised inside the workflow by ``ctx.run``; catch it to compensate.
    """

    def __init__(self, message: str, *, activity: str, error_type: str, attempts: int, seq: int | None = None) -> None:
        super().__init__(message)
        self.activity = activity
        self.error_type = error_type
        self.attempts = attempts
        self.seq = seq  # the journal position of the failed step


class AttemptLost(WeftError):
    """An activity attempt was lost with its executor (killed, or its lease ran out while the attempt was in
    flight); the type of the error such an attempt records. The engine raises nothing of this class: the attempt
    counts, and the next one runs (or, past ``max_attempts``, the step fails with this type)."""


class ActivityTimeout(WeftError, TimeoutError):
    """An activity attempt ran longer than its per-attempt ``timeout``, or was silent for longer than its
    ``heartbeat_timeout``."""


class ActivityCancelled(WeftError):
    """Raised by ``weft.heartbeat()`` inside an activity that should stop: its run was cancelled, terminated,
    timed out or taken away, the attempt passed its timeout, or its branch lost a ``ctx.race``. Whatever the
    attempt returns after this is discarded."""


class BranchCancelled(WeftError):
    """A branch lost a ``ctx.race`` and was cancelled; ``pending.result()`` of it raises this."""


class CancelledError(BaseException):
    """Raised inside workflow code by the durable call a run waits in (or its next one) once the run's cancel was
    requested (``handle.cancel()``, a parent's ``request_cancel``, a race its child lost, ``weft.bulk.cancel``).

    A ``BaseException``, like ``asyncio.CancelledError``, so ``except Exception`` does not swallow it. Outside
    ``with ctx.cleanup():`` every further durable call raises it again; let it escape and the run ends
    ``cancelled``."""

    def __init__(self, message: str = "the run's cancel was requested", *, reason: str = "") -> None:
        super().__init__(message)
        self.reason = reason


class WorkflowResultError(WeftError):
    """Base of the errors ``handle.result()`` raises for runs that did not complete."""

    def __init__(self, message: str, *, run_id: object = None, error: dict | None = None) -> None:
        super().__init__(message)
        self.run_id = run_id
        self.error = error or {}


class WorkflowFailed(WorkflowResultError):
    """The run failed."""


class WorkflowCancelled(WorkflowResultError):
    """The run was cancelled."""


class WorkflowTimedOut(WorkflowResultError):
    """The run exceeded its execution timeout."""


class WaitTimeout(WeftError, TimeoutError):
    """``ctx.wait_for_signal`` timed out before a matching signal arrived."""


class QueryNotFound(WeftError, LookupError):
    """The run's code registers no query handler of that name; ``registered`` lists the ones it does."""

    def __init__(self, message: str, *, name: str, registered: list[str]) -> None:
        super().__init__(message)
        self.name = name
        self.registered = registered


class QueryFailed(WeftError):
    """A query handler raised (its exception is the ``__cause__``), or answered what cannot be encoded."""


class UpdateRejected(WeftError):
    """The update was refused before anything was written: the run's code registers no update handler at all where
    it is, or its validator raised (the ``__cause__``). (A name the code does not handle yet, while it handles
    others, is held until the run's next wait: see UpdateNotHandled.)"""

    def __init__(self, message: str, *, name: str, registered: list[str] | None = None) -> None:
        super().__init__(message)
        self.name = name
        self.registered = registered or []


class UpdateNotHandled(UpdateRejected):
    """The update was accepted while the run's code had not registered its handler, and the run reached its next
    wait still without it: it was not applied (``registered`` lists the handlers the code had there)."""


class UpdateFailed(WeftError):
    """The update's handler raised (``error`` holds its type and message; the run goes on), or the run ended
    before it applied the update."""

    def __init__(self, message: str, *, error: dict | None = None) -> None:
        super().__init__(message)
        self.error = error or {}


class StartOrSignalConflict(WeftError):
    """``start_or_signal`` found a finished run and was not allowed to start a new one."""


class InvalidTaskToken(WeftError):
    """The task token is forged, malformed, or names no async activity."""


class TaskTokenAlreadyUsed(InvalidTaskToken):
    """The task token's activity attempt is already resolved (completed, failed, timed out or cancelled)."""


class ChildWorkflowFailed(WeftError):
    """A child workflow did not complete; raised in the parent (catch it to carry on). ``failure_category`` is
    the child's."""

    def __init__(self, message: str, *, workflow_id: str, run_id: object, status: str,
                 error: dict | None = None, failure_category: str = "") -> None:
        super().__init__(message)
        self.workflow_id = workflow_id
        self.run_id = run_id
        self.status = status
        self.error = error or {}
        self.failure_category = failure_category


class ScheduleAlreadyExists(WeftError):
    """A schedule with this schedule_id exists."""


class ScheduleNotFound(WeftError, LookupError):
    """No schedule has this schedule_id."""
