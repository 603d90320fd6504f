"""Start options: validated and made into an unsaved run, before anything is written.

Used by the client's starts, by schedules for their occurrences, and by the replay context for child runs,
so one set of rules (and one error per bad option) holds for every way a run begins.
"""

from __future__ import annotations

import itertools
import uuid
from collections.abc import Iterable
from datetime import datetime, timedelta
from typing import Any

from django_weft.common import attributes, clock, queues
from django_weft.common.codec import encode
from django_weft.common.durations import check_moment, to_seconds
from django_weft.common.registry import WorkflowDefinition
from django_weft.common.storable import check_text
from django_weft.exceptions import InvalidArgument
from django_weft.models import RunStatus, Workflow
from django_weft.models.instances import new_instance
from django_weft.observability import events
from django_weft.store import admissions

MAX_ID_LENGTH = 255
MAX_TAGS = 64
MAX_REASON_LENGTH = 2000


def check_id(value: Any, what: str, *, max_length: int = MAX_ID_LENGTH) -> None:
    if not isinstance(value, str) or not value or len(value) > max_length:
        shown = repr(value) if not isinstance(value, str) or len(value) <= 80 else f"{len(value)} characters"
        raise InvalidArgument(f"{what} must be a non-empty string of at most {max_length} characters, "
                              f"got {shown}")
    check_text(value, what)


def check_opaque_id(value: Any, what: str, *, max_bytes: int = 128) -> str:
    """A caller's deduplication id (signal_id, update_id): opaque, never trimmed, case-folded or normalised."""
    if not isinstance(value, str) or not value:
        raise InvalidArgument(f"{what} must be a non-empty string, got {value!r}")
    check_text(value, what)
    size = len(value.encode("utf-8"))
    if size > max_bytes:
        raise InvalidArgument(f"{what} must be at most {max_bytes} UTF-8 bytes, got {size}")
    return value


def check_reason(reason: Any) -> str:
    if not isinstance(reason, str) or len(reason) > MAX_REASON_LENGTH:
        raise InvalidArgument(f"a reason must be a string of at most {MAX_REASON_LENGTH} characters")
    check_text(reason, "reason")
    return reason


def check_tags(tags: Any) -> list[str]:
    try:  # a bare string is a mistake, not a list of one-character tags
        tag_list = None if isinstance(tags, str | bytes | dict) else list(tags)
    except TypeError:
        tag_list = None
    if tag_list is None or not all(isinstance(t, str) and t for t in tag_list):
        raise InvalidArgument("tags must be an iterable of non-empty strings")
    if len(tag_list) > MAX_TAGS:
        raise InvalidArgument(f"a run takes at most {MAX_TAGS} tags, got {len(tag_list)}")
    for tag in tag_list:
        check_id(tag, "a tag")
    return tag_list


def check_search_attributes(values: Any, current: dict[str, Any] | None = None, *,
                            what: str = "search_attributes") -> tuple[dict[str, Any], dict[str, Any]]:
    """``values`` checked (declared in WEFT_SEARCH_ATTRIBUTES, each of its type; None removes one), and the
    run row's ``search_attributes`` once they are applied over ``current``; InvalidArgument if any is wrong.
    (Each type bounds its values, and the declarations their number, so the row's JSON is bounded too.)"""
    checked = attributes.check_all(values, what)
    return checked, attributes.shown(checked, current)


def prepare_run(
    definition: WorkflowDefinition,
    input: Any = None,
    *,
    workflow_id: str | None = None,
    idempotency_key: str | None = None,
    start_at: datetime | None = None,
    start_after: float | timedelta | None = None,
    execution_timeout: float | timedelta | None = None,
    tags: Iterable[str] = (),
    search_attributes: dict[str, Any] | None = None,
    queue: str | None = None,
    concurrency_key: str | None = None,
    priority: int = 0,
    admitted: bool = False,
) -> Workflow:
    """Validate start options and build the (unsaved) run; raises before anything is written.

    A run on a queue (``queue``, or its type's default), or of a paused type, is prepared queued: admitted by
    its queue (store/admissions) from its start time on. ``admitted`` (a run that continues as new keeps its
    predecessor's slot) prepares it pending whatever its queue."""
    if workflow_id is not None and idempotency_key is not None:
        raise InvalidArgument("pass workflow_id or idempotency_key, not both: an idempotent start picks its own id")
    if workflow_id is not None:
        check_id(workflow_id, "workflow_id")
    if idempotency_key is not None:
        check_id(idempotency_key, "idempotency_key")
    if start_at is not None and start_after is not None:
        raise InvalidArgument("pass start_at or start_after, not both")
    if start_at is not None:
        start_at = check_moment(start_at, "start_at")
    tag_list = check_tags(tags)
    shown_attributes = {} if search_attributes is None else check_search_attributes(search_attributes)[1]
    timeout_seconds = (None if execution_timeout is None
                       else to_seconds(execution_timeout, "execution_timeout", allow_zero=False))
    delay_seconds = None if start_after is None else to_seconds(start_after, "start_after", allow_zero=True)
    queue_name = check_queue_options(definition, queue, concurrency_key, priority, known=not admitted)
    encoded_input = encode(input, what=f"input of workflow {definition.name!r}")

    now = clock.now()
    begins = start_at or (now + timedelta(seconds=delay_seconds) if delay_seconds else now)
    try:
        deadline = None if timeout_seconds is None else begins + timedelta(seconds=timeout_seconds)
    except OverflowError:
        raise InvalidArgument(f"start_at {begins.isoformat()} plus execution_timeout {timeout_seconds:g}s is past "
                              "the last representable date") from None
    run_id = uuid.uuid4()
    queued = not admitted and (bool(queue_name) or definition.name in admissions.paused_types())
    run = new_instance(Workflow, dict(
        run_id=run_id,
        workflow_id=workflow_id or str(run_id),
        workflow_type=definition.name,
        version=definition.version,
        input=encoded_input,
        idempotency_key=idempotency_key,
        tags=tag_list,
        search_attributes=shown_attributes,
        runnable_at=begins,
        execution_deadline=deadline,
        created_at=now,
        updated_at=now,
        trace_context=events.trace_context(),  # its executions link to the trace that started it
        queue=queue_name,
        concurrency_key=concurrency_key,
        priority=priority,
    ))
    if queued:
        run.status, run.admit_at, run.runnable_at = RunStatus.QUEUED, begins, None
        run.queue_order = next(_queue_order)
    return run


_queue_order = itertools.count(1)


MAX_PRIORITY = 2**31 - 1


def check_queue_options(definition: WorkflowDefinition, queue: str | None, concurrency_key: Any,
                        priority: Any, *, known: bool = True) -> str:
    """The queue a run of ``definition`` starts on ("" for none), its options checked (``known``: the queue
    must be one of WEFT_QUEUES now; a run continuing as new keeps its queue even if it has gone since)."""
    name = definition.queue if queue is None else queue
    if name is not None and known:
        queues.check_queue_name(name)
    if concurrency_key is not None:
        check_id(concurrency_key, "concurrency_key")
        if name is None:
            raise InvalidArgument("concurrency_key needs a queue: the queue's concurrency_per_key counts it")
    check_priority(priority)
    return name or ""


def check_priority(priority: Any) -> int:
    if not isinstance(priority, int) or isinstance(priority, bool) or not -MAX_PRIORITY <= priority <= MAX_PRIORITY:
        raise InvalidArgument(f"priority must be an int between {-MAX_PRIORITY} and {MAX_PRIORITY} (lower is "
                              f"admitted first), got {priority!r}")
    return priority
