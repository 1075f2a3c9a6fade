"""What of an index file changed since it was last made durable, and a shard's sync of it in pieces.

An index file changes in its header and slot table (random writes: a second's keys dirty nearly
all 20 MB of it) and in its entries (appended; a trim zeroes some past the kept ones).
`ChangedRanges` keeps that account for one file: `take` hands a sync the byte ranges that
changed and counts them synced, `untake` gives them back when the sync did not finish.
`PacedSync` is a shard's sync of what it took from its files, one piece at a time
(ShardIndex.begin_paced_sync), so the disk gets a little at a time instead of every changed
page in one fdatasync that the commitlog's group commit queues behind
(see docs/DECISIONS.md#paced-index-sync).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, NamedTuple

from engine.formats.index_file import entry_pos, slot_pos

if TYPE_CHECKING:
    from engine.index_file import IndexFile


class TakenRanges(NamedTuple):
    """Byte ranges a sync took from a file, and the account from before, which `untake` restores."""

    ranges: list[tuple[int, int]]
    synced_count_before: int
    zeroed_end_before: int


class ChangedRanges:
    """One index file's account: entries [1, synced_count) are on disk, [synced_count,
    zeroed_end) were zeroed by a trim, and `header_changed` says a trim or a restore rewrote the
    header or slots (puts show as entries past synced_count)."""

    def __init__(self, slot_count: int, synced_count: int):
        self.slot_count = slot_count
        self.synced_count = synced_count
        self.zeroed_end = 0
        self.header_changed = False

    def entries_zeroed(self, count: int, end: int) -> None:
        """A trim kept `count` entries and zeroed entries up to `end`."""
        self.synced_count = min(self.synced_count, count)
        self.zeroed_end = max(self.zeroed_end, end)

    def take(self, index_count: int) -> TakenRanges | None:
        """The byte ranges changed -- header and slot table, and the new or zeroed entries --
        now counted as synced; None when nothing changed."""
        end = max(index_count, self.zeroed_end)
        if index_count == self.synced_count and end <= index_count and not self.header_changed:
            return None
        ranges = [(0, slot_pos(self.slot_count))]
        start = min(self.synced_count, index_count)
        if end > start:
            ranges.append((entry_pos(self.slot_count, start), entry_pos(self.slot_count, end)))
        taken = TakenRanges(ranges, self.synced_count, self.zeroed_end)
        self.synced_count, self.zeroed_end, self.header_changed = index_count, 0, False
        return taken

    def untake(self, taken: TakenRanges) -> None:
        """Ranges taken but not all synced are changed again (the next take has them)."""
        self.synced_count = min(self.synced_count, taken.synced_count_before)
        self.zeroed_end = max(self.zeroed_end, taken.zeroed_end_before)
        self.header_changed = True


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
