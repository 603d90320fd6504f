"""The run page's "Work in flight" panel (design 9.5): the attempts that have not settled, first on the page."""

from __future__ import annotations

import json
from typing import Any

from django.utils.translation import gettext_lazy as _

from django_weft.admin.common import moment
from django_weft.common import privacy
from django_weft.common.positions import position_label
from django_weft.models import Workflow
from django_weft.services.pending_activities import (
    RETRIES_PAUSED,
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
    RETRIES_PAUSED: _("retries paused by an operator"),
}


# The step controls that apply to an attempt in each state (the panel links to the step-control form with them).
CONTROLS = {
    WAITING_FOR_RETRY: (("fire_timer_now", _("retry now")), ("pause_retries", _("pause retries")),
                        ("reset_attempts", _("reset attempts")), ("set_activity_options", _("change policy"))),
    RETRIES_PAUSED: (("unpause_retries", _("unpause retries")), ("reset_attempts", _("reset attempts")),
                     ("set_activity_options", _("change policy"))),
    WAITING_FOR_COMPLETION: (("reset_attempts", _("reset attempts")), ("set_activity_options", _("change policy"))),
}


def in_flight_rows(run: Workflow, control_url: str = "") -> list[dict[str, Any]]:
    """The panel's rows; payloads as JSON text (the template escapes it); with ``control_url`` (the user may control
    steps), links to the step controls that apply."""
    rows = []
    for item in pending_activities(run):
        row = item.as_dict()
        row["state_label"] = STATE_LABELS.get(item.state, item.state)
        if item.executor_silent:
            row["state_label"] = _("running, but its executor has not been seen since %(moment)s (killed or stalled): "
                                   "another executor takes the run over once its lease runs out") % {
                "moment": moment(item.executor_last_seen)}
        row["position"] = position_label(item.seq)
        for name in ("started_at", "last_heartbeat_at", "timeout_at", "next_retry_at"):  # as the rest of the page
            row[name] = moment(getattr(item, name)) if getattr(item, name) is not None else None
        details = item.heartbeat_details
        row["details_text"] = "" if details is None else privacy.shown_value(
            json.dumps(details, ensure_ascii=False, default=str) if privacy.visible() else "")  # compact: a narrow cell
        row["error_text"] = (f"{item.last_error.get('type')}: {item.last_error.get('message')}"
                             if item.last_error else "")
        row["controls"] = [{"label": label, "url": f"{control_url}?seq={item.seq}&control={name}"}
                           for name, label in CONTROLS.get(item.state, ())] if control_url else []
        rows.append(row)
    return rows
