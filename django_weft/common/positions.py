"""Journal positions of branches of workflow code (``ctx.start_branch``): the branch started at position S keeps its
own rows at ``branch_block(S) + 1``, ``+ 2``, ..., so the interleaving of branches never changes a position. A run's
own positions stay below BRANCH_BASE (WEFT_MAX_HISTORY is far smaller); the blocks fit a 32-bit column for branches
started up to position MAX_BRANCH_START."""

from __future__ import annotations

BRANCH_BASE = 1_000_000_000
BRANCH_SPAN = 50_000
MAX_BRANCH_START = (2**31 - 1 - BRANCH_BASE) // BRANCH_SPAN - 1


def branch_block(start_seq: int) -> int:
    """The position before the first row of the branch started at ``start_seq``."""
    return BRANCH_BASE + start_seq * BRANCH_SPAN
