"""Index file header / slot / entry layouts, positions, key hashing and sharding."""

from __future__ import annotations

import struct

import crc32c
import numpy as np
import pytest

from engine.errors import BadInputError, CorruptIndexError
from engine.formats.index_file import (
    INDEX_ENTRY_DTYPE,
    INDEX_ENTRY_SIZE,
    INDEX_HEADER_SIZE,
    SLOT_DTYPE,
    SLOT_SIZE,
    IndexEntry,
    IndexHeader,
    decode_index_entry,
    decode_index_header,
    decode_slot,
    encode_index_entry,
    encode_index_header,
    encode_slot,
    entry_pos,
    index_file_size,
    index_key,
    index_key_hash_of,
    shard_of,
    slot_of,
    slot_pos,
    time_diff_s,
)
from engine.formats.java_hash import index_key_hash


def test_sizes_match_reference():
    assert (INDEX_HEADER_SIZE, SLOT_SIZE, INDEX_ENTRY_SIZE) == (40, 4, 20)
    assert index_file_size(5_000_000, 20_000_000) == 420_000_040


def test_positions():
    assert slot_pos(0) == 40 and slot_pos(3) == 52
    assert entry_pos(100, 0) == 440 and entry_pos(100, 2) == 480
    assert entry_pos(100, 400) == index_file_size(100, 400)  # one past the last entry


def test_header_layout_and_round_trip():
    header = IndexHeader(begin_ts_ms=1, end_ts_ms=2, begin_commit_pos=3, end_commit_pos=4,
                         hash_slot_count=5, index_count=6)
    raw = encode_index_header(header)
    assert struct.unpack(">qqqqii", raw) == (1, 2, 3, 4, 5, 6)
    assert decode_index_header(b"\x00" * 8 + raw, 8) == header


def test_fresh_header_starts_index_count_at_one():
    assert IndexHeader().index_count == 1


def test_entry_layout_and_round_trip():
    entry = IndexEntry(key_hash=123, commit_pos=1 << 33, time_diff_s=7, prev_index=2)
    raw = encode_index_entry(entry)
    assert struct.unpack(">iqii", raw) == (123, 1 << 33, 7, 2)
    assert decode_index_entry(raw, 0) == entry


def test_numpy_views_match_struct_layouts():
    entries = [IndexEntry(i - 2, i << 30, i, i - 1) for i in range(5)]
    buf = b"".join(encode_index_entry(e) for e in entries)
    arr = np.frombuffer(buf, dtype=INDEX_ENTRY_DTYPE)
    assert [IndexEntry(*row) for row in arr.tolist()] == entries
    slots = np.frombuffer(b"".join(encode_slot(i) for i in (0, 3, -1)), dtype=SLOT_DTYPE)
    assert slots.tolist() == [0, 3, -1]


def test_slot_round_trip():
    assert encode_slot(9) == b"\x00\x00\x00\x09"
    assert decode_slot(bytes(40) + encode_slot(9), slot_pos(0)) == 9


@pytest.mark.parametrize(("decode", "size"), [
    (lambda b: decode_index_header(b, 0), 39),
    (lambda b: decode_index_entry(b, 0), 19),
    (lambda b: decode_slot(b, 0), 3),
])
def test_short_buffers_are_corrupt(decode, size):
    with pytest.raises(CorruptIndexError):
        decode(bytes(size))


def test_encode_out_of_range_is_bad_input():
    with pytest.raises(BadInputError):
        encode_index_entry(IndexEntry(2**31, 0, 0, 0))


def test_index_key_and_hash():
    assert index_key("abc", "k1") == "abc#k1"
    assert index_key_hash_of("abc", "k1") == index_key_hash("abc#k1")
    assert slot_of(index_key_hash("abc#k1"), 7) == index_key_hash("abc#k1") % 7


def test_shard_of_uses_crc32c_of_utf8_key():
    assert shard_of("abc", "k1", 4) == crc32c.crc32c(b"abc#k1") % 4
    assert shard_of("abc", "ü", 3) == crc32c.crc32c("abc#ü".encode()) % 3
    assert shard_of("abc", "k1", 1) == 0


def test_shard_of_spreads_keys():
    counts = [0] * 4
    for i in range(4000):
        counts[shard_of("topic", f"key-{i}", 4)] += 1
    assert min(counts) > 800


@pytest.mark.parametrize(("store_ts", "begin_ts", "expected"), [
    (10_999, 1_000, 9),
    (1_000, 1_000, 0),
    (500, 1_000, 0),  # before the begin timestamp: clamped
    (5_000, 0, 0),  # no begin timestamp yet
    (2**62, 1, 2**31 - 1),  # clamped to INT_MAX
])
def test_time_diff_s(store_ts, begin_ts, expected):
    assert time_diff_s(store_ts, begin_ts) == expected
