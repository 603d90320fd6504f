"""The replay context handed to workflow functions.

Each durable operation takes the next position (``seq``) in the run's journal. If the journal has an
entry there, the operation returns what was recorded (after checking that the code still asks for the
same kind and name); the first operation without an entry does the work and records its entry (committed
with the run's next write, and always before the next side effect), and an operation that must wait
commits the run as parked and raises :class:`Suspend`.
"""

from __future__ import annotations

from .replay.activities import ActivityOps
from .replay.attributes import SearchAttributes
from .replay.branches import Branches
from .replay.children import ChildHandle, Children
from .replay.inbox import Inbox
from .replay.lifecycle import Lifecycle
from .replay.pending import Pending
from .replay.timers import Timers
from .replay.values import RecordedValues

__all__ = ["ChildHandle", "Context", "Pending"]


class Context(ActivityOps, Branches, Timers, Inbox, Children, RecordedValues, SearchAttributes, Lifecycle):
    """What a workflow function receives as ``ctx``: every operation family of runtime.replay, over one
    core (runtime.replay.core.ReplayCore) that assigns journal positions and writes."""
