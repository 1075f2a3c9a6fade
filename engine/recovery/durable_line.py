"""The durable line (DESIGN §4 "a store never shrinks by surprise"): the commit position below
which the store has told producers their messages are on disk. Routine recovery may cut only
past it (the torn tail of a crash); damage, zeros or a missing segment or commitlog below it
refuse the start with StoreCorruptError, before recovery changes anything on disk. A short
segment is refused wherever it lies (no crash makes one); the rebuild pads it with zeros.

Where the line comes from:
- a readable checkpoint (or its `.bak`): its commitlog_flushed_pos, written only after the
  flush it names;
- no readable checkpoint: the largest end of a consume queue's last entry. Conservative: the
  derived files prove the data was written, and without a checkpoint nothing proves less.
Under sync flush a consume queue never points past the flushed position, but under async it
may (the dispatcher follows the written position), so with a checkpoint the queues do not
raise the line: an async power loss may legitimately take records they point at.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import NamedTuple

from engine.errors import CorruptRecordError, StoreCorruptError
from engine.files.naming import commitlog_dir, offset_to_name, segment_files
from engine.formats.checkpoint import Checkpoint
from engine.formats.cq_entry import is_filler_entry
from engine.formats.record import Verify
from engine.log.commitlog import CommitLog
from engine.log.tail import segment_base
from engine.log.walk_past import is_zero_from, valid_records_between
from engine.queues.table import ConsumeQueueTable
from engine.recovery.accepted_damage import AcceptedSpan, ScanPastAccepted


class DurableLine(NamedTuple):
    """The durable commit position and what says so (for the error and the report)."""

    pos: int
    source: str


def durable_line(checkpoint: Checkpoint | None, queues: ConsumeQueueTable) -> DurableLine:
    """See the module doc: the checkpoint's flushed position, else the queues' largest end."""
    if checkpoint is not None:
        return DurableLine(checkpoint.commitlog_flushed_pos, "the checkpoint's flushed position")
    return DurableLine(queues.max_commit_end(), "the consume queues' last entries")


def refuse_loss_below(commitlog: CommitLog, queues: ConsumeQueueTable, line: DurableLine,
                      start_pos: int, accepted: list[AcceptedSpan]) -> None:
    """Raise StoreCorruptError if recovery would cut below the line: a segment or the whole
    commitlog missing below it, or no valid record somewhere in [scan start, line), where the
    scan starts at recovery's `start_pos` or at the last record a consume queue points at below
    the line, whichever is first (so a zeroed segment the line falls in is seen even when
    recovery's own scan starts at the line). Damage the operator accepted (`accepted`, from a
    salvage) is passed over. Read-only: nothing on disk changes."""
    _refuse_missing(commitlog, line)
    below = _last_record_start_below(queues, line.pos)
    scan_from = max(min(start_pos, below if below is not None else start_pos), commitlog.min_pos)
    if scan_from >= line.pos:
        return
    bad = _first_bad_below(commitlog, scan_from, line.pos, accepted)
    seg_base = segment_base(commitlog, scan_from)
    if bad is not None and bad.pos == scan_from != seg_base:  # scan_from may be no record boundary
        bad = _first_bad_below(commitlog, seg_base, line.pos, accepted)
    if bad is not None:
        raise _corrupt_at(commitlog, bad, line)


def refuse_short_segments(root: Path, segment_bytes: int) -> None:
    """A commitlog segment shorter than the segment size lost its end (MappedFile.create sizes
    a new segment under a temporary name, so no crash leaves one short): StoreCorruptError
    naming it and the position where its bytes stop."""
    short = _short_segments(root, segment_bytes)
    if short:
        path, base_pos, size_bytes = short[0]
        raise StoreCorruptError(f"the segment is {size_bytes} bytes, not {segment_bytes}: its end "
                                "is missing", commit_pos=base_pos + size_bytes, durable_pos=None,
                                path=str(path))


def pad_short_segments(root: Path, segment_bytes: int) -> list[tuple[Path, int]]:
    """The rebuild's answer to short segments: extend each with zeros to the segment size (the
    missing bytes read as unwritten; the rebuild then cuts at the first invalid record).
    Returns (path, size it had) of each one extended."""
    padded = []
    for path, _base_pos, size_bytes in _short_segments(root, segment_bytes):
        with open(path, "r+b") as fh:
            fh.truncate(segment_bytes)
            os.fsync(fh.fileno())
        padded.append((path, size_bytes))
    return padded


def _short_segments(root: Path, segment_bytes: int) -> list[tuple[Path, int, int]]:
    sizes = [(path, base, path.stat().st_size) for base, path in segment_files(commitlog_dir(root))]
    return [(path, base, size) for path, base, size in sizes if size < segment_bytes]


def _last_record_start_below(queues: ConsumeQueueTable, line_pos: int) -> int | None:
    """The largest commit_pos below line_pos that a consume queue points at (binary search:
    a queue's commit positions grow with its offsets), None when there is none."""
    best = None
    for queue in queues:
        lo, hi = queue.min_offset, queue.max_offset
        while lo < hi:
            mid = (lo + hi) // 2
            entry = queue.entry(mid)
            if entry is not None and entry.commit_pos < line_pos:
                lo = mid + 1
            else:
                hi = mid
        entry = queue.entry(lo - 1) if lo > queue.min_offset else None
        if entry is not None and not is_filler_entry(entry):
            best = entry.commit_pos if best is None else max(best, entry.commit_pos)
    return best


def _refuse_missing(commitlog: CommitLog, line: DurableLine) -> None:
    segs = commitlog.segments
    directory = segs.directory
    if line.pos <= 0:
        return
    if not segs.segments:
        what = "the commitlog directory is missing" if not directory.is_dir() else \
            "the commitlog directory holds no segment"
        raise StoreCorruptError(f"{what}, but {line.source} says {line.pos} bytes are durable",
                                commit_pos=0, durable_pos=line.pos, path=str(directory))
    if segs.min_pos > line.pos:  # retention never deletes the segment being written
        raise StoreCorruptError(
            f"the log starts at {segs.min_pos}, past {line.source}: segment "
            f"{offset_to_name(line.pos - line.pos % segs.segment_bytes)} is missing",
            commit_pos=line.pos, durable_pos=line.pos, path=str(directory))
    if segs.end_pos < line.pos:
        missing = directory / offset_to_name(segs.end_pos)
        raise StoreCorruptError(
            f"the log ends at {segs.end_pos} (segment missing), before {line.source}",
            commit_pos=segs.end_pos, durable_pos=line.pos, path=str(missing))


def _first_bad_below(commitlog: CommitLog, start_pos: int, line_pos: int,
                     accepted: list[AcceptedSpan]) -> CorruptRecordError | None:
    """The error of the first invalid record in [start_pos, line_pos) outside the accepted
    spans, None if all are valid."""
    scanner = ScanPastAccepted(commitlog, start_pos, accepted)
    try:
        for _ in scanner:
            if scanner.pos >= line_pos:
                return None
    except CorruptRecordError as exc:
        return exc if exc.pos < line_pos else None
    if scanner.pos >= line_pos:
        return None
    return CorruptRecordError(f"the log ends at {scanner.pos}", pos=scanner.pos)


def _corrupt_at(commitlog: CommitLog, bad: CorruptRecordError, line: DurableLine) -> StoreCorruptError:
    segs = commitlog.segments
    segment = segs.find(bad.pos)
    path = str(segment.path) if segment is not None else str(segs.directory)
    if is_zero_from(commitlog, bad.pos):
        return StoreCorruptError(f"zeros from here to the end of the log, but {line.source} says "
                                 f"{line.pos} is durable (data lost, e.g. a zeroed segment)",
                                 commit_pos=bad.pos, durable_pos=line.pos, path=path)
    after = valid_records_between(commitlog, bad.pos, segs.end_pos, Verify.MQSTORE)
    return StoreCorruptError(f"no valid record ({bad.reason})", commit_pos=bad.pos,
                             durable_pos=line.pos, path=path, records_after=after.count)
