"""Which pages of an index file's header and slot table have disk blocks (SlotPages).

A slot table is allocated a page at a time, when a key first hashes into the page, rather than
whole when the file is created: a new index file then costs one page of disk, not
`slot_count` x 4 bytes (20 MB at the default 5M slots). The format is unchanged: a page never
allocated reads as zeros, which are empty slots, as RocketMQ's sparse files read.

Slots are written through the mapping (engine.index.file), and a store into an unallocated page
on a full disk is a SIGBUS, so every page a batch will write is allocated before the batch
writes anything (docs/DECISIONS.md#reserve-blocks-ahead): DiskFullError, nothing written.
What this object does not know (a file opened again) is allocated again: a posix_fallocate of
blocks a file has already costs no disk.

Reads take the same care: a read fault on a tmpfs hole allocates the page (and on a full tmpfs
is a SIGBUS), so a lookup reads a slot through the mapping only on a page known to have blocks,
and with pread elsewhere (`unknown_slot_head`), which reads a hole as zeros and allocates nothing.
"""

from __future__ import annotations

import os

import numpy as np

from engine.files.filesystem import PAGE_BYTES
from engine.files.mapped_file import MappedFile
from engine.formats.index_file import SLOT, SLOT_DTYPE, SLOT_SIZE, slot_pos

_slot_unpack = SLOT.unpack_from


class SlotPages:
    """The allocated pages among file bytes [0, slot_pos(slot_count)): the header's and slots'."""

    def __init__(self, slot_count: int):
        self.slot_count = slot_count
        page_count = -(-slot_pos(slot_count) // PAGE_BYTES)
        self._allocated = bytearray(page_count)  # 1: the page has blocks
        self._allocated_view = np.frombuffer(self._allocated, dtype=np.bool_)
        self._unallocated_pages = page_count  # 0: every put skips the lookup

    def allocated(self, start_pos: int, end_pos: int) -> None:
        """Pages of [start_pos, end_pos) have blocks: the header's at create, those holding data at open."""
        self._mark(start_pos // PAGE_BYTES, -(-end_pos // PAGE_BYTES))

    def _mark(self, first_page: int, end_page: int) -> None:
        view = self._allocated_view[first_page:end_page]
        self._unallocated_pages -= len(view) - int(np.count_nonzero(view))
        view[:] = True

    @property
    def has_blocks(self) -> bytearray:
        """Per page, 1 when it has blocks: a slot there reads through the mapping."""
        return self._allocated

    def unknown_slot_head(self, read_fd: int, spos: int) -> int:
        """The head at file byte `spos`, on a page not known to have blocks, read with pread on
        `read_fd` (a hole reads as 0, allocating nothing). A head found marks its page, which
        then holds data, so the next lookup there reads through the mapping."""
        head = _slot_unpack(os.pread(read_fd, SLOT_SIZE, spos), 0)[0]
        if head:
            page = spos // PAGE_BYTES
            self._mark(page, page + 1)
        return head

    def reserve_few(self, mapped: MappedFile, key_hashes: list[int]) -> None:
        """Allocate the slot pages a few keys hash into, key by key (no numpy fixed cost)."""
        if not self._unallocated_pages:
            return
        allocated, slot_count = self._allocated, self.slot_count
        missing = {slot_pos(key_hash % slot_count) // PAGE_BYTES for key_hash in key_hashes}
        missing = [page for page in missing if not allocated[page]]
        if missing:
            self._allocate_pages(mapped, np.array(sorted(missing), dtype=np.int64))

    def reserve_slots(self, mapped: MappedFile, slots: np.ndarray) -> None:
        """Allocate the pages holding `slots` (slot numbers), in runs of adjacent pages."""
        if not self._unallocated_pages:
            return
        pages = np.unique((slot_pos(0) + slots.astype(np.int64) * SLOT_SIZE) // PAGE_BYTES)
        missing = pages[~self._allocated_view[pages]]
        if len(missing):
            self._allocate_pages(mapped, missing)

    def _allocate_pages(self, mapped: MappedFile, pages: np.ndarray) -> None:
        """Allocate sorted distinct `pages`, each run of adjacent ones with one posix_fallocate;
        a run is marked only once its allocation succeeded."""
        run_starts = np.flatnonzero(np.diff(pages) != 1) + 1
        for run in np.split(pages, run_starts):
            first, last = int(run[0]), int(run[-1])
            mapped.allocate(first * PAGE_BYTES, (last + 1) * PAGE_BYTES)
            self._mark(first, last + 1)


def stored_slot_heads(mapped: MappedFile, slot_count: int) -> np.ndarray:
    """Every slot head of the file (a copy), read only from the pages that hold data: the others
    are empty slots, and a read fault on one would allocate it on tmpfs (its faults allocate)."""
    heads = np.zeros(slot_count, dtype=np.int32)
    for lo, hi in mapped.data_ranges(slot_pos(0), slot_pos(slot_count)):
        first, end = (lo - slot_pos(0)) // SLOT_SIZE, -(-(hi - slot_pos(0)) // SLOT_SIZE)
        heads[first:end] = np.frombuffer(mapped.buf, dtype=SLOT_DTYPE, count=end - first,
                                         offset=slot_pos(first))
    return heads
