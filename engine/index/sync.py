"""A shard's sync of its index files in pieces (ShardIndex.begin_paced_sync).

`PacedSync` syncs the byte ranges it took from its files (engine.index.changes.ChangedRanges)
one piece at a time, so the disk gets a little at a time instead of every changed page in one
fdatasync that the commitlog's group commit queues behind (see docs/DECISIONS.md#paced-index-sync).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from engine.index.changes import TakenRanges

if TYPE_CHECKING:
    from engine.index.file import IndexFile


@dataclass
class PacedSync:
    """A sync in pieces: the position it makes durable, its pieces (file, start, end) in order,
    and what it took from each file (given back if it is cancelled)."""

    target_pos: int
    pieces: list[tuple[IndexFile, int, int]]
    taken: list[tuple[IndexFile, TakenRanges]]
    next_piece: int = 0

    @classmethod
    def of(cls, target_pos: int, taken: list[tuple[IndexFile, TakenRanges]], piece_bytes: int) -> PacedSync:
        """The ranges taken from each file, cut in pieces of at most `piece_bytes`."""
        pieces = [(f, lo, min(lo + piece_bytes, hi)) for f, t in taken for start, hi in t.ranges
                  for lo in range(start, hi, piece_bytes)]
        return cls(target_pos, pieces, taken)

    def sync_next(self) -> bool:
        """Sync the next piece, if any; True when none is left."""
        if self.next_piece < len(self.pieces):
            index_file, lo, hi = self.pieces[self.next_piece]
            index_file.sync_range(lo, hi)
            self.next_piece += 1
        return self.next_piece >= len(self.pieces)

    def cancel(self) -> None:
        """Give back to each file what was taken from it: its next sync has it again."""
        for index_file, taken in self.taken:
            index_file.untake(taken)
