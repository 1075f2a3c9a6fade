"""tools.inventory against a real store: topics, groups and lag, live and stopped, and bad input.

Messages go in through the real Producer and offsets are committed by a real Consumer; the
expected values come from what the consumer reads back (record sizes, store times)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from engine.errors import BadInputError, NotAStoreError
from ipc.consumer import Consumer
from ipc.producer import Producer
from tests.helpers import snapshot
from tests.workers.store_harness import assert_check_clean, checked_store, start_store, wait_for
from tools.inventory import group_table, lag_table, topic_table
from tools.store_process import StoreProcess

SENT = {("Orders", 0): 5, ("Orders", 1): 3, ("Audit", 2): 2}


def now_ms() -> int:
    return time.time_ns() // 1_000_000


def produce(root: Path) -> None:
    with Producer(root) as producer:
        for (topic, queue_id), count in SENT.items():
            for i in range(count):
                body = f"{topic}-{queue_id}-{i}".encode() * (i + 1)
                assert producer.send(topic, body, queue_id=queue_id).ok


def records_of(root: Path) -> dict[tuple[str, int], list]:
    """Every record per queue as a consumer reads it (group 'reader' commits nothing)."""
    with Consumer(root, "reader") as consumer:
        return {key: consumer.pull(key[0], key[1], 0, max_count=32).messages for key in SENT}


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    running = start_store(tmp_path_factory.mktemp("inventory") / "store")
    produce(running.root)
    running.wait_caught_up()
    before_ms = now_ms()
    with Consumer(running.root, "billing") as consumer:
        consumer.commit("Orders", 0, 3)
    with Consumer(running.root, "audit") as consumer:
        consumer.commit("Audit", 2, 2)
    running.commit_window_ms = (before_ms, now_ms())
    yield running
    if running.running:
        assert running.stop() == 0
    assert_check_clean(running.root)


def expected_topics(records: dict) -> list[tuple]:
    return sorted((topic, qid, 0, len(recs), len(recs), sum(r.total_size for r in recs),
                   recs[0].store_ts_ms, recs[-1].store_ts_ms)
                  for (topic, qid), recs in records.items())


def as_tuples(rows) -> list[tuple]:
    return [(r.topic, r.queue_id, r.min_offset, r.max_offset, r.messages, r.stored_bytes,
             r.oldest_store_time_ms, r.newest_store_time_ms) for r in rows]


@pytest.mark.slow
def test_topic_table_of_a_live_store_matches_what_was_produced(store):
    records = records_of(store.root)
    rows = topic_table(store.root)
    assert as_tuples(rows) == expected_topics(records)
    assert rows[0].as_dict()["stored_bytes"] == rows[0].stored_bytes


@pytest.mark.slow
def test_group_table_lists_committed_offsets_and_commit_time(store):
    low_ms, high_ms = store.commit_window_ms
    rows = {row.group: row for row in group_table(store.root)}
    assert set(rows) == {"audit", "billing"}  # 'reader' only pulled, it never committed
    billing = rows["billing"]
    assert billing.topics == ("Orders",) and billing.queue_count == 1
    [commit] = billing.committed
    assert (commit.topic, commit.queue_id, commit.committed_offset) == ("Orders", 0, 3)
    assert low_ms <= commit.commit_time_ms <= high_ms
    assert billing.last_commit_time_ms == commit.commit_time_ms
    assert billing.as_dict()["committed"][0]["committed_offset"] == 3


@pytest.mark.slow
def test_lag_counts_from_the_committed_offset_and_from_min_when_none(store):
    records = records_of(store.root)
    before_ms = now_ms()
    rows = lag_table(store.root, "billing")
    after_ms = now_ms()
    assert [(r.topic, r.queue_id, r.committed_offset, r.max_offset, r.lag_messages) for r in rows] == [
        ("Orders", 0, 3, 5, 2), ("Orders", 1, None, 3, 3)]
    oldest_unread = {0: records[("Orders", 0)][3].store_ts_ms, 1: records[("Orders", 1)][0].store_ts_ms}
    for row in rows:
        assert before_ms - oldest_unread[row.queue_id] <= row.lag_ms <= after_ms - oldest_unread[row.queue_id]
    assert rows[1].last_commit_time_ms is None
    audit = lag_table(store.root, "audit")
    assert [(r.topic, r.queue_id, r.lag_messages, r.lag_ms) for r in audit] == [("Audit", 2, 0, 0)]
    assert {r.group for r in lag_table(store.root)} == {"audit", "billing"}


@pytest.mark.slow
@pytest.mark.parametrize("group, words", [("nobody", "has committed no offset"),
                                          ("bad name", "may only hold")])
def test_unknown_or_malformed_group_is_refused_and_nothing_changes(store, group, words):
    before = snapshot(store.root / "config")
    with pytest.raises(BadInputError, match=words):
        lag_table(store.root, group)
    assert snapshot(store.root / "config") == before


def test_not_a_store_is_refused_and_nothing_changes(tmp_path):
    (tmp_path / "notes.txt").write_text("not a store")
    for read in (topic_table, group_table, lag_table):
        with pytest.raises(NotAStoreError):
            read(tmp_path)
        with pytest.raises(NotAStoreError):
            read(tmp_path / "missing")
    assert snapshot(tmp_path) == {"notes.txt": snapshot(tmp_path)["notes.txt"]}
    assert not (tmp_path / "missing").exists()


@pytest.mark.slow
def test_a_stopped_store_reads_the_same_as_the_live_one(tmp_path):
    with checked_store(tmp_path / "store") as running:
        produce(running.root)
        running.wait_caught_up()
        with Consumer(running.root, "billing") as consumer:
            consumer.commit("Orders", 1, 1)
        live = (topic_table(running.root), group_table(running.root), lag_table(running.root))
    before = snapshot(running.root)
    stopped = (topic_table(running.root), group_table(running.root), lag_table(running.root))
    assert snapshot(running.root) == before
    assert stopped[0] == live[0] and stopped[1] == live[1]
    assert [(r.queue_id, r.lag_messages) for r in stopped[2]] == [(0, 5), (1, 2)]


@pytest.mark.slow
def test_min_offsets_and_lag_follow_retention(tmp_path):
    from engine.message import Message

    expire_at_once = {"clean_resource_interval_ms": 100, "file_reserved_hours": 0.0003,
                      "disk_warn_ratio": 0.001, "disk_clean_force_ratio": 0.999, "disk_full_ratio": 1.0}
    with checked_store(tmp_path / "store", store=expire_at_once) as running:
        with Producer(running.root) as producer:
            acks = producer.send_batch([Message("Ret", b"r" * 300, queue_id=0) for _ in range(600)])
        assert all(a.ok for a in acks)
        with Consumer(running.root, "slow") as consumer:
            consumer.commit("Ret", 0, 0)

        def tables_under_one_line():
            """The tables read while the retention line held still, and that line."""
            line = retention_line(running)
            if line == 0 or first_segment_pos(running.root) != line:
                return None  # no pass yet, or one between removing files and publishing
            tables = (topic_table(running.root), lag_table(running.root, "slow"))
            held = retention_line(running) == line == first_segment_pos(running.root)
            return (line, *tables) if held else None

        min_pos, [row], [lag] = wait_for(tables_under_one_line, "a retention pass to delete segments")
    first_kept = min(a.queue_offset for a in acks if a.commit_pos >= min_pos)
    assert row.min_offset == first_kept > 0 and row.max_offset == 600
    assert row.messages == 600 - first_kept
    assert (lag.committed_offset, lag.min_offset, lag.lag_messages) == (0, first_kept, 600 - first_kept)


def retention_line(running: StoreProcess) -> int:
    """The published retention line: the commitlog's first position still kept."""
    from ipc.retention_block import RetentionBlock

    with running.ctl() as ctl:
        return RetentionBlock(ctl).line().min_commit_pos


def first_segment_pos(root: Path) -> int:
    from engine.files.naming import commitlog_dir, name_to_offset

    return min(name_to_offset(p.name) for p in commitlog_dir(root).iterdir())
