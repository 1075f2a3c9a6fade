"""Delivery at a time in one process: a past time at once, beyond timer_max_delay_s refused
unwritten, never early to the millisecond, a minute's messages in time order whatever their
send order, exactly once across a crash, memory holding one minute however many wait, and
retention held back by a waiting timer message."""

from __future__ import annotations

import time

import pytest

from engine.check.fsck import check
from engine.config import StoreConfig
from engine.delivery.scheduled import DELAY_OFFSET_FILE
from engine.delivery.timer import timer_slot
from engine.files.naming import config_path
from engine.retention import expiry as retention
from engine.retention.expiry import RetentionReason
from engine.status import GetStatus, PutStatus
from engine.store import MessageStore
from engine.topics.system import TIMER_SLOT_MS, TIMER_TOPIC
from tests.helpers import SMALL_CONFIG, die, snapshot

CONFIG = SMALL_CONFIG.replace(consume_queue_entries=100)
# the conftest's clock stands still at the start of a minute: due times are relative to it
NOW_MS = int(time.time() * 1000) // TIMER_SLOT_MS * TIMER_SLOT_MS
CLOCK_START_MS = NOW_MS


@pytest.fixture(autouse=True)
def wall_clock(monkeypatch):
    """engine.message reads the wall clock to tell a past time from a future one: the test's."""
    monkeypatch.setattr("engine.message.time.time_ns", lambda: NOW_MS * 1_000_000)


def open_store(tmp_path, config: StoreConfig = CONFIG) -> MessageStore:
    return MessageStore.open(tmp_path / "store", config)


def bodies(store: MessageStore, topic: str = "Orders", queue_id: int = 0) -> list[bytes]:
    result = store.get_messages(topic, queue_id, 0, 1000)
    return [m.body for m in result.messages] if result.status is GetStatus.FOUND else []


def waiting_in_memory(store: MessageStore) -> int:
    return sum(len(window.waiting) for window in store.delivery.timer.windows)


def test_a_time_already_past_is_delivered_at_once(tmp_path, clock):
    store = open_store(tmp_path)
    result = store.put("Orders", b"now", queue_id=0, deliver_at_ms=NOW_MS - 1)
    assert result.status is PutStatus.PUT_OK and bodies(store) == [b"now"]
    assert store.queues.get(TIMER_TOPIC, timer_slot(NOW_MS - 1)) is None
    store.close()


def test_a_timed_message_waits_in_its_minutes_queue_and_arrives_at_its_millisecond(tmp_path, clock):
    store = open_store(tmp_path)
    at = NOW_MS + 1234
    result = store.put("Orders", b"t", tags="A", queue_id=2, deliver_at_ms=at)
    assert result.queue_id == timer_slot(at) and bodies(store, queue_id=2) == []
    [waiting] = store.get_messages(TIMER_TOPIC, timer_slot(at), 0).messages
    assert {k: waiting.properties[k] for k in ("REAL_TOPIC", "REAL_QID", "TIMER_DELIVER_MS")} == {
        "REAL_TOPIC": "Orders", "REAL_QID": "2", "TIMER_DELIVER_MS": str(at)}
    assert store.deliver_due(now_ms=at - 1) == 0
    assert store.deliver_due(now_ms=at) == 1
    [copy] = store.get_messages("Orders", 2, 0).messages
    assert copy.tags == "A" and copy.properties["DELIVERED_FROM"] == str(result.commit_pos)
    assert "TIMER_DELIVER_MS" not in copy.properties
    store.close()
    assert check(store.root) == []


def test_messages_of_one_minute_arrive_in_time_order_and_later_minutes_wait(tmp_path, clock):
    store = open_store(tmp_path)
    for offset_ms in (50_000, 10_000, 30_000, 20_000, 2 * TIMER_SLOT_MS + 5):
        store.put("Orders", b"%d" % offset_ms, queue_id=0, deliver_at_ms=NOW_MS + offset_ms)
    assert store.deliver_due(now_ms=NOW_MS + 25_000) == 2
    assert bodies(store) == [b"10000", b"20000"]
    assert store.deliver_due(now_ms=NOW_MS + 59_999) == 2
    assert store.deliver_due(now_ms=NOW_MS + 2 * TIMER_SLOT_MS + 4) == 0
    assert store.deliver_due(now_ms=NOW_MS + 2 * TIMER_SLOT_MS + 5) == 1
    assert bodies(store) == [b"10000", b"20000", b"30000", b"50000", b"120005"]
    store.close()
    assert check(store.root) == []


@pytest.mark.parametrize(("deliver_at_ms", "words"), [
    (NOW_MS + 3 * 24 * 3600 * 1000 + 1, "at most timer_max_delay_s = 259200 s ahead"),
    ("tomorrow", "must be an int"),
    (True, "must be an int"),
])
def test_a_time_beyond_the_maximum_or_not_a_time_is_refused_unwritten(tmp_path, clock, deliver_at_ms, words):
    store = open_store(tmp_path)
    before = snapshot(store.root)
    result = store.put("Orders", b"x", queue_id=0, deliver_at_ms=deliver_at_ms)
    assert result.status is PutStatus.MESSAGE_ILLEGAL and words in result.reason
    assert result.reason.startswith("invalid deliver_at_ms:")
    assert snapshot(store.root) == before
    store.close()


def test_a_delay_level_and_a_time_together_are_refused(tmp_path, clock):
    store = open_store(tmp_path)
    result = store.put("Orders", b"x", queue_id=0, delay_level=1, deliver_at_ms=NOW_MS + 10)
    assert result.status is PutStatus.MESSAGE_ILLEGAL and "not both" in result.reason
    store.close()


def test_the_maximum_is_a_setting_up_to_seven_days(tmp_path, clock):
    store = open_store(tmp_path, CONFIG.replace(timer_max_delay_s=60))
    assert store.put("Orders", b"x", queue_id=0, deliver_at_ms=NOW_MS + 61_000).status is \
        PutStatus.MESSAGE_ILLEGAL
    assert store.put("Orders", b"x", queue_id=0, deliver_at_ms=NOW_MS + 60_000).ok
    store.close()
    with pytest.raises(ValueError, match="timer_max_delay_s"):
        StoreConfig(timer_max_delay_s=8 * 24 * 3600)


def test_a_crash_after_out_of_order_deliveries_delivers_nothing_twice(tmp_path, clock):
    store = open_store(tmp_path)
    for offset_ms in (40_000, 10_000, 30_000):  # the first one sent is due last
        store.put("Orders", b"%d" % offset_ms, queue_id=0, deliver_at_ms=NOW_MS + offset_ms)
    progress = config_path(store.root, DELAY_OFFSET_FILE)
    assert store.deliver_due(now_ms=NOW_MS + 1) == 0
    assert not progress.exists()  # nothing to record yet
    assert store.deliver_due(now_ms=NOW_MS + 35_000) == 2  # 10000 and 30000, past the offset
    for path in (progress, progress.with_name(progress.name + ".bak")):
        path.unlink(missing_ok=True)  # the crash came before their save
    die(store)
    store = open_store(tmp_path)
    assert store.deliver_due(now_ms=NOW_MS + 35_000) == 0
    assert store.deliver_due(now_ms=NOW_MS + 40_000) == 1
    assert bodies(store) == [b"10000", b"30000", b"40000"]
    assert store.delivery.skipped_redeliveries == 2
    store.close()
    assert check(store.root) == []


def test_memory_holds_one_minute_however_many_minutes_wait(tmp_path, clock):
    store = open_store(tmp_path)
    for minute in range(1, 31):
        for i in range(3):
            store.put("Orders", b"m", queue_id=0, deliver_at_ms=NOW_MS + minute * TIMER_SLOT_MS + i)
    assert store.deliver_due(now_ms=NOW_MS + TIMER_SLOT_MS - 1) == 0
    assert waiting_in_memory(store) == 0  # this minute's slot is empty; 90 messages wait in files
    assert store.deliver_due(now_ms=NOW_MS + TIMER_SLOT_MS + 1) == 2
    assert waiting_in_memory(store) == 1  # only the open minutes are read
    assert len(store.delivery.timer.windows) <= 2
    store.close()


def test_retention_keeps_a_waiting_timer_message(tmp_path, clock):
    config = CONFIG.replace(queue_count=1, index_shards=1, file_reserved_hours=1,
                            delete_when_hour=retention.local_hour(NOW_MS))
    store = open_store(tmp_path, config)
    store.put("Orders", b"r" * 2500, queue_id=0, deliver_at_ms=NOW_MS + 2 * 24 * 3600 * 1000)
    for _ in range(4):
        store.put("Orders", b"r" * 2500, queue_id=0)
    report = store.clean_expired(now_ms=NOW_MS + 24 * 3600 * 1000)
    assert report.reason is RetentionReason.TIME_UP and report.segments_removed == []
    store.close()
