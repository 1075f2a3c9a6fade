"""Scan planning without Spark: range bounds never lose or duplicate a record; pruning is safe."""

from __future__ import annotations

import struct

from hypothesis import given, settings
from hypothesis import strategies as st

from engine.formats.record import BLANK_MAGIC, MAGIC_V1, MAGIC_V2, RECORD_FIXED_SIZE
from tools.spark.layout import Segment, read_layout
from tools.spark.partitions import (
    BlockReader,
    ScanFilter,
    SplitMode,
    chain_end,
    first_record_at,
    next_record_pos,
    plan_ranges,
    plan_scan,
    sample_splits,
)
from tools.spark.scan import RowFilter, ScanSpec, VerifyMode, iter_range

SEGMENT_BYTES = 8192


def build_segment(sizes: list[int], tail: str) -> tuple[bytes, list[int]]:
    """Fake records (TOTALSIZE, magic, junk that may look like headers) chained from 0."""
    out = bytearray(SEGMENT_BYTES)
    starts, pos = [], 0
    for i, size in enumerate(sizes):
        if pos + size + 8 > SEGMENT_BYTES:
            break
        struct.pack_into(">iI", out, pos, size, MAGIC_V1 if i % 3 else MAGIC_V2)
        junk = struct.pack(">iI", 100, MAGIC_V1) * (size // 8)
        out[pos + 8:pos + size] = junk[:size - 8]
        starts.append(pos)
        pos += size
    if tail == "filler":
        struct.pack_into(">iI", out, pos, SEGMENT_BYTES - pos, BLANK_MAGIC)
    elif tail == "garbage":
        struct.pack_into(">iI", out, pos, 12345, 0xDEADBEEF)
    return bytes(out), starts


def reader(data: bytes) -> BlockReader:
    return BlockReader(lambda pos, n: data[pos:pos + n], block_bytes=512)


def owned(data: bytes, ranges) -> list[int]:
    """Every record start each range owns, by the executor's rule (walk, then start < end)."""
    out = []
    for r in ranges:
        blocks = reader(data)
        pos = first_record_at(blocks, r.walk_from, r.start, SEGMENT_BYTES)
        while pos is not None and pos < r.end:
            nxt = next_record_pos(blocks, pos, SEGMENT_BYTES)
            if nxt is not None:  # a record (the executor stops at a filler, zeros or garbage)
                out.append(pos)
            pos = nxt
    return out


record_sizes = st.lists(st.integers(RECORD_FIXED_SIZE, 700), min_size=0, max_size=80)
tails = st.sampled_from(["filler", "zeros", "garbage"])


@settings(max_examples=200, deadline=None)
@given(record_sizes, tails, st.lists(st.integers(1, SEGMENT_BYTES - 1), max_size=12))
def test_walk_ranges_at_any_bounds_own_each_record_once(sizes, tail, cuts):
    data, starts = build_segment(sizes, tail)
    segment = Segment("seg", 0)
    ranges = [r.__class__(r.path, r.base_pos, r.segment_bytes, 0, r.start, r.end)
              for r in plan_ranges(segment, SEGMENT_BYTES, cuts, 0, SEGMENT_BYTES)]
    assert owned(data, ranges) == starts


@settings(max_examples=200, deadline=None)
@given(record_sizes, tails, st.integers(64, 4096), st.integers(0, SEGMENT_BYTES),
       st.integers(0, SEGMENT_BYTES))
def test_sampled_splits_are_record_starts_and_cover_a_commit_range(sizes, tail, target, lo, hi):
    data, starts = build_segment(sizes, tail)
    samples = sample_splits(reader(data), 0, SEGMENT_BYTES, target)
    splits = [p for p, _ in samples]
    assert set(splits) <= {*starts, 0}
    ranges = plan_ranges(Segment("seg", 0), SEGMENT_BYTES, splits, lo, hi)
    assert all(r.walk_from <= r.start for r in ranges)
    assert owned(data, ranges) == [p for p in starts if lo <= p < hi]


@given(record_sizes, tails)
def test_chain_end_is_after_the_last_record_or_the_segment_end_after_a_filler(sizes, tail):
    data, starts = build_segment(sizes, tail)
    end = chain_end(reader(data), 0, SEGMENT_BYTES)
    last_end = starts[-1] + sizes[len(starts) - 1] if starts else 0
    assert end == (SEGMENT_BYTES if tail == "filler" else last_end)


def _records_of(ranges, spec) -> list[int]:
    return [r.commit_pos for rng in ranges for r in iter_range(rng, spec) if spec.row_filter.accepts(r)]


SPEC = ScanSpec(VerifyMode.NONE, None, RowFilter())  # type: ignore[arg-type]


def test_plan_scan_on_a_real_store_reads_every_record_once(store_dir, records):
    layout = read_layout(store_dir)
    spec = ScanSpec(VerifyMode.FAIL, layout.full_verify, RowFilter())
    for mode in SplitMode:
        ranges = plan_scan(layout, ScanFilter(), target_bytes=2000, split_mode=mode)
        assert len(ranges) > len(layout.segments)
        assert _records_of(ranges, spec) == sorted(records)


def test_commit_range_starting_mid_record_reads_records_starting_inside(store_dir, records):
    layout = read_layout(store_dir)
    positions = sorted(records)
    lo, hi = positions[10] + 5, positions[200]
    for mode in SplitMode:
        ranges = plan_scan(layout, ScanFilter(lo, hi), target_bytes=3000, split_mode=mode)
        assert _records_of(ranges, SPEC) == [p for p in positions if lo <= p < hi]


def test_time_filter_prunes_segments_without_losing_records(store_dir, records):
    layout = read_layout(store_dir)
    times = sorted({r.store_ts_ms for r in records.values()})
    start_ms, end_ms = times[len(times) // 2], times[len(times) // 2 + 2]
    f = ScanFilter(start_ms=start_ms, end_ms=end_ms, time_slack_ms=0)
    ranges = plan_scan(layout, f, target_bytes=2000)
    assert len(ranges) < len(plan_scan(layout, ScanFilter(), target_bytes=2000))
    spec = ScanSpec(VerifyMode.NONE, layout.full_verify, RowFilter(None, start_ms, end_ms))
    wanted = sorted(p for p, r in records.items() if start_ms <= r.store_ts_ms < end_ms)
    assert _records_of(ranges, spec) == wanted


def test_topic_filter_prunes_ranges_through_consume_queues(store_dir, records):
    layout = read_layout(store_dir)
    few = sorted(records)[:3]
    only = frozenset({records[few[0]].topic})
    ranges = plan_scan(layout, ScanFilter(end_pos=few[-1] + 1, topics=only), target_bytes=200)
    everything = plan_scan(layout, ScanFilter(end_pos=few[-1] + 1), target_bytes=200)
    assert 0 < len(ranges) < len(everything)
    spec = ScanSpec(VerifyMode.NONE, layout.full_verify, RowFilter(only))
    assert _records_of(ranges, spec) == [p for p in few if records[p].topic in only]
