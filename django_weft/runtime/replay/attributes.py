"""Search attributes set by workflow code: ``ctx.set_search_attributes(**values)``, recorded as a step and applied
to the run (its row's ``search_attributes`` and the indexed rows ``weft.list_runs`` filters on) in the commit
that records it, so a replay does not apply it again and a crash cannot apply half of it.
"""

from __future__ import annotations

from typing import Any

from django_weft.common import clock
from django_weft.common.codec import encode
from django_weft.exceptions import InvalidArgument
from django_weft.models import StepKind, StepStatus
from django_weft.runtime.replay.core import ReplayCore, durable
from django_weft.store import journal
from django_weft.store.starts import check_search_attributes


class SearchAttributes(ReplayCore):
    """The replay context's search attributes (mixed into runtime.context.Context)."""

    @durable
    def set_search_attributes(self, **values: Any) -> None:
        """Set search attributes of this run (declared in WEFT_SEARCH_ATTRIBUTES, each of its type); None
        removes one, names not given keep their values. Raises InvalidArgument, recording nothing, for an
        undeclared name or a value of the wrong type."""
        self._refuse_in_handler("ctx.set_search_attributes()")
        if not values:
            raise InvalidArgument("ctx.set_search_attributes() takes at least one attribute: name=value (None "
                                  "removes one)")
        name = ",".join(sorted(values))[:255]
        checked: dict[str, Any] = {}
        shown: dict[str, Any] = {}
        if self._journal.get(self._seq + 1) is None and not self._dry:
            # New work: checked before it takes a position, so a refused call leaves no gap in the journal.
            # A recorded one is not checked again (the declarations may have changed since).
            checked, shown = check_search_attributes(values, self._claim.run.search_attributes,
                                                     what="ctx.set_search_attributes()")
        seq, step = self._next(StepKind.ATTRIBUTES, name)
        if step is not None:
            return  # applied by the commit that recorded it
        self._before_new_work(side_effects=False)
        run = self._claim.run
        now = clock.now()
        data = encode(checked, what="ctx.set_search_attributes()")
        self._defer(self._record(self._step(seq, StepKind.ATTRIBUTES, name, StepStatus.COMPLETED, result=data,
                                            started=now, finished=now), None))
        self._defer(journal.SetSearchAttributes(run.pk, run.created_at, checked, shown))
        run.search_attributes = shown  # what a continue_as_new later in this execution carries over
