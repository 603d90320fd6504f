"""django_weft's admin: runs (browse, cancel, retry, suspend, resume, purge, signal, query, update, complete
async activities), schedules (create, edit, pause, resume, trigger, cancel), executors (read-only: the
processes alive now) and the HTTP API's keys (create, shown once; revoke)."""

from .api_keys import ApiKeyAdmin
from .bulk import BulkOperationAdmin
from .executors import ExecutorAdmin
from .runs import WorkflowAdmin
from .schedules import ScheduleAdmin

__all__ = ["ApiKeyAdmin", "BulkOperationAdmin", "ExecutorAdmin", "ScheduleAdmin", "WorkflowAdmin"]
