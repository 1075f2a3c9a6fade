"""Readers after retention (issue 19, item 5): a co-located Consumer and `mqstore consume` start
at the first entry whose record still exists, at once, also while they were open as segments went.

The supervisor runs no retention yet (another issue); `retire_segments` runs retention's own
steps 1 and 2 (engine.retention.expiry: delete the oldest commitlog segments, then the consume-queue
files wholly below them) from the test process on the live store's files, as a cleaner would.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from engine.files.mapped_file import Access
from engine.log.commitlog import CommitLog
from engine.message import Message
from engine.queues.table import ConsumeQueueTable
from engine.recovery.recover import StoreParts
from engine.retention import expiry as retention
from engine.status import GetStatus
from ipc.consumer import Consumer
from ipc.producer import Producer
from tests.workers.store_harness import SMALL_STORE, assert_check_clean, cli, start_store

TOPIC = "RT"
COUNT = 900  # ~5 commitlog segments of 64 KiB; 500 entries per consume-queue file
PAD = b"p" * 300
FIRST_LOOK_S = 10.0  # a follow read must not crawl over deleted entries a poll at a time


def body(i: int) -> bytes:
    return b"m%d-" % i + PAD


def retire_segments(root: Path, count: int) -> int:
    """Retention's steps 1 and 2 on the `count` oldest segments; returns the new min position."""
    commitlog = CommitLog.open(root, SMALL_STORE["commitlog_file_size"], Access.READ_ONLY)
    queues = ConsumeQueueTable.load(root, SMALL_STORE["consume_queue_entries"], Access.READ_ONLY)
    parts = StoreParts(root, commitlog, queues, [], [])
    try:
        bases = [info.base_pos for info in commitlog.segments_info()[:count]]
        assert len(retention.delete_segments(parts, bases)) == count
        retention.clean_consume_queues(parts, commitlog.min_pos)
        return commitlog.min_pos
    finally:
        queues.close()
        commitlog.close()


@pytest.fixture
def retired(tmp_path):
    """A running store whose queue RT/0 lost its first records to retention: (store, acks,
    first live offset); a consumer "early" pulled from offset 0 before the deletion."""
    running = start_store(tmp_path / "store")
    try:
        with Producer(running.root) as producer:
            acks = list(producer.send_batch([Message(TOPIC, body(i), queue_id=0) for i in range(COUNT)]))
        assert all(a.ok for a in acks)
        running.wait_caught_up()
        early = Consumer(running.root, "early")
        assert early.pull(TOPIC, 0, 0, max_count=4).status is GetStatus.FOUND
        min_pos = retire_segments(running.root, 3)
        first = next(a.queue_offset for a in acks if a.commit_pos >= min_pos)
        assert 0 < first < 500  # inside the first consume-queue file, which stays
        yield running, early, first
        early.close()
    finally:
        assert running.stop() == 0
    assert_check_clean(running.root)


@pytest.mark.slow
def test_pull_below_the_new_minimum_says_too_small_with_the_first_live_offset(retired):
    running, early, first = retired
    for consumer in (early, Consumer(running.root, "late")):  # open before and after the deletion
        with consumer:
            small = consumer.pull(TOPIC, 0, 0)
            assert (small.status, small.next_offset, small.min_offset, small.max_offset) == \
                (GetStatus.OFFSET_TOO_SMALL, first, first, COUNT)
            found = consumer.pull(TOPIC, 0, small.next_offset, max_count=2)
            assert [r.body for r in found.messages] == [body(first), body(first + 1)]
            columns = consumer.pull_columns(TOPIC, 0, 0)
            assert (columns.status, columns.next_offset) == (GetStatus.OFFSET_TOO_SMALL, first)
            assert consumer.pull(TOPIC, 0).next_offset == first + 32  # no committed offset: from min


@pytest.mark.slow
def test_a_new_group_iterates_every_remaining_message(retired):
    running, _, first = retired
    with Consumer(running.root, "fresh") as consumer:
        assert [r.body for r in consumer.iterate(TOPIC)] == [body(i) for i in range(first, COUNT)]
        assert consumer.committed(TOPIC, 0) == COUNT
    with Consumer(running.root, "stale") as consumer:
        consumer.commit(TOPIC, 0, 7)  # committed before retention took offset 7
        assert [r.queue_offset for r in consumer.iterate(TOPIC)] == list(range(first, COUNT))


@pytest.mark.slow
def test_follow_gets_the_first_remaining_message_at_once(retired):
    _, early, first = retired
    started = time.monotonic()
    following = early.iterate(TOPIC, follow=True, poll_timeout_ms=60_000, auto_commit=False)
    assert next(following).queue_offset == first
    assert time.monotonic() - started < FIRST_LOOK_S
    following.close()


@pytest.mark.slow
def test_cli_consume_for_a_new_group_prints_the_remaining_messages(retired):
    running, _, first = retired
    consumed = cli("consume", "--store", str(running.root), "--topic", TOPIC, "--group", "cli", "--json")
    assert consumed.returncode == 0, consumed.stderr.decode()
    offsets = [json.loads(line)["queue_offset"] for line in consumed.stdout.decode().splitlines()]
    assert offsets == list(range(first, COUNT))
    one_queue = cli("consume", "--store", str(running.root), "--topic", TOPIC, "--group", "cli2",
                    "--queue-id", "0", "--offset", "0", "--max", "3", "--json")
    assert one_queue.returncode == 0, one_queue.stderr.decode()
    assert [json.loads(line)["queue_offset"] for line in one_queue.stdout.decode().splitlines()] == \
        [first, first + 1, first + 2]
