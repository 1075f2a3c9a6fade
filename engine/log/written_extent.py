"""How far the commitlog's records probably reach: the total a recovery scan reports against.

Segments are created zero-filled at their full size (and the next one ahead of need), so their
length says nothing about what was written; a progress total taken from it stops at a fraction.
The written part is a prefix: the estimate is the end of the last page of the last written
segment that holds a non-zero byte, found by bisection (a few page reads per segment). A page of
zeros inside a record body can make it short, so callers treat it as an estimate, never a bound.
"""

from __future__ import annotations

from engine.files.segment_queue import SegmentQueue

PAGE_BYTES = 4096


def written_end_estimate(segments: SegmentQueue) -> int:
    """The commit position the written records probably end at (min_pos when none is written)."""
    for segment in reversed(segments.segments):
        if not _page_is_zero(segment, 0, segments.segment_bytes):
            base = segments.base_of(segment)
            return base + _written_bytes(segment, segments.segment_bytes)
    return segments.min_pos


def _written_bytes(segment, segment_bytes: int) -> int:
    """End of the last non-zero page, given that page 0 is non-zero."""
    low, high = 0, -(-segment_bytes // PAGE_BYTES)  # page `low` is written, `high` is past the end
    while high - low > 1:
        middle = (low + high) // 2
        if _page_is_zero(segment, middle * PAGE_BYTES, segment_bytes):
            high = middle
        else:
            low = middle
    return min((low + 1) * PAGE_BYTES, segment_bytes)


def _page_is_zero(segment, file_pos: int, segment_bytes: int) -> bool:
    length = min(PAGE_BYTES, segment_bytes - file_pos)
    return not any(segment.read(file_pos, length))
