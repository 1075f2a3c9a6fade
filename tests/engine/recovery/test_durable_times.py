"""engine.recovery.durable_times: RocketMQ's three checkpoint timestamps are the store times of what the
checkpoint's positions hold (reference §5.1), never the wall clock of the checkpoint.

Records are stamped by a fake store clock (one second apart), and the checkpoint is written
later still, so a timestamp taken from the clock matches no record.
"""

from __future__ import annotations

import time
from pathlib import Path

from engine.check.fsck import check
from engine.config import FlushPolicy, StoreConfig
from engine.files.naming import CHECKPOINT_FILE
from engine.files.store_dir import mark_running
from engine.formats.checkpoint import decode_checkpoint
from engine.log.last_record import SEARCH_FIRST_BYTES
from engine.recovery.durable_times import sealed_index_ts_ms, store_ts_before
from engine.store import MessageStore

NOW_MS = int(time.time() * 1000)
CLOCK_START_MS = NOW_MS  # the conftest's `clock` starts here: records stamped near the wall clock
TOPIC = "DT"
NEVER_MS = 3_600_000  # no timed flush or checkpoint during a test
CONFIG = StoreConfig(commitlog_file_size=4096, consume_queue_entries=10, index_slot_count=64,
                     index_entry_count=11, index_shards=2, queue_count=1, flush=FlushPolicy.ASYNC,
                     async_flush_interval_ms=NEVER_MS, async_flush_thorough_interval_ms=NEVER_MS,
                     cq_flush_interval_ms=NEVER_MS)  # one record per segment, 10 keys per index file


def put_stamped(store: MessageStore, clock, first: int, count: int) -> list[int]:
    """`count` messages stamped NOW_MS + i s; their store times."""
    stamps = []
    for i in range(first, first + count):
        clock.now_ms = NOW_MS + i * 1000
        result = store.put(TOPIC, b"d" * 2500, keys=(f"k{i}",))
        assert result.ok, result
        stamps.append(store.read_at(result.commit_pos).store_ts_ms)
    assert stamps == [NOW_MS + i * 1000 for i in range(first, first + count)]
    return stamps


def read_checkpoint(root: Path):
    return decode_checkpoint((root / CHECKPOINT_FILE).read_bytes())


def newest_full_index_end_ts(store: MessageStore) -> int:
    ends = [shard.files[-2].end_ts_ms if len(shard.files) >= 2 else 0 for shard in store.shards]
    return min(ends)


def test_checkpoint_times_are_those_of_the_last_durable_records(tmp_path, clock):
    with MessageStore.open(tmp_path, CONFIG) as store:
        stamps = put_stamped(store, clock, 0, 30)
        store.commitlog.flush()  # the first 30 are durable in the commitlog ...
        stamps += put_stamped(store, clock, 30, 6)  # ... these are written and dispatched only
        clock.now_ms = NOW_MS + 100_000
        written = store.checkpoint()
        cp = read_checkpoint(tmp_path)
        assert cp == written
        assert cp.commitlog_flushed_pos < cp.cq_durable_pos == store.commitlog.written_pos
        assert cp.physic_msg_ts_ms == stamps[29]
        assert cp.logics_msg_ts_ms == stamps[35]
        assert cp.index_msg_ts_ms == newest_full_index_end_ts(store)
        # 2 keys a message, 10 keys a file: full files exist; which record ends the newest one
        # depends on how the random UNIQ_KEYs fall over the 2 shards (the dispatched 6 included)
        assert cp.index_msg_ts_ms in stamps
    assert check(tmp_path) == []


def test_checkpoint_times_after_a_crash_are_those_of_the_recovered_records(tmp_path, clock):
    with MessageStore.open(tmp_path, CONFIG) as store:
        stamps = put_stamped(store, clock, 0, 12)
        store.commitlog.flush()
    mark_running(tmp_path)  # as if the writer died: recovery writes the checkpoint
    clock.now_ms = NOW_MS + 100_000
    with MessageStore.open(tmp_path, CONFIG) as store:
        assert store.recovery_report.shutdown == "crash"
        cp = read_checkpoint(tmp_path)
        assert cp.physic_msg_ts_ms == cp.logics_msg_ts_ms == stamps[-1]
        assert cp.index_msg_ts_ms == newest_full_index_end_ts(store) < stamps[-1]
    assert check(tmp_path) == []


def test_the_record_ending_at_a_position_is_found_across_segments_and_after_retention(tmp_path, clock):
    with MessageStore.open(tmp_path, CONFIG) as store:
        log = store.commitlog
        assert store_ts_before(log, log.written_pos) == 0  # nothing there yet
        ends = []
        for i in range(8):
            stamp = put_stamped(store, clock, i, 1)[0]
            ends.append(log.written_pos)
            assert store_ts_before(log, log.written_pos) == stamp
        clock.now_ms = NOW_MS + 9000
        store.put(TOPIC, b"x" * 2500)  # rolls: the filler ends segment 7 at the next base
        assert store_ts_before(log, 8 * CONFIG.commitlog_file_size) == NOW_MS + 7000
        assert store_ts_before(log, ends[6]) == NOW_MS + 6000
        assert store_ts_before(log, ends[6] - 1) == 0  # inside a record: no record ends there
        for _ in range(8):  # retention: only the active segment is left
            log.remove_oldest_segment()
        assert store_ts_before(log, ends[6]) == 0  # below the log
        assert store_ts_before(log, log.written_pos) == NOW_MS + 9000


def test_a_large_record_is_found_past_the_first_search_round(tmp_path, clock):
    config = CONFIG.replace(commitlog_file_size=1 << 20)
    with MessageStore.open(tmp_path, config) as store:
        put_stamped(store, clock, 0, 1)
        clock.now_ms = NOW_MS + 5000
        assert store.put(TOPIC, b"L" * (SEARCH_FIRST_BYTES * 2)).ok
        assert store_ts_before(store.commitlog, store.commitlog.written_pos) == NOW_MS + 5000


def test_index_time_is_zero_while_a_shard_has_no_full_file(tmp_path, clock):
    with MessageStore.open(tmp_path, CONFIG) as store:
        put_stamped(store, clock, 0, 2)
        assert sealed_index_ts_ms(tmp_path, 2) == 0
        assert store.checkpoint().index_msg_ts_ms == 0
        assert sealed_index_ts_ms(tmp_path, 0) == 0
