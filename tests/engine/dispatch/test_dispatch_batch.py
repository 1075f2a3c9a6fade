"""Batch scan and dispatch build the same files as the record-by-record path (the reference)."""

from __future__ import annotations

import random
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.config import FlushPolicy, StoreConfig
from engine.dispatch.record import (
    dispatch_columns,
    dispatch_to_consume_queue,
    dispatch_to_shard,
    keys_by_shard,
)
from engine.errors import BadInputError, CorruptRecordError
from engine.files.mapped_file import Access
from engine.formats.index_file import index_key
from engine.formats.key_batch import index_key_hashes
from engine.formats.properties import encode_properties
from engine.formats.record import TxType, Verify, encode_record, stamp_record
from engine.index.shard import ShardIndex
from engine.log.commitlog import CommitLog
from engine.message import Message, build_properties, encode_message_properties
from engine.queues.table import ConsumeQueueTable
from engine.store import MessageStore

SEG = 16 * 1024
CLOCK_MS = 1_700_000_000_000
SHARDS = 3


def write_log(root: Path, count: int, seed: int = 3) -> CommitLog:
    """Records over two topics and three queues, some transactional, with tags and keys."""
    rnd = random.Random(seed)
    log = CommitLog.open(root, SEG, Access.READ_WRITE)
    next_offset: dict[tuple[str, int], int] = {}
    for i in range(count):
        topic, queue_id = rnd.choice(["TopicA", "TopicB"]), rnd.randrange(3)
        sys_flag = rnd.choice([0, 0, 0, int(TxType.PREPARED), int(TxType.COMMIT), int(TxType.ROLLBACK)])
        props = {"UNIQ_KEY": f"U{i:08d}"}
        if rnd.random() < 0.7:
            props["KEYS"] = " ".join(f"k{rnd.randrange(50)}" for _ in range(rnd.randrange(1, 4)))
        if rnd.random() < 0.5:
            props["TAGS"] = rnd.choice(["red", "green"])
        record = encode_record(topic, rnd.randbytes(rnd.randrange(300)), queue_id=queue_id,
                               properties=props, born_ts_ms=1, born_host=("127.0.0.1", 1),
                               store_host=("127.0.0.1", 10911), sys_flag=sys_flag)
        offset = next_offset.get((topic, queue_id), 0)
        if sys_flag in (0, int(TxType.COMMIT)):  # only these enter a consume queue
            next_offset[(topic, queue_id)] = offset + 1
        else:  # RocketMQ gives half and rollback records queue offset 0
            offset = 0
        log.append(record, queue_offset=offset, store_ts_ms=CLOCK_MS + 700 * i)
    return log


def open_derived(root: Path) -> tuple[ConsumeQueueTable, list[ShardIndex]]:
    queues = ConsumeQueueTable.load(root, 64, Access.READ_WRITE)
    shards = [ShardIndex.load(root, n, 7, 40, Access.READ_WRITE, clock_ms=lambda: CLOCK_MS)
              for n in range(SHARDS)]
    return queues, shards


def derived_files(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for sub in ("consumequeue", "index")
            for p in sorted((root / sub).rglob("*")) if p.is_file()}


def dispatch_scalar(log: CommitLog, start: int, end: int, queues, shards) -> None:
    for header in log.scan_headers(start, end):
        dispatch_to_consume_queue(queues, header)
        by_shard = keys_by_shard(header, len(shards))
        for n, shard in enumerate(shards):
            dispatch_to_shard(shard, header, by_shard.get(n, ()))


def dispatch_batch(log: CommitLog, start: int, end: int, queues, shards) -> None:
    for run in log.scan_batches(start, end, Verify.STRUCTURE):
        dispatch_columns(queues, shards, run.columns())


def close_all(queues, shards) -> None:
    for shard in shards:
        shard.sync()
        shard.close()
    queues.flush_all()
    queues.close()


@pytest.mark.parametrize("split", [None, 0.4])
def test_dispatch_batch_writes_the_same_files_as_record_by_record(tmp_path, split):
    log = write_log(tmp_path / "log", 400)
    end = log.written_pos
    for name, dispatch in (("scalar", dispatch_scalar), ("batch", dispatch_batch)):
        queues, shards = open_derived(tmp_path / name)
        if split is None:
            dispatch(log, 0, end, queues, shards)
        else:  # two steps that overlap: the second re-dispatches what is already there
            middle = [r.commit_pos for r in log.scan_headers(0, end)][int(400 * split)]
            dispatch(log, 0, middle, queues, shards)
            for shard in shards:
                shard.trim_from(shard.processed_pos)
            dispatch(log, 0, end, queues, shards)
        close_all(queues, shards)
    assert derived_files(tmp_path / "batch") == derived_files(tmp_path / "scalar")
    assert derived_files(tmp_path / "batch")


def test_batch_scanner_yields_what_scanner_yields_across_fillers(tmp_path):
    log = write_log(tmp_path, 300)
    scanner = log.scan_headers(0, log.written_pos)
    expected = [h.commit_pos for h in scanner]
    batches = log.scan_batches(0, log.written_pos, Verify.MQSTORE)
    got = [int(p) for run in batches for p in run.columns().commit_pos]
    assert got == expected
    assert (batches.pos, batches.fillers) == (scanner.pos, scanner.fillers) and scanner.fillers > 0
    middle = expected[150] + 1  # an end inside a record: both stop before it
    assert sum(r.count for r in log.scan_batches(0, middle)) == 150 == len(list(log.scan(0, middle)))


def test_batch_scanner_raises_where_scanner_raises(tmp_path):
    log = write_log(tmp_path, 200)
    positions = [h.commit_pos for h in log.scan_headers(0, log.written_pos)]
    target = positions[120] + 40
    segment = log.segments.find(target)
    segment.buf[target - log.segments.base_of(segment)] ^= 0x10
    with pytest.raises(CorruptRecordError) as reference:
        list(log.scan(0, log.written_pos))
    batches = log.scan_batches(0, log.written_pos)
    with pytest.raises(CorruptRecordError) as batch:
        list(batches)
    assert batch.value.pos == reference.value.pos == positions[120] == batches.pos


def test_shard_put_hashes_equals_put_across_rolls(tmp_path):
    rnd = random.Random(9)
    keys = [f"k{rnd.randrange(25)}" for _ in range(150)]
    positions = sorted(rnd.sample(range(10**7), len(keys)))
    times = [0, *sorted(rnd.randrange(CLOCK_MS, CLOCK_MS + 10**6) for _ in keys[1:])]
    one = ShardIndex.load(tmp_path / "one", 0, 5, 17, Access.READ_WRITE, clock_ms=lambda: CLOCK_MS)
    many = ShardIndex.load(tmp_path / "many", 0, 5, 17, Access.READ_WRITE, clock_ms=lambda: CLOCK_MS)
    for key, pos, ts in zip(keys, positions, times, strict=True):
        one.put("T", key, pos, ts)
    ends = np.cumsum([len(k) for k in keys])
    hashes = index_key_hashes([index_key("T", "")], np.zeros(len(keys), dtype=np.int64),
                              "".join(keys).encode(), ends - [len(k) for k in keys], ends)
    for lo, hi in ((0, 7), (7, 8), (8, 150)):
        many.put_hashes(hashes[lo:hi], np.array(positions[lo:hi]), np.array(times[lo:hi]))
    for shard in (one, many):
        shard.sync()
    assert len(one.files) == len(many.files) > 1
    for a, b in zip(one.files, many.files, strict=True):
        assert a.path.read_bytes() == b.path.read_bytes()


def test_store_put_batch_matches_encode_record_bytes(tmp_path):
    """put_batch's batch encoder writes what encode_record + stamp_record would."""
    config = StoreConfig(flush=FlushPolicy.ASYNC, commitlog_file_size=SEG, index_slot_count=11,
                         index_entry_count=100)
    messages = [Message("TopicA", b"body-%d" % i, tags="t" if i % 2 else None, keys=(f"k{i}",),
                        queue_id=i % 2, properties={"p": "v"} if i % 3 == 0 else {}) for i in range(60)]
    with MessageStore.open(tmp_path, config) as store:
        results = store.put_batch(messages)
        for result, message in zip(results, messages, strict=True):
            record = store.read_at(result.commit_pos)
            props = dict(record.properties)
            expected = encode_record(message.topic, message.body, queue_id=message.queue_id,
                                     properties=props, born_ts_ms=record.born_ts_ms,
                                     born_host=record.born_host, store_host=record.store_host)
            raw = bytearray(store.commitlog.read_bytes(result.commit_pos, record.total_size))
            stamp_record(expected, 0, queue_offset=result.queue_offset, commit_pos=result.commit_pos,
                         store_ts_ms=result.store_ts_ms)
            assert raw == expected
            assert store.query_by_key("TopicA", message.keys[0])[0].commit_pos == result.commit_pos


WORDS = st.text(alphabet=st.sampled_from("ab é\x01\x02_"), max_size=6)


@settings(max_examples=200, deadline=None)
@given(tags=st.none() | WORDS, keys=st.lists(WORDS, max_size=3).map(tuple) | WORDS,
       props=st.dictionaries(st.sampled_from(["p", "q", "TAGS"]), WORDS, max_size=2), wait=st.booleans())
def test_encode_message_properties_equals_the_validating_path(tags, keys, props, wait):
    message = Message("T", b"x", tags=tags, keys=keys, properties=props, wait=wait)
    try:
        expected = encode_properties(build_properties(message, uniq_key="U" * 32))
    except BadInputError:
        with pytest.raises(BadInputError):
            encode_message_properties(message, "U" * 32)
        return
    assert encode_message_properties(message, "U" * 32) == expected
