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


def position_label(seq: int) -> str:
    """A journal position as people read it: the run's own as themselves ("7"), a branch's as the position that
    started the branch and the row's place in it ("3.2": the second row of the branch started at 3)."""
    if seq < BRANCH_BASE:
        return str(seq)
    start, offset = divmod(seq - BRANCH_BASE, BRANCH_SPAN)
    return f"{start}.{offset}"


def missing_positions(seqs: set[int]) -> list[int]:
    """The positions without a row below the last of the run's own and, in each branch's block, below the last of
    that branch's (rows of branches still running or never settled)."""
    blocks: dict[int, int] = {}
    for seq in seqs:
        block = 0 if seq < BRANCH_BASE else seq - (seq - BRANCH_BASE) % BRANCH_SPAN
        blocks[block] = max(blocks.get(block, seq), seq)
    return [seq for block, last in sorted(blocks.items()) for seq in range(block + 1, last) if seq not in seqs]
