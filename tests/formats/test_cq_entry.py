"""The 20-byte consume-queue entry: struct and numpy views agree."""

from __future__ import annotations

import numpy as np
import pytest

from engine.errors import BadInputError, CorruptConsumeQueueError
from engine.formats.cq_entry import (
    CQ_DTYPE,
    CQ_ENTRY_SIZE,
    FILLER_ENTRY,
    FILLER_ENTRY_BYTES,
    CqEntry,
    decode_cq_entries,
    decode_cq_entry,
    encode_cq_entry,
    is_filler_entry,
    is_unwritten_entry,
    is_valid_entry,
)


def test_entry_byte_layout():
    raw = encode_cq_entry(0x0102030405060708, 172, -2)
    assert len(raw) == CQ_ENTRY_SIZE == 20
    assert raw == bytes.fromhex("0102030405060708" "000000ac" "fffffffffffffffe")


def test_entry_round_trip_at_position():
    buf = b"\xaa" * 7 + encode_cq_entry(8084, 172, 2567159)
    entry = decode_cq_entry(buf, 7)
    assert entry == CqEntry(commit_pos=8084, size=172, tags_code=2567159)
    assert entry.end_pos == 8256


def test_numpy_view_matches_struct_decode():
    entries = [(i * 172, 172, i - 5) for i in range(10)]
    buf = b"".join(encode_cq_entry(*e) for e in entries)
    arr = decode_cq_entries(buf)
    assert arr.dtype == CQ_DTYPE and len(arr) == 10
    assert arr["commit_pos"].tolist() == [e[0] for e in entries]
    assert arr["size"].tolist() == [172] * 10
    assert arr["tags_code"].tolist() == [e[2] for e in entries]
    part = decode_cq_entries(buf, 3 * CQ_ENTRY_SIZE, 2)
    assert part["commit_pos"].tolist() == [3 * 172, 4 * 172]
    assert np.shares_memory(part, np.frombuffer(buf, dtype=np.uint8))


def test_numpy_view_past_buffer_is_corrupt():
    with pytest.raises(CorruptConsumeQueueError):
        decode_cq_entries(bytes(40), 20, 2)


def test_short_buffer_is_corrupt():
    with pytest.raises(CorruptConsumeQueueError):
        decode_cq_entry(bytes(19), 0)
    with pytest.raises(CorruptConsumeQueueError):
        decode_cq_entry(bytes(40), 21)


@pytest.mark.parametrize("values", [(2**63, 1, 0), (0, 2**31, 0), (0, 1, -(2**63) - 1), (0, "1", 0)])
def test_encode_out_of_range_is_bad_input(values):
    with pytest.raises(BadInputError):
        encode_cq_entry(*values)


def test_filler_entry_is_rocketmq_blank():
    assert FILLER_ENTRY == (0, 0x7FFFFFFF, 0)
    entry = decode_cq_entry(FILLER_ENTRY_BYTES, 0)
    assert is_filler_entry(entry) and is_valid_entry(entry) and not is_unwritten_entry(entry)


def test_entry_states():
    unwritten = decode_cq_entry(bytes(20), 0)
    assert is_unwritten_entry(unwritten) and not is_valid_entry(unwritten)
    written = CqEntry(0, 172, 0)
    assert is_valid_entry(written) and not is_filler_entry(written) and not is_unwritten_entry(written)
    assert not is_valid_entry(CqEntry(-1, 172, 0))
