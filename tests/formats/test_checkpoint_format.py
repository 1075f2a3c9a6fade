"""The 4 KiB checkpoint image: RocketMQ fields in place, mqstore part from 64, CRC32C."""

from __future__ import annotations

import struct

import crc32c
import pytest

from engine.errors import BadInputError, CheckpointError
from engine.formats import checkpoint as ck
from engine.formats.checkpoint import (
    CHECKPOINT_SIZE,
    Checkpoint,
    decode_checkpoint,
    decode_rocketmq_checkpoint,
    encode_checkpoint,
    is_rocketmq_checkpoint,
)

CP = Checkpoint(physic_msg_ts_ms=1_700_000_005_000, logics_msg_ts_ms=1_700_000_004_000,
                index_msg_ts_ms=1_700_000_000_000, master_flushed_offset=5, confirm_commit_pos=6,
                commitlog_flushed_pos=1 << 31, cq_durable_pos=1 << 30, index_durable_pos=(10, 20, 30))


def test_encode_is_4096_bytes_with_rocketmq_fields_in_place():
    raw = encode_checkpoint(CP)
    assert len(raw) == CHECKPOINT_SIZE == 4096
    assert struct.unpack_from(">qqqqq", raw, 0) == (1_700_000_005_000, 1_700_000_004_000,
                                                    1_700_000_000_000, 5, 6)
    assert raw[40:64] == bytes(24)


def test_mqstore_part_layout():
    raw = encode_checkpoint(CP)
    assert raw[64:68] == b"MQCP"
    assert struct.unpack_from(">iqqi", raw, 68) == (1, 1 << 31, 1 << 30, 3)
    assert struct.unpack_from(">3q", raw, 96) == (10, 20, 30)
    used = 96 + 3 * 8
    assert struct.unpack_from(">I", raw, used)[0] == crc32c.crc32c(raw[:used])
    assert raw[used + 4 :] == bytes(CHECKPOINT_SIZE - used - 4)


@pytest.mark.parametrize("cp", [Checkpoint(), CP, Checkpoint(index_durable_pos=tuple(range(64)))])
def test_round_trip(cp):
    assert decode_checkpoint(encode_checkpoint(cp)) == cp


def test_every_byte_change_in_used_part_is_detected():
    raw = encode_checkpoint(CP)
    for pos in range(96 + 3 * 8 + 4):
        bad = bytearray(raw)
        bad[pos] ^= 0x01
        with pytest.raises(CheckpointError):
            decode_checkpoint(bytes(bad))


@pytest.mark.parametrize("size", [0, 4095, 4097])
def test_wrong_size_is_rejected(size):
    with pytest.raises(CheckpointError, match="bytes"):
        decode_checkpoint(bytes(size))


def with_fixed_crc(raw: bytearray, shard_count: int) -> bytes:
    used = 96 + shard_count * 8
    struct.pack_into(">I", raw, used, crc32c.crc32c(bytes(raw[:used])))
    return bytes(raw)


def test_unknown_version_is_rejected_even_with_valid_crc():
    raw = bytearray(encode_checkpoint(CP))
    struct.pack_into(">i", raw, 68, 2)
    with pytest.raises(CheckpointError, match="version 2"):
        decode_checkpoint(with_fixed_crc(raw, 3))


def test_unknown_magic_is_rejected():
    raw = bytearray(encode_checkpoint(CP))
    raw[64:68] = b"XXXX"
    with pytest.raises(CheckpointError, match="magic"):
        decode_checkpoint(with_fixed_crc(raw, 3))


def test_shard_count_out_of_range_is_rejected():
    raw = bytearray(encode_checkpoint(Checkpoint()))
    struct.pack_into(">i", raw, 88, 65)
    with pytest.raises(CheckpointError, match="shard count"):
        decode_checkpoint(bytes(raw))


def test_rocketmq_written_checkpoint():
    raw = struct.pack(">qq", 1_551_600_000_000, 1_551_600_001_000) + bytes(CHECKPOINT_SIZE - 16)
    assert is_rocketmq_checkpoint(raw)
    assert not is_rocketmq_checkpoint(encode_checkpoint(Checkpoint()))
    with pytest.raises(CheckpointError, match="RocketMQ"):
        decode_checkpoint(raw)
    cp = decode_rocketmq_checkpoint(raw)
    assert (cp.physic_msg_ts_ms, cp.logics_msg_ts_ms, cp.index_durable_pos) == (
        1_551_600_000_000, 1_551_600_001_000, ())
    with pytest.raises(CheckpointError):
        decode_rocketmq_checkpoint(bytes(39))


def test_rocketmq_reader_reads_mqstore_checkpoint():
    cp = decode_rocketmq_checkpoint(encode_checkpoint(CP))
    assert (cp.physic_msg_ts_ms, cp.confirm_commit_pos) == (CP.physic_msg_ts_ms, 6)
    assert cp.commitlog_flushed_pos == 0


def test_min_timestamp_is_3000_ms_before_the_older_of_physic_and_logics():
    # StoreCheckpointTest: getMinTimestamp() is 3000 ms before min(physic, logics).
    assert CP.min_timestamp_ms == 1_700_000_004_000 - 3000
    assert Checkpoint(physic_msg_ts_ms=1000, logics_msg_ts_ms=2000).min_timestamp_ms == 0
    assert CP.min_timestamp_index_ms == 1_700_000_000_000
    assert Checkpoint(physic_msg_ts_ms=10_000, logics_msg_ts_ms=10_000,
                      index_msg_ts_ms=9_000).min_timestamp_index_ms == 7_000


def test_shard_count_property():
    assert CP.shard_count == 3


@pytest.mark.parametrize("cp", [Checkpoint(index_durable_pos=tuple(range(65))),
                                Checkpoint(cq_durable_pos=2**63)])
def test_encode_bad_values_is_bad_input(cp):
    with pytest.raises(BadInputError):
        encode_checkpoint(cp)


def test_layout_constants():
    assert (ck.MQSTORE_PART_POS, ck.SHARDS_POS, ck.MAX_INDEX_SHARDS) == (64, 96, 64)
