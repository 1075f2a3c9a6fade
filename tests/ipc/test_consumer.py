"""ipc.Consumer and ipc.consumer_offsets: long polling, visibility, committed offsets."""

from __future__ import annotations

import json
import threading
import time

import pytest

from engine.errors import BadInputError, StoreError
from engine.status import GetStatus
from ipc.consumer import Consumer
from ipc.consumer_offsets import (
    ConsumerOffsets,
    encode_offset_table,
    parse_offset_document,
    parse_offset_table,
)
from ipc.producer import Producer
from tests.conftest import ROCKETMQ_SAMPLES
from tests.workers.store_harness import assert_check_clean, start_store

SAMPLE = ROCKETMQ_SAMPLES / "store-2019" / "config" / "consumerOffset.json"


# ------------------------------------------------------------------ offsets file (no processes)
def test_rocketmq_bare_integer_keys_are_read():
    text = '{"offsetTable":{"TopicTest@g":{0:250,1:250},\n "%RETRY%g@g":{0:0\n}}}'
    assert parse_offset_table(text) == {"TopicTest@g": {0: 250, 1: 250}, "%RETRY%g@g": {0: 0}}


@pytest.mark.skipif(not SAMPLE.exists(), reason="RocketMQ sample not present")
def test_rocketmq_sample_file_is_read():
    table = parse_offset_table(SAMPLE.read_text())
    assert table["TopicTest@please_rename_unique_group_name_4"] == {0: 250, 1: 250, 2: 250, 3: 250}


def test_string_literals_with_digits_are_left_alone():
    text = json.dumps({"offsetTable": {"T{0:1}@g": {"3": 4}}})
    assert parse_offset_table(text) == {"T{0:1}@g": {3: 4}}


def test_commit_writes_strict_json_with_backup(tmp_path):
    offsets = ConsumerOffsets(tmp_path)
    offsets.commit("T1", "g", 0, 5)
    offsets.commit("T1", "g", 1, 7)
    path = tmp_path / "config" / "consumerOffset.json"
    assert json.loads(path.read_text())["offsetTable"] == {"T1@g": {"0": 5, "1": 7}}
    assert json.loads(path.with_name(path.name + ".bak").read_text())["offsetTable"] == {
        "T1@g": {"0": 5}}
    assert offsets.get("T1", "g", 1) == 7 and offsets.get("T1", "other", 1) is None
    for written in (path, path.with_name(path.name + ".bak")):
        assert written.stat().st_mode & 0o077 == 0, written
    _, times = offsets.load_with_times()
    assert path.read_bytes() == encode_offset_table({"T1@g": {0: 5, 1: 7}}, times)


def test_commit_records_when_each_queue_was_committed(tmp_path):
    offsets = ConsumerOffsets(tmp_path)
    before_ms = time.time_ns() // 1_000_000
    offsets.commit_many("g", {("T1", 0): 5, ("T1", 1): 6})
    first = offsets.load_with_times()[1]["T1@g"]
    assert set(first) == {0, 1} and all(before_ms <= ms <= time.time_ns() // 1_000_000
                                        for ms in first.values())
    wait_ms = first[0] + 2
    while time.time_ns() // 1_000_000 < wait_ms:  # the clock, not a sleep for another party
        pass
    offsets.commit("T1", "g", 1, 9)
    later = offsets.load_with_times()[1]["T1@g"]
    assert later[0] == first[0] and later[1] > first[1]


def test_file_without_commit_times_reads_as_never_committed():
    table, times = parse_offset_document('{"offsetTable":{"T@g":{0:3}}}')
    assert table == {"T@g": {0: 3}} and times == {}


def test_torn_primary_falls_back_to_backup(tmp_path):
    offsets = ConsumerOffsets(tmp_path)
    offsets.commit("T1", "g", 0, 5)
    offsets.commit("T1", "g", 0, 6)
    offsets.path.write_text('{"offsetTable": {"T1@g": {"0": ')
    assert offsets.get("T1", "g", 0) == 5  # the backup, put in the primary's place
    offsets.path.write_text("garbage")
    offsets.path.with_name(offsets.path.name + ".bak").write_text("garbage")
    with pytest.raises(StoreError, match="unreadable"):
        offsets.load()


@pytest.mark.parametrize("group", ["", "a b", "x/y", "é"])
def test_bad_group_is_refused(tmp_path, group):
    with pytest.raises(BadInputError, match="group"):
        ConsumerOffsets(tmp_path).commit("T1", group, 0, 1)


def test_concurrent_commits_lose_nothing(tmp_path):
    offsets = ConsumerOffsets(tmp_path)
    threads = [threading.Thread(target=lambda q=q: [offsets.commit("T", "g", q, i) for i in range(20)])
               for q in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert offsets.load() == {"T@g": {0: 19, 1: 19, 2: 19, 3: 19}}


# ------------------------------------------------------------------ against a running store
@pytest.fixture(scope="module")
def store(tmp_path_factory):
    running = start_store(tmp_path_factory.mktemp("consumer") / "store")
    yield running
    if running.proc.poll() is None:
        assert running.stop() == 0
    assert_check_clean(running.root)


@pytest.mark.slow
def test_long_poll_wakes_on_arrival_without_busy_looping(store):
    with Consumer(store.root, "lp") as consumer, Producer(store.root) as producer:
        cpu0, wall0 = time.process_time(), time.monotonic()
        empty = consumer.pull("LP", 0, 0, timeout_ms=600)
        assert empty.status is GetStatus.NO_MESSAGE_IN_QUEUE
        assert time.monotonic() - wall0 >= 0.59
        assert time.process_time() - cpu0 < 0.15  # slept on a semaphore, did not spin
        timer = threading.Timer(0.3, lambda: producer.send("LP", b"late", queue_id=0))
        timer.start()
        started = time.monotonic()
        result = consumer.pull("LP", 0, 0, timeout_ms=10_000)
        elapsed = time.monotonic() - started
        timer.join()
        assert result.status is GetStatus.FOUND and result.messages[0].body == b"late"
        assert 0.25 <= elapsed < 3.0


@pytest.mark.slow
def test_pull_statuses_and_bad_input(store):
    with Producer(store.root) as producer:
        for i in range(5):
            assert producer.send("ST", f"m{i}".encode(), queue_id=1).ok
    store.wait_caught_up()
    with Consumer(store.root, "st") as consumer:
        result = consumer.pull("ST", 1, 0, max_count=3)
        assert result.status is GetStatus.FOUND and [r.body for r in result.messages] == [b"m0", b"m1", b"m2"]
        assert (result.next_offset, result.min_offset, result.max_offset) == (3, 0, 5)
        assert consumer.pull("ST", 1, 5).status is GetStatus.OFFSET_OVERFLOW_ONE
        assert consumer.pull("ST", 1, 9).status is GetStatus.OFFSET_OVERFLOW_BADLY
        assert consumer.pull("ST", 2, 0).status is GetStatus.NO_MESSAGE_IN_QUEUE
        with pytest.raises(BadInputError, match="queue_id"):
            consumer.pull("ST", 4)
        with pytest.raises(BadInputError, match="topic"):
            consumer.pull("../etc", 0)
        with pytest.raises(BadInputError, match="max_count"):
            consumer.pull("ST", 0, max_count=0)
    with pytest.raises(BadInputError, match="group"):
        Consumer(store.root, "bad group")


@pytest.mark.slow
def test_iterate_all_queues_and_commit(store):
    with Producer(store.root) as producer:
        sent = {producer.send("IT", f"m{i}".encode()).msg_id for i in range(10)}
    store.wait_caught_up()
    with Consumer(store.root, "it") as consumer:
        got = {r.msg_id for r in consumer.iterate("IT")}
        assert got == sent
        assert list(consumer.iterate("IT")) == []  # committed: nothing again
        assert sum(consumer.committed("IT", q) or 0 for q in range(4)) == 10


@pytest.mark.slow
def test_iterate_writes_offsets_on_its_timer_and_when_it_ends(store):
    """Offsets are written on the timer, not per batch, and never lost on a clean end: a break
    out of the loop and a close write what was consumed (whole batches: at least once)."""
    with Producer(store.root) as producer:
        assert producer.send_columns("ITER_TIMER", [b"m%d" % i for i in range(600)], queue_ids=0).ok
    store.wait_caught_up()
    on_disk = ConsumerOffsets(store.root)
    with Consumer(store.root, "timer") as consumer:
        for seen, _record in enumerate(consumer.iterate("ITER_TIMER", commit_interval_ms=3_600_000), 1):
            if seen == 400:
                assert on_disk.get("ITER_TIMER", "timer", 0) is None  # 12 batches, no write yet
            if seen == 500:
                break  # inside the 16th batch of 32: the 15 whole ones count
        assert on_disk.get("ITER_TIMER", "timer", 0) == 480
        suspended = consumer.iterate("ITER_TIMER", commit_interval_ms=3_600_000)
        bodies = [next(suspended).body for _ in range(33)]
        assert bodies[0] == b"m480" and bodies[-1] == b"m512"
    assert on_disk.get("ITER_TIMER", "timer", 0) == 512  # written by close()
    with Consumer(store.root, "timer") as consumer:
        every_batch = consumer.iterate("ITER_TIMER", commit_interval_ms=0)
        assert [next(every_batch).body for _ in range(40)][-1] == b"m551"
        assert on_disk.get("ITER_TIMER", "timer", 0) == 544  # the first batch, written at once
        assert len(list(every_batch)) == 48
    assert on_disk.get("ITER_TIMER", "timer", 0) == 600
    with Consumer(store.root, "timer") as consumer, pytest.raises(BadInputError, match="commit_interval_ms"):
        next(consumer.iterate("ITER_TIMER", commit_interval_ms=-1))


@pytest.mark.slow
def test_consumer_never_sees_what_is_not_flushed(tmp_path):
    store = start_store(tmp_path / "slow", env={"MQSTORE_FAULT_FSYNC_DELAY_MS": "700"})
    try:
        with Producer(store.root) as producer, Consumer(store.root, "v") as consumer:
            assert producer.send("VIS", b"warm-up", queue_id=0).ok
            store.wait_caught_up()
            result = producer.send("VIS", b"not yet durable", queue_id=0, wait=False)
            assert result.ok
            with store.ctl() as ctl:
                assert ctl.flushed_pos <= result.commit_pos  # appended, not flushed
            early = consumer.pull("VIS", 0, 1)
            assert early.status is GetStatus.OFFSET_OVERFLOW_ONE and not early.messages
            late = consumer.pull("VIS", 0, 1, timeout_ms=5000)
            assert late.messages and late.messages[0].body == b"not yet durable", late
    finally:
        assert store.stop() == 0
    assert_check_clean(store.root)


@pytest.mark.slow
def test_committed_offsets_survive_a_restart(tmp_path):
    store = start_store(tmp_path / "store")
    with Producer(store.root) as producer:
        for i in range(6):
            producer.send("OFF", f"m{i}".encode(), queue_id=0)
    store.wait_caught_up()
    with Consumer(store.root, "keep") as consumer:
        result = consumer.pull("OFF", 0, max_count=4)
        consumer.commit("OFF", 0, result.next_offset)
    assert store.stop() == 0
    store = start_store(store.root)
    try:
        with Consumer(store.root, "keep") as consumer:
            assert consumer.committed("OFF", 0) == 4
            rest = consumer.pull("OFF", 0)  # offset=None: from the committed offset
            assert [r.body for r in rest.messages] == [b"m4", b"m5"]
    finally:
        assert store.stop() == 0
    assert_check_clean(store.root)
