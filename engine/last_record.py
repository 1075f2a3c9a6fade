"""The record that ends at a position, found backwards: every record holds its own commit
position (PHYSICALOFFSET) and its size (TOTALSIZE), so the start `s` of the record ending at
`end` is the record magic at `s` whose TOTALSIZE is `end - s` and whose PHYSICALOFFSET is `s`.

The search reads only the bytes just below `end` (SEARCH_FIRST_BYTES, then four times more
each round, never past the segment's base), so its cost does not grow with the segment or the
write rate. A sealed segment's records end where its end-of-file filler starts: the filler's
8-byte head is the last non-zero data of the segment (segments are created zero-filled), found
by scanning back from the segment's end. A match is a candidate only: callers that need the
record whole read it with every check (engine.segment_age).
"""

from __future__ import annotations

import struct

import numpy as np

from engine.commitlog import CommitLog
from engine.formats.record import (
    BLANK_MAGIC,
    FILLER_FMT,
    FILLER_SIZE,
    MAGIC_OFFSET,
    MAGIC_V1,
    MAGIC_V2,
    PHYSICAL_OFFSET_OFFSET,
    RECORD_FIXED_SIZE,
)
from engine.log_walker import LogWindow

SEARCH_FIRST_BYTES = 4 << 10  # most records are smaller: one round finds them
ZERO_SCAN_BYTES = 1 << 20  # the zeros after a filler are read back this much at a time
_HEAD = struct.Struct(FILLER_FMT)  # TOTALSIZE, MAGICCODE: a record's or a filler's first 8 bytes
_COMMIT_POS = struct.Struct(">q")  # PHYSICALOFFSET
_MAGICS = tuple(magic.to_bytes(4, "big") for magic in (MAGIC_V1, MAGIC_V2))


def record_ending_at(log: CommitLog, end_pos: int) -> int | None:
    """The start of the record that ends exactly at `end_pos` (a record end, or a segment base
    after a filler); None when no record of the log ends there."""
    if end_pos <= log.min_pos:
        return None
    if (end_pos - log.min_pos) % log.segment_bytes == 0:  # the previous segment's last record
        return last_record_of_segment(log, end_pos - log.segment_bytes)
    window = log.window_at(end_pos - 1)
    return None if window is None else search_record_end(window, end_pos)


def last_record_of_segment(log: CommitLog, base_pos: int) -> int | None:
    """The start of a sealed segment's last record: the one ending at its filler, or at the
    segment's end when records fill it; None when the segment ends in neither (torn, zeroed)."""
    window = log.window_at(base_pos)
    if window is None or window.base_pos != base_pos:
        return None
    written_end = base_pos + written_bytes(window)
    filler_pos = written_end - FILLER_SIZE
    if filler_pos >= base_pos and _is_filler_at(window, filler_pos):
        return search_record_end(window, filler_pos) if filler_pos > base_pos else None
    if written_end == window.segment_end_pos:
        return search_record_end(window, written_end)
    return None


def search_record_end(window: LogWindow, end_pos: int) -> int | None:
    """The start of the record in `window` ending at `end_pos`, searched backwards (pure)."""
    end_off = end_pos - window.base_pos
    span, searched_low = SEARCH_FIRST_BYTES, end_off
    while searched_low > 0:
        low = max(0, end_off - span)
        for start in sorted(_magic_starts(window.buf, low, searched_low), reverse=True):
            if _ends_at(window, start, end_off):
                return window.base_pos + start
        searched_low, span = low, span * 4
    return None


def written_bytes(window: LogWindow) -> int:
    """The window's offset just past its last non-zero byte (0 when all of it is zero)."""
    high = min(len(window.buf), window.segment_end_pos - window.base_pos)
    while high > 0:
        low = max(0, high - ZERO_SCAN_BYTES)
        nonzero = np.flatnonzero(np.frombuffer(window.buf, dtype=np.uint8, count=high - low, offset=low))
        if len(nonzero):
            return low + int(nonzero[-1]) + 1
        high = low
    return 0


def _magic_starts(buf, low: int, high: int) -> list[int]:
    """Record starts s, low <= s < high - RECORD_FIXED_SIZE + 1, whose magic field holds a record magic."""
    last = high - RECORD_FIXED_SIZE
    if last < low:
        return []
    chunk = bytes(buf[low + MAGIC_OFFSET:last + MAGIC_OFFSET + 4])
    found = []
    for magic in _MAGICS:
        i = chunk.find(magic)
        while i >= 0:
            found.append(low + i)
            i = chunk.find(magic, i + 1)
    return found


def _ends_at(window: LogWindow, start: int, end_off: int) -> bool:
    total_size, _ = _HEAD.unpack_from(window.buf, start)
    commit_pos = _COMMIT_POS.unpack_from(window.buf, start + PHYSICAL_OFFSET_OFFSET)[0]
    return total_size == end_off - start and commit_pos == window.base_pos + start


def _is_filler_at(window: LogWindow, pos: int) -> bool:
    """An end-of-file filler's head at `pos`: BLANK_MAGIC and TOTALSIZE = the space left."""
    total_size, magic = _HEAD.unpack_from(window.buf, pos - window.base_pos)
    return magic == BLANK_MAGIC and total_size == window.segment_end_pos - pos
