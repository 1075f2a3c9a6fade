"""The last record before a position, found by following the record chain forward.

A record carries its length only at its start (RocketMQ's layout has no trailer), so the record
that ends at a position is found by hopping TOTALSIZE from a known record start
(engine.log_walker.hop_to_last, 8-byte heads only), across end-of-file fillers to the next
segment. The cost is the heads between the two positions; callers that move forward keep the
last answer as the next start (engine.durable_times) or remember it (engine.segment_age).
"""

from __future__ import annotations

from engine.commitlog import CommitLog
from engine.formats.record import FILLER_SIZE
from engine.log_walker import HopEnd, LogWindow, hop_to_last, is_filler_head


def last_record_before(log: CommitLog, from_pos: int, end_pos: int) -> int | None:
    """The start of the record that ends exactly at `end_pos`, walking from the record start
    `from_pos` < `end_pos`; None when the chain does not land on `end_pos` (bad bytes, zeros,
    a missing segment, or `end_pos` inside a record)."""
    pos, last = from_pos, None
    while pos < end_pos:
        window = log.window_at(pos)
        if window is None:
            return None
        start, pos, how = hop_to_last(window, pos, end_pos)
        last = last if start is None else start
        if how is HopEnd.REACHED:
            break
        if not _is_segment_end(window, pos, how):
            return None
        pos = window.segment_end_pos
    return last if pos == end_pos else None


def last_record_of_segment(log: CommitLog, base_pos: int) -> int | None:
    """The start of a sealed segment's last record; None when its chain stops short of the
    end-of-file filler (or of the segment's end), so that record cannot be told."""
    window = log.window_at(base_pos)
    if window is None:
        return None
    start, pos, how = hop_to_last(window, base_pos, window.segment_end_pos)
    if how is HopEnd.REACHED or _is_segment_end(window, pos, how):
        return start
    return None


def _is_segment_end(window: LogWindow, pos: int, how: HopEnd) -> bool:
    """The chain stopped where its segment's records end: at the filler, or with no room for one."""
    return how is HopEnd.CHAIN_END and (window.segment_end_pos - pos < FILLER_SIZE
                                        or is_filler_head(window, pos))
