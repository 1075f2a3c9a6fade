"""The record codec's batch paths (encode_many, stamp_many, spans, dispatch_columns) against its
scalar reference, byte for byte: one layout's two forms."""

from __future__ import annotations

import random

import crc32c
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.errors import BadInputError, CorruptRecordError
from engine.formats.crc32c_property import CRC32C_PROP_SIZE
from engine.formats.java_hash import index_key_hash
from engine.formats.key_batch import _KeyBytes, index_key_hashes, index_key_shards, index_key_values
from engine.formats.properties import encode_properties
from engine.formats.record import (
    MAGIC_OFFSET,
    SYS_FLAG_OFFSET,
    SysFlag,
    Verify,
    decode_header,
    decode_record,
    encode_record,
    stamp_record,
)
from engine.formats.record.dispatch_columns import columns_from_headers, decode_dispatch
from engine.formats.record.encode_many import encode_records
from engine.formats.record.spans import find_starts, verify_spans, walk_starts
from engine.formats.record.stamp_many import check_stampable, stamp_records
from engine.tuning import STRUCT_PATH_MAX_RECORDS

BORN, STORE = ("127.0.0.1", 4242), ("10.1.2.3", 10911)
BASE_POS = 1 << 30
TEXT = st.text(alphabet=st.sampled_from("abcXYZ019_-"), min_size=1, max_size=12)
KEYS_TEXT = st.lists(TEXT, min_size=1, max_size=3).map(" ".join) | st.just(" a  b ")
PROPS = st.fixed_dictionaries({}, optional={"TAGS": TEXT, "KEYS": KEYS_TEXT, "UNIQ_KEY": TEXT, "user": TEXT})
MESSAGES = st.lists(st.tuples(st.sampled_from(["TopicA", "B", "c_c"]), st.binary(max_size=300), PROPS,
                              st.integers(0, 7)), min_size=1, max_size=40)


def scalar_log(messages) -> tuple[bytearray, list[int]]:
    """Encode and stamp with the reference codec, end to end; returns the bytes and the starts."""
    records = [encode_record(topic, body, queue_id=queue_id, properties=props or None, born_ts_ms=77,
                             born_host=BORN, store_host=STORE)
               for topic, body, props, queue_id in messages]
    buf, starts, pos = bytearray(b"".join(records)), [], 0
    for i, record in enumerate(records):
        stamp_record(buf, pos, queue_offset=i, commit_pos=BASE_POS + pos, store_ts_ms=1_700_000_000_000 + i)
        starts.append(pos)
        pos += len(record)
    return buf, starts


def batch_log(messages) -> bytearray:
    props = [encode_properties(p) if p else b"" for _, _, p, _ in messages]
    enc = encode_records([t.encode() for t, _, _, _ in messages], [b for _, b, _, _ in messages], props,
                         [q for _, _, _, q in messages], born_ts_ms=77, born_host=BORN, store_host=STORE)
    stamp_records(enc.buf, enc.starts, enc.sizes, np.arange(len(messages)), BASE_POS + enc.starts,
                  1_700_000_000_000 + np.arange(len(messages)))
    return enc.buf


@settings(max_examples=60, deadline=None)
@given(messages=MESSAGES)
def test_record_batch_encode_and_stamp_equal_scalar_bytes(messages):
    scalar, _ = scalar_log(messages)
    assert bytes(batch_log(messages)) == bytes(scalar)


@settings(max_examples=60, deadline=None)
@given(messages=MESSAGES)
def test_record_batch_decode_dispatch_equals_decode_header(messages):
    buf, starts = scalar_log(messages)
    found = walk_starts(buf, 0, len(buf))
    assert found.tolist() == starts == find_starts(buf, 0, len(buf), BASE_POS).tolist()
    spans = verify_spans(buf, found, BASE_POS, Verify.MQSTORE)
    assert spans.count == len(messages)
    cols = decode_dispatch(buf, spans, BASE_POS)
    ref = columns_from_headers([decode_header(buf, s, base_pos=BASE_POS) for s in starts])
    for name in ("commit_pos", "total_size", "queue_id", "queue_offset", "sys_flag", "store_ts_ms",
                 "tags_code", "key_rows"):
        assert getattr(cols, name).tolist() == getattr(ref, name).tolist(), name
    assert [cols.topics[i] for i in cols.topic_index] == [ref.topics[i] for i in ref.topic_index]
    assert cols.keys == ref.keys


def record_with_properties(props: bytes) -> bytearray:
    """One stamped record at BASE_POS whose properties are exactly `props` (its body holds
    property-like text, which is not a property)."""
    record = bytearray(encode_record("T", b"body\x02KEYS\x01zzz\x02", queue_id=0, born_ts_ms=1,
                                     born_host=BORN, store_host=STORE))
    record = record[:record.index(b"__CRC32C") - 2] + len(props).to_bytes(2, "big") + props
    record[0:4] = len(record).to_bytes(4, "big")
    stamp_record(record, 0, queue_offset=0, commit_pos=BASE_POS, store_ts_ms=5)
    return record


def test_record_batch_properties_parse_like_rocketmq():
    """Later duplicates win, empty values and keys are skipped, KEYS text inside a value is not a key."""
    props = (b"KEYS\x01first\x02x\x01KEYS\x01no\x02KEYS\x01\x02\x01KEYS\x02KEYS\x01a  b \x02"
             b"UNIQ_KEY\x01u1\x02TAGS\x01t\x02__CRC32C\x010000000000\x02")
    record = record_with_properties(props)
    spans = verify_spans(record, np.array([0]), BASE_POS, Verify.MQSTORE)
    cols = decode_dispatch(record, spans, BASE_POS)
    ref = columns_from_headers([decode_header(record, 0, base_pos=BASE_POS)])
    assert cols.keys == ref.keys == [b"u1", b"a", b"b"]
    assert cols.tags_code.tolist() == ref.tags_code.tolist()


@pytest.mark.parametrize("seed", range(4))
def test_record_batch_single_byte_damage_is_found_where_the_reference_finds_it(seed):
    rnd = random.Random(seed)
    messages = [("TopicA", rnd.randbytes(rnd.randrange(200)), {"KEYS": f"k{i}"}, i % 3) for i in range(30)]
    good, _ = scalar_log(messages)
    print("seed", seed)
    for _ in range(150):
        buf = bytearray(good) + bytes(64)
        at = rnd.randrange(len(good))
        buf[at] ^= 1 << rnd.randrange(8)
        spans = verify_spans(buf, find_starts(buf, 0, len(buf), BASE_POS), BASE_POS, Verify.MQSTORE)
        batch_end = int(spans.ends[-1]) if spans.count else 0
        pos = 0
        with pytest.raises(CorruptRecordError):
            while True:
                pos += decode_record(buf, pos, base_pos=BASE_POS).total_size
        assert batch_end == pos <= at


def test_record_batch_leaves_non_ascii_and_ipv6_records_to_the_reference():
    messages = [("T", b"a", {"KEYS": "k"}, 0), ("T", b"b", {"KEYS": "ké"}, 0), ("T", b"c", {}, 0)]
    buf, starts = scalar_log(messages)
    assert verify_spans(buf, np.array(starts), BASE_POS, Verify.MQSTORE).count == 1
    decode_record(buf, starts[1], base_pos=BASE_POS)  # valid: the reference reads it
    flagged = bytearray(buf)
    flagged[SYS_FLAG_OFFSET + 3] |= int(SysFlag.STOREHOST_V6)
    assert verify_spans(flagged, np.array(starts), BASE_POS, Verify.STRUCTURE).count == 0


def test_record_batch_check_stampable_refuses_bad_records():
    record = encode_record("T", b"x", queue_id=0, born_ts_ms=1, born_host=BORN, store_host=STORE)
    starts, sizes = np.array([0]), np.array([len(record)])
    check_stampable(record, starts, sizes)
    with pytest.raises(BadInputError):
        check_stampable(record, starts, sizes - 1)
    no_tail = bytearray(record)
    no_tail[len(record) - CRC32C_PROP_SIZE] ^= 0xFF
    with pytest.raises(BadInputError):
        check_stampable(no_tail, starts, sizes)
    wrong_magic = bytearray(record)
    wrong_magic[MAGIC_OFFSET] ^= 0xFF
    check_stampable(wrong_magic, starts, sizes)  # stamping does not judge the magic (as stamp_record)


@pytest.mark.parametrize("count", [1, STRUCT_PATH_MAX_RECORDS, STRUCT_PATH_MAX_RECORDS + 1, 50])
def test_record_batch_stamp_paths_equal_stamp_record_with_bornhost_v6_flags(count):
    """Both stamp paths put STORETIMESTAMP where stamp_record does (after a 20-byte IPv6 born host
    when SYSFLAG says so) and seal the same CRC32C; one store time for all, or one per record."""
    records = [bytearray(encode_record("T", bytes([i]) * (i % 50), queue_id=0, born_ts_ms=1, born_host=BORN,
                                       store_host=STORE)) for i in range(count)]
    for record in records[1::3]:
        record[SYS_FLAG_OFFSET + 3] |= int(SysFlag.BORNHOST_V6)
    expected = bytearray(b"".join(records))
    starts = np.cumsum([0] + [len(r) for r in records[:-1]]).astype(np.int64)
    sizes = np.array([len(r) for r in records], dtype=np.int64)
    for store_ts in (1_700_000_000_000, 1_700_000_000_000 + np.arange(count) * 7):
        reference = bytearray(expected)
        for i, start in enumerate(starts.tolist()):
            ts = store_ts if isinstance(store_ts, int) else int(store_ts[i])
            stamp_record(reference, start, queue_offset=10 + i, commit_pos=BASE_POS + start, store_ts_ms=ts)
        stamped = bytearray(expected)
        stamp_records(stamped, starts, sizes, np.arange(count) + 10, BASE_POS + starts, store_ts)
        assert bytes(stamped) == bytes(reference)


@pytest.mark.parametrize("count", [3, STRUCT_PATH_MAX_RECORDS + 5])
def test_record_batch_stamp_records_given_out_of_order(count):
    records = [encode_record("T", bytes([i]) * (7 * i % 90), queue_id=0, born_ts_ms=1, born_host=BORN,
                             store_host=STORE) for i in range(count)]
    buf = bytearray(b"".join(records))
    starts = np.cumsum([0] + [len(r) for r in records[:-1]]).astype(np.int64)[::-1].copy()
    sizes = np.array([len(r) for r in records[::-1]], dtype=np.int64)
    reference = bytearray(buf)
    for i, start in enumerate(starts.tolist()):
        stamp_record(reference, start, queue_offset=i, commit_pos=BASE_POS + start, store_ts_ms=9)
    stamp_records(buf, starts, sizes, np.arange(count), BASE_POS + starts, 9)
    assert bytes(buf) == bytes(reference)


@pytest.mark.parametrize("count", [1, STRUCT_PATH_MAX_RECORDS + 1])
def test_record_batch_check_stampable_paths_refuse_the_same(count):
    record = encode_record("T", b"x", queue_id=0, born_ts_ms=1, born_host=BORN, store_host=STORE)
    buf = bytearray(record * count)
    starts = np.arange(count, dtype=np.int64) * len(record)
    sizes = np.full(count, len(record), dtype=np.int64)
    check_stampable(buf, starts, sizes)
    bad_sizes = sizes.copy()
    bad_sizes[-1] += 1
    with pytest.raises(BadInputError, match="past the end"):
        check_stampable(buf, starts, bad_sizes)
    with pytest.raises(BadInputError, match="too short"):
        check_stampable(buf, starts, np.full(count, 40))
    bad_sizes[-1] -= 2
    with pytest.raises(BadInputError, match="TOTALSIZE"):
        check_stampable(buf, starts, bad_sizes)
    buf[-CRC32C_PROP_SIZE] ^= 0xFF
    with pytest.raises(BadInputError, match="__CRC32C"):
        check_stampable(buf, starts, sizes)


@settings(max_examples=40, deadline=None)
@given(keys=st.lists(st.text(st.characters(blacklist_categories=("Cs",)), max_size=40), min_size=1,
                    max_size=30),
       topics=st.lists(TEXT, min_size=1, max_size=3), shard_count=st.integers(1, 5), data=st.data())
def test_key_batch_hashes_and_shards_equal_the_scalar_ones(keys, topics, shard_count, data):
    prefixes = [f"{t}#" for t in topics]
    which = np.array([data.draw(st.integers(0, len(prefixes) - 1)) for _ in keys], dtype=np.int64)
    raw = [k.encode("utf-8") for k in keys]
    ends = np.cumsum([len(r) for r in raw]).astype(np.int64)
    starts = ends - np.array([len(r) for r in raw], dtype=np.int64)
    blob = b"".join(raw)
    full = [prefixes[p] + k for p, k in zip(which.tolist(), keys, strict=True)]
    assert index_key_hashes(prefixes, which, blob, starts, ends).tolist() == list(map(index_key_hash, full))
    shards = index_key_shards([p.encode() for p in prefixes], which, blob, starts, ends, shard_count)
    assert shards.tolist() == [crc32c.crc32c(f.encode()) % shard_count for f in full]


@settings(max_examples=40, deadline=None)
@given(keys=st.lists(st.text(st.characters(max_codepoint=0x7F), min_size=1, max_size=70), min_size=1,
                    max_size=30),
       gaps=st.lists(st.binary(max_size=5), min_size=30, max_size=30),
       topics=st.lists(st.text(st.characters(max_codepoint=0x7F), max_size=12), min_size=1, max_size=3),
       shard_count=st.integers(2, 5), data=st.data())
def test_ascii_keys_between_other_bytes_take_the_whole_array_path_and_equal_the_scalar_ones(
        keys, gaps, topics, shard_count, data):
    """ASCII keys, none empty (the whole-array formulas), each after a few other bytes, as keys
    sit among the properties: a key's bytes and distances come from its own span only."""
    prefixes = [f"{t}#" for t in topics]
    which = np.array([data.draw(st.integers(0, len(prefixes) - 1)) for _ in keys], dtype=np.int64)
    blob, starts, ends = b"", [], []
    for key, gap in zip(keys, gaps, strict=False):
        blob += gap
        starts.append(len(blob))
        blob += key.encode("ascii")
        ends.append(len(blob))
    starts_at, ends_at = np.array(starts, dtype=np.int64), np.array(ends, dtype=np.int64)
    full = [prefixes[p] + k for p, k in zip(which.tolist(), keys, strict=True)]
    assert _KeyBytes(blob, starts_at, ends_at).is_plain()
    hashes = index_key_hashes(prefixes, which, blob, starts_at, ends_at)
    assert hashes.tolist() == list(map(index_key_hash, full))
    shards = index_key_shards([p.encode() for p in prefixes], which, blob, starts_at, ends_at, shard_count)
    assert shards.tolist() == [crc32c.crc32c(f.encode()) % shard_count for f in full]


@pytest.mark.parametrize("lengths", [(1, 511), (512, 3), (513, 2), (0, 7)])
def test_index_key_values_equal_the_scalar_ones_at_the_table_and_empty_key_limits(lengths):
    """The dispatcher's call: up to 512 bytes through the CRC table, longer keys and empty ones
    through one crc32c call each."""
    keys = ["k" * n if n % 2 else "7" * n for n in lengths]
    blob = b"".join(k.encode() for k in keys)
    ends = np.cumsum([len(k) for k in keys]).astype(np.int64)
    starts = ends - np.array([len(k) for k in keys], dtype=np.int64)
    which = np.zeros(len(keys), dtype=np.int64)
    hashes, shards = index_key_values(["T#"], which, blob, starts, ends, 3)
    assert hashes.tolist() == [index_key_hash("T#" + k) for k in keys]
    assert shards.tolist() == [crc32c.crc32c(f"T#{k}".encode()) % 3 for k in keys]
