"""A small backlog is dispatched record by record (engine.dispatch.span's plain-Python way): the
consume-queue entries and the key-ring blocks must be exactly those of the batch codec's way, across
a segment roll (a filler) included."""

from __future__ import annotations

import itertools
import shutil
from functools import partial

import numpy as np
import pytest

from engine.dispatch.few import decode_few
from engine.files.mapped_file import Access
from engine.log.commitlog import CommitLog
from engine.queues.table import ConsumeQueueTable
from engine.topics.table import TopicDefaults, TopicTable, TopicTableFile
from engine.tuning import FEW_RECORDS_BYTES
from ipc.key_ring import KeyRing
from ipc.shm import issue_shm_token
from tools.bench.probes.check_stamp import QUEUES, append_requests, make_requests
from workers.dispatcher import Dispatcher
from workers.request_check import RecordChecker

SEGMENT_BYTES = 64 << 10  # small, so the log rolls over a filler
CQ_ENTRIES = 1024
SHARDS = 2


def write_log(root, requests: int) -> list[int]:
    """Requests of 3 records with a key each; returns the written position after each."""
    log = CommitLog.open(root, SEGMENT_BYTES, Access.READ_WRITE)
    checker = RecordChecker(max_body_bytes=4096, segment_bytes=SEGMENT_BYTES,
                            route=partial(TopicTable().put_route, defaults=TopicDefaults(QUEUES)))
    ends = append_requests(log, checker, make_requests(requests * 3, 3, 200))
    log.flush()
    log.close()
    return ends


def dispatcher_over(root, tag: str) -> Dispatcher:
    """A Dispatcher with only what dispatching reads: the log, the queues and a real key ring."""
    dispatcher = Dispatcher.__new__(Dispatcher)
    dispatcher.commitlog = CommitLog.open(root, SEGMENT_BYTES, Access.READ_ONLY)
    dispatcher.queues = ConsumeQueueTable.load(root, CQ_ENTRIES, Access.READ_WRITE)
    dispatcher.shard_count = SHARDS
    issue_shm_token(root / f"ring-{tag}")  # what a supervisor does before any region is made
    dispatcher.ring = KeyRing.create(root / f"ring-{tag}", SHARDS, generation=1)
    dispatcher.ring_writers = [dispatcher.ring.writer(shard) for shard in range(SHARDS)]
    dispatcher.blocks_dropped = 0
    dispatcher.pos = 0
    dispatcher.topic_file, dispatcher._topics_seen = TopicTableFile(root), None  # no topic deleted
    return dispatcher


def close_dispatcher(dispatcher: Dispatcher) -> None:
    """Close and remove what dispatcher_over opened."""
    dispatcher.ring.remove()
    dispatcher.ring.close()
    dispatcher.queues.close()
    dispatcher.commitlog.close()


def ring_contents(ring: KeyRing, shard: int) -> tuple[list[tuple[int, int]], np.ndarray, np.ndarray]:
    """The (start, end) ranges of a shard's blocks and all their key hashes and positions."""
    reader = ring.reader(shard)
    ranges, hashes, positions = [], [], []
    while (block := reader.read(ranges[-1][1] if ranges else -1)) is not None:
        ranges.append((block.start_pos, block.end_pos))
        hashes.append(block.key_hash)
        positions.append(block.commit_pos)
    return ranges, np.concatenate(hashes), np.concatenate(positions)


@pytest.fixture
def two_logs(tmp_path):
    few_root, window_root = tmp_path / "few", tmp_path / "window"
    ends = write_log(few_root, 60)
    shutil.copytree(few_root, window_root)
    few, window = dispatcher_over(few_root, "few"), dispatcher_over(window_root, "window")
    yield ends, few, window
    for dispatcher in (few, window):
        close_dispatcher(dispatcher)


def test_few_records_at_a_time_dispatch_what_the_batch_path_does(two_logs, monkeypatch):
    ends, few, window = two_logs
    assert ends[-1] > SEGMENT_BYTES  # the log rolled: a filler lies in between
    dispatched = 0
    for end in ends:  # one flush per request, as one message at a time gives
        if few.pos < SEGMENT_BYTES < end:  # a step over the filler alone: no records, one block
            few.pos, count = few._dispatch_span(few.pos, SEGMENT_BYTES)
            assert (few.pos, count) == (SEGMENT_BYTES, 0)
        assert end - few.pos <= FEW_RECORDS_BYTES
        few.pos, count = few._dispatch_span(few.pos, end)
        dispatched += count
    monkeypatch.setattr("engine.dispatch.span.FEW_RECORDS_BYTES", -1)  # every step the batch codec's
    window.pos, window_count = window._dispatch_span(window.pos, ends[-1])
    while window.pos < ends[-1]:  # a window may stop short of the limit (MAX_STEP_BYTES)
        window.pos, more = window._dispatch_span(window.pos, ends[-1])
        window_count += more
    assert few.pos == window.pos == ends[-1]
    assert dispatched == window_count == 180
    for queue_id in range(QUEUES):
        got = few.queues.get("bench-0", queue_id).entries(0, 1000)
        want = window.queues.get("bench-0", queue_id).entries(0, 1000)
        assert len(got) == 45 and np.array_equal(got, want)
    for shard in range(SHARDS):
        few_ranges, few_hashes, few_positions = ring_contents(few.ring, shard)
        _, window_hashes, window_positions = ring_contents(window.ring, shard)
        assert few_ranges[0][0] == 0 and few_ranges[-1][1] == ends[-1]
        assert all(a[1] == b[0] for a, b in itertools.pairwise(few_ranges))  # no gap
        assert np.array_equal(few_hashes, window_hashes)
        assert np.array_equal(few_positions, window_positions)
    assert few.blocks_dropped == window.blocks_dropped == 0


def test_dispatch_span_takes_the_plain_way_only_for_a_span_of_few_records_bytes(tmp_path, monkeypatch):
    """The choice is dispatch_span's: a span up to FEW_RECORDS_BYTES is decoded by decode_few,
    a larger one by the batch codec alone."""
    ends = write_log(tmp_path, 60)
    small = max(end for end in ends if end <= FEW_RECORDS_BYTES)
    calls = []
    monkeypatch.setattr("engine.dispatch.span.decode_few",
                        lambda *args: calls.append(args[1:]) or decode_few(*args))
    dispatcher = dispatcher_over(tmp_path, "span")
    assert dispatcher._dispatch_span(0, small) == (small, 3 * (ends.index(small) + 1))
    assert calls == [(0, small, 0)]
    assert ends[-1] - small > FEW_RECORDS_BYTES
    step = dispatcher._dispatch_span(small, ends[-1])
    assert step.end_pos > small and step.count > 0
    assert len(calls) == 1  # more than FEW_RECORDS_BYTES: the batch codec alone
    close_dispatcher(dispatcher)
