"""Walk a commitlog record by record *past* bad bytes: what `engine.check` reports and what a
recovery cut quarantines. Read-only.

After a record that does not decode, the walk resynchronises: at the end its TOTALSIZE claims
if a record starts there, else at the next record found by its magic, else at the next segment.
Zeros from a position to the end of the log are a clean end, not bad bytes. A record found after
a bad region is genuine: a valid record holds its own commit position (PHYSICALOFFSET), and
positions are never reused.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from dataclasses import dataclass

from engine.commitlog import CommitLog
from engine.errors import CorruptRecordError
from engine.formats.record import MAGIC_OFFSET, MAGIC_V1, MAGIC_V2, Filler, Record, Verify, decode_record
from engine.mapped_file import MappedFile

_MAGICS = (MAGIC_V1.to_bytes(4, "big"), MAGIC_V2.to_bytes(4, "big"))
_MAGIC_CHUNK_BYTES = 1 << 20


@dataclass(frozen=True)
class BadRegion:
    """Bytes [start_pos, resume_pos) that hold no valid record, in the segment at `path`."""

    start_pos: int
    resume_pos: int
    reason: str
    path: str


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
    segs = log.segments
    end = segs.end_pos if end_pos is None else min(end_pos, segs.end_pos)
    pos = start_pos
    while pos < end:
        segment = segs.find(pos)
        base = segs.base_of(segment)
        try:
            item = decode_checked(segment, pos - base, base, verify)
        except CorruptRecordError as exc:
            region = _bad_region(log, pos, exc, end, verify)
            if region is None:
                return
            yield region
            pos = region.resume_pos
            continue
        yield item
        pos = item.end_pos


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
    segment = log.segments.find(pos)
    base = log.segments.base_of(segment)
    resume = _resync(segment, pos - base, base, exc.size, verify, min(segment.size_bytes, end - base))
    return BadRegion(pos, resume, exc.reason, str(segment.path))


def decode_checked(segment: MappedFile, file_pos: int, base: int, verify: Verify) -> Record | Filler:
    """decode_record, and a filler must reach exactly the end of its segment."""
    item = decode_record(segment.buf, file_pos, verify=verify, base_pos=base)
    if isinstance(item, Filler) and item.size != segment.size_bytes - file_pos:
        raise CorruptRecordError(f"filler of {item.size} bytes with {segment.size_bytes - file_pos} "
                                 "left in the segment", pos=base + file_pos)
    return item


def is_zero_from(log: CommitLog, pos: int) -> bool:
    """True when every byte from pos to the end of the last segment is zero. Holes of sparse
    segments are skipped unread, and the walk stops at the first non-zero chunk."""
    segs = log.segments
    return all(segment.is_zero(max(pos - segs.base_of(segment), 0)) for segment in segs.segments)


def _resync(segment: MappedFile, file_pos: int, base: int, size: int, verify: Verify, limit: int) -> int:
    """Where valid data resumes after a bad record at file_pos (see the module doc), searching
    the segment up to file position `limit`."""
    candidates = []
    if size > 0 and file_pos + size < limit:
        candidates.append(file_pos + size)
    for candidate in itertools.chain(candidates, _magic_candidates(segment, file_pos + 1, limit)):
        try:
            decode_checked(segment, candidate, base, verify)
        except CorruptRecordError:
            continue
        return base + candidate
    return base + limit


def _magic_candidates(segment: MappedFile, start: int, limit: int) -> Iterator[int]:
    """File positions start <= p < limit whose bytes at p + MAGIC_OFFSET are a record magic."""
    buf, limit = segment.buf, min(limit + MAGIC_OFFSET, segment.size_bytes)
    at = start + MAGIC_OFFSET
    while at < limit:
        chunk = bytes(buf[at:min(limit, at + _MAGIC_CHUNK_BYTES + 3)])
        hits = sorted(i for magic in _MAGICS for i in _find_all(chunk, magic))
        yield from (at + i - MAGIC_OFFSET for i in hits)
        at += _MAGIC_CHUNK_BYTES


def _find_all(data: bytes, needle: bytes) -> Iterator[int]:
    i = data.find(needle)
    while i >= 0:
        yield i
        i = data.find(needle, i + 1)
