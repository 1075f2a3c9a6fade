"""Producer.send_columns against a real supervisor: the records in the log byte for byte, the
BatchResult against what a consumer reads, splits over requests, bad input, threads."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import pytest

from engine.errors import BadInputError, StoreClosedError
from engine.files.naming import commitlog_dir, offset_to_name
from engine.formats.record.encode_many import encode_records
from engine.formats.record.stamp_many import stamp_records
from engine.message import Message, encode_message_properties
from engine.status import PutStatus
from ipc.batch_result import BatchResult
from ipc.consumer import Consumer
from ipc.producer import Producer
from tests.workers.store_harness import assert_check_clean, module_store, start_store

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    yield from module_store(tmp_path_factory.mktemp("columns") / "store",
                            store={"commitlog_file_size": 1024 * 1024})


def log_bytes(root: Path, commit_pos: int, size: int) -> bytes:
    """The bytes of the record at commit_pos, read from its commitlog segment file."""
    segment = json.loads((root / "store.json").read_text())["commitlog_file_size"]
    base = commit_pos - commit_pos % segment
    with open(commitlog_dir(root) / offset_to_name(base), "rb") as file:
        file.seek(commit_pos - base)
        return file.read(size)


def expected_log_bytes(record, *, tags, key) -> bytes:
    """What the message-by-message path writes for this message: its properties from
    engine.message with the record's UNIQ_KEY, encode_many's encoder, the record's stamps."""
    message = Message(record.topic, record.body, tags=tags, keys=(key,) if key else ())
    props = encode_message_properties(message, record.uniq_key)
    encoded = encode_records([record.topic.encode()], [record.body], [props], [record.queue_id],
                             born_ts_ms=record.born_ts_ms, born_host=record.born_host,
                             store_host=record.store_host)
    stamp_records(encoded.buf, encoded.starts, encoded.sizes, [record.queue_offset], [record.commit_pos],
                  record.store_ts_ms)
    return bytes(encoded.buf)


def pull_all(consumer: Consumer, topic: str, queue_count: int = 4) -> dict[int, object]:
    """Every record of the topic, by commit position."""
    records = {}
    for queue_id in range(queue_count):
        offset = 0
        while True:
            result = consumer.pull(topic, queue_id, offset, 512)
            if not result.messages:
                break
            records.update((r.commit_pos, r) for r in result.messages)
            offset = result.next_offset
    return records


def test_records_in_the_log_are_those_of_the_message_path(store):
    bodies = [b"", b"x" * 300, bytes(range(256)), b"%s%b", "é".encode()] * 8
    keys = [f"key-{i}-%é" if i % 3 else f"k{i}" for i in range(len(bodies))]
    with Producer(store.root) as producer:
        result = producer.send_columns("COLS_BYTES", bodies, keys=keys, tags="tag%é",
                                       queue_ids=[i % 4 for i in range(len(bodies))])
        plain = producer.send_columns("COLS_BYTES", [b"no", b"keys"], queue_ids=2)
    assert isinstance(result, BatchResult) and result.ok and plain.ok
    store.wait_caught_up()
    with Consumer(store.root, "cols") as consumer:
        records = pull_all(consumer, "COLS_BYTES")
    assert len(records) == len(bodies) + 2
    for i, put in enumerate(result):
        record = records[put.commit_pos]
        assert (record.body, record.keys, record.tags, record.queue_id, record.queue_offset) == (
            bodies[i], (keys[i],), "tag%é", i % 4, put.queue_offset)
        assert put.msg_id == record.msg_id and put.store_ts_ms == record.store_ts_ms
        assert log_bytes(store.root, record.commit_pos, record.total_size) == \
            expected_log_bytes(record, tags="tag%é", key=keys[i])
    for put in plain:
        record = records[put.commit_pos]
        assert record.keys == () and record.tags is None and record.queue_id == 2
        assert log_bytes(store.root, record.commit_pos, record.total_size) == \
            expected_log_bytes(record, tags=None, key=None)
    uniq = {r.uniq_key for r in records.values()}
    assert len(uniq) == len(records)


def test_send_batch_of_plain_messages_writes_the_same_records(store):
    """send_batch takes the columns path for these; the log must not tell the difference."""
    messages = [Message("COLS_BATCH", f"m{i}".encode(), keys=(f"k{i}",), tags="t") for i in range(30)]
    odd = [Message("COLS_BATCH", b"two keys", keys=("a", "b")), Message("COLS_BATCH", b"one", keys=("c",))]
    with Producer(store.root) as producer:
        results = producer.send_batch(messages) + producer.send_batch(odd)  # odd: message path
    assert all(r.ok for r in results)
    store.wait_caught_up()
    with Consumer(store.root, "cols") as consumer:
        records = pull_all(consumer, "COLS_BATCH")
    for message, put in zip(messages + odd, results, strict=True):
        record = records[put.commit_pos]
        assert record.body == message.body and record.keys == message.keys
        if len(message.keys) == 1:
            assert log_bytes(store.root, record.commit_pos, record.total_size) == \
                expected_log_bytes(record, tags=message.tags, key=message.keys[0])


def test_send_of_one_plain_message_takes_the_columns_path_and_writes_the_same_record(store, monkeypatch):
    """send() of a message without properties goes through send_columns (no Message built);
    the log must not tell the difference, and every other message still takes the message path."""
    import ipc.producer as producer_module
    built = []
    real_message = producer_module._message
    monkeypatch.setattr(producer_module, "_message", lambda *args: built.append(args) or real_message(*args))
    with Producer(store.root) as producer:
        keyed = producer.send("COLS_SEND", b"one %b", keys="k-%é", tags="t")
        listed = producer.send("COLS_SEND", b"listed", keys=["k2"], queue_id=3)
        plain = producer.send("COLS_SEND", b"plain")
        assert not built
        two_keys = producer.send("COLS_SEND", b"two", keys=("a", "b"))
        with_props = producer.send("COLS_SEND", b"props", properties={"p": "v"})
        bad = producer.send("COLS_SEND", b"bad queue", queue_id=99)
    assert len(built) == 3 and bad.status == PutStatus.MESSAGE_ILLEGAL
    assert all(put.ok for put in (keyed, listed, plain, two_keys, with_props))
    store.wait_caught_up()
    with Consumer(store.root, "cols") as consumer:
        records = pull_all(consumer, "COLS_SEND")
    for put, tags, key in ((keyed, "t", "k-%é"), (listed, None, "k2"), (plain, None, None)):
        record = records[put.commit_pos]
        assert put.msg_id == record.msg_id and put.queue_offset == record.queue_offset
        assert log_bytes(store.root, record.commit_pos, record.total_size) == \
            expected_log_bytes(record, tags=tags, key=key)
    assert records[listed.commit_pos].queue_id == 3
    assert records[two_keys.commit_pos].keys == ("a", "b")


def test_one_message_takes_the_one_record_path_and_writes_the_same_record(store, monkeypatch):
    """A one-message send_columns or send is encoded by encode_one, not encode_columns (numpy,
    lists); the log must not tell the difference, round robin included."""
    import ipc.producer as producer_module
    columns_calls = []
    real_columns = producer_module.encode_columns
    monkeypatch.setattr(producer_module, "encode_columns",
                        lambda *args, **kw: columns_calls.append(args) or real_columns(*args, **kw))
    with Producer(store.root) as producer:
        producer.send_columns("COLS_ONE", [b"first"])  # an unknown topic: checked by the general path
        columns_calls.clear()
        sent = [(producer.send_columns("COLS_ONE", [b"listed %b"], keys=["k-%\u00e9"], tags="t",
                                       queue_ids=[3])[0], "t", "k-%\u00e9"),
                (producer.send_columns("COLS_ONE", (b"tuple",), keys=("k2",), queue_ids=2)[0], None, "k2"),
                (producer.send_columns("COLS_ONE", [b"round robin"])[0], None, None),
                (producer.send("COLS_ONE", b"send", keys="k3"), None, "k3")]
        assert not columns_calls
    assert [put.queue_id for put, _, _ in sent] == [3, 2, 1, 2]  # round robin went on from "first"
    store.wait_caught_up()
    with Consumer(store.root, "cols") as consumer:
        records = pull_all(consumer, "COLS_ONE")
    for put, tags, key in sent:
        assert put.ok
        record = records[put.commit_pos]
        assert put.msg_id == record.msg_id and put.queue_offset == record.queue_offset
        assert log_bytes(store.root, record.commit_pos, record.total_size) == \
            expected_log_bytes(record, tags=tags, key=key)


def test_one_message_while_the_slot_is_busy_is_queued_once_and_keeps_the_round_robin(store):
    """A one-message send that finds another thread's request in flight goes through the queue
    with the record it made: sent once, the round robin not advanced twice."""
    with Producer(store.root) as producer:
        first = producer.send_columns("COLS_BUSY", [b"a"])[0]
        sender = producer._sender
        assert sender._claim_idle_slot()  # as another thread's request in flight would
        answers = []
        thread = threading.Thread(target=lambda: answers.append(producer.send("COLS_BUSY", b"b", keys="k")))
        thread.start()
        deadline = time.monotonic() + 10
        while not sender.queue:  # the send waits in the queue, not in the slot
            assert time.monotonic() < deadline and thread.is_alive()
            time.sleep(0.001)
        sender._free_slot()
        thread.join(10)
        third = producer.send_columns("COLS_BUSY", [b"c"])[0]
    assert answers[0].ok and [put.queue_id for put in (first, answers[0], third)] == [0, 1, 2]
    store.wait_caught_up()
    with Consumer(store.root, "cols") as consumer:
        records = pull_all(consumer, "COLS_BUSY")
    assert sorted(r.body for r in records.values()) == [b"a", b"b", b"c"]
    assert records[answers[0].commit_pos].keys == ("k",)


@pytest.mark.parametrize("kwargs, field, words", [
    ({"bodies": ["text"]}, "bodies", "body 0 must be bytes, not str"),
    ({"bodies": [b"x" * 9000]}, "bodies", "body 0: 9000 bytes exceeds the maximum of 8192"),
    ({"keys": ["two words"]}, "keys", "key 0"),
    ({"keys": [""]}, "keys", "key 0"),
    ({"keys": ["a\x01b"]}, "keys", "key 0"),
    ({"keys": ["\ud800"]}, "keys", "key 0"),
    ({"keys": [7]}, "keys", "key 0"),
    ({"keys": "k"}, "keys", "not a single str"),
    ({"queue_ids": [4]}, "queue_id", "4 is outside 0..3"),
    ({"queue_ids": -1}, "queue_id", "-1 is outside 0..3"),
    ({"queue_ids": [True]}, "queue_id", "must be an int, not bool"),
    ({"tags": ""}, "tags", "must not be empty"),
    ({"topic": "bad/topic"}, "topic", "invalid"),
    ({"keys": ["k" * 40000]}, "properties", "exceed 32767"),
])
def test_bad_one_message_columns_raise_as_many_do_and_send_nothing(store, kwargs, field, words):
    """The one-record path takes only what it can check itself; anything else gets the general
    path's error, as a batch of more messages would."""
    args = {"topic": "COLS_BAD_ONE", "bodies": [b"a"], **kwargs}
    with Producer(store.root) as producer, store.ctl() as ctl:
        assert producer.send_columns("COLS_BAD_ONE", [b"topic known"]).ok
        before = ctl.written_pos
        with pytest.raises(BadInputError, match=words) as info:
            producer.send_columns(args.pop("topic"), args.pop("bodies"), **args)
        assert info.value.field == field
        assert ctl.written_pos == before


def test_a_batch_larger_than_a_request_is_split_and_answered_in_order(store):
    count = 2600  # the mailbox takes at most 1024 records per request
    with Producer(store.root) as producer, store.ctl() as ctl:
        slot, mailbox = producer._sender.slot.index, producer._sender.mailbox
        seq_before = int(mailbox.req_seq[slot])
        result = producer.send_columns("COLS_SPLIT", [b"%06d" % i for i in range(count)], queue_ids=1)
        requests = int(mailbox.req_seq[slot]) - seq_before
        assert ctl.written_pos >= int(result.commit_pos.max())
    assert requests == 3
    assert result.ok and len(result) == count
    assert result.queue_offset.tolist() == list(range(count))  # one queue, send order
    assert (result.commit_pos[1:] > result.commit_pos[:-1]).all()


def test_round_robin_continues_across_calls(store):
    with Producer(store.root) as producer:
        first = producer.send_columns("COLS_RR", [b"a"] * 6)
        single = producer.send("COLS_RR", b"b")
        second = producer.send_columns("COLS_RR", [b"c"] * 3)
    assert first.queue_id.tolist() == [0, 1, 2, 3, 0, 1]
    assert single.queue_id == 2 and second.queue_id.tolist() == [3, 0, 1]


@pytest.mark.parametrize("kwargs, field, words", [
    ({"bodies": [b"a", "text"]}, "bodies", "body 1 must be bytes, not str"),
    ({"bodies": [b"a", b"x" * 9000]}, "bodies", "body 1: 9000 bytes exceeds the maximum of 8192"),
    ({"keys": ["k1"]}, "keys", "1 keys for 2 messages"),
    ({"keys": ["k1", "two words"]}, "keys", "key 1"),
    ({"queue_ids": [0]}, "queue_ids", "1 queue ids for 2 messages"),
    ({"queue_ids": [0, 4]}, "queue_id", "4 is outside 0..3"),
    ({"tags": ""}, "tags", "must not be empty"),
    ({"topic": "bad/topic"}, "topic", "invalid"),
    ({"keys": ["k", "k" * 40000]}, "properties", "exceed 32767"),
])
def test_bad_columns_raise_and_send_nothing(store, kwargs, field, words):
    args = {"topic": "COLS_BAD", "bodies": [b"a", b"b"], **kwargs}
    with Producer(store.root) as producer, store.ctl() as ctl:
        before = ctl.written_pos
        with pytest.raises(BadInputError, match=words) as info:
            producer.send_columns(args.pop("topic"), args.pop("bodies"), **args)
        with pytest.raises(BadInputError):
            producer.send_columns_async("COLS_BAD", [b"a", b"b"], **{"keys": ["k1"]})
        assert info.value.field == field
        assert ctl.written_pos == before
        assert producer.send_columns("COLS_BAD", [b"fine"]).ok  # the producer goes on


def test_empty_columns_and_closed_producer(store):
    with Producer(store.root) as producer:
        empty = producer.send_columns("COLS_EMPTY", [])
        assert len(empty) == 0 and empty.ok
        assert len(producer.send_columns_async("COLS_EMPTY", []).result(timeout=5)) == 0
    with pytest.raises(StoreClosedError):
        producer.send_columns("COLS_EMPTY", [b"late"])


def test_blocking_and_async_calls_from_many_threads_keep_each_threads_order(store):
    """Columns from many threads share the one queue and slot: a thread's messages land in its
    send order and every one is answered."""
    results: dict[int, list] = {t: [] for t in range(6)}

    def worker(t: int) -> None:
        with_async = t % 2 == 0
        for i in range(40):
            bodies = [f"{t}-{i}-{j}".encode() for j in range(5)]
            if with_async:
                results[t].append(producer.send_columns_async("COLS_THREADS", bodies, queue_ids=t % 4))
            else:
                results[t].append(producer.send_columns("COLS_THREADS", bodies, queue_ids=t % 4))

    with Producer(store.root) as producer:
        threads = [threading.Thread(target=worker, args=(t,)) for t in range(6)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        answered = {t: [r.result(timeout=30) if not isinstance(r, BatchResult) else r for r in rs]
                    for t, rs in results.items()}
    for t, batches in answered.items():
        assert all(b.ok for b in batches)
        offsets = [o for b in batches for o in b.queue_offset.tolist()]
        assert len(offsets) == 200 and offsets == sorted(offsets), t


def test_status_counts_of_a_batch_into_a_stopping_store(tmp_path):
    running = start_store(tmp_path / "store")
    producer = Producer(running.root, reattach_timeout_s=0)
    try:
        assert producer.send_columns("COLS_STOP", [b"x"] * 3).ok
        assert running.stop() == 0
        result = producer.send_columns("COLS_STOP", [b"y"] * 4)
        assert result.status_counts() == {PutStatus.SERVICE_NOT_AVAILABLE: 4}
        assert "reattach_timeout_s = 0 s" in result[0].reason
        assert all(r.reason for r in result) and result.msg_ids() == [None] * 4
        one = producer.send_columns("COLS_STOP", [b"z"])  # the one-record path
        assert one.status_counts() == {PutStatus.SERVICE_NOT_AVAILABLE: 1}
        assert "reattach_timeout_s = 0 s" in one[0].reason
    finally:
        producer.close()
    assert_check_clean(running.root)
