"""django_weft's admin: runs (browse, cancel, retry, suspend, resume, purge, signal, query, update, complete
async activities), schedules (create, edit, pause, resume, trigger, cancel) and executors (read-only: the
processes alive now)."""

from .bulk import BulkOperationAdmin
from .executors import ExecutorAdmin
from .runs import WorkflowAdmin
from .schedules import ScheduleAdmin

__all__ = ["BulkOperationAdmin", "ExecutorAdmin", "ScheduleAdmin", "WorkflowAdmin"]
