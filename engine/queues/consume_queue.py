"""A consume queue: one (topic, queue id)'s 20-byte entries that point into the commitlog.

One queue lives in <root>/consumequeue/<topic>/<queueId>/ as files of `entries_per_file`
entries, each named by its logical byte offset (entry index x 20). Entry n (its queue
offset) sits at logical byte n x 20; a queue that starts past 0 keeps its offsets, and the
part of its first file below the start holds filler entries (RocketMQ's fillPreBlank).
Consume queues are derived data: whatever is wrong with one is rebuilt from the commitlog.

An entry is *valid* when commit_pos >= 0 and size > 0 (fillers included, RocketMQ §3.3);
the first invalid entry (zeros: never written) ends the queue. Rules mqstore adds:
- `put_entries` is idempotent by queue offset (a re-dispatched entry, compared whole, returns False) and
  refuses a gap or a conflicting entry with CorruptConsumeQueueError (RocketMQ #7355 appended
  anyway);
- `recover(durable_pos)` trusts the entries below the durable position only: those past it may
  be torn by a power loss (a 20-byte entry can straddle two disk sectors), so re-dispatch
  compares them whole and rewrites one that differs, and `drop_unconfirmed` (run by
  `ConsumeQueueTable.truncate_all_from`, after re-dispatch) drops those re-dispatch did not reach;
- recovery and truncation zero the stale bytes behind the last valid entry (DESIGN §5.4);
  bytes behind an invalid entry only once re-dispatch has put the entries back from their
  records (`cut_offset`, `clear_cut_tail`), so a crash before that leaves the same evidence;
- every "last entry" read is guarded against empty files (RocketMQ #9728);
- a write that touches a page not yet allocated reserves blocks first (`MappedFile.reserve`), so
  a full disk gives DiskFullError before any byte of the batch is written, never SIGBUS.

`min_offset` is kept in memory; `load` puts it after the leading fillers of the first file and
`correct_min_offset` moves it past entries whose records retention has deleted (recovery and
retention in the writer; a reader before each read, as its view loads the file start).
"""

from __future__ import annotations

import bisect
import os
import struct
from collections.abc import Callable
from enum import Enum
from pathlib import Path
from typing import NoReturn

import numpy as np

from engine.errors import BadInputError, CorruptConsumeQueueError, DiskFullError
from engine.files.filesystem import DISK_FULL_ERRNOS
from engine.files.mapped_file import Access, MappedFile, ReadAhead, reserve_end
from engine.files.naming import consume_queue_dir, offset_to_name, validate_topic
from engine.files.open_files import OpenFileBudget
from engine.files.segment_queue import SegmentQueue
from engine.formats.cq_entry import (
    CQ_DTYPE,
    CQ_ENTRY,
    CQ_ENTRY_SIZE,
    FILLER_ENTRY,
    CqEntry,
    decode_cq_entry,
    encode_cq_entry,
)
from engine.tuning import FEW_QUEUE_ENTRIES

_FILLER_BYTES = encode_cq_entry(*FILLER_ENTRY)
_entry_unpack = CQ_ENTRY.unpack_from
_entry_pack = CQ_ENTRY.pack
_SCAN_CHUNK_ENTRIES = 4096
_RECOVER_FILES = 3  # RocketMQ recovers from the third-to-last file


class Boundary(Enum):
    """Which entry offset_for_time picks among equal store times (RocketMQ BoundaryType)."""

    LOWER = "lower"
    UPPER = "upper"


class _NoStoreTime(Exception):
    pass


class ConsumeQueue:
    """One queue's entries; offsets are queue offsets, `lpos` is a logical byte offset."""

    def __init__(self, topic: str, queue_id: int, segments: SegmentQueue, entries_per_file: int):
        self.topic = topic
        self.queue_id = queue_id
        self.segments = segments
        self.entries_per_file = entries_per_file
        self._min_offset = self._max_offset = self._flushed_offset = 0
        self._max_commit_end = 0
        # logical bytes [from, to) whose blocks are allocated: a write inside needs no reserve
        self._reserved_from_lpos = self._reserved_to_lpos = 0
        # after recover(durable_pos): entries [from, end) are past the durable position and not
        # yet confirmed by re-dispatch, which confirmed (or repaired) them up to `confirmed`
        self._unconfirmed_from = self._unconfirmed_end = self._confirmed_end = 0
        # after recover(): the offset from which re-dispatch must put entries back (None: none)
        self.cut_offset: int | None = None

    @classmethod
    def load(cls, root: Path, topic: str, queue_id: int, entries_per_file: int,
             access: Access, budget: OpenFileBudget | None = None) -> ConsumeQueue:
        """Map the queue's files (none yet is fine) and find its last valid entry; with a
        `budget` (shared by a table's queues), files beyond it are closed until used."""
        validate_topic(topic)
        check_queue_id(queue_id)
        # no read-around: a reader's scan past the last entry would zero-fill the reserved rest
        # of the file at once (see docs/DECISIONS.md#read-ahead-own-page)
        segments = SegmentQueue.load(consume_queue_dir(root, topic, queue_id),
                                     entries_per_file * CQ_ENTRY_SIZE, access, ReadAhead.OWN_PAGE,
                                     budget)
        queue = cls(topic, queue_id, segments, entries_per_file)
        if segments.segments:
            first = segments.segments[0]
            queue._min_offset = segments.min_pos // CQ_ENTRY_SIZE + _filler_prefix(first)
            queue._max_offset = queue._flushed_offset = queue._scan_forward(queue._recover_from())
            queue._min_offset = min(queue._min_offset, queue._max_offset)
            queue._update_commit_end()
        return queue

    @property
    def min_offset(self) -> int:
        return self._min_offset

    @property
    def max_offset(self) -> int:
        """The next queue offset to write (counts the offsets below min_offset too)."""
        return self._max_offset

    @property
    def flushed_offset(self) -> int:
        return self._flushed_offset

    @property
    def max_commit_end(self) -> int:
        """commit_pos + size of the last entry; 0 when the queue holds none."""
        return self._max_commit_end

    @property
    def file_bytes(self) -> int:
        return self.entries_per_file * CQ_ENTRY_SIZE

    # ------------------------------------------------------------------ write

    def put_entries(self, queue_offsets, commit_positions, sizes, tags_codes) -> int:
        """Write entries (columns as lists or numpy arrays) by the rules above; returns the entries
        written, repaired ones included (0: all were there). All or nothing on a full disk.
        One entry, or an appended run of up to FEW_QUEUE_ENTRIES, is packed with struct: numpy's
        fixed cost a call is more than their work; anything else takes the numpy way."""
        count = len(queue_offsets)
        if not count == len(commit_positions) == len(sizes) == len(tags_codes):
            raise BadInputError("put_entries", "columns of different lengths")
        if count == 1:
            return self._put_one(int(queue_offsets[0]), int(commit_positions[0]), int(sizes[0]),
                                 int(tags_codes[0]))
        if 0 < count <= FEW_QUEUE_ENTRIES:
            columns = [c if isinstance(c, list) else np.asarray(c).tolist()
                       for c in (queue_offsets, commit_positions, sizes, tags_codes)]
            if self._append_run(*columns):
                return count
        return self._put_arrays(np.asarray(queue_offsets, dtype=np.int64),
                                np.asarray(commit_positions, dtype=np.int64),
                                np.asarray(sizes, dtype=np.int64), np.asarray(tags_codes, dtype=np.int64))

    def _put_one(self, queue_offset: int, commit_pos: int, size: int, tags_code: int) -> int:
        """One entry into the mapping; 0 if it is already there (re-dispatch)."""
        _check_entry(queue_offset, commit_pos, size)
        if queue_offset < self._max_offset:
            return int(self._reconcile(queue_offset, np.array([commit_pos]), np.array([size]),
                                       np.array([tags_code])) > 0)
        if queue_offset > self._max_offset:
            self._start_at_or_refuse(queue_offset)
        self._write(queue_offset, encode_cq_entry(commit_pos, size, tags_code))
        self._max_offset = queue_offset + 1
        self._max_commit_end = commit_pos + size
        return 1

    def _append_run(self, queue_offsets: list[int], commit_positions: list[int], sizes: list[int],
                    tags_codes: list[int]) -> bool:
        """Pack and write entries that are one valid run starting at max_offset; False (nothing
        written) for anything else, which _put_arrays refuses or repairs by the whole rules."""
        first = queue_offsets[0]
        if (first != self._max_offset or queue_offsets != list(range(first, first + len(queue_offsets)))
                or min(commit_positions) < 0 or min(sizes) <= 0):
            return False
        try:
            data = b"".join(map(_entry_pack, commit_positions, sizes, tags_codes))
        except struct.error as exc:
            raise BadInputError("put_entries", str(exc)) from None
        self._write(first, data)
        self._max_offset = first + len(queue_offsets)
        self._max_commit_end = commit_positions[-1] + sizes[-1]
        return True

    def _put_arrays(self, offsets: np.ndarray, commits: np.ndarray, sizes: np.ndarray,
                    tags: np.ndarray) -> int:
        """put_entries of int64 columns of equal length: one run is reconciled where it overlaps
        the queue and written past it in one write; entries in any other order go one by one."""
        count = len(offsets)
        if count == 0:
            return 0
        if count > 1 and not np.all(np.diff(offsets) == 1):  # not one run: entry by entry
            return sum(self._put_one(int(o), int(c), int(s), int(t))
                       for o, c, s, t in zip(offsets, commits, sizes, tags, strict=True))
        if offsets[0] < 0 or commits.min() < 0 or sizes.min() <= 0:
            raise BadInputError("put_entries", "negative offset or commit_pos, or size <= 0")
        first = int(offsets[0])
        if first > self._max_offset:
            self._start_at_or_refuse(first)
        present = min(max(self._max_offset - first, 0), count)
        repaired = 0
        if present:
            repaired = self._reconcile(first, commits[:present], sizes[:present], tags[:present])
        if present == count:
            return repaired
        entries = np.empty(count - present, dtype=CQ_DTYPE)
        entries["commit_pos"] = commits[present:]
        entries["size"] = sizes[present:]
        entries["tags_code"] = tags[present:]
        self._write(self._max_offset, entries.tobytes())
        self._max_offset += count - present
        self._max_commit_end = int(commits[-1] + sizes[-1])
        return count - present + repaired

    def initialize_with_offset(self, queue_offset: int) -> None:
        """Drop every file and restart the queue empty at `queue_offset` (min = max)."""
        if queue_offset < 0:
            raise BadInputError("queue_offset", f"{queue_offset} must be >= 0")
        self.segments.remove_after(self.segments.min_pos)
        self._forget_reservation()
        self._start_at(queue_offset)

    def _start_at_or_refuse(self, queue_offset: int) -> None:
        if self._max_offset:
            raise CorruptConsumeQueueError(
                f"gap: offset {queue_offset} put while the queue ends at {self._max_offset}",
                path=str(self.segments.directory), queue_offset=queue_offset)
        self.segments.remove_after(self.segments.min_pos)  # files holding no entry
        self._forget_reservation()
        self._start_at(queue_offset)

    def _start_at(self, queue_offset: int) -> None:
        """Create the file holding `queue_offset`, fillers before it, durably (fillPreBlank)."""
        lpos = queue_offset * CQ_ENTRY_SIZE
        fill_bytes = lpos % self.file_bytes
        if fill_bytes:
            self._reserve(lpos - fill_bytes, lpos)
        segment = self.segments.find(lpos - fill_bytes) or self._create_segment(lpos - fill_bytes)
        if fill_bytes:
            segment.write(0, _FILLER_BYTES * (fill_bytes // CQ_ENTRY_SIZE))
            segment.sync(0, fill_bytes)
        self._min_offset = self._max_offset = self._flushed_offset = queue_offset
        self._max_commit_end = 0

    def _reconcile(self, first: int, commits: np.ndarray, sizes: np.ndarray, tags: np.ndarray) -> int:
        """Entries re-put at [first, first+len) must equal the stored ones, all three fields (below
        min_offset: skipped). One that differs is rewritten when recovery left it unconfirmed
        (past the durable position: possibly torn), else it is corruption. Returns the rewritten.

        Equal ones are written again too: after a failed writeback (EIO) the kernel keeps their
        pages clean in the cache, and only a new write makes the next flush put them on disk
        (re-puts come from recovery and a restarted dispatcher, after such a failure)."""
        skip = min(max(self._min_offset - first, 0), len(commits))
        lo = first + skip
        stored = self.entries(lo, len(commits) - skip)
        if self._unconfirmed_end > self._confirmed_end:
            self._confirmed_end = max(self._confirmed_end, lo + len(stored))
        same = ((stored["commit_pos"] == commits[skip:]) & (stored["size"] == sizes[skip:])
                & (stored["tags_code"] == tags[skip:]))
        bad = lo + np.flatnonzero(~same)
        outside = bad[(bad < self._unconfirmed_from) | (bad >= self._unconfirmed_end)]
        if len(outside):
            self._raise_conflict(int(outside[0]), stored[int(outside[0]) - lo], first, commits, sizes, tags)
        entries = np.empty(len(stored), dtype=CQ_DTYPE)
        entries["commit_pos"] = commits[skip:skip + len(stored)]
        entries["size"] = sizes[skip:skip + len(stored)]
        entries["tags_code"] = tags[skip:skip + len(stored)]
        self._copy_in(lo, entries.tobytes())  # the entries exist: no block to reserve
        self._flushed_offset = min(self._flushed_offset, lo)  # the next flush syncs them again
        if len(bad):
            self._update_commit_end()
        return len(bad)

    def _raise_conflict(self, bad: int, old, first: int, commits, sizes, tags) -> NoReturn:
        i = bad - first
        raise CorruptConsumeQueueError(
            f"offset {bad} holds commit_pos {old['commit_pos']} size {old['size']} tags_code "
            f"{old['tags_code']}, re-put with commit_pos {commits[i]} size {sizes[i]} tags_code {tags[i]}",
            path=str(self.segments.directory), queue_offset=bad)

    def _write(self, queue_offset: int, data: bytes) -> None:
        """Copy whole entries in at `queue_offset`, creating files as the data crosses them.

        Blocks are reserved first for every byte (DiskFullError before anything is written); the
        common case is one range check against what is reserved already."""
        lpos = queue_offset * CQ_ENTRY_SIZE
        end = lpos + len(data)
        if lpos < self._reserved_from_lpos or end > self._reserved_to_lpos:
            self._reserve(lpos, end)
        self._copy_in(queue_offset, data)

    def _copy_in(self, queue_offset: int, data: bytes) -> None:
        """pwrite whole entries in at `queue_offset`, into files that exist with blocks for them."""
        lpos, done = queue_offset * CQ_ENTRY_SIZE, 0
        while done < len(data):
            segment = self.segments.find(lpos)
            file_pos = lpos - self.segments.base_of(segment)
            n = min(len(data) - done, self.file_bytes - file_pos)
            segment.write(file_pos, data[done:done + n])
            lpos, done = lpos + n, done + n

    def _reserve(self, lpos: int, end: int) -> None:
        """Create the files [lpos, end) falls in and allocate their blocks up to `end` rounded up by
        `reserve_end` within the last file (each file from its start, as MappedFile.reserve
        does), then remember the range. DiskFullError when the disk has no room."""
        last_base = (end - 1) - (end - 1) % self.file_bytes
        to = last_base + min(self.file_bytes, reserve_end(end - last_base))
        first_base = lpos - lpos % self.file_bytes
        for base in range(first_base, last_base + 1, self.file_bytes):
            segment = self.segments.find(base) or self._create_segment(base)
            segment.reserve(min(self.file_bytes, to - base))
        if first_base <= self._reserved_to_lpos and self._reserved_from_lpos <= to:
            self._reserved_from_lpos = min(self._reserved_from_lpos, first_base)
            self._reserved_to_lpos = max(self._reserved_to_lpos, to)
        else:
            self._reserved_from_lpos, self._reserved_to_lpos = first_base, to

    def _create_segment(self, base_pos: int) -> MappedFile:
        try:
            return self.segments.create(base_pos)
        except OSError as exc:
            if exc.errno in DISK_FULL_ERRNOS:
                raise DiskFullError("no space left to create a consume-queue file",
                                    path=str(self.segments.directory)) from exc
            raise

    def _forget_reservation(self) -> None:
        """Files were removed: a later write reserves again (cheap where blocks exist)."""
        self._reserved_from_lpos = self._reserved_to_lpos = 0

    def flush(self) -> int:
        """msync the entries written since the last flush; returns the flushed offset."""
        target = self._max_offset
        if target > self._flushed_offset:
            self.segments.sync_range(self._flushed_offset * CQ_ENTRY_SIZE, target * CQ_ENTRY_SIZE)
        self._flushed_offset = target
        return target

    # ------------------------------------------------------------------- read

    def entry(self, queue_offset: int) -> CqEntry | None:
        """The entry at `queue_offset`, or None outside [min_offset, max_offset)."""
        if not self._min_offset <= queue_offset < self._max_offset:
            return None
        return self._entry_at(queue_offset)

    def entries(self, queue_offset: int, max_count: int) -> np.ndarray:
        """Up to `max_count` entries from `queue_offset` (CQ_DTYPE, a copy), crossing files.

        Stops at max_offset; empty when `queue_offset` is outside [min_offset, max_offset).
        """
        count = min(max_count, self._max_offset - queue_offset)
        if queue_offset < self._min_offset or count <= 0:
            return np.empty(0, dtype=CQ_DTYPE)
        parts = []
        lpos, end = queue_offset * CQ_ENTRY_SIZE, (queue_offset + count) * CQ_ENTRY_SIZE
        while lpos < end:
            segment, file_pos = self._locate(lpos)
            n = min(end - lpos, self.file_bytes - file_pos)
            parts.append(np.frombuffer(segment.read(file_pos, n), dtype=CQ_DTYPE).copy())
            lpos += n
        return parts[0] if len(parts) == 1 else np.concatenate(parts)

    def _entry_at(self, queue_offset: int) -> CqEntry:
        segment, file_pos = self._locate(queue_offset * CQ_ENTRY_SIZE)
        return decode_cq_entry(segment.buf, file_pos)

    def _locate(self, lpos: int) -> tuple[MappedFile, int]:
        segment = self.segments.find(lpos)
        if segment is None:
            raise CorruptConsumeQueueError(f"no file holds logical byte {lpos}",
                                           path=str(self.segments.directory))
        return segment, lpos - self.segments.base_of(segment)

    def offset_for_time(self, ts_ms: int, boundary: Boundary,
                        store_ts_of: Callable[[int, int], int], min_commit_pos: int = 0) -> int:
        """The queue offset of the message stored at `ts_ms` (RocketMQ §3.6), by binary search.

        LOWER: the first entry with store time >= ts_ms (max_offset if none); UPPER: the last
        entry with store time <= ts_ms. Entries below `min_commit_pos` are skipped; a store
        time the callback cannot read (< 0) gives 0. The result is clamped to
        [min_offset, max_offset], so a queue without entries returns its min_offset (0 if new).
        """
        lo, hi = self._first_at_or_after(min_commit_pos), self._max_offset
        if lo >= hi:
            return self._clamp(hi)

        def store_ts(queue_offset: int) -> int:
            entry = self._entry_at(queue_offset)
            ts = store_ts_of(entry.commit_pos, entry.size)
            if ts < 0:
                raise _NoStoreTime
            return ts

        try:
            if boundary is Boundary.LOWER:
                return self._clamp(lo + bisect.bisect_left(range(lo, hi), ts_ms, key=store_ts))
            i = bisect.bisect_right(range(lo, hi), ts_ms, key=store_ts)
            return self._clamp(lo + i - 1 if i else 0)
        except _NoStoreTime:
            return self._clamp(0)

    def _clamp(self, queue_offset: int) -> int:
        return min(max(queue_offset, self._min_offset), self._max_offset)

    def _first_at_or_after(self, min_commit_pos: int, end: int | None = None) -> int:
        """First offset in [min, end) whose commit_pos >= min_commit_pos, `end` if none
        (default max_offset); a binary search, as positions ascend with offsets."""
        end = self._max_offset if end is None else end
        lo = max(self._min_offset, self.segments.min_pos // CQ_ENTRY_SIZE)
        return lo + bisect.bisect_left(range(lo, end), min_commit_pos,
                                       key=lambda o: self._entry_at(o).commit_pos)

    # ---------------------------------------------------- recover and retain

    def recover(self, durable_pos: int | None = None) -> int:
        """Find the last valid entry from the third-to-last file on, make it the queue's end and
        return max_offset.

        After a clean end (zeros only behind it) the files after it go. When bytes follow the
        first invalid entry (a torn tail, or damage with valid entries behind it), `cut_offset`
        is its offset: re-dispatch must put the entries from there back from their records
        (engine.queues.cuts says from where in the log). Those bytes stay until `clear_cut_tail`,
        after re-dispatch: zeroed before it, a crash in between would leave a clean end there,
        which the next recovery takes for the queue's true end.

        With `durable_pos` (the consume queues' durable commit position), the entries pointing at
        or past it are kept but unconfirmed: re-dispatch compares each whole and rewrites one
        that differs, and `drop_unconfirmed` drops those it did not reach. Without it every
        valid entry is trusted (a differing re-put is then corruption)."""
        if not self.segments.segments:
            return self._max_offset
        start = self._recover_from()
        end, self.cut_offset = self._recovered_end(start)
        if self.cut_offset is None:  # a clean end: only zeros follow, in files that can go
            self._drop_files_after(end)
        self._end_at(end)
        self.segments.sync_range(start * CQ_ENTRY_SIZE, end * CQ_ENTRY_SIZE)
        self._flushed_offset = end
        if durable_pos is not None:
            lo = max(self._min_offset, start)
            # entries below the durable position are sorted; past it anything may lie, so the
            # search can only land late (trusting a torn entry re-dispatch then finds), never early
            first = lo + bisect.bisect_left(range(lo, end), durable_pos,
                                            key=lambda o: self._entry_at(o).commit_pos)
            self._unconfirmed_from = self._confirmed_end = first
            self._unconfirmed_end = end
        return end

    def find_cut(self) -> int | None:
        """recover()'s `cut_offset`, read-only: for a look before a writer opens the store."""
        return self._recovered_end(self._recover_from())[1] if self.segments.segments else None

    def _recovered_end(self, start: int) -> tuple[int, int | None]:
        """(the first invalid entry at or after `start`, that offset again when bytes follow it
        or None after a clean end)."""
        end = self._scan_forward(start)
        return end, end if self._holds_data_from(end) else None

    def raw_entry(self, queue_offset: int) -> CqEntry:
        """The 20 bytes at `queue_offset` decoded as they are, valid or not (within the files)."""
        return self._entry_at(queue_offset)

    def record_end_before(self, queue_offset: int) -> int:
        """The commit position just past the record of the entry before `queue_offset`: where the
        records of the entries from `queue_offset` on begin at the earliest. 0 (the log's start)
        when no entry precedes it or that entry is a filler."""
        if queue_offset <= self._min_offset:
            return 0
        entry = self._entry_at(queue_offset - 1)
        if (entry.commit_pos, entry.size, entry.tags_code) == FILLER_ENTRY or entry.commit_pos < 0:
            return 0
        return entry.commit_pos + entry.size

    def clear_cut_tail(self) -> None:
        """After re-dispatch put back what recover() cut: zero the stale bytes past the end."""
        if self.cut_offset is not None:
            self.cut_offset = None
            self._cut_at(self._max_offset)

    def _holds_data_from(self, queue_offset: int) -> bool:
        """Whether any byte at or past entry `queue_offset` is not zero: a queue's clean end is
        followed by zeros only (holes are not read)."""
        lpos = queue_offset * CQ_ENTRY_SIZE
        for segment in self.segments.segments:
            base = self.segments.base_of(segment)
            if base + self.file_bytes > lpos and not segment.is_zero(max(lpos - base, 0), self.file_bytes):
                return True
        return False

    def drop_unconfirmed(self) -> int:
        """After re-dispatch: drop the unconfirmed entries it did not reach (their records lie past
        the recovery cut, or they are torn); returns how many."""
        end, keep = self._unconfirmed_end, max(self._unconfirmed_from, self._confirmed_end)
        self._unconfirmed_from = self._unconfirmed_end = self._confirmed_end = 0
        if self._max_offset > end or keep >= self._max_offset:  # re-dispatch went past them all
            return 0
        removed = self._max_offset - keep
        self._cut_at(keep)
        return removed

    def truncate_from_commit_pos(self, cut_pos: int) -> int:
        """Drop every entry whose commit_pos >= cut_pos, walking back from the end; returns
        how many. Dropped bytes are zeroed, files left empty deleted (never the first)."""
        new_max = self._max_offset
        while new_max > self._min_offset:
            last_lpos = (new_max - 1) * CQ_ENTRY_SIZE
            lo = max(self._min_offset, (last_lpos - last_lpos % self.file_bytes) // CQ_ENTRY_SIZE)
            kept = np.flatnonzero(self.entries(lo, new_max - lo)["commit_pos"] < cut_pos)
            new_max = lo + (int(kept[-1]) + 1 if len(kept) else 0)
            if len(kept):
                break
        removed = self._max_offset - new_max
        if removed:
            self._cut_at(new_max)
        return removed

    def _cut_at(self, end: int) -> None:
        """Make `end` the queue's end: zero the rest of its file, delete the files after it.

        Only bytes that hold data are zeroed (holes stay holes), so a cut never needs new disk
        blocks: recovery works on a full disk."""
        lpos = end * CQ_ENTRY_SIZE
        self._drop_files_after(end)
        segment = self.segments.find(lpos)
        if segment is not None:
            file_pos = lpos - self.segments.base_of(segment)
            if not segment.is_zero(file_pos, self.file_bytes):
                segment.zero_nonzero(file_pos, self.file_bytes)
                segment.sync(file_pos, self.file_bytes)
        self._end_at(end)

    def _drop_files_after(self, end: int) -> None:
        """Delete the files after the one holding entry `end` (never the first)."""
        self.segments.remove_after(max(end * CQ_ENTRY_SIZE, self.segments.min_pos + 1))
        self._forget_reservation()

    def _end_at(self, end: int) -> None:
        """Make `end` the queue's end in memory; the bytes past it are left as they are."""
        self._max_offset = end
        self._min_offset = min(self._min_offset, end)
        self._flushed_offset = min(self._flushed_offset, end)
        self._unconfirmed_end = min(self._unconfirmed_end, end)
        self._confirmed_end = min(self._confirmed_end, end)
        self._update_commit_end()

    def correct_min_offset(self, min_commit_pos: int, end: int | None = None) -> int:
        """Move min_offset to the first entry below `end` (default max_offset) whose record is
        still at or past `min_commit_pos` (the commitlog's min position), by binary search; to
        `end` when every entry below it is stale (RocketMQ §3.5). Returns min_offset.

        A reader passes the end its published position covers: an entry past it may be half
        written. One entry read when the first entry's record still exists (the common case)."""
        end = self._max_offset if end is None else min(end, self._max_offset)
        if self._min_offset >= end or self._entry_at(self._min_offset).commit_pos >= min_commit_pos:
            return self._min_offset
        self._min_offset = self._first_at_or_after(min_commit_pos, end)
        return self._min_offset

    def delete_expired_files(self, min_commit_pos: int) -> int:
        """Delete leading files whose last entry points below `min_commit_pos` (never the
        last file), then correct min_offset; returns the number of files deleted."""
        deleted = 0
        while len(self.segments.segments) > 1:
            last = decode_cq_entry(self.segments.segments[0].buf, self.file_bytes - CQ_ENTRY_SIZE)
            if not (last.size > 0 and 0 <= last.commit_pos < min_commit_pos):
                break
            self.segments.remove_first()
            self._forget_reservation()
            deleted += 1
        self._min_offset = max(self._min_offset, self.segments.min_pos // CQ_ENTRY_SIZE)
        self.correct_min_offset(min_commit_pos)
        return deleted

    def refresh(self) -> None:
        """Read-only views: adopt the writer's new or deleted files and entries written since.

        Cheap when nothing changed (one stat, no directory listing): the directory is listed
        only when the first known file is gone (retention removes files from the front), or
        when the entries run to the end of the last known file and the next file exists. An
        entry being written at that moment may be seen torn: bound reads by the dispatcher's
        published position, not by this max_offset alone."""
        segments = self.segments
        listed = not segments.segments or segments.front_deleted()
        if listed:
            segments.refresh()
            if not segments.segments:
                return
            self._min_offset = max(self._min_offset, segments.min_pos // CQ_ENTRY_SIZE)
        end = self._scan_forward(max(self._max_offset, self._min_offset))
        while end * CQ_ENTRY_SIZE == segments.end_pos and self._next_file_exists():
            segments.refresh()
            listed = True
            if end * CQ_ENTRY_SIZE == segments.end_pos:
                break  # still being created: a later refresh adopts it
            end = self._scan_forward(end)
        if listed or end != self._max_offset:
            self._max_offset = self._flushed_offset = end
            self._update_commit_end()

    def _next_file_exists(self) -> bool:
        """Whether the file after the last mapped one is on disk (the writer rolled to it)."""
        return os.path.exists(self.segments.directory / offset_to_name(self.segments.end_pos))

    def _recover_from(self) -> int:
        segments = self.segments.segments
        first = segments[max(0, len(segments) - _RECOVER_FILES)]
        return self.segments.base_of(first) // CQ_ENTRY_SIZE

    def _scan_forward(self, queue_offset: int) -> int:
        """The offset of the first invalid entry at or after `queue_offset` (or the end)."""
        lpos = queue_offset * CQ_ENTRY_SIZE
        while (segment := self.segments.find(lpos)) is not None:
            file_pos = lpos - self.segments.base_of(segment)
            commit_pos, size, _ = _entry_unpack(segment.buf, file_pos)
            if commit_pos < 0 or size <= 0:  # nothing new: the common case of a caught-up reader
                return lpos // CQ_ENTRY_SIZE
            n = min(self.file_bytes - file_pos, _SCAN_CHUNK_ENTRIES * CQ_ENTRY_SIZE)
            chunk = np.frombuffer(segment.read(file_pos, n), dtype=CQ_DTYPE)
            valid = (chunk["commit_pos"] >= 0) & (chunk["size"] > 0)
            if not valid.all():
                return (lpos + int(np.argmin(valid)) * CQ_ENTRY_SIZE) // CQ_ENTRY_SIZE
            lpos += n
        return lpos // CQ_ENTRY_SIZE

    def _update_commit_end(self) -> None:
        last = self.entry(self._max_offset - 1)
        if last is None or (last.commit_pos, last.size, last.tags_code) == FILLER_ENTRY:
            self._max_commit_end = 0
        else:
            self._max_commit_end = last.commit_pos + last.size

    def close(self) -> None:
        self.segments.close()


def _filler_prefix(segment: MappedFile) -> int:
    """How many filler entries open the file (fillPreBlank)."""
    if bytes(segment.read(0, CQ_ENTRY_SIZE)) != _FILLER_BYTES:
        return 0
    entries = np.frombuffer(segment.read(0, segment.size_bytes), dtype=CQ_DTYPE)
    filler = ((entries["commit_pos"] == FILLER_ENTRY[0]) & (entries["size"] == FILLER_ENTRY[1])
              & (entries["tags_code"] == FILLER_ENTRY[2]))
    return len(filler) if filler.all() else int(np.argmin(filler))


def check_queue_id(queue_id: object) -> None:
    """BadInputError unless `queue_id` is a plain int >= 0 (it names a directory)."""
    if not isinstance(queue_id, int) or isinstance(queue_id, bool) or queue_id < 0:
        raise BadInputError("queue_id", f"{queue_id!r} must be an int >= 0")


def _check_entry(queue_offset: int, commit_pos: int, size: int) -> None:
    if queue_offset < 0 or commit_pos < 0 or size <= 0:
        raise BadInputError("entry", f"queue_offset {queue_offset}, commit_pos {commit_pos}, "
                            f"size {size}: offsets must be >= 0 and size > 0")
