"""The end of the log past a recovery cut: whether anything was written there, and the copy of
it that goes to quarantine/ before the log is truncated (DESIGN §5.6: nothing is cut unseen).

The copy holds every byte from the cut to the last non-zero byte, so each valid record in it
decodes at its own commit position (file offset = commit_pos - cut_pos); it is streamed a
QUARANTINE_CHUNK_BYTES piece at a time, holes of sparse segments read as zeros.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import NamedTuple

from engine.files.filesystem import ensure_dir, write_new_file
from engine.files.naming import quarantine_name
from engine.formats.record import Verify
from engine.log.commitlog import CommitLog
from engine.log.walk_past import valid_records_between

QUARANTINE_CHUNK_BYTES = 8 << 20  # the cut-off tail is copied to its quarantine file this much at a time


class QuarantinedTail(NamedTuple):
    """Where the tail past a cut went, its size and the valid records it holds."""

    path: Path
    size_bytes: int
    valid_records: int


def quarantine_tail(commitlog: CommitLog, directory: Path, cut_pos: int, now_ms: int
                    ) -> QuarantinedTail | None:
    """Copy the log's bytes from cut_pos to its last written byte into a new file in
    `directory`; None when nothing was written past cut_pos (a clean end, not a tear)."""
    end_pos = tail_end(commitlog, cut_pos)
    if end_pos == cut_pos:  # only zeros past the cut
        return None
    path = ensure_dir(directory) / quarantine_name(cut_pos, now_ms)
    write_new_file(path, log_chunks(commitlog, cut_pos, end_pos))
    records = valid_records_between(commitlog, cut_pos, end_pos, Verify.MQSTORE).count
    return QuarantinedTail(path, end_pos - cut_pos, records)


def data_segments_after(commitlog: CommitLog, cut_pos: int) -> list[Path]:
    """The segments past the one holding cut_pos that hold data (a preallocated, all-zero
    segment is not data: removing it is not worth reporting)."""
    seg = commitlog.segments
    cut_base = segment_base(commitlog, cut_pos)
    return [s.path for s in seg.segments if seg.base_of(s) > cut_base and not s.is_zero()]


def segment_base(commitlog: CommitLog, pos: int) -> int:
    """The base position of the segment that holds (or would hold) pos."""
    seg = commitlog.segments
    return pos - (pos - seg.min_pos) % seg.segment_bytes if seg.segments else 0


def tail_end(commitlog: CommitLog, cut_pos: int) -> int:
    """The position after the last non-zero byte at or past cut_pos (cut_pos if there is none):
    the end of what a cut there removes, and of what a check reads. Read backwards a chunk at a
    time, holes skipped."""
    seg = commitlog.segments
    for segment in reversed(seg.segments):
        base = seg.base_of(segment)
        if base + segment.size_bytes <= cut_pos:
            break
        data_end = segment.nonzero_end(max(cut_pos - base, 0))
        if data_end is not None:
            return base + data_end
    return cut_pos


def log_chunks(commitlog: CommitLog, start_pos: int, end_pos: int) -> Iterator[memoryview | bytes]:
    """The log's bytes [start_pos, end_pos) in order, at most QUARANTINE_CHUNK_BYTES at a time
    (views of the segments; a hole of a sparse segment, or a missing segment, reads as zeros):
    what a copy to quarantine/ streams, a cut tail or a salvaged span alike."""
    seg = commitlog.segments
    pos = start_pos
    for segment in seg.segments:
        base = seg.base_of(segment)
        if base + segment.size_bytes <= pos or base >= end_pos:
            continue
        for lo, hi in segment.data_ranges(max(pos - base, 0), end_pos - base):
            yield from _zero_chunks(base + lo - pos)
            for start in range(lo, hi, QUARANTINE_CHUNK_BYTES):
                yield segment.read(start, min(QUARANTINE_CHUNK_BYTES, hi - start))
            pos = base + hi
    yield from _zero_chunks(end_pos - pos)


def _zero_chunks(length_bytes: int) -> Iterator[bytes]:
    for start in range(0, length_bytes, QUARANTINE_CHUNK_BYTES):
        yield bytes(min(QUARANTINE_CHUNK_BYTES, length_bytes - start))
