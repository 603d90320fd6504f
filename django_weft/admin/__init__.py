"""django_weft's admin: runs (browse, cancel, retry, suspend, resume, purge, signal, complete async
activities) and schedules (create, edit, pause, resume, trigger, cancel)."""

from .runs import WorkflowAdmin
from .schedules import ScheduleAdmin

__all__ = ["ScheduleAdmin", "WorkflowAdmin"]
