"""The plain-Python small-step dispatch (engine.dispatch.few) against the reference decoder and
the record-by-record dispatch: the same fields, keys, consume-queue and index bytes."""

from __future__ import annotations

import random

import crc32c
import numpy as np
import pytest
from hypothesis import given, settings

from engine.dispatch.few import decode_few, few_key_columns, few_to_consume_queues
from engine.dispatch.record import KeyColumns, put_key_columns
from engine.errors import BadInputError, CorruptConsumeQueueError
from engine.files.mapped_file import Access
from engine.formats.java_hash import index_key_hash
from engine.formats.key_batch import padded_key_hashes
from engine.formats.record import SYS_FLAG_OFFSET, Filler, SysFlag, decode_header
from engine.formats.record.dispatch_columns import columns_from_headers
from engine.queues.consume_queue import ConsumeQueue
from tests.engine.dispatch.test_dispatch_batch import (
    close_all,
    derived_files,
    dispatch_scalar,
    open_derived,
    write_log,
)
from tests.formats.test_record_many import BASE_POS, MESSAGES, record_with_properties, scalar_log

INT32_MIN_KEY = "polygenelubricants"  # its Java hash is Integer.MIN_VALUE: index_key_hash 0


@settings(max_examples=60, deadline=None)
@given(messages=MESSAGES)
def test_decode_few_reads_what_the_reference_decoder_reads(messages):
    buf, starts = scalar_log(messages)
    few = decode_few(buf, 0, len(buf), BASE_POS)
    headers = [decode_header(buf, s, base_pos=BASE_POS) for s in starts]
    ref = columns_from_headers(headers)
    assert few.count == len(messages) and few.end_pos == BASE_POS + len(buf)
    for name in ("commit_pos", "total_size", "queue_id", "queue_offset", "sys_flag", "store_ts_ms",
                 "tags_code"):
        assert getattr(few, name) == getattr(ref, name).tolist(), name
    assert [t.decode() for t in few.topic] == [h.topic for h in headers]
    rows = [row for row, keys in enumerate(few.index_keys) for _ in keys]
    assert rows == ref.key_rows.tolist()
    assert [k for keys in few.index_keys for k in keys] == [
        f"{headers[row].topic}#".encode() + key for row, key in zip(rows, ref.keys, strict=True)]


def test_decode_few_parses_properties_like_rocketmq():
    """Later duplicates win, empty values and keys are skipped, KEYS text inside a value is not a key."""
    props = (b"KEYS\x01first\x02x\x01KEYS\x01no\x02KEYS\x01\x02\x01KEYS\x02KEYS\x01a  b \x02"
             b"UNIQ_KEY\x01u1\x02TAGS\x01t\x02__CRC32C\x010000000000\x02")
    record = record_with_properties(props)
    few = decode_few(record, 0, len(record), BASE_POS)
    ref = columns_from_headers([decode_header(record, 0, base_pos=BASE_POS)])
    assert few.index_keys == [[b"T#u1", b"T#a", b"T#b"]]
    assert few.tags_code == ref.tags_code.tolist() != [0]


def plain_log() -> tuple[bytearray, list[int]]:
    messages = [("T", bytes([i]) * 20, {"KEYS": f"k{i}"}, i % 2) for i in range(6)]
    return scalar_log(messages)


@pytest.mark.parametrize("what", ["non-ascii", "ipv6", "damage", "filler", "crosses the end"])
def test_decode_few_stops_at_the_first_piece_it_does_not_take(what):
    """What it leaves is the batch codec's (or the reference's) to read or to refuse."""
    buf, starts = plain_log()
    end = len(buf)
    if what == "non-ascii":
        buf, starts = scalar_log([("T", b"a", {"KEYS": "k"}, 0)] * 3 + [("T", b"b", {"KEYS": "ké"}, 0)])
        end = len(buf)
    elif what == "ipv6":
        buf[starts[3] + SYS_FLAG_OFFSET + 3] |= int(SysFlag.STOREHOST_V6)
    elif what == "damage":
        buf[starts[3] + 30] ^= 0x01  # PHYSICALOFFSET
    elif what == "filler":
        buf[starts[3]:] = (len(buf) - starts[3]).to_bytes(4, "big") + (0xCBD43194).to_bytes(4, "big") \
            + bytes(len(buf) - starts[3] - 8)
    else:
        end = starts[4] - 1
    few = decode_few(buf, 0, end, BASE_POS)
    assert few.count == 3 and few.end_pos == BASE_POS + starts[3]
    assert decode_few(buf, starts[3], end, BASE_POS).count == 0


@pytest.mark.parametrize("keys", [
    [INT32_MIN_KEY.encode(), b"T#a", b"T#" + b"x" * 40, b"k"],
    [b"T#" + b"y" * 600, b"T#b"],  # longer than the padded matrix: one by one
    [bytes(random.Random(seed).choices(range(32, 127), k=seed % 50 + 1)) for seed in range(200)],
])
def test_padded_key_hashes_equal_the_scalar_hash(keys):
    assert padded_key_hashes(keys) == [index_key_hash(k.decode("ascii")) for k in keys]
    assert padded_key_hashes([INT32_MIN_KEY.encode()]) == [0] and padded_key_hashes([]) == []


def dispatch_few_steps(log, start: int, end: int, queues, shards, step_records: int) -> None:
    """The dispatcher's small steps: decode_few a few records at a time; the piece it does not
    take here, the filler at each segment's end, is crossed."""
    pos = start
    while pos < end:
        window = log.window_at(pos)
        stop = min(end, window.segment_end_pos)
        few = decode_few(window.buf, pos - window.base_pos, stop - window.base_pos, window.base_pos)
        if few.count:
            cut = few.commit_pos[step_records] if few.count > step_records else few.end_pos
            few = decode_few(window.buf, pos - window.base_pos, cut - window.base_pos, window.base_pos)
            few_to_consume_queues(queues, few)
            for shard, keys in zip(shards, few_key_columns(few, len(shards)), strict=True):
                put_key_columns(shard, KeyColumns(*(np.array(c, dtype=np.int64) for c in keys)), few.end_pos)
            pos = few.end_pos
            continue
        assert isinstance(decode_header(window.buf, pos - window.base_pos), Filler)
        pos = window.segment_end_pos


@pytest.mark.parametrize("step_records", [1, 7, 64])
def test_few_steps_write_the_same_files_as_record_by_record(tmp_path, step_records):
    """Two topics, three queues, transactional records, tags, several keys, segment fillers."""
    log = write_log(tmp_path / "log", 400)
    end = log.written_pos
    for name, dispatch in (("scalar", dispatch_scalar),
                           ("few", lambda *a: dispatch_few_steps(*a, step_records))):
        queues, shards = open_derived(tmp_path / name)
        dispatch(log, 0, end, queues, shards)
        for shard in shards:
            shard.mark_processed(end)
        close_all(queues, shards)
    assert derived_files(tmp_path / "few") == derived_files(tmp_path / "scalar")
    assert derived_files(tmp_path / "few")


def test_put_few_writes_put_batch_bytes_and_keeps_put_rules(tmp_path):
    few_queue = ConsumeQueue.load(tmp_path / "a", "T", 0, 16, Access.READ_WRITE)
    batch_queue = ConsumeQueue.load(tmp_path / "b", "T", 0, 16, Access.READ_WRITE)
    rnd = random.Random(5)
    entries = [(i, 1000 * i, 100 + i, rnd.randrange(-2**40, 2**40)) for i in range(40)]
    for lo, hi in ((0, 3), (3, 20), (20, 40)):  # the middle run crosses a file
        cols = [list(c) for c in zip(*entries[lo:hi], strict=True)]
        assert few_queue.put_entries(*cols) == batch_queue.put_entries(*map(np.array, cols)) == hi - lo
    assert np.array_equal(few_queue.entries(0, 100), batch_queue.entries(0, 100))
    assert few_queue.max_offset == 40 and few_queue.max_commit_end == 39_000 + 139
    again = [list(c) for c in zip(*entries[30:40], strict=True)]
    assert few_queue.put_entries(*again) == 0  # a re-put of what is there: nothing written
    with pytest.raises(CorruptConsumeQueueError, match="gap"):
        few_queue.put_entries([45], [45_000], [10], [0])
    changed = [again[0], again[1], [s + 1 for s in again[2]], again[3]]
    with pytest.raises(CorruptConsumeQueueError):
        few_queue.put_entries(*changed)
    assert np.array_equal(few_queue.entries(0, 100), batch_queue.entries(0, 100))
    few_queue.segments.close()
    batch_queue.segments.close()


@pytest.mark.parametrize("short", [1, 2, 3])
def test_put_few_of_columns_of_different_lengths_is_refused_and_writes_nothing(tmp_path, short):
    queue = ConsumeQueue.load(tmp_path, "T", 0, 16, Access.READ_WRITE)
    cols = [[0, 1, 2], [0, 100, 200], [100, 100, 100], [0, 0, 0]]
    cols[short] = cols[short][:2]
    with pytest.raises(BadInputError, match="different lengths"):
        queue.put_entries(*cols)
    assert queue.max_offset == 0 and len(queue.entries(0, 100)) == 0
    queue.segments.close()


def test_few_key_columns_split_keys_by_shard_in_record_order():
    buf, starts = scalar_log([("T", b"x", {"KEYS": f"a{i} b{i}", "UNIQ_KEY": f"u{i}"}, 0) for i in range(9)])
    few = decode_few(buf, 0, len(buf), BASE_POS)
    per_shard = few_key_columns(few, 3)
    for shard, (hashes, positions, times) in enumerate(per_shard):
        want = [(index_key_hash(f"T#{k}"), BASE_POS + s, 1_700_000_000_000 + i)
                for i, s in enumerate(starts) for k in (f"u{i}", f"a{i}", f"b{i}")
                if crc32c.crc32c(f"T#{k}".encode()) % 3 == shard]
        assert list(zip(hashes, positions, times, strict=True)) == want and want
