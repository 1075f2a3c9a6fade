"""ipc.Consumer.pull_columns against a running store: the same messages, statuses and offsets
as pull, records over several commitlog segments, a consume-queue entry that does not match its
record refused, bad input refused without a change; and wait_for_more."""

from __future__ import annotations

import threading
import time

import pytest

from engine.errors import BadInputError, CorruptConsumeQueueError, ServiceNotAvailableError
from engine.files.naming import consume_queue_dir
from engine.formats.cq_entry import CQ_ENTRY, CQ_ENTRY_SIZE
from engine.status import GetStatus, PutStatus
from ipc.consumer import Consumer
from ipc.producer import Producer
from tests.workers.store_harness import assert_check_clean, start_store


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    running = start_store(tmp_path_factory.mktemp("columns") / "store")  # 64 KiB segments
    yield running
    if running.proc.poll() is None:
        assert running.stop() == 0
    assert_check_clean(running.root)


def columns_as_rows(result) -> list[tuple]:
    """Every record of a ColumnsResult as (commit_pos, queue_offset, store_ts_ms, born_ts_ms, flag,
    sys_flag, total_size, topic, body, properties), read through the lazy accessors."""
    rows = []
    for view in result.views:
        for i in range(view.count):
            rows.append((int(view.commit_pos[i]), int(view.queue_offset[i]), int(view.store_ts_ms[i]),
                         int(view.born_ts_ms[i]), int(view.flag[i]), int(view.sys_flag[i]),
                         int(view.total_size[i]), view.topic(i), bytes(view.body(i)), view.properties(i)))
    return rows


def records_as_rows(records) -> list[tuple]:
    return [(r.commit_pos, r.queue_offset, r.store_ts_ms, r.born_ts_ms, r.flag, r.sys_flag, r.total_size,
             r.topic, r.body, r.properties) for r in records]


@pytest.mark.slow
def test_bodies_keys_and_properties_equal_what_pull_returns(store):
    with Producer(store.root) as producer:
        for i in range(12):
            assert producer.send("RT", bytes([i]) * (i * 13), tags=f"t{i % 3}", keys=(f"k{i}", f"x{i}"),
                                 queue_id=1, properties={"color": "blue" if i % 2 else "red"}).ok
        sent = producer.send_columns("RT", [b"col-%d" % i for i in range(20)],
                                     keys=[f"c{i}" for i in range(20)], queue_ids=1)
        assert sent.status_counts() == {PutStatus.PUT_OK: 20}
    store.wait_caught_up()
    with Consumer(store.root, "rt") as consumer:
        pulled = consumer.pull("RT", 1, 0, max_count=100)
        columns = consumer.pull_columns("RT", 1, 0, max_count=100)
        assert pulled.status is columns.status is GetStatus.FOUND and columns.count == 32
        assert columns_as_rows(columns) == records_as_rows(pulled.messages)
        assert columns.records() == pulled.messages
        assert [r.keys for r in columns.records()][:2] == [("k0", "x0"), ("k1", "x1")]
        assert (columns.next_offset, columns.min_offset, columns.max_offset) == (32, 0, 32)
        part = consumer.pull_columns("RT", 1, 5, max_count=4)
        assert columns_as_rows(part) == records_as_rows(pulled.messages[5:9]) and part.next_offset == 9


@pytest.mark.slow
def test_statuses_and_offsets_equal_pull(store):
    with Producer(store.root) as producer:
        for i in range(5):
            assert producer.send("CS", f"m{i}".encode(), queue_id=2).ok
    store.wait_caught_up()
    with Consumer(store.root, "cs") as consumer:
        for queue_id, offset in [(2, 0), (2, 3), (2, 5), (2, 9), (3, 0), (2, None)]:
            pulled = consumer.pull("CS", queue_id, offset, max_count=2)
            columns = consumer.pull_columns("CS", queue_id, offset, max_count=2)
            assert (columns.status, columns.next_offset, columns.min_offset, columns.max_offset) == (
                pulled.status, pulled.next_offset, pulled.min_offset, pulled.max_offset), (queue_id, offset)
            assert columns.count == len(pulled.messages)
        assert consumer.pull_columns("CS", 2, 5).status is GetStatus.OFFSET_OVERFLOW_ONE
        assert consumer.pull_columns("NONE", 0).status is GetStatus.NO_MESSAGE_IN_QUEUE


@pytest.mark.slow
def test_records_across_several_segments(store):
    bodies = [bytes([i % 256]) * 700 for i in range(300)]  # ~240 KB of records: >= 4 segments of 64 KiB
    with Producer(store.root) as producer:
        assert producer.send_columns("MS", bodies, queue_ids=0).status_counts() == {PutStatus.PUT_OK: 300}
    store.wait_caught_up()
    with Consumer(store.root, "ms") as consumer:
        columns = consumer.pull_columns("MS", 0, 0, max_count=4096)
        assert len(columns.views) >= 3
        assert all(len({int(p) // consumer.commitlog.segment_bytes for p in v.commit_pos}) == 1
                   for v in columns.views)
        assert [bytes(v.body(i)) for v in columns.views for i in range(v.count)] == bodies
        assert columns_as_rows(columns) == records_as_rows(consumer.pull("MS", 0, 0, 4096).messages)


@pytest.mark.slow
def test_wait_for_more_sleeps_until_something_is_dispatched(store):
    with Consumer(store.root, "wm") as consumer, Producer(store.root) as producer:
        store.wait_caught_up()
        bound = consumer.dispatched_pos
        cpu0, wall0 = time.process_time(), time.monotonic()
        assert consumer.wait_for_more(bound, 400) is False
        assert time.monotonic() - wall0 >= 0.39 and time.process_time() - cpu0 < 0.15
        timer = threading.Timer(0.2, lambda: producer.send("WM", b"late", queue_id=0))
        timer.start()
        assert consumer.wait_for_more(bound, 10_000) is True
        timer.join()
        assert consumer.dispatched_pos > bound
        late = consumer.pull_columns("WM", 0, 0, timeout_ms=5000)
        assert late.status is GetStatus.FOUND and bytes(late.views[0].body(0)) == b"late"


@pytest.mark.slow
def test_bad_input_is_refused_and_changes_nothing(store):
    with Producer(store.root) as producer:
        assert producer.send("BI", b"x", queue_id=0).ok
    store.wait_caught_up()
    offsets_file = store.root / "config" / "consumerOffset.json"
    with Consumer(store.root, "bi") as consumer:
        consumer.commit("BI", 0, 1)
        before = offsets_file.read_bytes()
        for kwargs, field in [({"topic": "../etc"}, "topic"), ({"topic": ""}, "topic"),
                              ({"queue_id": 4}, "queue_id"), ({"queue_id": -1}, "queue_id"),
                              ({"max_count": 0}, "max_count"), ({"max_count": 10**6}, "max_count"),
                              ({"offset": -1}, "offset"), ({"offset": "0"}, "offset"),
                              ({"timeout_ms": -5}, "timeout_ms")]:
            args = {"topic": "BI", "queue_id": 0, **kwargs}
            with pytest.raises(BadInputError, match=field):
                consumer.pull_columns(args.pop("topic"), args.pop("queue_id"), **args)
        with pytest.raises(BadInputError, match="timeout_ms"):
            consumer.wait_for_more(0, -1)
        assert offsets_file.read_bytes() == before and consumer.committed("BI", 0) == 1
        assert consumer.pull_columns("BI", 0, 0).count == 1


@pytest.mark.slow
def test_an_entry_that_does_not_match_its_record_is_corrupt(tmp_path):
    running = start_store(tmp_path / "store")
    try:
        with Producer(running.root) as producer:
            for i in range(4):
                assert producer.send("CQ", f"cq-{i}".encode(), queue_id=0).ok
            assert producer.send("OTHER", b"elsewhere", queue_id=3).ok
        running.wait_caught_up()
        path = sorted(consume_queue_dir(running.root, "CQ", 0).iterdir())[0]
        other = sorted(consume_queue_dir(running.root, "OTHER", 3).iterdir())[0].read_bytes()[:CQ_ENTRY_SIZE]
        original = path.read_bytes()
        commit_pos, size, tags = CQ_ENTRY.unpack_from(original, 2 * CQ_ENTRY_SIZE)
        damages = {"other topic": other, "size": CQ_ENTRY.pack(commit_pos, size + 1, tags),
                   "no segment": CQ_ENTRY.pack(commit_pos + (1 << 40), size, tags)}
        with Consumer(running.root, "cq") as consumer:
            assert consumer.pull_columns("CQ", 0, 0).count == 4
            with open(path, "r+b") as f:  # no sound frame there: passed over and reported, not raised
                f.seek(2 * CQ_ENTRY_SIZE)
                f.write(CQ_ENTRY.pack(commit_pos + 4, size, tags))
            torn = consumer.pull_columns("CQ", 0, 0)
            assert (torn.count, torn.next_offset) == (3, 4)
            assert [(s.commit_pos, s.queue_offset) for s in torn.skipped] == [(commit_pos + 4, 2)]
            for what, entry in damages.items():
                with open(path, "r+b") as f:
                    f.seek(2 * CQ_ENTRY_SIZE)
                    f.write(entry)
                with pytest.raises(CorruptConsumeQueueError) as info:
                    consumer.pull_columns("CQ", 0, 0)
                assert info.value.queue_offset == 2, what
                assert consumer.pull_columns("CQ", 0, 0, max_count=2).count == 2  # before the bad entry
            with open(path, "r+b") as f:
                f.seek(2 * CQ_ENTRY_SIZE)
                f.write(damages["other topic"])
            with pytest.raises(CorruptConsumeQueueError):
                consumer.pull("CQ", 0, 0)  # pull says so too (the entry points at another queue)
        path.write_bytes(original)
    finally:
        assert running.stop() == 0
    assert_check_clean(running.root)


def test_wait_for_more_gives_up_when_the_supervisor_dies_unreaped(tmp_path):
    """SIGKILLed and not yet reaped by its parent (a zombie, which still takes signals): a
    consumer sleeping in wait_for_more says SERVICE_NOT_AVAILABLE instead of sleeping on
    (at once with reattach_timeout_s = 0: no new supervisor is waited for)."""
    running = start_store(tmp_path / "store")
    with Consumer(running.root, "gone", reattach_timeout_s=0) as consumer:
        running.wait_caught_up()
        bound = consumer.dispatched_pos
        assert consumer.wait_for_more(bound, 50) is False  # registered as a waiter
        running.proc.kill()  # not waited for: the supervisor stays a zombie meanwhile
        with pytest.raises(ServiceNotAvailableError, match="supervisor is gone"):
            consumer.wait_for_more(bound, 60_000)
    running.proc.wait()
    restarted = start_store(running.root)
    assert restarted.stop() == 0
    assert_check_clean(running.root)
