"""The replay context handed to workflow functions.

Each durable operation takes the next position (``seq``) in the run's journal. If the journal has an
entry there, the operation returns what was recorded (after checking that the code still asks for the
same kind and name); the first operation without an entry does the work and records its entry (committed
with the run's next write, and always before the next side effect), and an operation that must wait
commits the run as parked and raises :class:`Suspend`.
"""

from __future__ import annotations

from django_weft.runtime.replay.activities import ActivityOps
from django_weft.runtime.replay.attributes import SearchAttributes
from django_weft.runtime.replay.branches import Branches
from django_weft.runtime.replay.children import ChildHandle, Children
from django_weft.runtime.replay.code_branches import CodeBranches
from django_weft.runtime.replay.inbox import Inbox
from django_weft.runtime.replay.info import RunInfo, WorkflowInfo
from django_weft.runtime.replay.lifecycle import Lifecycle
from django_weft.runtime.replay.outgoing import OutgoingSignals
from django_weft.runtime.replay.pending import Pending
from django_weft.runtime.replay.published import Published
from django_weft.runtime.replay.saga import Saga, Sagas
from django_weft.runtime.replay.timers import Timers
from django_weft.runtime.replay.values import RecordedValues

__all__ = ["ChildHandle", "Context", "Pending", "Saga", "WorkflowInfo"]


class Context(ActivityOps, Sagas, CodeBranches, Branches, Timers, Inbox, Children, RecordedValues, SearchAttributes,
              Lifecycle, OutgoingSignals, Published, RunInfo):
    """What a workflow function receives as ``ctx``: every operation family of runtime.replay, over one
    core (runtime.replay.core.ReplayCore) that assigns journal positions and writes."""
