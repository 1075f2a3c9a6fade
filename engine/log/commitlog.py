"""The commitlog: one append-only log of records over fixed-size segments (<root>/commitlog).

Positions are `commit_pos` (bytes from the start of the whole log); a segment holds
[base_pos, base_pos + segment_bytes) and is named by its base_pos.

**Filler rule** (RocketMQ's END_OF_FILE, DESIGN §3): a record is never split across segments.
When `len(record) + FILLER_SIZE > space left` in the current segment, the writer puts an
8-byte filler at `written_pos` (TOTALSIZE = space left, MAGIC = BLANK_MAGIC; the rest of the
segment stays zero), moves `written_pos` to the next segment's base, creates that segment and
preallocates the one after it. Hence at least 8 bytes are always left for a filler, and every
segment that is not the last ends with one. Readers follow a filler to the next segment base.

Step order of a roll: filler bytes -> create next segment -> preallocate the one after. A crash
at any step leaves a log that recovery reads as "valid up to the filler" (a preallocated or
just-created segment is all zeros, which a scan reports as the unwritten end).

Positions: `written_pos` is where the next record goes; `flushed_pos` is what msync has made
durable. On open they start at the end of the loaded segments (everything counts as written,
as RocketMQ's load does) until recovery calls `reset_positions` or `truncate_to`; a fresh store
starts at 0 and creates its first segment on the first append. A read-only view (readers,
the dispatcher) tracks the end of the segments it has mapped; `refresh()` adopts new ones.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import NamedTuple

import numpy as np

from engine.errors import BadInputError, DiskFullError, StoreError
from engine.files.filesystem import remove_file
from engine.files.mapped_file import Access, MappedFile
from engine.files.naming import commitlog_dir, segment_files
from engine.files.segment_queue import SegmentQueue
from engine.formats.record import (
    FILLER_SIZE,
    TOTAL_SIZE_FIELD,
    Filler,
    Record,
    Verify,
    decode_record,
    encode_filler,
    stamp_record,
)
from engine.formats.record.stamp_many import (
    StampableRecords,
    check_stampable,
    stamp_checked_records,
    stamp_few,
)
from engine.log.scan import BatchScanner, Scanner
from engine.log.walker import LogWindow, header_decoder, record_decoder


class _Run(NamedTuple):
    """Records blob[start:end] written at commit_pos in one pwrite; first_size: its first record's."""

    first_size: int
    start: int
    end: int
    commit_pos: int


_ZERO_CHUNK_BYTES = 1 << 20


class SegmentInfo(NamedTuple):
    """What retention needs to know about one segment."""

    base_pos: int
    path: Path


class CommitLog:
    """Append, read and cut the commitlog. Only the supervisor opens it READ_WRITE."""

    def __init__(self, segments: SegmentQueue):
        self.segments = segments
        self.written_pos = segments.end_pos
        self.flushed_pos = segments.end_pos

    @classmethod
    def open(cls, root: Path, segment_bytes: int, access: Access) -> CommitLog:
        """Load the segments of <root>/commitlog (a layout problem raises SegmentLayoutError)."""
        return cls(SegmentQueue.load(commitlog_dir(root), segment_bytes, access))

    @property
    def segment_bytes(self) -> int:
        return self.segments.segment_bytes

    @property
    def min_pos(self) -> int:
        """First commit position still on disk (the first segment's base; 0 when empty)."""
        return self.segments.min_pos

    def next_segment_pos(self, pos: int) -> int:
        """Base of the segment after the one holding `pos`."""
        return (pos // self.segment_bytes + 1) * self.segment_bytes

    def reset_positions(self, written_pos: int, flushed_pos: int) -> None:
        """Recovery's verdict: where the next record goes and what is known durable."""
        file_pos = written_pos % self.segment_bytes
        if file_pos and self.segment_bytes - file_pos < FILLER_SIZE:
            raise BadInputError("written_pos", f"{written_pos} leaves no room for a filler")
        if not 0 <= flushed_pos <= written_pos:
            raise BadInputError("flushed_pos", f"{flushed_pos} not in [0, {written_pos}]")
        self.written_pos = written_pos
        self.flushed_pos = flushed_pos

    def refresh(self) -> None:
        """Read-only views: adopt segments the writer created (and forget deleted ones)."""
        self.segments.refresh()
        if self.segments.access is Access.READ_ONLY:
            self.written_pos = self.flushed_pos = self.segments.end_pos

    # ---------------------------------------------------------------- append

    def append(self, record: bytes | bytearray | memoryview, *, queue_offset: int,
               store_ts_ms: int) -> int:
        """Copy one encoded record in at `written_pos`, stamp it, return its commit_pos."""
        (size,) = self._check_sizes((record,))
        segment, file_pos = self._room_for(size)
        segment.reserve_zeroed(file_pos, file_pos + size)
        commit_pos = self.written_pos
        segment.buf[file_pos:file_pos + size] = record
        stamp_record(segment.buf, file_pos, queue_offset=queue_offset, commit_pos=commit_pos,
                     store_ts_ms=store_ts_ms)
        self.written_pos = commit_pos + size
        return commit_pos

    def append_batch(self, records: Sequence[bytes | bytearray | memoryview],
                     queue_offsets: Sequence[int], store_ts_ms: int) -> list[int]:
        """Append many records with one store time; returns their commit positions.

        Each record is whole within a segment; a batch may span a roll (unlike RocketMQ,
        which moves a whole batch). Nothing is written if any record is invalid.
        """
        if len(records) != len(queue_offsets):
            raise BadInputError("queue_offsets", f"{len(queue_offsets)} offsets for "
                                f"{len(records)} records")
        sizes = np.fromiter(map(len, records), dtype=np.int64, count=len(records))
        starts = np.zeros(len(records), dtype=np.int64)
        np.cumsum(sizes[:-1], out=starts[1:])
        blob = bytearray().join(records)
        return self.append_encoded(blob, starts, sizes, queue_offsets, store_ts_ms).tolist()

    def append_encoded(self, blob: bytearray, starts: np.ndarray, sizes: np.ndarray,
                       queue_offsets, store_ts_ms: int) -> np.ndarray:
        """Append the records laid end to end in `blob` (encode_many.encode_records) after
        checking each (stamp_many.check_stampable: nothing is written if one is bad); returns
        their commit positions."""
        return self.append_stampable(check_stampable(blob, starts, sizes), queue_offsets, store_ts_ms)

    def append_stampable(self, records: StampableRecords, queue_offsets, store_ts_ms: int, *,
                         before_write: Callable[[np.ndarray], None] | None = None) -> np.ndarray:
        """append_encoded of records already checked: plan the runs (a run fits the rest of one
        segment), stamp every record in `records.buf` (stamp_many.stamp_checked_records), call
        `before_write(positions)` once the positions are final, then write each run with one
        pwrite (MappedFile.write). The appender registers its waiting request in before_write, so
        a write that hangs on the disk cannot keep the request from its deadline. A DiskFullError
        undoes the runs already written."""
        blob, starts, sizes = records
        count = len(starts)
        if not count:
            return np.empty(0, dtype=np.int64)
        largest = int(sizes.max())
        if largest + FILLER_SIZE > self.segment_bytes:
            raise BadInputError("body", f"record of {largest} bytes does not fit a segment "
                                f"of {self.segment_bytes} bytes (minus {FILLER_SIZE} for a filler)")
        positions, runs = self._plan_runs(starts, sizes)
        stamp_checked_records(blob, starts, sizes, np.asarray(queue_offsets, dtype=np.int64),
                              positions, store_ts_ms)
        if before_write is not None:
            before_write(positions)
        batch_start_pos = self.written_pos
        try:
            with memoryview(blob) as view:
                for run in runs:
                    segment, file_pos = self._room_for(run.first_size)
                    if self.written_pos != run.commit_pos:
                        raise StoreError(f"append planned commit_pos {run.commit_pos}, the log is at "
                                         f"{self.written_pos}", path=str(self.segments.directory))
                    segment.reserve_zeroed(file_pos, file_pos + run.end - run.start)
                    segment.write(file_pos, view[run.start:run.end])
                    self.written_pos += run.end - run.start
        except DiskFullError:
            if self.written_pos != batch_start_pos:  # all or nothing: undo the runs already copied
                self._take_back(batch_start_pos)
            raise
        return positions

    def append_few(self, blob: bytearray, sizes: list[int], queue_offsets: list[int],
                   store_ts_ms: int, *, before_write: Callable[[list[int]], None]) -> list[int]:
        """append_stampable of a few records laid back to back from blob[0], given as lists: when
        they fit the rest of the active segment, planned, stamped (stamp_many.stamp_few) and
        written with one pwrite without numpy, whose fixed cost per call outweighs the work of a
        few records (docs/DECISIONS.md#small-batches-scalar); else by append_stampable. Returns
        their commit positions; `before_write` gets them as append_stampable's does."""
        starts, at = [], 0
        for size in sizes:
            starts.append(at)
            at += size
        if at != len(blob):
            raise BadInputError("sizes", f"{len(sizes)} records of {at} bytes in {len(blob)} bytes")
        located = self.segments.locate(self.written_pos)
        if located is None or self.written_pos - located[1] + at + FILLER_SIZE > self.segment_bytes:
            arrays = StampableRecords(blob, np.array(starts, dtype=np.int64), np.array(sizes, dtype=np.int64))
            return self.append_stampable(arrays, queue_offsets, store_ts_ms,
                                         before_write=lambda positions: before_write(positions.tolist())
                                         ).tolist()
        segment, base_pos = located
        commit_pos = self.written_pos
        file_pos = commit_pos - base_pos
        positions = [commit_pos + start for start in starts]
        stamp_few(blob, starts, sizes, queue_offsets, positions, store_ts_ms)
        before_write(positions)
        segment.reserve_zeroed(file_pos, file_pos + at)
        segment.write(file_pos, blob)
        self.written_pos = commit_pos + at
        return positions

    def _plan_runs(self, starts: np.ndarray, sizes: np.ndarray) -> tuple[np.ndarray, list[_Run]]:
        """Each record's commit_pos, and the runs that write them, as _room_for will lay them out
        (a record that does not fit the rest of its segment starts the next one)."""
        count = len(starts)
        ends = starts + sizes
        last_end = int(ends[-1])
        positions = np.empty(count, dtype=np.int64)
        runs: list[_Run] = []
        pos = self.written_pos
        located = self.segments.locate(pos)
        base = located[1] if located is not None else pos - pos % self.segment_bytes
        i = 0
        while i < count:
            first_size = int(sizes[i])
            if first_size + FILLER_SIZE > self.segment_bytes - (pos - base):
                base += self.segment_bytes
                pos = base
            room = self.segment_bytes - (pos - base) - FILLER_SIZE
            lo = int(starts[i])
            j = count if last_end - lo <= room else \
                i + int(np.searchsorted(ends[i:] - lo, room, side="right"))
            positions[i:j] = starts[i:j] + (pos - lo)
            runs.append(_Run(first_size, lo, int(ends[j - 1]), pos))
            pos += int(ends[j - 1]) - lo
            i = j
        return positions, runs

    def _check_sizes(self, records) -> list[int]:
        """Each record's length, which must match its TOTALSIZE field and fit a segment."""
        sizes = [len(record) for record in records]
        if sizes and max(sizes) + FILLER_SIZE > self.segment_bytes:
            raise BadInputError("body", f"record of {max(sizes)} bytes does not fit a segment of "
                                f"{self.segment_bytes} bytes (minus {FILLER_SIZE} for a filler)")
        unpack = TOTAL_SIZE_FIELD.unpack_from
        if any(size < FILLER_SIZE or unpack(record)[0] != size
               for record, size in zip(records, sizes, strict=True)):
            raise BadInputError("record", "a record's TOTALSIZE field does not match its length")
        return sizes

    def _room_for(self, size: int) -> tuple[MappedFile, int]:
        """The segment and file_pos where a record of `size` goes, rolling if it does not fit."""
        segment, file_pos = self._active_segment()
        space_left = self.segment_bytes - file_pos
        if size + FILLER_SIZE > space_left:
            segment.reserve_zeroed(file_pos, file_pos + FILLER_SIZE)
            segment.write(file_pos, encode_filler(space_left))
            self.written_pos += space_left
            segment, file_pos = self._active_segment()
            self.segments.preallocate_next()
        return segment, file_pos

    def _active_segment(self) -> tuple[MappedFile, int]:
        """The segment holding `written_pos`; created (the next one preallocated) if missing.

        After recovery the next segment may already be loaded (a preallocated file): reuse it."""
        located = self.segments.locate(self.written_pos)
        if located is None:
            base_pos = self.written_pos - self.written_pos % self.segment_bytes
            segment = self.segments.create(base_pos)
            self.segments.preallocate_next()
            return segment, self.written_pos - base_pos
        return located[0], self.written_pos - located[1]

    # ----------------------------------------------------------------- flush

    def flush(self) -> int:
        """msync [flushed_pos, written_pos); returns the new flushed_pos. Errors propagate."""
        target = self.written_pos
        if target > self.flushed_pos:
            self.segments.sync_range(self.flushed_pos, target)
        self.flushed_pos = target
        return target

    # ------------------------------------------------------------------ read

    def read_at(self, commit_pos: int, verify: Verify = Verify.MQSTORE) -> Record:
        """Decode the record at `commit_pos` (CorruptRecordError if its bytes are bad)."""
        segment, file_pos = self._readable(commit_pos, 1)
        record = decode_record(segment.buf, file_pos, verify=verify,
                               base_pos=commit_pos - file_pos)
        if isinstance(record, Filler):
            raise BadInputError("commit_pos", f"{commit_pos} is an end-of-file filler")
        return record

    def read_bytes(self, commit_pos: int, size: int) -> memoryview:
        """A zero-copy view of [commit_pos, commit_pos + size), which must lie in one segment."""
        segment, file_pos = self._readable(commit_pos, size)
        return segment.read(file_pos, size)

    def _readable(self, commit_pos: int, size: int) -> tuple[MappedFile, int]:
        if size <= 0:
            raise BadInputError("size", f"{size} must be positive")
        if commit_pos >= self.written_pos and self.segments.access is Access.READ_ONLY:
            self.refresh()
        if not self.min_pos <= commit_pos < self.written_pos:
            raise BadInputError("commit_pos", f"{commit_pos} outside [{self.min_pos}, "
                                f"{self.written_pos})")
        segment = self.segments.find(commit_pos)
        if segment is None:
            raise BadInputError("commit_pos", f"no segment holds {commit_pos}")
        file_pos = commit_pos - self.segments.base_of(segment)
        if file_pos + size > self.segment_bytes:
            raise BadInputError("size", f"[{commit_pos}, +{size}) crosses a segment end")
        return segment, file_pos

    def window_at(self, pos: int) -> LogWindow | None:
        """The mapped segment holding `pos` as a walker's window (a read-only view adopts
        segments the writer has made since); None when no segment holds it."""
        segment = self.segments.find(pos)
        if segment is None and self.segments.access is Access.READ_ONLY:
            self.refresh()
            segment = self.segments.find(pos)
        if segment is None:
            return None
        base_pos = self.segments.base_of(segment)
        return LogWindow(segment.buf, base_pos, base_pos + segment.size_bytes, str(segment.path))

    def scan(self, start_pos: int, end_pos: int | None = None,
             verify: Verify = Verify.MQSTORE) -> Scanner:
        """Iterate Records from `start_pos` (a record boundary); see Scanner for the rules."""
        return Scanner(self.window_at, self._scan_start(start_pos), self._scan_end(end_pos),
                       record_decoder(verify))

    def scan_batches(self, start_pos: int, end_pos: int | None = None,
                     verify: Verify = Verify.MQSTORE) -> BatchScanner:
        """Like scan (scan_headers with Verify.STRUCTURE), many records per step: ScannedRuns."""
        return BatchScanner(self.window_at, self._scan_start(start_pos), self._scan_end(end_pos), verify)

    def scan_headers(self, start_pos: int, end_pos: int | None = None) -> Scanner:
        """Like scan, yielding RecordHeaders (no CRC check): the dispatcher's fast path."""
        return Scanner(self.window_at, self._scan_start(start_pos), self._scan_end(end_pos),
                       header_decoder)

    def _scan_start(self, start_pos: int) -> int:
        if start_pos < self.min_pos:
            raise BadInputError("start_pos", f"{start_pos} is below the log start {self.min_pos}")
        return start_pos

    def _scan_end(self, end_pos: int | None) -> int:
        """A scan's end: `end_pos`, by default the end of the last segment."""
        return self.segments.end_pos if end_pos is None else end_pos

    # -------------------------------------------------------- cut and retain

    def tail_bytes(self, cut_pos: int, end_pos: int) -> bytes:
        """A copy of [cut_pos, end_pos) across segments (recovery quarantines it before a cut)."""
        parts = []
        pos = cut_pos
        while pos < end_pos:
            segment = self.segments.find(pos)
            if segment is None:
                break
            base_pos = self.segments.base_of(segment)
            stop = min(end_pos, base_pos + self.segment_bytes)
            parts.append(segment.read(pos - base_pos, stop - pos).tobytes())
            pos = stop
        return b"".join(parts)

    def truncate_to(self, cut_pos: int) -> None:
        """Cut the log at `cut_pos`: zero the rest of its segment, delete every later segment.

        Copy what you want to keep first (`tail_bytes`). Zeroing skips chunks that are already
        zero, so a sparse 1 GiB tail costs reads, not writes; the zeroed range is msync'd.
        """
        if not self.min_pos <= cut_pos <= max(self.segments.end_pos, self.min_pos):
            raise BadInputError("cut_pos", f"{cut_pos} outside [{self.min_pos}, "
                                f"{self.segments.end_pos}]")
        segment = self.segments.find(cut_pos)
        if segment is not None:
            file_pos = cut_pos - self.segments.base_of(segment)
            segment.zero_nonzero(file_pos)
            segment.sync(file_pos, self.segment_bytes)
        next_base = self.next_segment_pos(cut_pos)
        self.segments.remove_after(next_base)
        self._remove_stray_files(next_base)
        self.written_pos = self.flushed_pos = cut_pos

    def _take_back(self, cut_pos: int) -> None:
        """Undo an append that failed part way (DISK_FULL): zero what it wrote from `cut_pos` on
        (a filler, runs) and move the positions back, keeping every segment file. Readers (the
        dispatcher, consumers) may have mapped the segment it rolled into, preallocated long
        before; truncate_to would delete that file and the next roll make a new one under its
        name, and they would read the deleted file's zeros where the records are."""
        pos = cut_pos
        while pos < self.written_pos:
            segment = self.segments.find(pos)
            base_pos = self.segments.base_of(segment)
            end_file_pos = min(self.written_pos - base_pos, self.segment_bytes)
            segment.zero_nonzero(pos - base_pos, end_file_pos)
            segment.sync(pos - base_pos, end_file_pos)
            pos = base_pos + self.segment_bytes
        self.written_pos = cut_pos
        self.flushed_pos = min(self.flushed_pos, cut_pos)

    def _remove_stray_files(self, from_pos: int) -> None:
        """Delete unadopted segment files (a preallocated one) at or past `from_pos`."""
        for file in segment_files(self.segments.directory):
            if file.base_pos >= from_pos:
                remove_file(file.path)

    def remove_oldest_segment(self) -> Path:
        """Retention: delete the first segment; never the one being written."""
        if len(self.segments.segments) < 2 or self.min_pos + self.segment_bytes > self.written_pos:
            raise BadInputError("segment", "the oldest segment is the active one")
        return self.segments.remove_first()

    def segments_info(self) -> list[SegmentInfo]:
        """(base_pos, path) of every segment, oldest first (a segment's age is the store time
        of its last record, engine.retention.segment_age, never its file's mtime)."""
        return [SegmentInfo(self.segments.base_of(s), s.path) for s in self.segments.segments]

    def close(self) -> None:
        self.segments.close()

def window_scans(commitlog: CommitLog, start_pos: int, limit_pos: int,
                 window_bytes: int) -> Iterator[BatchScanner]:
    """A step's batch scans (structure checked): over at most `window_bytes` from start_pos, then,
    only when that took nothing (one record or filler bigger than the window), to limit_pos. Each
    scanner is to be read through before the next is asked for."""
    scanner = commitlog.scan_batches(start_pos, min(limit_pos, start_pos + window_bytes), Verify.STRUCTURE)
    yield scanner
    if scanner.pos == start_pos:
        yield commitlog.scan_batches(start_pos, limit_pos, Verify.STRUCTURE)
