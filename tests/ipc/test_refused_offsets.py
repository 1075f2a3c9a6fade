"""A committed offset found outside its queue stays refused until reset or a new commit, even
once producers refill the queue past it (config/consumerOffset.refused.json)."""

from __future__ import annotations

import json

import pytest

from engine.config import FlushPolicy, StoreConfig
from engine.errors import CommittedOffsetError, StoreError
from ipc.consumer import Consumer
from ipc.consumer_offsets import ConsumerOffsets, encode_offset_table
from ipc.producer import Producer
from ipc.refused_offsets import RefusedOffset, decode_refused, encode_refused, read_refused, refused_path
from tests.workers.store_harness import SMALL_STORE, assert_check_clean, module_store, start_store, wait_for
from tools.inventory import group_table, lag_table
from tools.offset_reset import reset_offsets
from tools.torture.faults import DurablePositions, _old_versions
from workers.status_report import not_running_status, render_not_running

ENTRY = RefusedOffset("g", "T", 0, 10, 6, 1_764_620_000_000, "consumer pid 7")


def test_the_codec_round_trips():
    assert decode_refused(encode_refused([ENTRY]).decode()) == [ENTRY]
    assert decode_refused('{"refused": []}') == []


@pytest.mark.parametrize("text", [
    "[]", '{"refused": {}}', '{"refused": [1]}', "{nope",
    json.dumps({"refused": [{**ENTRY.__dict__, "offset": None}]}),
    json.dumps({"refused": [{**ENTRY.__dict__, "offset": True}]}),
    json.dumps({"refused": [{**ENTRY.__dict__, "extra": 1}]}),
    json.dumps({"refused": [{k: v for k, v in ENTRY.__dict__.items() if k != "where"}]}),
])
def test_the_codec_raises_on_garbage_and_the_reader_names_the_file(tmp_path, text):
    with pytest.raises(ValueError):
        decode_refused(text)
    refused_path(tmp_path).parent.mkdir()
    refused_path(tmp_path).write_text(text)
    with pytest.raises(StoreError, match="refused offsets unreadable"):
        read_refused(tmp_path)


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    yield from module_store(tmp_path_factory.mktemp("refused") / "store")


def _send(root, topic: str, count: int, prefix: str) -> None:
    with Producer(root) as producer:
        for i in range(count):
            assert producer.send(topic, f"{prefix}-{i}".encode(), queue_id=0).ok


def _write_offsets(root, table: dict) -> None:
    path = ConsumerOffsets(root).path
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(encode_offset_table(table))


@pytest.mark.slow
def test_a_refusal_found_by_a_consumer_holds_once_the_queue_grows_past_the_offset(store):
    _send(store.root, "Regrow", 6, "old")
    store.wait_caught_up()
    _write_offsets(store.root, {"Regrow@g": {0: 10}})
    with Consumer(store.root, "g") as consumer, pytest.raises(CommittedOffsetError, match="end 6"):
        consumer.committed("Regrow", 0)
    [entry] = [e for e in read_refused(store.root) if e.topic == "Regrow"]
    assert (entry.group, entry.offset, entry.queue_end_seen) == ("g", 10, 6)
    assert entry.where.startswith("consumer pid ")
    warning = "group g committed offset 10 on Regrow/0, past the queue's end 6"
    assert warning in (store.root / "mqstore.log").read_text()
    _send(store.root, "Regrow", 8, "new")  # the queue now ends at 14, past the offset
    store.wait_caught_up()
    with Consumer(store.root, "g") as consumer, pytest.raises(CommittedOffsetError, match="end 6"):
        list(consumer.iterate("Regrow"))
    [row] = lag_table(store.root, "g")
    [group_row] = [g for g in group_table(store.root) if g.group == "g"]
    assert [c.refused for c in group_row.committed] == [True]
    assert row.refused and row.offset_problem.startswith("refused (found past the end 6")
    assert "1 refused until reset" in render_not_running(not_running_status(store.root, "X", "-"))
    [move] = reset_offsets(store.root, "g", "Regrow", "6")
    assert (move.before, move.after) == (10, 6) and read_refused(store.root) == []
    with Consumer(store.root, "g") as consumer:
        assert [m.body for m in consumer.pull("Regrow", 0, max_count=2).messages] == [b"new-0", b"new-1"]


@pytest.mark.slow
def test_a_commit_of_another_value_clears_the_refusal_and_the_same_value_does_not(store):
    _send(store.root, "Moved", 2, "m")
    store.wait_caught_up()
    _write_offsets(store.root, {"Moved@h": {0: 50}})
    with Consumer(store.root, "h") as consumer:
        with pytest.raises(CommittedOffsetError, match="end 2"):
            consumer.committed("Moved", 0)
        consumer.commit("Moved", 0, 50)  # the same value: no deliberate move, still refused
        assert [e.offset for e in read_refused(store.root) if e.group == "h"] == [50]
        with pytest.raises(CommittedOffsetError):
            consumer.committed("Moved", 0)
        consumer.commit("Moved", 0, 1)
        assert [e for e in read_refused(store.root) if e.group == "h"] == []
        assert consumer.committed("Moved", 0) == 1


def _wait_dispatched(running) -> None:
    """Under async flush with no timer nothing is flushed, so wait for dispatch alone."""
    def dispatched():
        positions = running.positions()
        return positions.dispatched_pos == positions.written_pos
    wait_for(dispatched, "dispatch to reach the written position")


ASYNC_UNSYNCED = {"flush": "async", "async_flush_interval_ms": 10**9,
                  "async_flush_thorough_interval_ms": 10**9, "cq_flush_interval_ms": 10**9,
                  "index_flush_interval_ms": 10**9}


@pytest.mark.slow
def test_after_an_async_power_loss_the_starting_supervisor_refuses_the_offset_for_good(tmp_path):
    """6 sent and consumed, the power goes before any page was written back: the group's offset
    6 lies past the recovered queue's end, and stays refused as 8 new messages arrive."""
    root = tmp_path / "store"
    running = start_store(root, store=ASYNC_UNSYNCED)
    durable = DurablePositions.from_positions(running.positions())
    _send(root, "Lost", 6, "old")
    _wait_dispatched(running)
    with Consumer(root, "g") as consumer:
        assert len(list(consumer.iterate("Lost"))) == 6  # commits offset 6 at the end
    assert running.positions().flushed_pos == durable.commitlog_flushed_pos  # nothing synced
    children = running.child_pids()
    running.kill()
    running.wait_orphans_gone(children)
    config = StoreConfig(**{**SMALL_STORE, **ASYNC_UNSYNCED, "flush": FlushPolicy.ASYNC})
    for path, old in _old_versions(root, durable, config):  # every unsynced page is lost
        path.write_bytes(old)
    for running in module_store(root, store=ASYNC_UNSYNCED):
        [entry] = read_refused(root)  # before any consumer ran
        assert (entry.offset, entry.queue_end_seen, entry.where) == (6, 0, "supervisor start")
        warning = "group g committed offset 6 on Lost/0, past the queue's end 0"
        assert warning in (root / "mqstore.log").read_text()
        _send(root, "Lost", 8, "new")
        _wait_dispatched(running)
        with Consumer(root, "g") as consumer, pytest.raises(CommittedOffsetError):
            list(consumer.iterate("Lost"))
        reset_offsets(root, "g", "Lost", "earliest")
        with Consumer(root, "g") as consumer:
            assert [m.body for m in consumer.iterate("Lost")][:2] == [b"new-0", b"new-1"]


@pytest.mark.slow
def test_reset_covers_a_committed_queue_whose_files_are_gone(tmp_path):
    """After `recover --rebuild` dropped a queue: its offset is refused from the start, and the
    reset moves it ([0, 0]) instead of saying the topic has no queue."""
    root = tmp_path / "store"
    running = start_store(root)
    assert running.stop() == 0
    _write_offsets(root, {"Gone@g": {1: 5}})
    for running in module_store(root):
        assert [(e.queue_id, e.offset, e.where) for e in read_refused(root)] == [(1, 5, "supervisor start")]
        [move] = reset_offsets(root, "g", "Gone", "earliest")
        assert (move.queue_id, move.before, move.after) == (1, 5, 0) and read_refused(root) == []
        with Producer(root) as producer:
            assert producer.send("Gone", b"new0", queue_id=1).ok
        running.wait_caught_up()
        with Consumer(root, "g") as consumer:
            assert [m.body for m in consumer.iterate("Gone")] == [b"new0"]
    assert_check_clean(root)


def test_the_start_check_leaves_a_garbled_record_alone_and_finds_offsets_past_their_queues(tmp_path):
    """In process: what the supervisor runs after recovery, given the recovered queue ends."""
    from ipc.refused_offsets import refuse_offsets_past_their_queues

    _write_offsets(tmp_path, {"T@g": {0: 7, 1: 2}, "U@g": {0: 1}})
    found = refuse_offsets_past_their_queues(tmp_path, {("T", 0): 6, ("T", 1): 2})
    assert [(e.topic, e.queue_id, e.offset, e.queue_end_seen) for e in found] == [
        ("T", 0, 7, 6), ("U", 0, 1, 0)]
    assert read_refused(tmp_path) == found
    assert refuse_offsets_past_their_queues(tmp_path, {("T", 0): 6, ("T", 1): 2}) == []  # recorded
    refused_path(tmp_path).write_text("{nope")
    assert refuse_offsets_past_their_queues(tmp_path, {}) == []
    assert refused_path(tmp_path).read_text() == "{nope"  # changes nothing
