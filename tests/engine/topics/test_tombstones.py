"""A deleted topic's tombstone never sits above the durable end of the log: the delete flushes
the log first, and an open lowers a tombstone the recovered log ends below (a power loss of an
older store, a torn tail), so a topic created again has its new records dispatched."""

from __future__ import annotations

from dataclasses import replace

from engine.check.fsck import check
from engine.config import FlushPolicy
from engine.status import GetStatus, PutStatus
from engine.store import MessageStore
from engine.topics.table import TopicChange, TopicOp, TopicTableFile
from tests.helpers import SMALL_CONFIG, die, reopen, zero_log_from

ASYNC = replace(SMALL_CONFIG, flush=FlushPolicy.ASYNC)  # puts stay in the page cache until a flush


def test_delete_flushes_the_log_before_writing_its_tombstone(tmp_path):
    store = MessageStore.open(tmp_path, ASYNC)
    store.put("Gone", b"durable", queue_id=0)
    store.checkpoint()
    for i in range(3):
        store.put("Gone", b"cached-%d" % i, queue_id=0)
    assert store.commitlog.flushed_pos < store.commitlog.written_pos
    tombstone = store.change_topic(TopicChange(TopicOp.DELETE, "Gone")).tombstones["Gone"]
    assert tombstone == store.commitlog.written_pos
    assert store.commitlog.flushed_pos >= tombstone  # what a power loss keeps covers the tombstone
    store.close()
    assert check(tmp_path) == []


def test_open_lowers_a_tombstone_above_the_recovered_end_and_dispatches_the_new_topic(tmp_path):
    store = MessageStore.open(tmp_path, ASYNC)
    store.put("Gone", b"durable", queue_id=0)
    store.checkpoint()
    durable_end = store.commitlog.written_pos
    for i in range(3):
        store.put("Gone", b"cached-%d" % i, queue_id=0)
    store.change_topic(TopicChange(TopicOp.DELETE, "Gone"))
    die(store)
    zero_log_from(tmp_path, durable_end)  # the power loss of a store whose delete did not flush
    with reopen(tmp_path, ASYNC) as store:
        assert store.commitlog.written_pos == durable_end
        assert TopicTableFile(tmp_path).load().tombstones == {"Gone": durable_end}  # rewritten first
        assert store.put("Gone", b"NEW", queue_id=0).status is PutStatus.PUT_OK
        found = store.get_messages("Gone", 0, 0)
        assert found.status is GetStatus.FOUND and [m.body for m in found.messages] == [b"NEW"]
    with reopen(tmp_path, ASYNC) as store:
        assert [m.body for m in store.get_messages("Gone", 0, 0).messages] == [b"NEW"]
    assert check(tmp_path) == []


def test_query_by_key_leaves_out_a_deleted_topics_records(tmp_path):
    with MessageStore.open(tmp_path, SMALL_CONFIG) as store:
        store.put("Gone", b"old", keys=["k1"], queue_id=0)
        store.change_topic(TopicChange(TopicOp.DELETE, "Gone"))
        store.put("Gone", b"new", keys=["k1"], queue_id=0)
        assert [m.body for m in store.query_by_key("Gone", "k1")] == [b"new"]
    assert check(tmp_path) == []
