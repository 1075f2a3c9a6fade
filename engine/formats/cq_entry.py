"""Consume-queue entry: 20 bytes, big-endian, RocketMQ ConsumeQueue layout.

    off  size  field
      0     8  commit_pos   commitlog position of the record (long)
      8     4  size         the record's TOTALSIZE (int)
     12     8  tags_code    Java hashCode of TAGS, 0 without tags (long)

Entry n of a queue sits at logical byte n*20 (files are named by their first logical byte).
Consume queues are derived data: a damaged one is rebuilt from the commitlog.

Entry states (RocketMQ ConsumeQueue.recover): an entry is *valid* when commit_pos >= 0 and
size > 0; an all-zero entry is *unwritten* (the tail of a preallocated file); the *filler*
(0, 0x7FFFFFFF, 0) pads a queue that starts past the start of its file.
"""

from __future__ import annotations

import struct
from typing import NamedTuple

import numpy as np

from engine.errors import BadInputError, CorruptConsumeQueueError

CQ_ENTRY_FMT = ">qiq"
CQ_ENTRY_SIZE = 20
assert struct.calcsize(CQ_ENTRY_FMT) == CQ_ENTRY_SIZE
CQ_ENTRY = struct.Struct(CQ_ENTRY_FMT)

CQ_DTYPE = np.dtype([("commit_pos", ">i8"), ("size", ">i4"), ("tags_code", ">i8")])
assert CQ_DTYPE.itemsize == CQ_ENTRY_SIZE

FILLER_SIZE_MARK = 0x7FFFFFFF  # Integer.MAX_VALUE in the size field marks a filler entry
FILLER_ENTRY = (0, FILLER_SIZE_MARK, 0)
FILLER_ENTRY_BYTES = CQ_ENTRY.pack(*FILLER_ENTRY)


class CqEntry(NamedTuple):
    """One decoded entry (a NamedTuple: built straight from struct.unpack on the hot path)."""

    commit_pos: int
    size: int
    tags_code: int

    @property
    def end_pos(self) -> int:
        return self.commit_pos + self.size


def encode_cq_entry(commit_pos: int, size: int, tags_code: int) -> bytes:
    """The 20 bytes of one entry; BadInputError if a value does not fit its field."""
    try:
        return CQ_ENTRY.pack(commit_pos, size, tags_code)
    except struct.error as exc:
        raise BadInputError("consume queue entry", str(exc)) from None


def decode_cq_entry(buf, pos: int = 0) -> CqEntry:
    """The entry at buf[pos:]; CorruptConsumeQueueError if fewer than 20 bytes remain."""
    try:
        return CqEntry._make(CQ_ENTRY.unpack_from(buf, pos))
    except struct.error:
        raise CorruptConsumeQueueError(f"fewer than {CQ_ENTRY_SIZE} bytes at byte {pos}") from None


def decode_cq_entries(buf, pos: int = 0, count: int = -1) -> np.ndarray:
    """`count` entries (all that fit when -1) from buf[pos:] as a CQ_DTYPE array, without copying."""
    if count < 0:
        count = (len(buf) - pos) // CQ_ENTRY_SIZE
    if pos < 0 or pos + count * CQ_ENTRY_SIZE > len(buf):
        raise CorruptConsumeQueueError(f"{count} entries at byte {pos} run past the buffer")
    return np.frombuffer(buf, dtype=CQ_DTYPE, count=count, offset=pos)


def is_valid_entry(entry: CqEntry) -> bool:
    """RocketMQ's test for a written entry: commit_pos >= 0 and size > 0 (a filler passes too)."""
    return entry.commit_pos >= 0 and entry.size > 0


def is_filler_entry(entry: CqEntry) -> bool:
    return entry.commit_pos == 0 and entry.size == FILLER_SIZE_MARK and entry.tags_code == 0


def is_unwritten_entry(entry: CqEntry) -> bool:
    return entry.commit_pos == 0 and entry.size == 0 and entry.tags_code == 0
