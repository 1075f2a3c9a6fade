"""engine.topics.table and the in-process store: config/topics.json (RocketMQ's layout), the one
put rule per (topic, queue id), operator changes, and deleted topics' tombstones.

tests/workers/test_topics_live.py runs the same against a real supervisor and its children.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from engine.check.fsck import check
from engine.errors import BadInputError
from engine.files.naming import CONFIG_DIR, TOPICS_FILE
from engine.refusal import Refusal
from engine.status import GetStatus, PutStatus
from engine.store import MessageStore
from engine.topics.table import (
    PERM_READ,
    PERM_WRITE,
    TopicChange,
    TopicDefaults,
    TopicFileError,
    TopicOp,
    TopicTable,
    TopicTableFile,
    decode_topic_table,
    encode_topic_table,
    parse_perm,
    perm_text,
)
from tests.conftest import ROCKETMQ_SAMPLES
from tests.helpers import SMALL_CONFIG, die, queue_bodies, rebuild, reopen, snapshot

SAMPLE_TOPICS = ROCKETMQ_SAMPLES / "store-2019" / "config" / TOPICS_FILE
DEFAULTS = TopicDefaults(SMALL_CONFIG.queue_count)


def create(topic: str, queues: int, perm: int = PERM_READ | PERM_WRITE) -> TopicChange:
    return TopicChange(TopicOp.CREATE, topic, queues, perm)


def topics_path(root: Path) -> Path:
    return root / CONFIG_DIR / TOPICS_FILE


# ---------------------------------------------------------------- the file


def test_rocketmq_written_topics_json_loads_with_its_queue_counts_and_perms():
    table = TopicTableFile(SAMPLE_TOPICS.parent.parent).load()
    assert table.version_counter == 3 and table.version_ms == 1551626364371
    counts = {name: (c.read_queue_count, c.write_queue_count, c.perm) for name, c in table.topics.items()}
    assert counts["BenchmarkTest"] == (1024, 1024, 6)
    assert counts["TopicTest"] == (4, 4, 6)
    assert counts["DefaultCluster"] == (16, 16, 7)
    assert counts["%RETRY%please_rename_unique_group_name_4"] == (1, 1, 6)
    assert len(counts) == 9 and table.tombstones == {}


def test_written_table_reads_back_as_rocketmq_wrote_it():
    table = decode_topic_table(SAMPLE_TOPICS.read_text())
    written = json.loads(encode_topic_table(table))
    original = json.loads(SAMPLE_TOPICS.read_text())
    assert written["topicConfigTable"] == original["topicConfigTable"]
    assert written["dataVersion"] == original["dataVersion"]
    assert decode_topic_table(encode_topic_table(table).decode()) == table


def test_fastjson_bare_integer_keys_are_read():
    text = ('{"topicConfigTable":{7:{"topicName":"7","readQueueNums":2,"writeQueueNums":2,"perm":6}},'
            '"mqstoreTombstones":{3:120}}')
    table = decode_topic_table(text)
    assert table.topics["7"].write_queue_count == 2 and table.tombstones == {"3": 120}


GOOD = {"topicName": "T", "readQueueNums": 4, "writeQueueNums": 4, "perm": 6}
BAD_FILES = {
    "not JSON": ("{not json", "Expecting"),
    "a list": ("[]", "top level"),
    "name differs": (json.dumps({"topicConfigTable": {"T": {**GOOD, "topicName": "U"}}}), "topicName"),
    "count a string": (json.dumps({"topicConfigTable": {"T": {**GOOD, "readQueueNums": "4"}}}),
                       "topicConfigTable.T.readQueueNums"),
    "count too big": (json.dumps({"topicConfigTable": {"T": {**GOOD, "writeQueueNums": 2000}}}),
                      "writeQueueNums is 2000"),
    "perm 9": (json.dumps({"topicConfigTable": {"T": {**GOOD, "perm": 9}}}), "perm is 9"),
    "no perm": (json.dumps({"topicConfigTable": {"T": {k: v for k, v in GOOD.items() if k != "perm"}}}),
                "has no perm"),
    "bad topic name": (json.dumps({"topicConfigTable": {"a/b": {**GOOD, "topicName": "a/b"}}}), "'a/b'"),
    "order not bool": (json.dumps({"topicConfigTable": {"T": {**GOOD, "order": "no"}}}), "order"),
    "filter type": (json.dumps({"topicConfigTable": {"T": {**GOOD, "topicFilterType": "SQL"}}}),
                    "topicFilterType"),
    "negative tombstone": (json.dumps({"mqstoreTombstones": {"T": -1}}), "mqstoreTombstones.T"),
}


@pytest.mark.parametrize("name", sorted(BAD_FILES))
def test_bad_topics_json_refuses_the_open_and_changes_nothing(tmp_path, name):
    text, words = BAD_FILES[name]
    MessageStore.open(tmp_path, SMALL_CONFIG).close()
    topics_path(tmp_path).write_text(text)
    before = {k: v for k, v in snapshot(tmp_path).items() if k != "lock"}
    with pytest.raises(TopicFileError) as refused:
        MessageStore.open(tmp_path, SMALL_CONFIG)
    assert words in str(refused.value) and refused.value.hint
    assert {k: v for k, v in snapshot(tmp_path).items() if k != "lock"} == before


def test_every_write_keeps_the_previous_version_as_bak(tmp_path):
    with MessageStore.open(tmp_path, SMALL_CONFIG) as store:
        store.change_topic(create("A", 2))
        store.change_topic(create("B", 3))
    backup = decode_topic_table((tmp_path / CONFIG_DIR / (TOPICS_FILE + ".bak")).read_text())
    current = TopicTableFile(tmp_path).load()
    assert set(backup.topics) == {"A"} and set(current.topics) == {"A", "B"}
    assert current.version_counter == backup.version_counter + 1


# ---------------------------------------------------------------- the put rule


def test_a_put_past_the_topics_write_queues_is_refused_and_changes_nothing(tmp_path):
    with MessageStore.open(tmp_path, SMALL_CONFIG) as store:
        store.change_topic(create("Solo", 1))
        assert store.put("Solo", b"x", queue_id=0).status is PutStatus.PUT_OK
        before = snapshot(tmp_path)
        refused = store.put("Solo", b"x", queue_id=1)
        assert refused.status is PutStatus.MESSAGE_ILLEGAL
        assert refused.reason == "invalid queue_id: 1 is not one of the topic's 1 write queues (0..0)"
        assert snapshot(tmp_path) == before
        assert store.max_offset("Solo", 1) == 0 and store.max_offset("Solo", 0) == 1


def test_a_topic_may_have_more_queues_than_the_default(tmp_path):
    with MessageStore.open(tmp_path, SMALL_CONFIG) as store:
        store.change_topic(create("Wide", 1024))
        assert store.put("Wide", b"x", queue_id=1023).status is PutStatus.PUT_OK
        assert store.put("Wide", b"x", queue_id=1024).status is PutStatus.MESSAGE_ILLEGAL
    with reopen(tmp_path) as store:  # queue 1023 is the topic's, past store.json's queue_count
        assert queue_bodies(store, 1023, "Wide") == [b"x"]


def test_a_read_only_topic_refuses_puts_until_it_is_made_writable(tmp_path):
    with MessageStore.open(tmp_path, SMALL_CONFIG) as store:
        store.change_topic(create("Frozen", 2, PERM_READ))
        refused = store.put("Frozen", b"x")
        assert refused.status is PutStatus.MESSAGE_ILLEGAL
        assert "perm 4 does not allow writes" in refused.reason
        assert store.max_offset("Frozen", 0) == 0
        store.change_topic(TopicChange(TopicOp.UPDATE, "Frozen", 2, PERM_READ | PERM_WRITE))
        assert store.put("Frozen", b"x").status is PutStatus.PUT_OK


def test_first_put_creates_an_unconfigured_topic_with_the_default_queue_count(tmp_path):
    with MessageStore.open(tmp_path, SMALL_CONFIG) as store:
        assert store.put("Fresh", b"x", queue_id=3).status is PutStatus.PUT_OK
    config = TopicTableFile(tmp_path).load().topics["Fresh"]
    assert (config.read_queue_count, config.write_queue_count, config.perm) == (4, 4, 6)


def test_without_auto_create_an_unconfigured_topic_is_refused_and_nothing_is_written(tmp_path):
    config = SMALL_CONFIG.replace(auto_create_topic=False)
    with MessageStore.open(tmp_path, config) as store:
        before = snapshot(tmp_path)
        refused = store.put("Nobody", b"x")
        assert refused.status is PutStatus.MESSAGE_ILLEGAL and "auto_create_topic is off" in refused.reason
        assert snapshot(tmp_path) == before
        store.change_topic(create("Nobody", 1))
        assert store.put("Nobody", b"x").status is PutStatus.PUT_OK


def test_the_rule_says_why_with_a_refusal_code_for_the_producer():
    table = TopicTable().with_topic(TopicDefaults(2).config_for("T"))
    with pytest.raises(BadInputError) as refused:
        table.put_route("T", 2, DEFAULTS)
    error = refused.value
    assert (error.refusal, error.limit, error.found) == (Refusal.WRITE_QUEUE, 2, 2)
    with pytest.raises(BadInputError) as refused:
        table.put_route("U", 0, TopicDefaults(2, auto_create=False))
    assert refused.value.refusal == Refusal.TOPIC_UNKNOWN
    assert table.put_route("U", 1, TopicDefaults(2)).write_queue_count == 2  # auto-created


def test_a_store_from_before_topics_json_gets_its_topics_configured_at_open(tmp_path):
    with MessageStore.open(tmp_path, SMALL_CONFIG) as store:
        store.put("Old", b"x", queue_id=2)
    topics_path(tmp_path).unlink()
    with reopen(tmp_path) as store:
        assert store.topics.topics["Old"].write_queue_count == SMALL_CONFIG.queue_count
    assert "Old" in TopicTableFile(tmp_path).load().topics


# ---------------------------------------------------------------- operator changes


def test_changes_that_cannot_apply_are_refused_and_change_nothing(tmp_path):
    with MessageStore.open(tmp_path, SMALL_CONFIG) as store:
        store.change_topic(create("T", 4))
        store.put("T", b"x", queue_id=2)
        before = snapshot(tmp_path)
        cases = [
            (create("T", 4), "exists"),
            (TopicChange(TopicOp.UPDATE, "Missing", 2), "no topic Missing"),
            (TopicChange(TopicOp.DELETE, "Missing"), "no topic Missing"),
            (TopicChange(TopicOp.UPDATE, "T", 2), "holds messages in queue 2"),
            (create("U", 0), "1..1024"),
            (create("U", 1025), "1..1024"),
            (create("U", 2, 1), "perm"),
            (create("a/b", 2), "topic"),
            (create("SCHEDULE_TOPIC_XXXX", 2), "the store's own topic"),
            *[(create(name, 2), "a name the store keeps for its own topics")
              for name in ("TBW102", "RMQ_SYS_TRACE_TOPIC", "%RETRY%g", "%DLQ%g")],
        ]
        for change, words in cases:
            with pytest.raises(BadInputError, match=words):
                store.change_topic(change)
        assert snapshot(tmp_path) == before
        store.change_topic(TopicChange(TopicOp.UPDATE, "T", 3))  # queue 2 stays covered
        assert store.topics.topics["T"].write_queue_count == 3


def test_perm_words_are_rocketmqs_bits():
    assert [parse_perm(word) for word in ("rw", "r", "w")] == [6, 4, 2]
    assert [perm_text(perm) for perm in (7, 6, 4, 2, 0)] == ["rw", "rw", "r", "w", "-"]
    with pytest.raises(BadInputError, match="not one of rw, r, w"):
        parse_perm("x")


def test_the_stores_own_topics_take_their_counts_from_the_store_not_the_file():
    table = TopicTable().with_topic(TopicDefaults(2).config_for("SYS")).with_system_topics({"SYS": 18})
    assert table.topics["SYS"].write_queue_count == 18
    with pytest.raises(BadInputError, match="the store's own topic"):
        from engine.topics.table import plan_topic_change
        plan_topic_change(table, TopicChange(TopicOp.DELETE, "SYS"), used_queue_count=0, end_pos=0)


# ---------------------------------------------------------------- deleted topics


def test_delete_drops_the_queues_and_a_topic_created_again_starts_fresh(tmp_path):
    with MessageStore.open(tmp_path, SMALL_CONFIG) as store:
        for i in range(5):
            store.put("Gone", b"old-%d" % i, queue_id=1)
        store.put("Kept", b"k")
        table = store.change_topic(TopicChange(TopicOp.DELETE, "Gone"))
        assert table.tombstones["Gone"] == store.commitlog.written_pos
        assert not (tmp_path / "consumequeue" / "Gone").exists()
        assert store.get_messages("Gone", 1, 0).status is GetStatus.NO_MESSAGE_IN_QUEUE
        again = store.put("Gone", b"new", queue_id=1)
        assert again.queue_offset == 0
        assert queue_bodies(store, 1, "Gone") == [b"new"] and queue_bodies(store, 0, "Kept") == [b"k"]
    assert check(tmp_path) == []


def test_a_rebuild_from_the_log_does_not_bring_a_deleted_topic_back(tmp_path):
    with MessageStore.open(tmp_path, SMALL_CONFIG) as store:
        for i in range(12):  # across consume-queue files and commitlog segments
            store.put("Gone", b"old-%d" % i * 40, queue_id=i % 2)
        store.change_topic(TopicChange(TopicOp.DELETE, "Gone"))
        store.put("Gone", b"new", queue_id=1)
    with rebuild(tmp_path) as store:
        assert store.max_offset("Gone", 0) == 0
        assert queue_bodies(store, 1, "Gone") == [b"new"]
    assert check(tmp_path) == []


def test_a_crash_before_the_old_queues_went_leaves_the_topic_deleted(tmp_path):
    """The dispatcher was killed between the tombstone and removing the queue files: the next
    open removes them before re-dispatch, which skips the old records."""
    store = MessageStore.open(tmp_path, SMALL_CONFIG)
    for i in range(6):
        store.put("Gone", b"old-%d" % i, queue_id=0)
    store.checkpoint()
    saved = shutil.copytree(tmp_path / "consumequeue" / "Gone", tmp_path.parent / "saved-queue")
    store.change_topic(TopicChange(TopicOp.DELETE, "Gone"))
    store.put("Gone", b"new", queue_id=0)
    die(store)
    shutil.rmtree(tmp_path / "consumequeue" / "Gone")
    shutil.copytree(saved, tmp_path / "consumequeue" / "Gone")  # the old queue, as left behind
    assert check(tmp_path) == []  # the old queue is the next open's to remove: no finding
    with reopen(tmp_path) as store:
        assert queue_bodies(store, 0, "Gone") == [b"new"]
    assert check(tmp_path) == []


def test_an_update_keeps_what_it_is_not_given(tmp_path):
    shutil.copy(SAMPLE_TOPICS, tmp_path / "topics.json")
    with MessageStore.open(tmp_path / "store", SMALL_CONFIG) as store:
        store.change_topic(create("T", 4))
        store.change_topic(TopicChange(TopicOp.UPDATE, "T", perm=PERM_READ))
        assert counts_and_perm(store, "T") == (4, PERM_READ)
        store.change_topic(TopicChange(TopicOp.UPDATE, "T", 6))
        assert counts_and_perm(store, "T") == (6, PERM_READ)
    (tmp_path / "store" / CONFIG_DIR / TOPICS_FILE).write_bytes((tmp_path / "topics.json").read_bytes())
    with reopen(tmp_path / "store") as store:  # RocketMQ's perm 7 (rw and inherit) stays as read
        store.change_topic(TopicChange(TopicOp.UPDATE, "DefaultCluster", 20))
        assert counts_and_perm(store, "DefaultCluster") == (20, 7)


def counts_and_perm(store: MessageStore, topic: str) -> tuple[int, int]:
    config = store.topics.topics[topic]
    return config.write_queue_count, config.perm


def test_consumers_read_every_queue_a_send_may_reach_when_read_queues_are_fewer():
    text = json.dumps({"topicConfigTable": {"Half": {**GOOD, "topicName": "Half", "readQueueNums": 1,
                                                     "writeQueueNums": 2}}})
    table = decode_topic_table(text)
    assert table.write_queue_count("Half", DEFAULTS) == 2
    assert table.read_queue_count("Half", DEFAULTS) == 2  # RocketMQ reads 1 and leaves queue 1 unread
    assert table.topics["Half"].read_queue_count == 1  # kept as read, written back the same
