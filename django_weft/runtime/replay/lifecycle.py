"""How a run's code evolves and how a long run renews itself: ``ctx.patched`` / ``ctx.deprecate_patch`` (a
marker in the journal says which side of a change a run is on) and ``ctx.continue_as_new``.
"""

from __future__ import annotations

from typing import Any, NoReturn

from django_weft.common import clock
from django_weft.common.codec import encode
from django_weft.models import StepKind, StepStatus
from django_weft.runtime.errors import ContinueAsNew
from django_weft.runtime.replay.core import ReplayCore, durable
from django_weft.store.starts import check_id


class Lifecycle(ReplayCore):
    """The replay context's patches and continue-as-new (mixed into runtime.context.Context)."""

    @durable
    def patched(self, change_id: str) -> bool:
        """True where the run takes the code added by change ``change_id``.

        At the run's frontier (new runs, and a run that reaches this line on new code) a marker is
        recorded and True returned; replaying a journal with the marker here returns True; replaying one
        with some other step here (the run passed this point on old code) returns False and consumes
        nothing, so the old code path replays as it was recorded.
        """
        check_id(change_id, "a patch's change_id", max_length=255)
        self._refuse_in_handler(f"ctx.patched({change_id!r})")
        seq = self._seq + 1
        step = self._journal.get(seq)
        if step is not None:
            if step.kind == StepKind.PATCH and step.name == change_id:
                self._seq = seq
                return True
            return False
        if seq <= self._journal_end:
            return False  # a gap a branch in flight left: the run has rows past this point, from the old code
        self._seq = seq
        self._before_new_work(side_effects=False)
        now = clock.now()
        self._defer(self._record(self._step(seq, StepKind.PATCH, change_id, StepStatus.COMPLETED, started=now,
                                            finished=now), None))
        return True

    @durable
    def deprecate_patch(self, change_id: str) -> None:
        """The cleanup of ``patched(change_id)`` once no open run lacks its marker: consumes the marker
        where a run has one, records nothing where it has not. Remove it when no open run has the marker."""
        check_id(change_id, "a patch's change_id", max_length=255)
        self._refuse_in_handler(f"ctx.deprecate_patch({change_id!r})")
        step = self._journal.get(self._seq + 1)
        if step is not None and step.kind == StepKind.PATCH and step.name == change_id:
            self._seq += 1

    @durable
    def continue_as_new(self, input: Any = None) -> NoReturn:
        """End this run as ``continued`` and start the next run of the same workflow id with ``input``, in
        one transaction: same type (its newest version), tags, search attributes (those still declared), schedule
        and parent;
        signals not consumed yet move to it. The journal starts empty, so a run that loops forever stays
        cheap to wake. Handles' ``result()`` follows the chain."""
        self._refuse_in_handler("ctx.continue_as_new()")
        data = encode(input, what=f"input of the run continuing workflow {self._claim.run.workflow_type!r}")
        self._before_new_work(side_effects=False)
        raise ContinueAsNew(data)
