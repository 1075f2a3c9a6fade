"""Commitlog records many at a time: batch encode and stamp (numpy), byte-identical to record.py.

`engine.formats.record` is the reference codec and owns the layout; this module only imports its
constants. The fixed 88-byte header of a v1 IPv4 record is described once more as a numpy
structured dtype, built from `record.V4_HEADER_FMT` and checked against record.py's offsets at
import time, so that many headers are filled by a few whole-array writes.

Per record, Python work is kept to what cannot be vectorized: one zlib.crc32 of the body when
encoding and one crc32c call when stamping (each a C call, driven by `map`). Everything else
(header fields, queue offsets, positions, store time) is a numpy write at all record starts at
once, the ten CRC32C digits of all records one `%` format; the bytes are joined with one
`bytearray.join`. Up to STRUCT_PATH_MAX_RECORDS records are checked and stamped one by one with
struct instead, where numpy's fixed cost per call (1-6 us here) outweighs the work.
"""

from __future__ import annotations

import re
import socket
import struct
import zlib
from collections.abc import Sequence
from typing import NamedTuple

import crc32c
import numpy as np

from engine.errors import BadInputError
from engine.formats.crc32c_property import CRC32C_DIGITS, CRC32C_PREFIX, CRC32C_PROP_SIZE, CRC32C_RESERVED
from engine.formats.record import (
    BODY_CRC_MASK,
    BODY_OFFSET,
    MAGIC_OFFSET,
    MAGIC_V1,
    MAX_PROPERTIES_BYTES,
    MAX_TOPIC_BYTES,
    PHYSICAL_OFFSET_OFFSET,
    PROPERTIES_LENGTH_SIZE,
    QUEUE_OFFSET_OFFSET,
    RECORD_FIXED_SIZE,
    STORE_TS_OFFSET,
    STORE_TS_OFFSET_BORN_V6,
    SYS_FLAG_OFFSET,
    TOPIC_LENGTH_SIZE_V1,
    TOTAL_SIZE_FIELD,
    V4_HEADER_FMT,
    V4_HEADER_SIZE,
    SysFlag,
)

HEADER_FIELDS = ("total_size", "magic", "body_crc", "queue_id", "flag", "queue_offset", "commit_pos",
                 "sys_flag", "born_ts_ms", "born_ip", "born_port", "store_ts_ms", "store_ip",
                 "store_port", "reconsume_times", "prepared_tx_offset", "body_length")
_NUMPY_CODES = {"b": "i1", "h": ">i2", "i": ">i4", "I": ">u4", "q": ">i8"}


def _dtype_of(struct_fmt: str, names: Sequence[str]) -> np.dtype:
    """A numpy structured dtype with the layout of a big-endian struct format."""
    codes = re.findall(r"(\d*)([a-zA-Z])", struct_fmt.lstrip(">"))
    kinds = [f"S{count}" if code == "s" else _NUMPY_CODES[code] for count, code in codes]
    return np.dtype(list(zip(names, kinds, strict=True)))


HEADER_DTYPE = _dtype_of(V4_HEADER_FMT, HEADER_FIELDS)
assert HEADER_DTYPE.itemsize == V4_HEADER_SIZE == BODY_OFFSET
assert HEADER_DTYPE.fields["magic"][1] == MAGIC_OFFSET
assert HEADER_DTYPE.fields["queue_offset"][1] == QUEUE_OFFSET_OFFSET
assert HEADER_DTYPE.fields["commit_pos"][1] == PHYSICAL_OFFSET_OFFSET
assert HEADER_DTYPE.fields["sys_flag"][1] == SYS_FLAG_OFFSET
assert HEADER_DTYPE.fields["store_ts_ms"][1] == STORE_TS_OFFSET

_HOSTS_V6 = int(SysFlag.BORNHOST_V6 | SysFlag.STOREHOST_V6)
_BORNHOST_V6 = int(SysFlag.BORNHOST_V6)
_CRC_DIGITS_OFFSET = len(CRC32C_PREFIX)  # from the start of the __CRC32C tail
_CRC_DIGITS_FORMAT = f"%0{CRC32C_DIGITS}d"  # a CRC32C (< 2**32) has at most ten digits
_CRC_DIGITS_BYTES_FORMAT = _CRC_DIGITS_FORMAT.encode("ascii")
_CRC32C_PREFIX_VOID = np.void(CRC32C_PREFIX)
_SYS_FLAG_LOW_BYTE = SYS_FLAG_OFFSET + 3  # SYSFLAG is big-endian; BORNHOST_V6 is in its last byte
assert _BORNHOST_V6 < 0x100 and 10**CRC32C_DIGITS > 2**32
_STAMP = struct.Struct(">qq")  # QUEUEOFFSET PHYSICALOFFSET, adjacent
_I64 = struct.Struct(">q")
assert QUEUE_OFFSET_OFFSET + _I64.size == PHYSICAL_OFFSET_OFFSET
# Up to this many records, stamping (and the supervisor's request check) goes record by record
# with struct: numpy's fixed cost per call (1-6 us) exceeds the per-record work of a few records.
STRUCT_PATH_MAX_RECORDS = 24
_POWERS_OF_TEN = 10 ** np.arange(CRC32C_DIGITS - 1, -1, -1, dtype=np.int64)
_ASCII_ZERO = ord("0")


class EncodedRecords(NamedTuple):
    """Records laid end to end in `buf`; record i is buf[starts[i]:starts[i] + sizes[i]]."""

    buf: bytearray
    starts: np.ndarray  # int64, position of each record in buf
    sizes: np.ndarray  # int64, each record's TOTALSIZE


class StampableRecords(NamedTuple):
    """Records laid end to end in `buf` that `check_stampable` accepted (or a check demanding more
    of each record, like the supervisor's request check): stamping and appending need no other."""

    buf: bytearray
    starts: np.ndarray  # int64
    sizes: np.ndarray  # int64


# ---------------------------------------------------------------- numpy field access


def gather(u8: np.ndarray, positions: np.ndarray, width: int) -> np.ndarray:
    """The `width` bytes at each position, as an (n, width) uint8 array (a copy): one fancy
    index over an overlapping view of `width`-byte items, one item per position (indexing every
    byte costs several times more)."""
    if width <= 0:
        return np.zeros((len(positions), 0), dtype=np.uint8)
    return int_view(u8, f"V{width}")[positions].view(np.uint8).reshape(len(positions), width)


def int_view(u8: np.ndarray, be_dtype) -> np.ndarray:
    """An overlapping view whose element i is the `be_dtype` value at bytes [i, i + size): a
    field at many unaligned positions is then read or written by one fancy index, one element
    per position (rather than `size` bytes per position)."""
    dtype = np.dtype(be_dtype)
    return np.ndarray(shape=(max(len(u8) - dtype.itemsize + 1, 0),), dtype=dtype, buffer=u8,
                      strides=(1,))


def gather_int(u8: np.ndarray, positions: np.ndarray, be_dtype) -> np.ndarray:
    """The big-endian integer of type `be_dtype` ('>i4', '>i8', ...) at each position, as int64."""
    return int_view(u8, be_dtype)[positions].astype(np.int64)


def scatter_int(u8: np.ndarray, positions: np.ndarray, values, be_dtype) -> None:
    """Write each value as a big-endian `be_dtype` at its position."""
    int_view(u8, be_dtype)[positions] = values


def gather_field(u8: np.ndarray, starts: np.ndarray, name: str) -> np.ndarray:
    """HEADER_DTYPE field `name` of the records at `starts` (IPv4 layout), as int64."""
    dtype, offset = HEADER_DTYPE.fields[name][:2]
    return gather_int(u8, starts + offset, dtype)


# ---------------------------------------------------------------- encode


def encode_records(topic_raws: Sequence[bytes], bodies: Sequence[bytes], props_raws: Sequence[bytes],
                   queue_ids: Sequence[int], *, born_ts_ms: int, born_host: tuple[str, int],
                   store_host: tuple[str, int], flag: int = 0, sys_flag: int = 0) -> EncodedRecords:
    """Many `record.encode_record` results end to end, byte for byte.

    `topic_raws` are UTF-8 topics, `props_raws` encoded properties *without* the CRC32C tail
    (it is reserved here, as encode_record does). Inputs are assumed validated per message
    (engine.message); lengths and ranges are checked here as a whole, BadInputError if off.
    """
    n = len(bodies)
    if not n == len(topic_raws) == len(props_raws) == len(queue_ids):
        raise BadInputError("records", "topics, bodies, properties and queue ids differ in count")
    body_lens = np.fromiter(map(len, bodies), dtype=np.int64, count=n)
    topic_lens = np.fromiter(map(len, topic_raws), dtype=np.int64, count=n)
    props_lens = np.fromiter(map(len, props_raws), dtype=np.int64, count=n) + CRC32C_PROP_SIZE
    _check_lengths(topic_lens, props_lens)
    sizes = RECORD_FIXED_SIZE + body_lens + topic_lens + props_lens
    header = np.zeros(n, dtype=HEADER_DTYPE)
    header["magic"], header["flag"], header["sys_flag"] = MAGIC_V1, flag, sys_flag
    header["born_ts_ms"] = born_ts_ms
    header["born_ip"], header["born_port"] = _ipv4(born_host)
    header["store_ip"], header["store_port"] = _ipv4(store_host)
    header["total_size"] = sizes
    header["body_crc"] = np.fromiter(map(zlib.crc32, bodies), dtype=np.int64, count=n) & BODY_CRC_MASK
    header["queue_id"] = queue_ids
    header["body_length"] = body_lens
    pieces: list = [None] * (6 * n)
    pieces[0::6] = header.view(f"V{V4_HEADER_SIZE}").tolist()
    pieces[1::6] = bodies
    pieces[2::6] = _topic_pieces(topic_raws, topic_lens)
    pieces[3::6] = props_lens.astype(">i2").view(f"V{PROPERTIES_LENGTH_SIZE}").tolist()
    pieces[4::6] = props_raws
    pieces[5::6] = [CRC32C_RESERVED] * n
    starts = np.zeros(n, dtype=np.int64)
    np.cumsum(sizes[:-1], out=starts[1:])
    return EncodedRecords(bytearray().join(pieces), starts, sizes)


def _check_lengths(topic_lens: np.ndarray, props_lens: np.ndarray) -> None:
    if len(topic_lens) and (topic_lens.min() < 1 or topic_lens.max() > MAX_TOPIC_BYTES):
        raise BadInputError("topic", f"must be 1..{MAX_TOPIC_BYTES} bytes of UTF-8")
    if len(props_lens) and props_lens.max() > MAX_PROPERTIES_BYTES:
        raise BadInputError("properties", f"properties plus the {CRC32C_PROP_SIZE}-byte CRC32C "
                            f"property exceed {MAX_PROPERTIES_BYTES}")


def _topic_pieces(topic_raws: Sequence[bytes], topic_lens: np.ndarray) -> list[bytes]:
    """TOPICLENGTH byte + topic for each record (one object per distinct topic)."""
    assert TOPIC_LENGTH_SIZE_V1 == 1
    by_topic = {raw: bytes((len(raw),)) + raw for raw in set(topic_raws)}
    return list(map(by_topic.__getitem__, topic_raws))


def _ipv4(host: tuple[str, int]) -> tuple[bytes, int]:
    ip, port = host
    try:
        return socket.inet_pton(socket.AF_INET, ip), port
    except (OSError, TypeError):
        raise BadInputError("host", f"{host!r} is not an (IPv4 address, port) pair") from None


# ---------------------------------------------------------------- stamp


def check_stampable(buf, starts: np.ndarray, sizes: np.ndarray) -> StampableRecords:
    """The records, once each one's TOTALSIZE equals its size and it has a reserved __CRC32C tail
    (what `record.stamp_record` checks); BadInputError otherwise, so a batch is refused before
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
    """`record.stamp_record` for every record of `buf` at once: QUEUEOFFSET, PHYSICALOFFSET,
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
    born_v6 = u8[starts + _SYS_FLAG_LOW_BYTE] & _BORNHOST_V6
    if born_v6.any():
        ts_at += np.where(born_v6 != 0, STORE_TS_OFFSET_BORN_V6 - STORE_TS_OFFSET, 0)
    longs[ts_at] = store_ts_ms
    crc_pos = starts + (sizes - CRC32C_PROP_SIZE)
    crcs = crc32c_each(buf, starts, crc_pos).tolist()
    digits = (_CRC_DIGITS_FORMAT * n % tuple(crcs)).encode("ascii")
    int_view(u8, f"V{CRC32C_DIGITS}")[crc_pos + _CRC_DIGITS_OFFSET] = np.frombuffer(
        digits, dtype=f"V{CRC32C_DIGITS}")


def _stamp_each(buf, starts: list[int], sizes: list[int], queue_offsets: list[int],
                commit_positions: list[int], store_times: list[int]) -> None:
    """stamp_checked_records one record at a time, as record.stamp_record does."""
    stamp, put_long, crc_of = _STAMP.pack_into, _I64.pack_into, crc32c.crc32c
    with memoryview(buf) as view:
        for start, size, queue_offset, commit_pos, store_ts_ms in zip(
                starts, sizes, queue_offsets, commit_positions, store_times, strict=True):
            stamp(view, start + QUEUE_OFFSET_OFFSET, queue_offset, commit_pos)
            born_v6 = view[start + _SYS_FLAG_LOW_BYTE] & _BORNHOST_V6
            put_long(view, start + (STORE_TS_OFFSET_BORN_V6 if born_v6 else STORE_TS_OFFSET), store_ts_ms)
            crc_pos = start + size - CRC32C_PROP_SIZE
            digits_pos = crc_pos + _CRC_DIGITS_OFFSET
            crc = crc_of(view[start:crc_pos])
            view[digits_pos:digits_pos + CRC32C_DIGITS] = _CRC_DIGITS_BYTES_FORMAT % crc


def crc32c_each(buf, starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """CRC32C of buf[starts[i]:ends[i]] for each i (int64)."""
    return _checksum_each(crc32c.crc32c, buf, starts, ends)


def crc32_each(buf, starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """zlib CRC32 of buf[starts[i]:ends[i]] for each i (int64; BODYCRC keeps BODY_CRC_MASK of it)."""
    return _checksum_each(zlib.crc32, buf, starts, ends)


def _checksum_each(checksum, buf, starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """One C call per range, on a memoryview slice of `buf`: no copy of the bytes (a bytes copy
    of the run, then of each range, cost more than the checksums themselves at 64 KiB bodies and
    no less at 128 B)."""
    with memoryview(buf) as view:
        ranges = map(view.__getitem__, map(slice, starts.tolist(), ends.tolist()))
        return np.fromiter(map(checksum, ranges), dtype=np.int64, count=len(starts))


def digits_value(digits: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(value, ok) of (n, 10) ASCII digit rows; ok is False where a byte is not a digit."""
    d = digits.astype(np.int64) - _ASCII_ZERO
    ok = ((d >= 0) & (d <= 9)).all(axis=1)
    return d @ _POWERS_OF_TEN, ok


def hosts_v6(sys_flags: np.ndarray) -> np.ndarray:
    """True where a SYSFLAG says a host is IPv6 (the batch paths leave those to record.py)."""
    return (sys_flags & _HOSTS_V6) != 0


__all__ = ["HEADER_DTYPE", "STRUCT_PATH_MAX_RECORDS", "EncodedRecords", "StampableRecords", "check_stampable",
           "crc32_each", "crc32c_each", "digits_value", "encode_records", "gather", "gather_field",
           "gather_int", "hosts_v6", "int_view", "scatter_int", "stamp_checked_records", "stamp_records"]
