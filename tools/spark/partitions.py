"""Planning a scan of the commitlog: segments, byte ranges inside them, and pruning.

A scan is a list of `ScanRange`s. A range owns the records of one segment whose start
`file_pos` lies in [start, end); it finds its first record by walking the record chain
(each record starts with its TOTALSIZE) from `walk_from`, a position known to be a record
start. Two neighbouring ranges share one bound, so the first record at or after that bound
is the last record's successor for one range and the first record of the next: no record is
read twice or missed, whatever the bounds are. The walk (engine.log.walker.hop_heads) reads
only each record's 8-byte head (TOTALSIZE, MAGIC) through 1 MiB blocks and stops at a filler,
zeros or garbage.

Two ways to choose the bounds (`SplitMode`), both exact:
- SAMPLE (default): the planner walks each large segment's chain once on the driver and puts
  the bounds at record starts, so every range has `walk_from == start` and executors never
  walk. It also learns where the data ends (no empty ranges over the unwritten part of the
  active segment) and the store time at each bound (finer time pruning).
- WALK: bounds at fixed byte offsets, no planning I/O; every executor walks from the segment
  start to its bound, so a segment cut in k ranges pays about k/2 walks of itself.

Prefer SAMPLE locally and WALK (`splitMode=walk`, with a larger `maxPartitionBytes` to cut the
walks) from ~4 executor cores up: SAMPLE costs serial driver time, WALK a walk per range, and
decoding costs about ten times the walk, so WALK's share shrinks with more cores
(docs/DECISIONS.md#spark-split-mode).

Pruning: a segment is skipped when the store times it can hold (from its first record to the
next segment's first record; store time never goes back in commit order, less a slack) miss
the requested time range; a range is skipped when the consume queues of the requested topics
have no entry in it (only below the position the consume queues are known to cover).
Trailing segments that start with zeros (preallocated) get no range at all.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from enum import Enum
from pathlib import Path

import numpy as np

from engine.errors import CorruptRecordError
from engine.files.naming import CONSUMEQUEUE_DIR
from engine.filters.tag_expression import MATCH_ALL_TAGS, TagExpression
from engine.formats.cq_entry import CQ_DTYPE, CQ_ENTRY_SIZE, FILLER_SIZE_MARK
from engine.formats.record import FILLER_SIZE, V4_HEADER_SIZE, store_ts_at
from engine.log.walker import HopEnd, LogWindow, hop_heads, is_filler_head
from tools.spark.layout import Segment, StoreFormat, StoreLayout, read_durable_pos

BLOCK_BYTES = 1 << 20
DEFAULT_PARTITION_BYTES = 128 << 20
Reader = Callable[[int, int], bytes]  # (file_pos, length) -> bytes (shorter at end of file)


class SplitMode(Enum):
    SAMPLE = "sample"
    WALK = "walk"


@dataclass(frozen=True)
class ScanRange:
    """Records of one segment starting in [start, end) (file positions); walk from `walk_from`."""

    path: str
    base_pos: int
    segment_bytes: int
    walk_from: int
    start: int
    end: int


@dataclass(frozen=True)
class ScanFilter:
    """What to read: commit positions [start_pos, end_pos), store times [start_ms, end_ms)."""

    start_pos: int = 0
    end_pos: int | None = None
    start_ms: int | None = None
    end_ms: int | None = None
    topics: frozenset[str] | None = None
    time_slack_ms: int = 60_000
    tags: TagExpression = MATCH_ALL_TAGS  # rows only: ranges are not pruned by tag


# ----------------------------------------------------------------------- chain walking


class BlockReader:
    """Reads a file through one cached block; `view(pos, n)` -> (buffer, offset in it)."""

    def __init__(self, read: Reader, block_bytes: int = BLOCK_BYTES):
        self._read = read
        self._block_bytes = block_bytes
        self._block = b""
        self._block_pos = 0
        self._window: LogWindow | None = None

    def view(self, file_pos: int, length: int) -> tuple[bytes, int]:
        off = file_pos - self._block_pos
        if off < 0 or off + length > len(self._block):
            self._block = self._read(file_pos, max(length, self._block_bytes))
            self._block_pos, off = file_pos, 0
        return self._block, off

    def window(self, file_pos: int, length: int, base_pos: int, segment_bytes: int) -> LogWindow:
        """The cached block holding [file_pos, +length) (shorter at the end of the file) as a
        walker's window over the segment whose first byte is at commit position `base_pos`."""
        block, off = self.view(file_pos, length)
        window = self._window
        if window is None or window.buf is not block or window.base_pos != base_pos + file_pos - off \
                or window.segment_end_pos != base_pos + segment_bytes:
            window = self._window = LogWindow(block, base_pos + file_pos - off, base_pos + segment_bytes)
        return window


def pread_reader(fd: int) -> Reader:
    return lambda file_pos, length: os.pread(fd, length, file_pos)


def next_record_pos(blocks: BlockReader, file_pos: int, segment_bytes: int) -> int | None:
    """Where the chain goes after the record at `file_pos`; None at a filler, zeros or garbage."""
    window = blocks.window(file_pos, FILLER_SIZE, 0, segment_bytes)
    if window.end_pos - file_pos < FILLER_SIZE:
        return None
    pos, end = hop_heads(window, file_pos, file_pos + 1)
    return pos if end is HopEnd.REACHED else None


def _hop(blocks: BlockReader, pos: int, stop: int, segment_bytes: int) -> tuple[int, bool]:
    """Follow the chain from the record start `pos` while below `stop` (log_walker.hop_heads,
    one cached block at a time): (position, True) at the first chain position >= stop,
    (position, False) where the chain ends before it."""
    while True:
        window = blocks.window(pos, FILLER_SIZE, 0, segment_bytes)
        if pos < stop and window.end_pos - pos < FILLER_SIZE:
            return pos, False  # the file ends before the segment does
        pos, end = hop_heads(window, pos, stop)
        if end is not HopEnd.WINDOW_END:
            return pos, end is HopEnd.REACHED


def first_record_at(blocks: BlockReader, walk_from: int, start: int, segment_bytes: int) -> int | None:
    """The first chain position >= start, walking from the record start `walk_from`;
    None when the chain ends (filler, unwritten or invalid bytes) before `start`."""
    pos, reached = _hop(blocks, walk_from, start, segment_bytes)
    return pos if reached else None


def chain_end(blocks: BlockReader, walk_from: int, segment_bytes: int) -> int:
    """Where the chain from `walk_from` stops: the segment end after a filler, else the first
    position that holds no record (unwritten or invalid bytes)."""
    pos, _ = _hop(blocks, walk_from, segment_bytes, segment_bytes)
    if segment_bytes - pos >= FILLER_SIZE \
            and is_filler_head(blocks.window(pos, FILLER_SIZE, 0, segment_bytes), pos):
        return segment_bytes
    return pos


def sample_splits(blocks: BlockReader, walk_from: int, segment_bytes: int,
                  target_bytes: int) -> list[tuple[int, int | None]]:
    """Walk the whole chain once; return (file_pos, store_ts_ms) of record starts about
    `target_bytes` apart, the first being `walk_from` (store time None where unreadable)."""
    splits = [(walk_from, _store_ts(blocks, walk_from, segment_bytes))]
    pos = walk_from
    while (nxt := next_record_pos(blocks, pos, segment_bytes)) is not None:
        if pos - splits[-1][0] >= target_bytes:
            splits.append((pos, _store_ts(blocks, pos, segment_bytes)))
        pos, reached = _hop(blocks, nxt, splits[-1][0] + target_bytes, segment_bytes)
        if not reached:
            break
    return splits


def _store_ts(blocks: BlockReader, file_pos: int, segment_bytes: int) -> int | None:
    length = min(V4_HEADER_SIZE + 12, segment_bytes - file_pos)
    buf, off = blocks.view(file_pos, length)
    try:
        return store_ts_at(buf[off:off + length], 0)
    except CorruptRecordError:  # not a record (unwritten, filler): this header prunes nothing
        return None


# ---------------------------------------------------------------------------- planning


def plan_ranges(segment: Segment, segment_bytes: int, splits: Sequence[int], first: int,
                limit: int) -> list[ScanRange]:
    """Ranges of one segment between sorted record-start `splits` (file positions), cut to
    [first, limit); each range walks from the nearest split at or below its start."""
    bounds = sorted({*splits, 0})
    out = []
    for i, lo in enumerate(bounds):
        hi = bounds[i + 1] if i + 1 < len(bounds) else segment_bytes
        start, end = max(lo, first), min(hi, limit)
        if start < end:
            out.append(ScanRange(segment.path, segment.base_pos, segment_bytes, lo, start, end))
    return out


def plan_scan(layout: StoreLayout, scan_filter: ScanFilter, *, target_bytes: int = DEFAULT_PARTITION_BYTES,
              split_mode: SplitMode = SplitMode.SAMPLE, known_start: int | None = None) -> list[ScanRange]:
    """The ranges to read for `scan_filter`, pruned by time and topic. `known_start`, a commit
    position known to be a record start (a stream's last offset), saves the walk up to it."""
    end_pos = scan_filter.end_pos if scan_filter.end_pos is not None else 2**63 - 1
    first_ts = _segment_first_ts(layout) if _has_time_filter(scan_filter) else {}
    ranges: list[ScanRange] = []
    for i, seg in enumerate(layout.segments[:_written_segment_count(layout)]):
        lo = max(scan_filter.start_pos - seg.base_pos, 0)
        hi = min(end_pos - seg.base_pos, layout.segment_bytes)
        if lo >= hi or not _segment_may_match(layout, i, first_ts, scan_filter):
            continue
        ranges += _plan_segment(seg, layout.segment_bytes, lo, hi, target_bytes, split_mode,
                                known_start, scan_filter)
    if scan_filter.topics is not None:
        ranges = prune_by_topic(layout, ranges, scan_filter.topics)
    return ranges


def _written_segment_count(layout: StoreLayout) -> int:
    """Segments up to the last one that starts with something: trailing segments whose first
    header is zero (preallocated, nothing written) hold no record and get no partition."""
    count = len(layout.segments)
    while count:
        with open(layout.segments[count - 1].path, "rb") as f:
            if any(os.pread(f.fileno(), FILLER_SIZE, 0)):
                break
        count -= 1
    return count


def _plan_segment(seg: Segment, segment_bytes: int, lo: int, hi: int, target_bytes: int,
                  split_mode: SplitMode, known_start: int | None, scan_filter: ScanFilter) -> list[ScanRange]:
    anchor = 0
    if known_start is not None and 0 <= known_start - seg.base_pos <= lo:
        anchor = known_start - seg.base_pos
    if hi - anchor <= target_bytes:
        return plan_ranges(seg, segment_bytes, [anchor], lo, hi)
    if split_mode is SplitMode.WALK:
        fixed = range(anchor + target_bytes, hi, target_bytes)
        ranges = plan_ranges(seg, segment_bytes, [anchor, *fixed], lo, hi)
        return [replace(r, walk_from=anchor) for r in ranges]
    with open(seg.path, "rb") as f:
        samples = sample_splits(BlockReader(pread_reader(f.fileno())), anchor, segment_bytes, target_bytes)
    ranges = plan_ranges(seg, segment_bytes, [p for p, _ in samples], lo, hi)
    return _prune_ranges_by_time(ranges, samples, scan_filter)


def _has_time_filter(f: ScanFilter) -> bool:
    return f.start_ms is not None or f.end_ms is not None


def _segment_first_ts(layout: StoreLayout) -> dict[int, int | None]:
    """Store time of each segment's first record (None for an empty or unreadable segment)."""
    out = {}
    for i, seg in enumerate(layout.segments):
        with open(seg.path, "rb") as f:
            out[i] = _store_ts(BlockReader(pread_reader(f.fileno()), 4096), 0, layout.segment_bytes)
    return out


def _time_overlaps(lo_ts: int | None, hi_ts: int | None, f: ScanFilter) -> bool:
    """Can records stored in [lo_ts, hi_ts] (None: unknown) fall in [start_ms, end_ms)?"""
    if f.end_ms is not None and lo_ts is not None and lo_ts - f.time_slack_ms >= f.end_ms:
        return False
    return not (f.start_ms is not None and hi_ts is not None and hi_ts + f.time_slack_ms < f.start_ms)


def _segment_may_match(layout: StoreLayout, i: int, first_ts: dict, f: ScanFilter) -> bool:
    if not _has_time_filter(f):
        return True
    upper = first_ts.get(i + 1) if i + 1 < len(layout.segments) else None
    return _time_overlaps(first_ts.get(i), upper, f)


def _prune_ranges_by_time(ranges: list[ScanRange], samples: list[tuple[int, int | None]],
                          f: ScanFilter) -> list[ScanRange]:
    if not _has_time_filter(f):
        return ranges
    ts_at = dict(samples)
    starts = sorted(ts_at)
    kept = []
    for r in ranges:
        later = [p for p in starts if p > r.walk_from]
        upper = ts_at[later[0]] if later else None
        if _time_overlaps(ts_at.get(r.walk_from), upper, f):
            kept.append(r)
    return kept


# ------------------------------------------------------------------- topic pruning


def read_topic_positions(root: str | Path, topics: frozenset[str]) -> np.ndarray:
    """Sorted commit positions of every consume-queue entry of `topics` (fillers dropped)."""
    parts = [np.empty(0, dtype=np.int64)]
    base = Path(root) / CONSUMEQUEUE_DIR
    for topic in topics:
        topic_dir = base / topic
        if not topic_dir.is_dir():
            continue
        for queue_dir in topic_dir.iterdir():
            for path in sorted(queue_dir.iterdir()) if queue_dir.is_dir() else ():
                entries = np.fromfile(path, dtype=CQ_DTYPE, count=path.stat().st_size // CQ_ENTRY_SIZE)
                valid = (entries["size"] > 0) & (entries["size"] != FILLER_SIZE_MARK) \
                    & (entries["commit_pos"] >= 0)
                parts.append(entries["commit_pos"][valid].astype(np.int64))
    return np.unique(np.concatenate(parts))


def prune_by_topic(layout: StoreLayout, ranges: list[ScanRange], topics: frozenset[str]) -> list[ScanRange]:
    """Drop ranges below the consume queues' durable position that hold no entry of `topics`.

    RocketMQ-written stores and stores without a checkpoint are not pruned. Records that never
    enter a consume queue (a transaction PREPARED/ROLLBACK one at queue offset 0, as RocketMQ
    writes them) are not seen by this pruning."""
    covered_end = read_durable_pos(layout.root) if layout.format is StoreFormat.MQSTORE else None
    if not covered_end:
        return ranges
    positions = read_topic_positions(layout.root, topics)
    kept = []
    for r in ranges:
        lo, hi = r.base_pos + r.start, r.base_pos + r.end
        if hi > covered_end:
            kept.append(r)
            continue
        i = int(np.searchsorted(positions, lo))
        if i < len(positions) and positions[i] < hi:
            kept.append(r)
    return kept
