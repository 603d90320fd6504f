"""The run page's "Work in flight" panel (design 9.5): the attempts that have not settled, first on the page."""

from __future__ import annotations

import json
from typing import Any

from django.utils.translation import gettext_lazy as _

from django_weft.models import Workflow
from django_weft.services.pending_activities import (
    RUNNING,
    WAITING_FOR_COMPLETION,
    WAITING_FOR_RETRY,
    WAITING_FOR_SLOT,
    pending_activities,
)

STATE_LABELS = {
    RUNNING: _("running"),
    WAITING_FOR_COMPLETION: _("waiting for its async completion"),
    WAITING_FOR_RETRY: _("waiting to retry"),
    WAITING_FOR_SLOT: _("waiting for a slot"),
}


def in_flight_rows(run: Workflow) -> list[dict[str, Any]]:
    """The panel's rows; payloads as JSON text (the template escapes it)."""
    rows = []
    for item in pending_activities(run):
        row = item.as_dict()
        row["state_label"] = STATE_LABELS.get(item.state, item.state)
        row["details_text"] = "" if item.heartbeat_details is None else json.dumps(
            item.heartbeat_details, indent=2, ensure_ascii=False, default=str)
        row["error_text"] = (f"{item.last_error.get('type')}: {item.last_error.get('message')}"
                             if item.last_error else "")
        rows.append(row)
    return rows
