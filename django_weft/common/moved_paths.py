"""Import paths that moved when the package took its layered layout (0.2): each old path still imports, as
the module at its new path, with a DeprecationWarning naming the new one.

Public paths are those ``django_weft.__doc__`` lists; the rest were never promised, but code written against the
flat layout keeps working for a release.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import sys
import warnings
from types import ModuleType

MOVED = {
    "django_weft.codec": "django_weft.common.codec",
    "django_weft.clock": "django_weft.common.clock",
    "django_weft.durations": "django_weft.common.durations",
    "django_weft.storable": "django_weft.common.storable",
    "django_weft.tokens": "django_weft.common.tokens",
    "django_weft.occurrences": "django_weft.common.occurrences",
    "django_weft.registry": "django_weft.common.registry",
    "django_weft.attributes": "django_weft.common.attributes",
    "django_weft.choices": "django_weft.models.choices",
    "django_weft.api_models": "django_weft.models.api_keys",
    "django_weft.heartbeat_models": "django_weft.models.executors",
    "django_weft.update_models": "django_weft.models.updates",
    "django_weft.search_models": "django_weft.models.search",
    "django_weft.audit_models": "django_weft.models.audit",
    "django_weft.querysets": "django_weft.models.querysets",
    "django_weft.instances": "django_weft.models.instances",
    "django_weft.transitions": "django_weft.store.transitions",
    "django_weft.journal": "django_weft.store.journal",
    "django_weft.deliveries": "django_weft.store.inbox",
    "django_weft.resolutions": "django_weft.store.activity_answers",
    "django_weft.repairs": "django_weft.store.repairs",
    "django_weft.terminations": "django_weft.store.terminations",
    "django_weft.forks": "django_weft.store.forks",
    "django_weft.spent_keys": "django_weft.store.spent_keys",
    "django_weft.claim_statement": "django_weft.store.claim_statement",
    "django_weft.signal_statement": "django_weft.store.signal_statement",
    "django_weft.group_commit": "django_weft.store.group_commit",
    "django_weft.lease_renewals": "django_weft.store.leases",
    "django_weft.attribute_rows": "django_weft.store.search_rows",
    "django_weft.wakeups": "django_weft.store.wakeups",
    "django_weft.lock_retries": "django_weft.store.lock_retries",
    "django_weft.bound_cursor": "django_weft.store.bound_cursor",
    "django_weft.starts": "django_weft.store.starts",
    "django_weft.activities": "django_weft.runtime.activities",
    "django_weft.heartbeats": "django_weft.runtime.heartbeats",
    "django_weft.runtime.leases": "django_weft.runtime.lease_keeper",
    "django_weft.client": "django_weft.services.client",
    "django_weft.with_start": "django_weft.services.with_start",
    "django_weft.updates": "django_weft.services.updates",
    "django_weft.queries": "django_weft.services.queries",
    "django_weft.finding": "django_weft.services.visibility",
    "django_weft.filter_text": "django_weft.services.visibility_text",
    "django_weft.bulk": "django_weft.services.bulk",
    "django_weft.schedules": "django_weft.services.schedules",
    "django_weft.schedule_tick": "django_weft.services.schedule_tick",
    "django_weft.maintenance": "django_weft.services.maintenance",
    "django_weft.liveness": "django_weft.services.liveness",
    "django_weft.replay_check": "django_weft.services.replay_check",
    "django_weft.api_keys": "django_weft.services.api_keys",
    "django_weft.runtime.worker": "django_weft.worker.loop",
    "django_weft.runtime.drive": "django_weft.worker.celery_drive",
    "django_weft.runtime.in_caller": "django_weft.worker.in_caller",
    "django_weft.runtime.listener": "django_weft.worker.listener",
    "django_weft.beat": "django_weft.worker.celery_beat",
    "django_weft.task_sends": "django_weft.worker.task_sends",
}


class MovedPathFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Finds an old path in ``MOVED`` and loads it as the module at the new path (the same module object)."""

    def find_spec(self, fullname: str, path: object = None,
                  target: object = None) -> importlib.machinery.ModuleSpec | None:
        if fullname not in MOVED:
            return None
        return importlib.machinery.ModuleSpec(fullname, self)

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        new = MOVED[spec.name]
        warnings.warn(f"{spec.name} moved to {new}; import it from there", DeprecationWarning, stacklevel=2)
        return importlib.import_module(new)

    def exec_module(self, module: ModuleType) -> None:
        """The module at the new path is already executed."""


def install() -> None:
    if not any(isinstance(finder, MovedPathFinder) for finder in sys.meta_path):
        sys.meta_path.append(MovedPathFinder())
