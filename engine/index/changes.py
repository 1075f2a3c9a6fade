"""What of an index file changed since it was last made durable: one file's account for its syncs.

An index file changes in its header and slot table (random writes: a second's keys dirty nearly
all 20 MB of it) and in its entries (appended; a trim zeroes some past the kept ones).
`ChangedRanges` keeps that account for one file: `take` hands a sync the byte ranges that
changed and counts them synced, `untake` gives them back when the sync did not finish.
"""

from __future__ import annotations

from typing import NamedTuple

from engine.formats.index_file import entry_pos, slot_pos


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
