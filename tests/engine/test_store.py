"""MessageStore: RocketMQ's DefaultMessageStoreTest, ReputMessageServiceTest, BatchPutMessageTest,
StoreCheckpointTest and DefaultMessageStoreShutDownTest, ported to the in-process store API.

Time is injected (the `clock` fixture replaces the store's clock); nothing sleeps.
"""

from __future__ import annotations

import os

import pytest

from engine import store as store_module
from engine.check.fsck import check
from engine.config import FlushPolicy
from engine.errors import BadInputError, CorruptRecordError, StoreCorruptError, StoreLockedError
from engine.files.naming import (
    ABORT_FILE,
    CHECKPOINT_FILE,
    COMMITLOG_DIR,
    CONSUMEQUEUE_DIR,
    INDEX_DIR,
    LOCK_FILE,
    STORE_META_FILE,
)
from engine.formats.checkpoint import MIN_TIMESTAMP_MARGIN_MS, Checkpoint
from engine.formats.crc32c_property import CRC32C_PROP_SIZE
from engine.formats.index_file import index_key_hash_of
from engine.formats.msg_id import parse_msg_id
from engine.formats.properties import PROP_UNIQ_KEY, encode_properties
from engine.formats.record import MAX_PROPERTIES_BYTES, PROPERTIES_LENGTH_SIZE, Verify, decode_record
from engine.formats.uniq_key import new_uniq_key
from engine.message import Message
from engine.queues.consume_queue import Boundary
from engine.recovery.checkpoint import CheckpointSource, load_checkpoint, write_checkpoint
from engine.recovery.recover import RecoveryMode
from engine.retention import expiry as retention
from engine.status import GetStatus, PutStatus
from engine.store import MessageStore
from tests.helpers import TOPIC, die, local_time_ms, log_bytes, patch, queue_bodies, segment_of, snapshot

BODY = b"Once, there was a chance for me!"  # RocketMQ's test body, 32 bytes


def put_n(store: MessageStore, n: int, *, queue_id: int = 0, clock=None, step_ms: int = 0, **kw):
    results = []
    for i in range(n):
        results.append(store.put(TOPIC, BODY + b"%d" % i, queue_id=queue_id, **kw))
        if clock is not None:
            clock.advance(step_ms)
    assert all(r.ok for r in results), [r for r in results if not r.ok]
    return results


# ------------------------------------------------------------------------------ lifecycle


def test_repeat_restart_second_open_is_refused_with_the_holder_pid(tmp_path, small_config):
    store = MessageStore.open(tmp_path, small_config)
    try:
        put_n(store, 3)
        before = snapshot(tmp_path)
        with pytest.raises(StoreLockedError) as exc:
            MessageStore.open(tmp_path, small_config)
        assert f"already in use by pid {os.getpid()}" in str(exc.value)
        assert str(tmp_path) in str(exc.value) and exc.value.hint
        assert snapshot(tmp_path) == before
        assert store.put(TOPIC, b"still writable").queue_offset == 3  # the first is unharmed
    finally:
        store.close()
    MessageStore.open(tmp_path, small_config).close()  # the lock went with close


def test_store_path_ok_layout_and_abort_marker(tmp_path, small_config):
    root = tmp_path / "store"
    store = MessageStore.open(root, small_config)
    put_n(store, 1)
    for name in (COMMITLOG_DIR, CONSUMEQUEUE_DIR, INDEX_DIR):
        assert (root / name).is_dir()
    for name in (STORE_META_FILE, LOCK_FILE, ABORT_FILE, CHECKPOINT_FILE):
        assert (root / name).is_file()
    store.close()
    assert not (root / ABORT_FILE).exists()


def test_shutdown_clean_vs_crash_is_seen_by_the_next_open(tmp_path, small_config):
    """DefaultMessageStoreShutDownTest: only a clean close removes `abort`; close dispatches
    everything first, so it never leaves dispatch behind."""
    store = MessageStore.open(tmp_path, small_config.replace(flush=FlushPolicy.ASYNC))
    put_n(store, 5)
    store.close()
    store = MessageStore.open(tmp_path, small_config)
    assert store.recovery_report.shutdown == "clean"
    assert store.max_offset(TOPIC, 0) == 5
    die(store)
    assert (tmp_path / ABORT_FILE).exists()
    store = MessageStore.open(tmp_path, small_config)
    assert store.recovery_report.shutdown == "crash"
    store.close()


# ------------------------------------------------------------------------------ write and read


def test_write_and_read_every_offset(tmp_path, small_config):
    with MessageStore.open(tmp_path, small_config) as store:
        results = put_n(store, 30)
        assert [r.queue_offset for r in results] == list(range(30))
        assert len({segment_of(tmp_path, r.commit_pos)[0] for r in results}) > 1  # rolled
        for i, r in enumerate(results):
            got = store.get_messages(TOPIC, 0, i, 1)
            assert got.status is GetStatus.FOUND and got.next_offset == i + 1
            (msg,) = got.messages
            assert (msg.body, msg.commit_pos, msg.queue_offset) == (BODY + b"%d" % i, r.commit_pos, i)
    assert check(tmp_path) == []


def test_look_message_by_offset_first_last_and_out_of_bound(tmp_path, small_config):
    with MessageStore.open(tmp_path, small_config) as store:
        results = put_n(store, 10)
        assert store.read_at(results[0].commit_pos).body == BODY + b"0"
        last = store.read_at(results[-1].commit_pos)
        assert last.body == BODY + b"9"
        with pytest.raises(BadInputError):
            store.read_at(last.end_pos)  # the max position: nothing there
        with pytest.raises(BadInputError):
            store.read_at(-1)
        with pytest.raises(CorruptRecordError):
            store.read_at(results[3].commit_pos + 1)  # not a record start: refused, not misread


def test_msg_id_decodes_to_store_host_and_commit_position(tmp_path, small_config):
    with MessageStore.open(tmp_path, small_config) as store:
        for r in put_n(store, 5):
            assert len(r.msg_id) == 32
            assert parse_msg_id(r.msg_id) == (small_config.store_ip_port, r.commit_pos)
            assert store.read_at(r.commit_pos).msg_id == r.msg_id


def test_pull_size_honours_max_count(tmp_path, small_config):
    with MessageStore.open(tmp_path, small_config) as store:
        put_n(store, 32)
        for max_count in (32, 20, 10):
            got = store.get_messages(TOPIC, 0, 0, max_count)
            assert got.status is GetStatus.FOUND
            assert len(got.messages) == max_count and got.next_offset == max_count
        assert [m.body for m in store.get_messages(TOPIC, 0, 0, 32).messages] == \
            [BODY + b"%d" % i for i in range(32)]


def test_group_commit_every_acknowledged_message_is_flushed(tmp_path, small_config):
    with MessageStore.open(tmp_path, small_config) as store:
        for r in put_n(store, 15):
            assert store.read_at(r.commit_pos).end_pos <= store.commitlog.flushed_pos
        assert store.commitlog.flushed_pos == store.commitlog.written_pos


# ------------------------------------------------------------------------------ offset by time


def test_offset_for_time_exact_skewed_and_unknown_queue(tmp_path, small_config, clock):
    with MessageStore.open(tmp_path, small_config) as store:
        results = put_n(store, 12, clock=clock, step_ms=10)
        times = [r.store_ts_ms for r in results]
        assert times == sorted(set(times))
        for i, ts in enumerate(times):
            assert store.offset_for_time(TOPIC, 0, ts) == i
            assert store.offset_for_time(TOPIC, 0, ts, Boundary.UPPER) == i
            assert store.offset_for_time(TOPIC, 0, ts - 2) == i  # 2 ms skew finds the message
        assert store.offset_for_time(TOPIC, 0, times[0] - 20_000) == 0  # large skew: the first
        assert store.offset_for_time(TOPIC, 0, times[-1] + 1) == 12  # after the last: one past
        assert store.offset_for_time(TOPIC, 3, times[0]) == 0  # a queue that does not exist
        assert store.offset_for_time("Nobody", 0, times[0]) == 0


def test_offset_for_time_equal_store_times_lower_and_upper(tmp_path, small_config, clock):
    with MessageStore.open(tmp_path, small_config) as store:
        put_n(store, 2, clock=clock, step_ms=10)
        put_n(store, 3)  # three messages with one store time
        clock.advance(10)
        put_n(store, 1)
        same = clock.now_ms - 10
        assert store.offset_for_time(TOPIC, 0, same, Boundary.LOWER) == 2
        assert store.offset_for_time(TOPIC, 0, same, Boundary.UPPER) == 4


# ------------------------------------------------------------------------------ limits


def test_properties_too_long_is_refused_and_the_queue_offset_does_not_move(tmp_path, small_config):
    with MessageStore.open(tmp_path, small_config) as store:
        log_before = log_bytes(tmp_path)
        result = store.put(TOPIC, BODY, properties={"p": "v" * (MAX_PROPERTIES_BYTES + 1)})
        assert result.status is PutStatus.PROPERTIES_SIZE_EXCEEDED
        assert result.commit_pos is None and result.queue_offset is None and result.reason
        assert store.max_offset(TOPIC, 0) == 0 and log_bytes(tmp_path) == log_before
        assert store.put(TOPIC, BODY).queue_offset == 0
        assert store.put(TOPIC, BODY).queue_offset == 1
        assert store.max_offset(TOPIC, 0) == 2


def test_put_long_message_limits(tmp_path, small_config):
    """testPutLongMessage: body == max is stored, max + 1 is illegal; properties at the limit are
    stored, one byte more exceeds it (the store adds UNIQ_KEY and the 20-byte CRC32C tail)."""
    config = small_config.replace(commitlog_file_size=1 << 16, max_body_bytes=1000)
    uniq_overhead = len(encode_properties({PROP_UNIQ_KEY: new_uniq_key()}))
    pair_overhead = len(encode_properties({"p": "v"})) - 1
    max_value = MAX_PROPERTIES_BYTES - CRC32C_PROP_SIZE - uniq_overhead - pair_overhead
    with MessageStore.open(tmp_path, config) as store:
        ok = store.put(TOPIC, b"b" * 1000)
        assert ok.ok and store.read_at(ok.commit_pos).body == b"b" * 1000
        assert store.put(TOPIC, b"b" * 1001).status is PutStatus.MESSAGE_ILLEGAL
        at_limit = store.put(TOPIC, b"x", properties={"p": "v" * max_value})
        assert at_limit.ok
        record = store.read_at(at_limit.commit_pos)
        assert record.properties["p"] == "v" * max_value
        props_at = record.end_pos - MAX_PROPERTIES_BYTES  # PROPERTIESLENGTH sits just before
        props_len = log_bytes(tmp_path)[props_at - PROPERTIES_LENGTH_SIZE:props_at]
        assert int.from_bytes(props_len, "big") == MAX_PROPERTIES_BYTES  # exactly the limit on disk
        over = store.put(TOPIC, b"x", properties={"p": "v" * (max_value + 1)})
        assert over.status is PutStatus.PROPERTIES_SIZE_EXCEEDED
        assert store.max_offset(TOPIC, 0) == 2


def test_put_exceeding_the_default_max_body_is_illegal(tmp_path, small_config):
    """testPutMsgExceedsMaxLength with RocketMQ's default 4 MiB limit (segments big enough)."""
    config = small_config.replace(commitlog_file_size=8 << 20, max_body_bytes=4 << 20)
    with MessageStore.open(tmp_path, config) as store:
        assert store.put(TOPIC, b"\0" * ((4 << 20) + 1)).status is PutStatus.MESSAGE_ILLEGAL
        assert store.max_offset(TOPIC, 0) == 0
        ok = store.put(TOPIC, b"\1" * (4 << 20))
        assert ok.ok and ok.queue_offset == 0
        assert store.read_at(ok.commit_pos).body == b"\1" * (4 << 20)


def test_record_larger_than_a_segment_is_illegal_and_leaks_no_offset(tmp_path, small_config):
    """A body under max_body_bytes whose record cannot fit a segment: a status, not an exception,
    and the queue offset it would have taken is not lost (regression: the next put used to
    leave a gap that broke dispatch)."""
    with MessageStore.open(tmp_path, small_config) as store:
        put_n(store, 1)
        result = store.put(TOPIC, b"z" * small_config.commitlog_file_size)
        assert result.status is PutStatus.MESSAGE_ILLEGAL and "segment" in result.reason
        assert store.put(TOPIC, BODY).queue_offset == 1
        assert store.max_offset(TOPIC, 0) == 2
    assert check(tmp_path) == []


# ------------------------------------------------------------------------------ reput


def test_sync_flush_only_flushed_messages_are_visible(tmp_path, small_config):
    """ReputMessageServiceTest (RocketMQ #8239): under sync flush nothing past the flushed
    position reaches a consume queue. A flush that never completes is faked on the instance."""
    store = MessageStore.open(tmp_path, small_config)
    log = store.commitlog
    log.flush = lambda: log.flushed_pos  # the disk never confirms
    stalled = put_n(store, 5)
    assert [r.queue_offset for r in stalled] == list(range(5))  # offsets are still assigned
    assert log.flushed_pos == 0 < log.written_pos
    assert store.get_messages(TOPIC, 0, 0).status is GetStatus.NO_MESSAGE_IN_QUEUE
    assert store.max_offset(TOPIC, 0) == 0
    with pytest.raises(BadInputError):
        store.read_at(stalled[0].commit_pos)
    del log.flush  # the disk comes back: the next flush covers everything written
    put_n(store, 1)
    got = store.get_messages(TOPIC, 0, 0)
    assert len(got.messages) == 6
    assert all(m.end_pos <= log.flushed_pos for m in got.messages)
    store.close()
    assert check(tmp_path) == []


def test_async_flush_appended_messages_are_visible_before_any_flush(tmp_path, small_config):
    with MessageStore.open(tmp_path, small_config.replace(flush=FlushPolicy.ASYNC)) as store:
        put_n(store, 10)
        assert store.commitlog.flushed_pos == 0 < store.commitlog.written_pos
        got = store.get_messages(TOPIC, 0, 0)
        assert got.status is GetStatus.FOUND and len(got.messages) == 10
    assert check(tmp_path) == []


# ------------------------------------------------------------------------------ batches


def test_put_batch_every_message_is_found_by_key(tmp_path, small_config):
    batch = [Message(TOPIC, b"batch-%d" % i, keys=(f"bk{i}",), tags="TAG1", queue_id=1)
             for i in range(30)]
    with MessageStore.open(tmp_path, small_config) as store:
        results = store.put_batch(batch)
        assert [r.status for r in results] == [PutStatus.PUT_OK] * 30
        assert [r.queue_offset for r in results] == list(range(30))
        assert len({r.store_ts_ms for r in results}) == 1
        assert len({segment_of(tmp_path, r.commit_pos)[0] for r in results}) > 1  # spans a roll
        for i, r in enumerate(results):
            (found,) = store.query_by_key(TOPIC, f"bk{i}")
            assert (found.commit_pos, found.body, found.msg_id) == (r.commit_pos, b"batch-%d" % i,
                                                                    r.msg_id)
    assert check(tmp_path) == []


def test_put_batch_bad_messages_get_their_own_status_the_rest_are_stored(tmp_path, small_config):
    batch = [Message(TOPIC, b"a"), Message("bad/topic", b"b"), Message(TOPIC, b"c", queue_id=99),
             Message(TOPIC, b"d")]
    with MessageStore.open(tmp_path, small_config) as store:
        results = store.put_batch(batch)
        assert [r.status for r in results] == [PutStatus.PUT_OK, PutStatus.MESSAGE_ILLEGAL,
                                               PutStatus.MESSAGE_ILLEGAL, PutStatus.PUT_OK]
        assert [results[0].queue_offset, results[3].queue_offset] == [0, 1]
        assert queue_bodies(store, 0) == [b"a", b"d"]


# ------------------------------------------------------------------------------ get statuses


def test_get_messages_statuses_and_next_offsets(tmp_path, small_config):
    with MessageStore.open(tmp_path, small_config) as store:
        empty = store.get_messages(TOPIC, 0, 0)
        assert (empty.status, empty.next_offset) == (GetStatus.NO_MESSAGE_IN_QUEUE, 0)
        put_n(store, 5)
        assert store.get_messages(TOPIC, 1, 0).status is GetStatus.NO_MESSAGE_IN_QUEUE
        found = store.get_messages(TOPIC, 0, 1, 2)
        assert (found.status, found.next_offset, found.min_offset, found.max_offset) == \
            (GetStatus.FOUND, 3, 0, 5)
        one = store.get_messages(TOPIC, 0, 5)
        assert (one.status, one.next_offset, one.messages) == (GetStatus.OFFSET_OVERFLOW_ONE, 5, [])
        badly = store.get_messages(TOPIC, 0, 9)
        assert (badly.status, badly.next_offset) == (GetStatus.OFFSET_OVERFLOW_BADLY, 5)
        tail = store.get_messages(TOPIC, 0, 3, 32)
        assert (len(tail.messages), tail.next_offset) == (2, 5)


def test_get_messages_offset_too_small_after_retention(tmp_path, small_config, monkeypatch):
    for module in (store_module, retention):  # the expiry hour decides, not this machine's disk
        monkeypatch.setattr(module, "disk_usage_ratio", lambda path: 0.1)
    with MessageStore.open(tmp_path, small_config) as store:
        results = put_n(store, 60)
        report = store.clean_expired(now_ms=local_time_ms(4, small_config.delete_when_hour))
        assert report.segments_removed
        low = store.min_offset(TOPIC, 0)
        assert 0 < low < 60
        assert results[low].commit_pos >= store.commitlog.min_pos > results[low - 1].commit_pos
        small = store.get_messages(TOPIC, 0, 0)
        assert (small.status, small.next_offset, small.min_offset) == \
            (GetStatus.OFFSET_TOO_SMALL, low, low)
        assert store.get_messages(TOPIC, 0, low, 1).messages[0].body == BODY + b"%d" % low
        assert store.put(TOPIC, BODY).queue_offset == 60  # offsets keep counting
    assert check(tmp_path) == []


# ------------------------------------------------------------------------------ query by key


def test_query_by_key_filters_colliding_keys_and_other_topics(tmp_path, small_config):
    config = small_config.replace(index_slot_count=1, index_shards=1)  # every key in one chain
    assert index_key_hash_of(TOPIC, "Aa") == index_key_hash_of(TOPIC, "BB")  # a true collision
    with MessageStore.open(tmp_path, config) as store:
        mine = {key: store.put(TOPIC, key.encode(), keys=(key,)) for key in ("Aa", "BB", "k1", "k2")}
        other = store.put("Other", b"other k1", keys=("k1",))
        for key, r in mine.items():
            assert [m.commit_pos for m in store.query_by_key(TOPIC, key)] == [r.commit_pos]
        assert [m.commit_pos for m in store.query_by_key("Other", "k1")] == [other.commit_pos]
        assert store.query_by_key(TOPIC, "absent") == []
        uniq = store.read_at(mine["k2"].commit_pos).uniq_key
        assert [m.commit_pos for m in store.query_by_key(TOPIC, uniq)] == [mine["k2"].commit_pos]


def test_query_by_key_time_bounds_and_max_count(tmp_path, small_config, clock):
    with MessageStore.open(tmp_path, small_config) as store:
        results = put_n(store, 5, clock=clock, step_ms=5000, keys=("same",))
        ts = [r.store_ts_ms for r in results]
        assert [m.commit_pos for m in store.query_by_key(TOPIC, "same")] == \
            [r.commit_pos for r in results]
        assert [m.commit_pos for m in store.query_by_key(TOPIC, "same", ts[2], ts[2])] == \
            [results[2].commit_pos]
        assert [m.store_ts_ms for m in store.query_by_key(TOPIC, "same", ts[1], ts[3])] == ts[1:4]
        assert len(store.query_by_key(TOPIC, "same", max_count=2)) == 2


# ------------------------------------------------------------------------------ checkpoint


def test_checkpoint_values_survive_reopen_and_min_timestamp_margin(tmp_path):
    """StoreCheckpointTest: written values read back; min timestamp = physic - 3000."""
    physic = 1_700_000_000_000
    cp = Checkpoint(physic_msg_ts_ms=physic, logics_msg_ts_ms=physic + 1000, index_msg_ts_ms=physic + 2,
                    confirm_commit_pos=700, commitlog_flushed_pos=800, cq_durable_pos=600,
                    index_durable_pos=(500, 400))
    write_checkpoint(tmp_path, cp)
    loaded = load_checkpoint(tmp_path)
    assert (loaded.checkpoint, loaded.source) == (cp, CheckpointSource.PRIMARY)
    assert loaded.checkpoint.min_timestamp_ms == physic - MIN_TIMESTAMP_MARGIN_MS
    assert loaded.checkpoint.min_timestamp_index_ms == physic - MIN_TIMESTAMP_MARGIN_MS
    newer = Checkpoint(physic_msg_ts_ms=physic + 5, logics_msg_ts_ms=physic + 5)
    write_checkpoint(tmp_path, newer)
    assert load_checkpoint(tmp_path).checkpoint == newer
    (tmp_path / CHECKPOINT_FILE).unlink()
    fallback = load_checkpoint(tmp_path)
    assert (fallback.checkpoint, fallback.source) == (cp, CheckpointSource.BACKUP)  # the .bak


def test_store_checkpoint_records_durable_positions(tmp_path, small_config):
    store = MessageStore.open(tmp_path, small_config)
    put_n(store, 12)
    cp = store.checkpoint()
    end = store.commitlog.written_pos
    assert load_checkpoint(tmp_path).checkpoint == cp
    assert cp.commitlog_flushed_pos == cp.cq_durable_pos == end
    assert cp.index_durable_pos == (end, end)
    store.close()
    assert load_checkpoint(tmp_path).checkpoint.commitlog_flushed_pos == end


# ------------------------------------------------------------------------------ record CRC


def test_append_prop_crc_every_record_validates_and_a_flipped_property_byte_is_caught(
        tmp_path, small_config):
    """AppendPropCRCTest: every record carries a valid CRC32C; flip one properties byte of the
    last record and the record check fails."""
    with MessageStore.open(tmp_path, small_config) as store:
        results = put_n(store, 8, tags="TAG1")
        last = store.read_at(results[-1].commit_pos)
    log = log_bytes(tmp_path)
    for r in results:
        decode_record(log, r.commit_pos, verify=Verify.MQSTORE)
    path, file_pos = segment_of(tmp_path, last.commit_pos)
    victim = file_pos + last.total_size - CRC32C_PROP_SIZE - 2  # in UNIQ_KEY's value
    patch(path, victim, bytes([log[last.commit_pos + victim - file_pos] ^ 0x20]))
    with pytest.raises(CorruptRecordError, match="CRC32C"):
        decode_record(log_bytes(tmp_path), last.commit_pos, verify=Verify.MQSTORE)
    with pytest.raises(StoreCorruptError) as refused:  # below the clean stop's durable line
        MessageStore.open(tmp_path, small_config)
    assert refused.value.commit_pos == last.commit_pos
    with MessageStore.open(tmp_path, small_config, recovery=RecoveryMode.REBUILD) as store:
        assert store.recovery_report.cut_pos == last.commit_pos  # the changed record is never served
        assert store.max_offset(TOPIC, 0) == 7
    assert check(tmp_path) == []
