"""Walk a commitlog record by record *past* bad bytes: what `engine.check.fsck` reports and what a
recovery cut quarantines. Read-only.

The walk and its resync are engine.log.walker's (OnBadBytes.RESYNC); this module hands it
one mapped segment after another and decides what only the whole log can tell: zeros from a
position to the end of the log are a clean end, not bad bytes.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from engine.errors import CorruptRecordError
from engine.formats.record import Filler, Record, Verify
from engine.log.commitlog import CommitLog
from engine.log.walker import (
    UNWRITTEN_REASON,
    BadRegion,
    OnBadBytes,
    Stop,
    record_decoder,
    resync,
    walk,
)


@dataclass(frozen=True)
class ValidRecords:
    """How many valid records (not fillers) a stretch of the log holds, and their bytes."""

    count: int = 0
    size_bytes: int = 0


def walk_log(log: CommitLog, start_pos: int, verify: Verify,
             end_pos: int | None = None) -> Iterator[Record | Filler | BadRegion]:
    """Every record, filler and bad region from `start_pos` (a record boundary) to the end of
    written data (or `end_pos`, which also bounds the search for a record after bad bytes), in
    log order."""
    end = log.segments.end_pos if end_pos is None else min(end_pos, log.segments.end_pos)
    decode = record_decoder(verify)
    pos = start_pos
    while pos < end:
        window = log.window_at(pos)
        for item in walk(window, pos, end, decode, verify, OnBadBytes.RESYNC):
            if item is Stop.UNWRITTEN:
                region = _bad_region(log, pos, CorruptRecordError(UNWRITTEN_REASON, pos=pos), end, verify)
                if region is None:
                    return
                yield region
                pos = region.resume_pos
            elif isinstance(item, Stop):
                pos = window.segment_end_pos if item is Stop.SEGMENT_END else end
            else:
                yield item
                pos = item.resume_pos if isinstance(item, BadRegion) else item.end_pos


def valid_records_between(log: CommitLog, start_pos: int, end_pos: int, verify: Verify) -> ValidRecords:
    """The valid records in [start_pos, end_pos), bad regions skipped (what a cut throws out).
    Runs of records go through the batch scanner (CommitLog.scan_batches), the same checks."""
    count = size_bytes = 0
    pos, end = start_pos, min(end_pos, log.segments.end_pos)
    while pos < end:
        try:
            for run in log.scan_batches(pos, end, verify):
                count += run.count
                size_bytes += run.byte_count
            break
        except CorruptRecordError as exc:
            region = _bad_region(log, exc.pos, exc, end, verify)
            if region is None:
                break
            pos = region.resume_pos
    return ValidRecords(count, size_bytes)


def _bad_region(log: CommitLog, pos: int, exc: CorruptRecordError, end: int,
                verify: Verify) -> BadRegion | None:
    """The bad bytes from `pos` (where `exc` was raised) to where valid data resumes (searched
    up to `end`); None when only zeros follow (a clean end)."""
    if is_zero_from(log, pos):
        return None
    return resync(log.window_at(pos), pos, exc, end, verify)


def is_zero_from(log: CommitLog, pos: int) -> bool:
    """True when every byte from pos to the end of the last segment is zero: a clean end, not a
    tear. Holes of sparse segments are skipped unread, and the look stops at the first non-zero
    chunk; segments that end at or before pos are not looked at."""
    segs = log.segments
    return all(segment.is_zero(max(pos - base, 0)) for segment in segs.segments
               if (base := segs.base_of(segment)) + segment.size_bytes > pos)
