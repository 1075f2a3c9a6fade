"""The record that ends at a position, found backwards and read with every check.

Every record holds its own commit position (PHYSICALOFFSET) and its size (TOTALSIZE), so a
candidate start `s` of the record ending at `end` is a record magic at `s` whose TOTALSIZE is
`end - s` and whose PHYSICALOFFSET is `s`. A producer's body can hold such bytes, so candidates
are tried newest first and the first that decodes with every check (Verify.MQSTORE: BODYCRC and
CRC32C) is the record: a fake inside the last record's body is newer than it and fails its CRCs.

Cost, bounded whatever the segment size or write rate: the search reads only the bytes just
below `end` (SEARCH_FIRST_BYTES, then four times more each round, each round the starts the one
before did not cover, never past the segment's base), and at most MAX_CANDIDATES are decoded,
each a CRC over at most the record. A sealed segment's records end where its end-of-file filler
starts: the filler's 8-byte head is the segment's last non-zero byte, found by reading back over
the segment's data ranges only (its holes are never read: see MappedFile.nonzero_end).
"""

from __future__ import annotations

import struct
from collections.abc import Iterator

from engine.errors import CorruptRecordError
from engine.formats.record import (
    BLANK_MAGIC,
    FILLER_FMT,
    FILLER_SIZE,
    MAGIC_OFFSET,
    MAGIC_V1,
    MAGIC_V2,
    PHYSICAL_OFFSET_OFFSET,
    RECORD_FIXED_SIZE,
    Record,
    Verify,
    decode_record,
)
from engine.log.commitlog import CommitLog
from engine.log.walker import LogWindow

SEARCH_FIRST_BYTES = 4 << 10  # most records are smaller: one round finds them
MAX_CANDIDATES = 16  # decoded with every check at most: each costs a CRC over up to a record
_HEAD = struct.Struct(FILLER_FMT)  # TOTALSIZE, MAGICCODE: a record's or a filler's first 8 bytes
_COMMIT_POS = struct.Struct(">q")  # PHYSICALOFFSET
_MAGICS = tuple(magic.to_bytes(4, "big") for magic in (MAGIC_V1, MAGIC_V2))
_MAGIC_PREFIX = _MAGICS[0][:3]
_MAGIC_LAST_BYTES = tuple(magic[3:] for magic in _MAGICS)
assert all(magic[:3] == _MAGIC_PREFIX for magic in _MAGICS)


def record_ending_at(log: CommitLog, end_pos: int) -> Record | None:
    """The record that ends exactly at `end_pos` (a record end, or a segment base after a
    filler), read with every check; None when nothing record-shaped ends there, and
    CorruptRecordError when something does but none of it reads."""
    if end_pos <= log.min_pos:
        return None
    if (end_pos - log.min_pos) % log.segment_bytes == 0:  # the previous segment's last record
        return last_record_of_segment(log, end_pos - log.segment_bytes)
    window = log.window_at(end_pos - 1)
    return None if window is None else decode_record_ending_at(window, end_pos)


def last_record_of_segment(log: CommitLog, base_pos: int) -> Record | None:
    """A sealed segment's last record: the one ending at its filler, or at the segment's end
    when records fill it; None when the segment ends in neither (torn, zeroed), no record ends
    there or its file is gone, and CorruptRecordError when none of what ends there reads."""
    window = log.window_at(base_pos)
    segment = log.segments.find(base_pos)
    if window is None or segment is None or window.base_pos != base_pos:
        return None
    try:
        data_end = segment.nonzero_end()
    except FileNotFoundError:  # retention removed it after a read-only view last refreshed
        return None
    if data_end is None:
        return None
    written_end = base_pos + data_end
    filler_pos = written_end - FILLER_SIZE
    if filler_pos >= base_pos and _is_filler_at(window, filler_pos):
        return decode_record_ending_at(window, filler_pos) if filler_pos > base_pos else None
    if written_end == window.segment_end_pos:
        return decode_record_ending_at(window, written_end)
    return None


def decode_record_ending_at(window: LogWindow, end_pos: int) -> Record | None:
    """The newest record in `window` ending at `end_pos` that decodes with every check (pure);
    None when no start there is record-shaped, CorruptRecordError when none of them decodes."""
    failures: list[CorruptRecordError] = []
    for start_pos in record_starts_ending_at(window, end_pos):
        if len(failures) == MAX_CANDIDATES:
            break
        try:
            return decode_record(window.buf, start_pos - window.base_pos, verify=Verify.MQSTORE,
                                 base_pos=window.base_pos)
        except CorruptRecordError as exc:
            failures.append(exc)
    if not failures:
        return None
    newest = failures[0]
    raise CorruptRecordError(
        f"none of the {len(failures)} record-shaped starts tried (at most {MAX_CANDIDATES}) ending "
        f"at {end_pos} reads with every check; the newest: {newest.reason}",
        pos=newest.pos, path=window.path or None, size=newest.size)


def record_starts_ending_at(window: LogWindow, end_pos: int) -> Iterator[int]:
    """Commit positions `s` in `window`, newest first, holding a record magic, TOTALSIZE
    `end_pos - s` and PHYSICALOFFSET `s` (pure; candidates only, their CRCs unchecked)."""
    end_off = end_pos - window.base_pos
    span, high = SEARCH_FIRST_BYTES, end_off - RECORD_FIXED_SIZE + 1  # starts below `high` are left
    while high > 0:
        low = max(0, end_off - span)
        for start in sorted(_magic_starts(window.buf, low, high), reverse=True):
            if _ends_at(window, start, end_off):
                yield window.base_pos + start
        high, span = low, span * 4


def _magic_starts(buf, low: int, high: int) -> list[int]:
    """Record starts s, low <= s < high, whose magic field holds a record magic (one search for
    the bytes both magics begin with, then the last byte)."""
    chunk = bytes(buf[low + MAGIC_OFFSET:high - 1 + MAGIC_OFFSET + 4])
    found = []
    i = chunk.find(_MAGIC_PREFIX)
    while i >= 0:
        if chunk[i + 3:i + 4] in _MAGIC_LAST_BYTES:
            found.append(low + i)
        i = chunk.find(_MAGIC_PREFIX, i + 1)
    return found


def _ends_at(window: LogWindow, start: int, end_off: int) -> bool:
    total_size, _ = _HEAD.unpack_from(window.buf, start)
    commit_pos = _COMMIT_POS.unpack_from(window.buf, start + PHYSICAL_OFFSET_OFFSET)[0]
    return total_size == end_off - start and commit_pos == window.base_pos + start


def _is_filler_at(window: LogWindow, pos: int) -> bool:
    """An end-of-file filler's head at `pos`: BLANK_MAGIC and TOTALSIZE = the space left."""
    total_size, magic = _HEAD.unpack_from(window.buf, pos - window.base_pos)
    return magic == BLANK_MAGIC and total_size == window.segment_end_pos - pos
