"""django_weft's admin: runs (browse, cancel, retry, suspend, resume, purge, signal, query, update, complete
async activities), schedules (create, edit, pause, resume, trigger, cancel), executors (read-only: the
processes alive now) and the HTTP API's keys (create, shown once; revoke)."""

from django_weft.admin.api_keys import ApiKeyAdmin
from django_weft.admin.bulk import BulkOperationAdmin
from django_weft.admin.executors import ExecutorAdmin
from django_weft.admin.queues import PausedTypeAdmin, QueueStateAdmin
from django_weft.admin.runs import WorkflowAdmin
from django_weft.admin.schedules import ScheduleAdmin

__all__ = ["ApiKeyAdmin", "BulkOperationAdmin", "ExecutorAdmin", "PausedTypeAdmin", "QueueStateAdmin", "ScheduleAdmin",
           "WorkflowAdmin"]
