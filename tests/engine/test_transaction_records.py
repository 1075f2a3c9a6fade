"""Transaction PREPARED and ROLLBACK records already in a log: the dispatch rule of
engine.dispatch.record, end to end through recovery, reads, queries and check.

mqstore refuses these records from producers (tests/ipc/test_producer.py), but an older
mqstore stored them with the queue's next offset and acknowledged them, and RocketMQ stores
them with queue offset 0. A store holding either must open, serve every message and check clean.
"""

from __future__ import annotations

from pathlib import Path

from engine.check.fsck import check
from engine.formats.record import TxType, encode_record
from engine.message import Message
from engine.store import MessageStore
from tests.helpers import SMALL_CONFIG, TOPIC, die, queue_bodies, reopen

STORE_TS_MS = 1_700_000_000_000


def append_raw(store: MessageStore, body: bytes, *, queue_id: int, queue_offset: int, tx: TxType) -> None:
    """Append one record the way a store that took it from a producer wrote it, bypassing put."""
    record = encode_record(TOPIC, body, queue_id=queue_id, properties={"KEYS": body.decode()},
                           born_ts_ms=1, born_host=("127.0.0.1", 1), store_host=("127.0.0.1", 10911),
                           sys_flag=int(tx))
    store.commitlog.append(record, queue_offset=queue_offset, store_ts_ms=STORE_TS_MS)


def crashed_store_with(root: Path, raw: list[tuple[bytes, int, int, TxType]]) -> None:
    """Two plain messages per queue, then `raw` records (body, queue, offset, tx) on disk, then a crash."""
    store = MessageStore.open(root, SMALL_CONFIG)
    assert all(r.ok for r in store.put_batch([Message(TOPIC, b"m%d" % i, queue_id=i % 2) for i in range(4)]))
    for body, queue_id, queue_offset, tx in raw:
        append_raw(store, body, queue_id=queue_id, queue_offset=queue_offset, tx=tx)
    store.commitlog.flush()
    die(store)


def test_records_an_older_mqstore_acknowledged_with_an_offset_are_messages_of_their_queue(tmp_path):
    """A PREPARED and a ROLLBACK record holding offsets 2 and 3 of queue 1, then a plain one at 4:
    recovery opens the store (no gap), and all three are consumed and found by key."""
    crashed_store_with(tmp_path, [(b"prepared", 1, 2, TxType.PREPARED), (b"rollback", 1, 3, TxType.ROLLBACK),
                                  (b"after", 1, 4, TxType.NOT)])
    store = reopen(tmp_path)
    try:
        assert queue_bodies(store, 1) == [b"m1", b"m3", b"prepared", b"rollback", b"after"]
        assert store.max_offset(TOPIC, 1) == 5
        for key in ("prepared", "rollback", "after"):
            assert [m.body for m in store.query_by_key(TOPIC, key)] == [key.encode()]
        result = store.put(TOPIC, b"next", queue_id=1)
        assert result.ok and result.queue_offset == 5
    finally:
        store.close()
    assert check(tmp_path) == []


def test_rocketmq_half_and_rollback_records_at_offset_zero_stay_out_of_their_queue(tmp_path):
    """RocketMQ's shape: PREPARED and ROLLBACK with queue offset 0 enter no queue; the half
    message is indexed, the rollback is not; the queue's offsets stay consecutive."""
    crashed_store_with(tmp_path, [(b"half", 0, 0, TxType.PREPARED), (b"undo", 0, 0, TxType.ROLLBACK),
                                  (b"after", 0, 2, TxType.NOT)])
    store = reopen(tmp_path)
    try:
        assert queue_bodies(store, 0) == [b"m0", b"m2", b"after"]
        assert [m.body for m in store.query_by_key(TOPIC, "half")] == [b"half"]
        assert store.query_by_key(TOPIC, "undo") == []
    finally:
        store.close()
    assert check(tmp_path) == []
