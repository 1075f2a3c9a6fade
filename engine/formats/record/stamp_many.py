"""Commitlog records many at a time: check and stamp at append, byte-identical to scalar.stamp_record.

Per record, Python work is kept to one crc32c call (a C call, driven by `map`); the queue
offsets, positions and store time are numpy writes at all record starts at once, the ten
CRC32C digits of all records one `%` format. Up to STRUCT_PATH_MAX_RECORDS records are checked
and stamped one by one with struct instead, where numpy's fixed cost per call outweighs the
work (see docs/DECISIONS.md#small-batches-scalar).
"""

from __future__ import annotations

import struct
from typing import NamedTuple

import crc32c
import numpy as np

from engine.errors import BadInputError
from engine.formats.crc32c_property import CRC32C_DIGITS, CRC32C_PREFIX, CRC32C_PROP_SIZE
from engine.formats.record.arrays import crc32c_each, int_view
from engine.formats.record.layout import (
    BORNHOST_V6,
    PHYSICAL_OFFSET_OFFSET,
    QUEUE_OFFSET_OFFSET,
    RECORD_FIXED_SIZE,
    STORE_TS_OFFSET,
    STORE_TS_OFFSET_BORN_V6,
    SYS_FLAG_LOW_BYTE_OFFSET,
    TOTAL_SIZE_FIELD,
)
from engine.tuning import STRUCT_PATH_MAX_RECORDS

_CRC_DIGITS_OFFSET = len(CRC32C_PREFIX)  # from the start of the __CRC32C tail
_CRC_DIGITS_FORMAT = f"%0{CRC32C_DIGITS}d"  # a CRC32C (< 2**32) has at most ten digits
_CRC_DIGITS_BYTES_FORMAT = _CRC_DIGITS_FORMAT.encode("ascii")
_CRC32C_PREFIX_VOID = np.void(CRC32C_PREFIX)
assert 10**CRC32C_DIGITS > 2**32
_STAMP = struct.Struct(">qq")  # QUEUEOFFSET PHYSICALOFFSET, adjacent
_I64 = struct.Struct(">q")
assert QUEUE_OFFSET_OFFSET + _I64.size == PHYSICAL_OFFSET_OFFSET


class StampableRecords(NamedTuple):
    """Records laid end to end in `buf` that `check_stampable` accepted (or a check demanding more
    of each record, like the supervisor's request check): stamping and appending need no other."""

    buf: bytearray
    starts: np.ndarray  # int64
    sizes: np.ndarray  # int64


# ---------------------------------------------------------------- stamp


def check_stampable(buf, starts: np.ndarray, sizes: np.ndarray) -> StampableRecords:
    """The records, once each one's TOTALSIZE equals its size and it has a reserved __CRC32C tail
    (what `scalar.stamp_record` checks); BadInputError otherwise, so a batch is refused before
    any write."""
    if len(starts) <= STRUCT_PATH_MAX_RECORDS:
        _check_stampable_each(buf, starts.tolist(), sizes.tolist())
        return StampableRecords(buf, starts, sizes)
    u8 = np.frombuffer(buf, dtype=np.uint8)
    if starts.min() < 0 or (starts + sizes).max() > len(u8):
        raise BadInputError("record", "a record runs past the end of the buffer")
    if sizes.min() < RECORD_FIXED_SIZE + CRC32C_PROP_SIZE:
        raise BadInputError("record", "a record is too short to hold a __CRC32C tail")
    if not (int_view(u8, ">i4")[starts] == sizes).all():
        raise BadInputError("record", "a record's TOTALSIZE field does not match its length")
    tails = int_view(u8, f"V{len(CRC32C_PREFIX)}")[starts + (sizes - CRC32C_PROP_SIZE)]
    if not (tails == _CRC32C_PREFIX_VOID).all():
        raise BadInputError("record", "a record has no reserved __CRC32C tail")
    return StampableRecords(buf, starts, sizes)


def _check_stampable_each(buf, starts: list[int], sizes: list[int]) -> None:
    """check_stampable one record at a time (struct): cheaper than numpy for a few records."""
    unpack, length, prefix = TOTAL_SIZE_FIELD.unpack_from, len(buf), CRC32C_PREFIX
    with memoryview(buf) as view:
        for start, size in zip(starts, sizes, strict=True):
            if start < 0 or start + size > length:
                raise BadInputError("record", "a record runs past the end of the buffer")
            if size < RECORD_FIXED_SIZE + CRC32C_PROP_SIZE:
                raise BadInputError("record", "a record is too short to hold a __CRC32C tail")
            if unpack(view, start)[0] != size:
                raise BadInputError("record", "a record's TOTALSIZE field does not match its length")
            tail = start + size - CRC32C_PROP_SIZE
            if view[tail:tail + len(prefix)] != prefix:
                raise BadInputError("record", "a record has no reserved __CRC32C tail")


def stamp_records(buf, starts: np.ndarray, sizes: np.ndarray, queue_offsets, commit_positions,
                  store_ts_ms) -> None:
    """`scalar.stamp_record` for every record of `buf` at once: QUEUEOFFSET, PHYSICALOFFSET,
    STORETIMESTAMP (one int for all, or one per record) in place, then each CRC32C sealed."""
    check_stampable(buf, starts, sizes)
    stamp_checked_records(buf, starts, sizes, queue_offsets, commit_positions, store_ts_ms)


def stamp_checked_records(buf, starts: np.ndarray, sizes: np.ndarray, queue_offsets,
                          commit_positions, store_ts_ms) -> None:
    """stamp_records for records that `check_stampable` has accepted. Up to
    STRUCT_PATH_MAX_RECORDS records are stamped one by one with struct, more with numpy: one
    fancy-index write per field, one crc32c call per record, the digits by one `%` format."""
    n = len(starts)
    if n <= STRUCT_PATH_MAX_RECORDS:
        store_times = ([int(store_ts_ms)] * n if type(store_ts_ms) is int or np.ndim(store_ts_ms) == 0
                       else np.asarray(store_ts_ms).tolist())
        _stamp_each(buf, starts.tolist(), sizes.tolist(), np.asarray(queue_offsets).tolist(),
                    np.asarray(commit_positions).tolist(), store_times)
        return
    u8 = np.frombuffer(buf, dtype=np.uint8)
    longs = int_view(u8, ">i8")
    longs[starts + QUEUE_OFFSET_OFFSET] = queue_offsets
    longs[starts + PHYSICAL_OFFSET_OFFSET] = commit_positions
    ts_at = starts + STORE_TS_OFFSET
    born_v6 = u8[starts + SYS_FLAG_LOW_BYTE_OFFSET] & BORNHOST_V6
    if born_v6.any():
        ts_at += np.where(born_v6 != 0, STORE_TS_OFFSET_BORN_V6 - STORE_TS_OFFSET, 0)
    longs[ts_at] = store_ts_ms
    crc_pos = starts + (sizes - CRC32C_PROP_SIZE)
    crcs = crc32c_each(buf, starts, crc_pos).tolist()
    digits = (_CRC_DIGITS_FORMAT * n % tuple(crcs)).encode("ascii")
    int_view(u8, f"V{CRC32C_DIGITS}")[crc_pos + _CRC_DIGITS_OFFSET] = np.frombuffer(
        digits, dtype=f"V{CRC32C_DIGITS}")


def stamp_few(buf, starts: list[int], sizes: list[int], queue_offsets: list[int],
              commit_positions: list[int], store_ts_ms: int) -> None:
    """stamp_checked_records of a few records given as lists, with one store time: struct only."""
    _stamp_each(buf, starts, sizes, queue_offsets, commit_positions, [store_ts_ms] * len(starts))


def _stamp_each(buf, starts: list[int], sizes: list[int], queue_offsets: list[int],
                commit_positions: list[int], store_times: list[int]) -> None:
    """stamp_checked_records one record at a time, as scalar.stamp_record does."""
    stamp, put_long, crc_of = _STAMP.pack_into, _I64.pack_into, crc32c.crc32c
    with memoryview(buf) as view:
        for start, size, queue_offset, commit_pos, store_ts_ms in zip(
                starts, sizes, queue_offsets, commit_positions, store_times, strict=True):
            stamp(view, start + QUEUE_OFFSET_OFFSET, queue_offset, commit_pos)
            born_v6 = view[start + SYS_FLAG_LOW_BYTE_OFFSET] & BORNHOST_V6
            put_long(view, start + (STORE_TS_OFFSET_BORN_V6 if born_v6 else STORE_TS_OFFSET), store_ts_ms)
            crc_pos = start + size - CRC32C_PROP_SIZE
            digits_pos = crc_pos + _CRC_DIGITS_OFFSET
            crc = crc_of(view[start:crc_pos])
            view[digits_pos:digits_pos + CRC32C_DIGITS] = _CRC_DIGITS_BYTES_FORMAT % crc
