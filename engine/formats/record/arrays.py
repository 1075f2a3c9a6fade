"""Record fields and byte spans at many positions of one buffer, read with whole-array numpy work.

Every field of the layout (layout.HEADER_DTYPE) is read at all record starts by one fancy index
over an overlapping view of the buffer (element i is the value at bytes [i, i + size)), so no
Python runs per record; checksums are one C call per record, driven by `map`.
"""

from __future__ import annotations

import zlib

import crc32c
import numpy as np

from engine.formats.crc32c_property import CRC32C_DIGITS
from engine.formats.record.layout import HEADER_DTYPE, HOSTS_V6

_ASCII_ZERO = ord("0")
_POWERS_OF_TEN = 10 ** np.arange(CRC32C_DIGITS - 1, -1, -1, dtype=np.int64)


def int_view(u8: np.ndarray, be_dtype) -> np.ndarray:
    """An overlapping view whose element i is the `be_dtype` value at bytes [i, i + size): a
    field at many unaligned positions is then read or written by one fancy index, one element
    per position (rather than `size` bytes per position)."""
    dtype = np.dtype(be_dtype)
    return np.ndarray(shape=(max(len(u8) - dtype.itemsize + 1, 0),), dtype=dtype, buffer=u8,
                      strides=(1,))


def gather(u8: np.ndarray, positions: np.ndarray, width: int) -> np.ndarray:
    """The `width` bytes at each position, as an (n, width) uint8 array (a copy): one fancy
    index over an overlapping view of `width`-byte items, one item per position (indexing every
    byte costs several times more)."""
    if width <= 0:
        return np.zeros((len(positions), 0), dtype=np.uint8)
    return int_view(u8, f"V{width}")[positions].view(np.uint8).reshape(len(positions), width)


def gather_int(u8: np.ndarray, positions: np.ndarray, be_dtype) -> np.ndarray:
    """The big-endian integer of type `be_dtype` ('>i4', '>i8', ...) at each position, as int64."""
    return int_view(u8, be_dtype)[positions].astype(np.int64)


def gather_field(u8: np.ndarray, starts: np.ndarray, name: str) -> np.ndarray:
    """Header field `name` of the records at `starts` (IPv4 layout), as int64."""
    dtype, offset = HEADER_DTYPE.fields[name][:2]
    return gather_int(u8, starts + offset, dtype)


def take_spans(u8: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(int32 offsets, bytes) of the spans u8[starts[i]:ends[i]] laid end to end."""
    lens = ends - starts
    offsets = np.zeros(len(lens) + 1, dtype=np.int64)
    np.cumsum(lens, out=offsets[1:])
    index = np.repeat(starts - offsets[:-1], lens) + np.arange(offsets[-1], dtype=np.int64)
    return offsets.astype(np.int32), u8[index]


def slices(chunk: bytes | memoryview, starts: np.ndarray, ends: np.ndarray):
    """chunk[starts[i]:ends[i]] for each i, lazily (views when `chunk` is a memoryview)."""
    return map(chunk.__getitem__, map(slice, starts.tolist(), ends.tolist()))


def first_false(ok: np.ndarray) -> int:
    """How many leading entries of `ok` are True."""
    return len(ok) if ok.all() else int(np.argmin(ok))


def clip(positions: np.ndarray, valid: np.ndarray) -> np.ndarray:
    """Positions where `valid` (rows whose field is known to lie in the buffer), 0 elsewhere:
    a gather at them stays in the buffer whatever the other rows hold."""
    return positions if valid.all() else np.where(valid, positions, 0)


def hosts_v6(sys_flags: np.ndarray) -> np.ndarray:
    """True where a SYSFLAG says a host is IPv6."""
    return (sys_flags & HOSTS_V6) != 0


def crc32c_each(buf, starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """CRC32C of buf[starts[i]:ends[i]] for each i (int64)."""
    return _checksum_each(crc32c.crc32c, buf, starts, ends)


def crc32_each(buf, starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """zlib CRC32 of buf[starts[i]:ends[i]] for each i (int64; BODYCRC keeps BODY_CRC_MASK of it)."""
    return _checksum_each(zlib.crc32, buf, starts, ends)


def _checksum_each(checksum, buf, starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """One C call per range, on a memoryview slice of `buf`: no copy of the bytes (a bytes copy
    of the run, then of each range, costs more than the checksums; docs/DECISIONS.md#checksums-on-views)."""
    with memoryview(buf) as view:
        return np.fromiter(map(checksum, slices(view, starts, ends)), dtype=np.int64, count=len(starts))


def digits_value(digits: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(value, ok) of (n, CRC32C_DIGITS) ASCII digit rows, most significant first; ok is False
    where a byte is not a digit."""
    d = digits.astype(np.int64) - _ASCII_ZERO
    ok = ((d >= 0) & (d <= 9)).all(axis=1)
    return d @ _POWERS_OF_TEN, ok
