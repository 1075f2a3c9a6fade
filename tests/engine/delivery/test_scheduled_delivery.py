"""Delayed delivery in one process: the SCHEDULE_TOPIC_XXXX rewrite, the tag-field rule that
dispatch and check share, delivery never early and in order, exactly once across a crash,
delayOffset.json, retention held back by undelivered messages, and the refusals of system
topics and store-set properties (nothing on disk changes)."""

from __future__ import annotations

import json
import time

import pytest

from engine.check.findings import FindingKind
from engine.check.fsck import check
from engine.config import StoreConfig
from engine.delivery.scheduled import DELAY_OFFSET_FILE
from engine.errors import BadInputError, DelayOffsetError
from engine.files.naming import config_path
from engine.formats.cq_entry import CQ_ENTRY
from engine.formats.delay_offset import decode_delay_offsets
from engine.formats.java_hash import tags_code
from engine.message import Message
from engine.retention import expiry as retention
from engine.retention.expiry import RetentionReason
from engine.status import GetStatus, PutStatus
from engine.store import MessageStore
from engine.topics.system import SCHEDULE_TOPIC
from tests.helpers import SMALL_CONFIG, cq_entry_of, die, patch, snapshot

LEVELS = "100ms 200ms 1s"
CONFIG = SMALL_CONFIG.replace(message_delay_level=LEVELS)
NOW_MS = int(time.time() * 1000)
CLOCK_START_MS = NOW_MS  # the conftest's clock


def open_store(tmp_path, config: StoreConfig = CONFIG) -> MessageStore:
    return MessageStore.open(tmp_path / "store", config)


def real_messages(store: MessageStore, topic: str, queue_id: int) -> list:
    result = store.get_messages(topic, queue_id, 0, 100)
    return result.messages if result.status is GetStatus.FOUND else []


def test_delay_level_stores_the_message_in_schedule_topic_with_its_real_topic(tmp_path, clock):
    store = open_store(tmp_path)
    result = store.put("Orders", b"later", tags="TagA", keys=("k1",), queue_id=2, delay_level=2)
    assert result.status is PutStatus.PUT_OK and result.queue_id == 1  # queue level - 1
    [scheduled] = real_messages(store, SCHEDULE_TOPIC, 1)
    assert scheduled.body == b"later" and scheduled.tags == "TagA"
    assert {k: scheduled.properties[k] for k in ("DELAY", "REAL_TOPIC", "REAL_QID")} == {
        "DELAY": "2", "REAL_TOPIC": "Orders", "REAL_QID": "2"}
    assert store.get_messages("Orders", 2, 0).status is GetStatus.NO_MESSAGE_IN_QUEUE
    # the entry's tag field is the delivery time, not the hash of TagA
    entry = store.queues.get(SCHEDULE_TOPIC, 1).entry(0)
    assert entry.tags_code == result.store_ts_ms + 200 != tags_code("TagA")
    store.close()
    assert check(store.root) == []


def test_check_reports_a_scheduled_entry_holding_the_tag_hash(tmp_path, clock):
    """The tag-field rule is check's too: the hash RocketMQ replaces is a mismatch there."""
    store = open_store(tmp_path)
    assert store.put("Orders", b"later", tags="TagA", queue_id=0, delay_level=1).ok
    store.close()
    path, file_pos = cq_entry_of(store.root, 0, 0, topic=SCHEDULE_TOPIC)
    commit_pos, size, _ = CQ_ENTRY.unpack_from(path.read_bytes(), file_pos)
    patch(path, file_pos, CQ_ENTRY.pack(commit_pos, size, tags_code("TagA")))
    assert {f.kind for f in check(store.root)} == {FindingKind.CQ_ENTRY_MISMATCH}


def test_delivery_is_never_early_and_keeps_the_record(tmp_path, clock):
    store = open_store(tmp_path)
    sent = store.put("Orders", b"m", tags="T1", keys=("k",), queue_id=3, delay_level=1)
    assert store.deliver_due(now_ms=sent.store_ts_ms + 99) == 0
    assert real_messages(store, "Orders", 3) == []
    assert store.deliver_due(now_ms=sent.store_ts_ms + 100) == 1
    [copy] = real_messages(store, "Orders", 3)
    assert (copy.body, copy.tags, copy.keys, copy.born_ts_ms) == (b"m", "T1", ("k",), sent.store_ts_ms)
    assert "DELAY" not in copy.properties and copy.properties["DELIVERED_FROM"] == str(sent.commit_pos)
    assert store.query_by_key("Orders", "k")[0].commit_pos == copy.commit_pos
    assert store.deliver_due(now_ms=sent.store_ts_ms + 10_000) == 0  # once
    store.close()
    assert check(store.root) == []


def test_a_level_is_delivered_in_order_and_levels_do_not_wait_for_each_other(tmp_path, clock):
    store = open_store(tmp_path)
    slow = store.put("Orders", b"slow", queue_id=0, delay_level=3)
    fast = [store.put("Orders", b"fast-%d" % i, queue_id=0, delay_level=1) for i in range(5)]
    assert store.deliver_due(now_ms=fast[-1].store_ts_ms + 100) == 5
    assert [m.body for m in real_messages(store, "Orders", 0)] == [b"fast-%d" % i for i in range(5)]
    assert store.deliver_due(now_ms=slow.store_ts_ms + 999) == 0
    assert store.deliver_due(now_ms=slow.store_ts_ms + 1000) == 1
    assert real_messages(store, "Orders", 0)[-1].body == b"slow"
    store.close()


def test_delay_property_from_a_client_delays_the_message(tmp_path, clock):
    store = open_store(tmp_path)
    sent = store.put("Orders", b"d", queue_id=1, properties={"DELAY": "2", "region": "eu"})
    assert sent.status is PutStatus.PUT_OK and real_messages(store, "Orders", 1) == []
    assert store.deliver_due(now_ms=sent.store_ts_ms + 199) == 0
    assert store.deliver_due(now_ms=sent.store_ts_ms + 200) == 1
    assert real_messages(store, "Orders", 1)[0].properties["region"] == "eu"
    store.close()


@pytest.mark.parametrize(("message", "field", "words"), [
    (Message("Orders", b"x", properties={"DELAY": "4"}), "delay_level", "level 4 is outside 1..3"),
    (Message("Orders", b"x", properties={"DELAY": "0"}), "delay_level", "level 0 is outside 1..3"),
    (Message("Orders", b"x", properties={"DELAY": "soon"}), "delay_level", "must be an int"),
    (Message("Orders", b"x", delay_level=9), "delay_level", "level 9 is outside 1..3"),
    (Message("Orders", b"x", delay_level=1, properties={"DELAY": "2"}), "delay_level", "DELAY property"),
    (Message(SCHEDULE_TOPIC, b"x"), "topic", "system topic"),
    (Message("rmq_sys_wheel_timer", b"x"), "topic", "system topic"),
    (Message("%RETRY%group", b"x"), "topic", "system topic"),
    (Message("%DLQ%group", b"x"), "topic", "system topic"),
    (Message("Orders", b"x", properties={"REAL_TOPIC": "Other"}), "properties", "set by the store only"),
    (Message("Orders", b"x", properties={"REAL_QID": "1"}), "properties", "set by the store only"),
    (Message("Orders", b"x", properties={"DELIVERED_FROM": "0"}), "properties", "set by the store only"),
    (Message("Orders", b"x", properties={"TIMER_DELIVER_MS": "1"}), "properties", "set by the store only"),
    (Message("Orders", b"x", properties={"__STARTDELIVERTIME": "1"}), "properties", "set by the store only"),
])
def test_system_topics_store_set_properties_and_bad_levels_are_refused_unwritten(
        tmp_path, clock, message, field, words):
    store = open_store(tmp_path)
    store.put("Orders", b"before", queue_id=0)
    before = snapshot(store.root)
    [result] = store.put_batch([message])
    assert result.status is PutStatus.MESSAGE_ILLEGAL
    assert result.reason.startswith(f"invalid {field}:") and words in result.reason
    assert snapshot(store.root) == before
    store.close()


def test_a_crash_after_delivery_before_the_progress_save_delivers_nothing_twice(tmp_path, clock):
    store = open_store(tmp_path)
    sent = [store.put("Orders", b"m-%d" % i, queue_id=0, delay_level=1) for i in range(4)]
    store.deliver_due(now_ms=sent[0].store_ts_ms + 100)  # all four, saved
    progress = config_path(store.root, DELAY_OFFSET_FILE)
    saved_before = progress.read_bytes()
    more = [store.put("Orders", b"n-%d" % i, queue_id=0, delay_level=1) for i in range(3)]
    assert store.deliver_due(now_ms=more[0].store_ts_ms + 100) == 3
    progress.write_bytes(saved_before)  # the crash came before the save of the last three
    die(store)
    store = open_store(tmp_path)
    assert store.deliver_due(now_ms=more[0].store_ts_ms + 10_000) == 0
    assert store.delivery.skipped_redeliveries == 3
    assert [m.body for m in real_messages(store, "Orders", 0)] == \
        [b"m-%d" % i for i in range(4)] + [b"n-%d" % i for i in range(3)]
    # once the offsets pass them the next save records it; a second crash finds nothing to redo
    die(store)
    store = open_store(tmp_path)
    assert store.deliver_due(now_ms=more[0].store_ts_ms + 10_000) == 0
    assert len(real_messages(store, "Orders", 0)) == 7
    store.close()
    assert check(store.root) == []


def test_delay_offset_file_has_rocketmq_layout_and_reads_fastjson_bare_keys(tmp_path, clock):
    store = open_store(tmp_path)
    sent = store.put("Orders", b"m", queue_id=0, delay_level=2)
    store.deliver_due(now_ms=sent.store_ts_ms + 200)
    store.close()
    data = json.loads(config_path(store.root, DELAY_OFFSET_FILE).read_text())
    assert data["offsetTable"] == {"2": 1}
    assert decode_delay_offsets(b'{"offsetTable":{1:5,3:0}}').offsets == {1: 5, 3: 0}
    for bad in (b"{", b'{"offsetTable":{"x":1}}', b'{"offsetTable":{"1":-1}}', b'{"offsetTable":[]}'):
        with pytest.raises(DelayOffsetError, match=r"delayOffset\.json"):
            decode_delay_offsets(bad)


@pytest.mark.parametrize("text", ["", "5x", "0s", "1.5s", "10 20"])
def test_a_bad_delay_level_table_is_refused_naming_it(text):
    with pytest.raises(BadInputError, match="message_delay_level"):
        StoreConfig(message_delay_level=text)


def test_delay_levels_accept_ms_and_rocketmq_units():
    assert StoreConfig(message_delay_level="100ms 1s 2m 1h 1d").delay_levels_ms == (
        100, 1000, 120_000, 3_600_000, 86_400_000)
    assert len(StoreConfig().delay_levels_ms) == 18 and StoreConfig().delay_levels_ms[-1] == 7_200_000


# ------------------------------------------------------------------------------ retention

RETAIN = CONFIG.replace(queue_count=1, index_shards=1, file_reserved_hours=1,
                        delete_when_hour=retention.local_hour(NOW_MS), message_delay_level="1h")
HOUR_MS = 3_600_000
BODY = b"r" * 2500  # one record per 4 KiB segment


def test_retention_keeps_an_undelivered_scheduled_record_and_forced_cleaning_counts_it(tmp_path, clock):
    store = open_store(tmp_path, RETAIN)
    store.put("Orders", BODY, queue_id=0, delay_level=1)
    for _ in range(4):
        store.put("Orders", BODY, queue_id=0)
    later_ms = NOW_MS + 24 * HOUR_MS  # the delete hour, every segment expired, the message waiting
    report = store.clean_expired(now_ms=later_ms)
    assert report.reason is RetentionReason.TIME_UP
    assert report.segments_removed == [] and store.commitlog.min_pos == 0
    parts = store._parts
    forced = retention.run_retention(parts, RETAIN, now_ms=later_ms, usage_ratio=0.86,
                                     scheduled_pos=store.delivery.waiting_pos(store.queues))
    assert forced.reason is RetentionReason.SPACE_FORCE and forced.segments_removed
    assert store.deliver_due(now_ms=later_ms) == 0 and store.delivery.dropped_count == 1
    store.close()
    assert check(store.root) == []


def test_a_delivered_scheduled_record_no_longer_holds_retention(tmp_path, clock):
    store = open_store(tmp_path, RETAIN)
    sent = store.put("Orders", BODY, queue_id=0, delay_level=1)
    for _ in range(4):
        store.put("Orders", BODY, queue_id=0)
    assert store.deliver_due(now_ms=sent.store_ts_ms + HOUR_MS) == 1
    report = store.clean_expired(now_ms=NOW_MS + 24 * HOUR_MS)
    # every segment but the active one, which holds the delivered copy
    assert report.reason is RetentionReason.TIME_UP and len(report.segments_removed) == 5
    store.close()


def test_a_torn_delay_offset_file_falls_back_to_its_backup_and_without_one_is_refused(tmp_path, clock):
    store = open_store(tmp_path)
    sent = [store.put("Orders", b"m-%d" % i, queue_id=0, delay_level=1) for i in range(2)]
    store.deliver_due(now_ms=sent[0].store_ts_ms + 100)  # both: the first save
    more = store.put("Orders", b"n", queue_id=0, delay_level=1)
    store.deliver_due(now_ms=more.store_ts_ms + 100)  # the second save, the first one in .bak
    store.close()
    progress = config_path(store.root, DELAY_OFFSET_FILE)
    progress.write_bytes(b'{"offsetTable": {1: ')
    store = open_store(tmp_path)  # the .bak says 2: the copy of n is found, not made again
    assert store.delivery.offsets == {1: 2}
    assert store.deliver_due(now_ms=more.store_ts_ms + 10_000) == 0
    assert len(real_messages(store, "Orders", 0)) == 3
    store.close()
    progress.write_bytes(b"garbage")
    progress.with_name(progress.name + ".bak").write_bytes(b"garbage")
    with pytest.raises(DelayOffsetError, match=r"no readable \.bak") as refused:
        open_store(tmp_path)
    assert "delivered again" in refused.value.hint
    progress.write_bytes(b'{"offsetTable": {"1": 3}}')  # the operator put a good copy back
    open_store(tmp_path).close()  # the refused open left the store unlocked


def test_a_store_with_more_delay_levels_than_queues_reopens(tmp_path, clock):
    """SCHEDULE_TOPIC_XXXX has a queue per level (18 by default) whatever queue_count (4 here):
    its queue 17 is no queue hidden from store.json."""
    store = open_store(tmp_path, SMALL_CONFIG)
    assert store.put("Orders", b"in 2h", queue_id=0, delay_level=18).queue_id == 17
    store.close()
    with open_store(tmp_path, SMALL_CONFIG) as store:
        assert store.delivery.waiting_pos(store.queues) == 0
    assert check(store.root) == []
