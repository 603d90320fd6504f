"""``POST bulk/<operation>``: weft.bulk over HTTP, called twice as in Python: ``"dry_run": true`` previews
(``matched``, ``sample_ids``, ``confirmation_token``) and changes nothing; the same body with that
``confirmation_token`` acts (``count``, ``audit_id``), or answers 409 ``bulk_set_changed`` if the runs matching
the filters changed meanwhile. Each operation needs the permission the admin asks for it.
"""

from __future__ import annotations

import uuid
from typing import Any, Literal

from django.http import HttpRequest
from ninja import Router, Schema
from pydantic import Field

from django_weft.api.auth import caller, require
from django_weft.api.filters import RunFilters, to_keywords
from django_weft.api.schemas import ERRORS, Body
from django_weft.exceptions import InvalidArgument
from django_weft.services import bulk
from django_weft.services.bulk import BulkPreview

router = Router(tags=["bulk"])

Operation = Literal["cancel", "terminate", "signal", "retry_failed", "suspend", "resume", "purge"]

# The body fields each operation takes besides the filters and the confirmation.
ARGUMENTS: dict[str, tuple[str, ...]] = {
    "cancel": ("reason",), "terminate": ("reason",), "suspend": ("reason",),
    "signal": ("signal", "payload", "signal_id"),
}


TAKEN = frozenset(name for names in ARGUMENTS.values() for name in names)


class BulkIn(Body):
    filters: RunFilters = Field(default_factory=lambda: RunFilters.model_validate({}),
                                description="The filters of GET runs (none: every run the operation applies to).")
    dry_run: bool = False
    confirmation_token: str | None = Field(None, min_length=1, max_length=4096,
                                           description="The token of the preview, to act.")
    reason: str = Field("", max_length=1000, description="cancel, terminate, suspend.")
    signal: str | None = Field(None, min_length=1, max_length=255, description="signal: the signal's name.")
    payload: Any = Field(None, description="signal: the payload.")
    signal_id: str | None = Field(None, min_length=1, max_length=128,
                                  description="signal: delivers once per run, however often it is repeated.")


class BulkOut(Schema):
    matched: int = Field(description="The runs the operation applies to (previewed or confirmed).")
    sample_ids: list[uuid.UUID] | None = Field(None, description="Preview: the newest of them.")
    confirmation_token: str | None = Field(None, description="Preview: send it back to act.")
    count: int | None = Field(None, description="Done: the runs changed.")
    skipped: int | None = Field(None, description="Done: matched runs that had changed meanwhile.")
    audit_id: int | None = Field(None, description="Done: the BulkOperation audit record.")


@router.post("bulk/{operation}", url_name="bulk", response={200: BulkOut, **ERRORS},
             summary="Preview or act on many runs")
def perform(request: HttpRequest, operation: Operation, body: BulkIn) -> dict[str, Any]:
    require(request, bulk.PERMISSIONS[operation])
    ignored = sorted(name for name in body.model_fields_set & TAKEN if name not in ARGUMENTS.get(operation, ()))
    if ignored:  # it would be dropped silently, and look applied
        raise InvalidArgument(f"bulk {operation} takes no {', '.join(ignored)}")
    arguments = {name: getattr(body, name) for name in ARGUMENTS.get(operation, ())}
    if operation == "signal":
        arguments["name"] = arguments.pop("signal")
    outcome = bulk.OPERATIONS[operation](
        **arguments, dry_run=body.dry_run, confirmation_token=body.confirmation_token,
        requested_by=caller(request), **to_keywords(body.filters))
    if isinstance(outcome, BulkPreview):
        return {"matched": outcome.matched, "sample_ids": outcome.sample_ids,
                "confirmation_token": outcome.confirmation_token}
    return {"matched": outcome.matched, "count": outcome.count, "skipped": outcome.skipped,
            "audit_id": outcome.operation_id}
