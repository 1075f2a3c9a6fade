"""Checkpoint: 4 KiB; RocketMQ's StoreCheckpoint fields where RocketMQ reads them, then mqstore's.

    off   size  field                      notes
      0      8  physic_msg_ts_ms           RocketMQ physicMsgTimestamp
      8      8  logics_msg_ts_ms           RocketMQ logicsMsgTimestamp
     16      8  index_msg_ts_ms            RocketMQ indexMsgTimestamp (min over shards)
     24      8  master_flushed_offset      RocketMQ masterFlushedOffset (5.0.0+)
     32      8  confirm_commit_pos         RocketMQ confirmPhyOffset (5.1.1+)
     40     24  reserved, zero
     64      4  magic                      0x4D514350 "MQCP"; all zero from 64 on = RocketMQ-written
     68      4  version                    CHECKPOINT_VERSION
     72      8  commitlog_flushed_pos      commitlog bytes durable up to here
     80      8  cq_durable_pos             consume queues hold every record before this
     88      4  shard_count N              0..MAX_INDEX_SHARDS
     92      4  reserved, zero
     96    8*N  index_durable_pos[N]       each index shard holds every key before its position
  96+8N      4  crc32c                     CRC32C of bytes [0, 96+8N)
          rest  zero up to CHECKPOINT_SIZE

The file is replaced atomically (temp, fsync, rename), never patched in place; the CRC
catches a torn or foreign file, and the reader falls back to the `.bak` copy or a full scan.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

import crc32c

from engine.errors import BadInputError, CheckpointError

CHECKPOINT_SIZE = 4096
CHECKPOINT_MAGIC = 0x4D514350  # "MQCP"
CHECKPOINT_VERSION = 1
MAX_INDEX_SHARDS = 64
MIN_TIMESTAMP_MARGIN_MS = 3000  # RocketMQ StoreCheckpoint.getMinTimestamp

ROCKETMQ_PART_FMT = ">qqqqq"
ROCKETMQ_PART_SIZE = 40
MQSTORE_PART_POS = 64
MQSTORE_HEAD_FMT = ">Iiqqi4x"  # magic, version, commitlog_flushed_pos, cq_durable_pos, shard_count
MQSTORE_HEAD_SIZE = 32
SHARD_POS_FMT = ">q"
SHARD_POS_SIZE = 8
CRC_FMT = ">I"
CRC_SIZE = 4
assert struct.calcsize(ROCKETMQ_PART_FMT) == ROCKETMQ_PART_SIZE <= MQSTORE_PART_POS
assert struct.calcsize(MQSTORE_HEAD_FMT) == MQSTORE_HEAD_SIZE
assert struct.calcsize(SHARD_POS_FMT) == SHARD_POS_SIZE
assert struct.calcsize(CRC_FMT) == CRC_SIZE
SHARDS_POS = MQSTORE_PART_POS + MQSTORE_HEAD_SIZE
assert SHARDS_POS + MAX_INDEX_SHARDS * SHARD_POS_SIZE + CRC_SIZE <= CHECKPOINT_SIZE

_ROCKETMQ_PART = struct.Struct(ROCKETMQ_PART_FMT)
_MQSTORE_HEAD = struct.Struct(MQSTORE_HEAD_FMT)
_CRC = struct.Struct(CRC_FMT)
_SHARDS = [struct.Struct(f">{n}q") for n in range(MAX_INDEX_SHARDS + 1)]


@dataclass(frozen=True, slots=True)
class Checkpoint:
    """Durable positions and RocketMQ's timestamps; recovery scans from the lowest position."""

    physic_msg_ts_ms: int = 0
    logics_msg_ts_ms: int = 0
    index_msg_ts_ms: int = 0
    master_flushed_offset: int = 0
    confirm_commit_pos: int = 0
    commitlog_flushed_pos: int = 0
    cq_durable_pos: int = 0
    index_durable_pos: tuple[int, ...] = ()

    @property
    def min_timestamp_ms(self) -> int:
        """RocketMQ getMinTimestamp: min(physic, logics) less a 3 s margin, never negative."""
        return max(0, min(self.physic_msg_ts_ms, self.logics_msg_ts_ms) - MIN_TIMESTAMP_MARGIN_MS)

    @property
    def min_timestamp_index_ms(self) -> int:
        """RocketMQ getMinTimestampIndex: min(min_timestamp_ms, index_msg_ts_ms)."""
        return min(self.min_timestamp_ms, self.index_msg_ts_ms)

    @property
    def shard_count(self) -> int:
        return len(self.index_durable_pos)


def _used_size(shard_count: int) -> int:
    """Bytes covered by the CRC for `shard_count` shards (the CRC itself follows them)."""
    return SHARDS_POS + shard_count * SHARD_POS_SIZE


def encode_checkpoint(cp: Checkpoint) -> bytes:
    """The full 4096-byte file image of `cp`, CRC included."""
    shards = tuple(cp.index_durable_pos)
    if len(shards) > MAX_INDEX_SHARDS:
        raise BadInputError("checkpoint", f"{len(shards)} index shards, at most {MAX_INDEX_SHARDS}")
    out = bytearray(CHECKPOINT_SIZE)
    try:
        _ROCKETMQ_PART.pack_into(out, 0, cp.physic_msg_ts_ms, cp.logics_msg_ts_ms, cp.index_msg_ts_ms,
                                 cp.master_flushed_offset, cp.confirm_commit_pos)
        _MQSTORE_HEAD.pack_into(out, MQSTORE_PART_POS, CHECKPOINT_MAGIC, CHECKPOINT_VERSION,
                                cp.commitlog_flushed_pos, cp.cq_durable_pos, len(shards))
        _SHARDS[len(shards)].pack_into(out, SHARDS_POS, *shards)
    except struct.error as exc:
        raise BadInputError("checkpoint", str(exc)) from None
    used = _used_size(len(shards))
    _CRC.pack_into(out, used, crc32c.crc32c(bytes(out[:used])))
    return bytes(out)


def is_rocketmq_checkpoint(buf) -> bool:
    """True when the mqstore part (byte 64 on) is all zeros: RocketMQ wrote this file."""
    return len(buf) == CHECKPOINT_SIZE and not any(bytes(buf[MQSTORE_PART_POS:]))


def decode_checkpoint(buf) -> Checkpoint:
    """Decode an mqstore checkpoint; CheckpointError on wrong size, magic, version or CRC."""
    if len(buf) != CHECKPOINT_SIZE:
        raise CheckpointError(f"checkpoint is {len(buf)} bytes, expected {CHECKPOINT_SIZE}")
    if is_rocketmq_checkpoint(buf):
        raise CheckpointError("checkpoint has no mqstore part (written by RocketMQ)",
                              hint="read it with decode_rocketmq_checkpoint")
    magic, version, commitlog_flushed_pos, cq_durable_pos, shard_count = _MQSTORE_HEAD.unpack_from(
        buf, MQSTORE_PART_POS)
    if magic != CHECKPOINT_MAGIC:
        raise CheckpointError(f"checkpoint magic 0x{magic:08X} is not 0x{CHECKPOINT_MAGIC:08X}")
    if version != CHECKPOINT_VERSION:
        raise CheckpointError(f"checkpoint version {version} is not {CHECKPOINT_VERSION}")
    if not 0 <= shard_count <= MAX_INDEX_SHARDS:
        raise CheckpointError(f"checkpoint shard count {shard_count} outside 0..{MAX_INDEX_SHARDS}")
    used = _used_size(shard_count)
    stored_crc = _CRC.unpack_from(buf, used)[0]
    actual_crc = crc32c.crc32c(bytes(buf[:used]))
    if stored_crc != actual_crc:
        raise CheckpointError(f"checkpoint CRC32C {stored_crc:08X} != computed {actual_crc:08X}")
    rocketmq = _ROCKETMQ_PART.unpack_from(buf, 0)
    shards = _SHARDS[shard_count].unpack_from(buf, SHARDS_POS)
    return Checkpoint(*rocketmq, commitlog_flushed_pos, cq_durable_pos, shards)


def decode_rocketmq_checkpoint(buf) -> Checkpoint:
    """Only RocketMQ's fields (a RocketMQ-written store); mqstore positions are left at 0."""
    if len(buf) < ROCKETMQ_PART_SIZE:
        raise CheckpointError(f"checkpoint is {len(buf)} bytes, fewer than {ROCKETMQ_PART_SIZE}")
    return Checkpoint(*_ROCKETMQ_PART.unpack_from(buf, 0))
