"""Hash index file: RocketMQ IndexFile layout (header, slot table, entry array), big-endian.

    file:   header 40 | slots slot_count x 4 | entries entry_count x 20

    header  off  size  field
              0     8  begin_ts_ms          store time of the first entry
              8     8  end_ts_ms            store time of the last entry
             16     8  begin_commit_pos
             24     8  end_commit_pos
             32     4  hash_slot_count      slots ever filled
             36     4  index_count          next entry number; starts at 1 (entry 0 is unused)

    slot    0  4  newest entry number of the slot's chain, 0 = empty

    entry   0  4  key_hash      index_key_hash(`topic#key`)
            4  8  commit_pos
           12  4  time_diff_s   (store_ts_ms - begin_ts_ms) // 1000, clamped to 0..INT_MAX
           16  4  prev_index    previous entry of the same slot, 0 ends the chain

A key lives in slot key_hash % slot_count of the file, and in index shard
CRC32C(`topic#key`) % shard_count (never the Java hash: it would leave most slots of each
shard empty). Index files are derived data, rebuilt or trimmed from the commitlog.
The codecs return raw values; load-time fixes (index_count <= 0 -> 1) belong to the reader.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

import crc32c
import numpy as np

from engine.errors import BadInputError, CorruptIndexError
from engine.formats.java_hash import index_key_hash

INDEX_HEADER_FMT = ">qqqqii"
INDEX_HEADER_SIZE = 40
SLOT_FMT = ">i"
SLOT_SIZE = 4
INDEX_ENTRY_FMT = ">iqii"
INDEX_ENTRY_SIZE = 20
assert struct.calcsize(INDEX_HEADER_FMT) == INDEX_HEADER_SIZE
assert struct.calcsize(SLOT_FMT) == SLOT_SIZE
assert struct.calcsize(INDEX_ENTRY_FMT) == INDEX_ENTRY_SIZE
INDEX_HEADER = struct.Struct(INDEX_HEADER_FMT)
SLOT = struct.Struct(SLOT_FMT)
INDEX_ENTRY = struct.Struct(INDEX_ENTRY_FMT)
# numpy views for vectorised scans of the slot table and entry array
SLOT_DTYPE = np.dtype(">i4")
INDEX_ENTRY_DTYPE = np.dtype([("key_hash", ">i4"), ("commit_pos", ">i8"), ("time_diff_s", ">i4"),
                              ("prev_index", ">i4")])
assert SLOT_DTYPE.itemsize == SLOT_SIZE and INDEX_ENTRY_DTYPE.itemsize == INDEX_ENTRY_SIZE

FIRST_INDEX = 1  # index_count of a fresh file; entry 0 is never used
INT32_MAX = 2**31 - 1
KEY_SEPARATOR = "#"


@dataclass(frozen=True, slots=True)
class IndexHeader:
    """The 40-byte header of an index file."""

    begin_ts_ms: int = 0
    end_ts_ms: int = 0
    begin_commit_pos: int = 0
    end_commit_pos: int = 0
    hash_slot_count: int = 0
    index_count: int = FIRST_INDEX


@dataclass(frozen=True, slots=True)
class IndexEntry:
    """One 20-byte index entry, a link in its slot's chain."""

    key_hash: int
    commit_pos: int
    time_diff_s: int
    prev_index: int


def encode_index_header(header: IndexHeader) -> bytes:
    return _pack(INDEX_HEADER, "index header", header.begin_ts_ms, header.end_ts_ms,
                 header.begin_commit_pos, header.end_commit_pos, header.hash_slot_count,
                 header.index_count)


def decode_index_header(buf, pos: int = 0) -> IndexHeader:
    """The header at buf[pos:]; CorruptIndexError if the buffer is too short."""
    return IndexHeader(*_unpack(INDEX_HEADER, buf, pos, "index header"))


def encode_index_entry(entry: IndexEntry) -> bytes:
    return _pack(INDEX_ENTRY, "index entry", entry.key_hash, entry.commit_pos, entry.time_diff_s,
                 entry.prev_index)


def decode_index_entry(buf, pos: int) -> IndexEntry:
    """The entry at buf[pos:] (pos from entry_pos); CorruptIndexError if the buffer is too short."""
    return IndexEntry(*_unpack(INDEX_ENTRY, buf, pos, "index entry"))


def encode_slot(index_no: int) -> bytes:
    return _pack(SLOT, "index slot", index_no)


def decode_slot(buf, pos: int) -> int:
    return _unpack(SLOT, buf, pos, "index slot")[0]


def index_file_size(slot_count: int, entry_count: int) -> int:
    """Bytes of a file with `slot_count` slots and room for `entry_count` entries."""
    return INDEX_HEADER_SIZE + slot_count * SLOT_SIZE + entry_count * INDEX_ENTRY_SIZE


def slot_pos(slot: int) -> int:
    """File position of slot number `slot`."""
    return INDEX_HEADER_SIZE + slot * SLOT_SIZE


def entry_pos(slot_count: int, index_no: int) -> int:
    """File position of entry number `index_no` in a file with `slot_count` slots."""
    return INDEX_HEADER_SIZE + slot_count * SLOT_SIZE + index_no * INDEX_ENTRY_SIZE


def slot_of(key_hash: int, slot_count: int) -> int:
    """The slot of a (non-negative) key hash."""
    return key_hash % slot_count


def time_diff_s(store_ts_ms: int, begin_ts_ms: int) -> int:
    """Seconds from the file's begin timestamp, clamped to 0..INT_MAX; 0 if begin_ts_ms <= 0."""
    if begin_ts_ms <= 0:
        return 0
    return max(0, min(INT32_MAX, (store_ts_ms - begin_ts_ms) // 1000))


def check_geometry(slot_count: int, entry_count: int) -> None:
    """ValueError for a slot or entry count no index file can have (config is checked earlier)."""
    if slot_count < 1 or entry_count < 2 or entry_count > INT32_MAX:
        raise ValueError(f"bad index geometry: {slot_count} slots, {entry_count} entries")


def header_problem(h: IndexHeader, slot_count: int, entry_count: int) -> str | None:
    """Why a decoded header cannot belong to a file of this geometry, or None."""
    if not 1 <= h.index_count <= entry_count:
        return f"index_count {h.index_count} outside [1, {entry_count}]"
    if not 0 <= h.hash_slot_count <= min(slot_count, h.index_count - 1):
        return f"hash_slot_count {h.hash_slot_count} impossible with {h.index_count - 1} keys"
    if h.begin_commit_pos < 0 or h.end_commit_pos < 0:
        return f"negative commit position ({h.begin_commit_pos}, {h.end_commit_pos})"
    return None


def index_key(topic: str, key: str) -> str:
    """The string an index stores a key under: `topic#key`."""
    return f"{topic}{KEY_SEPARATOR}{key}"


def index_key_hash_of(topic: str, key: str) -> int:
    """index_key_hash of `topic#key` (RocketMQ abs rule)."""
    return index_key_hash(index_key(topic, key))


def shard_of(topic: str, key: str, shard_count: int) -> int:
    """The index shard that owns a key: CRC32C of UTF-8 `topic#key`, modulo the shard count."""
    return crc32c.crc32c(index_key(topic, key).encode("utf-8")) % shard_count


def _pack(layout: struct.Struct, what: str, *values: int) -> bytes:
    try:
        return layout.pack(*values)
    except struct.error as exc:
        raise BadInputError(what, str(exc)) from None


def _unpack(layout: struct.Struct, buf, pos: int, what: str) -> tuple:
    if pos < 0 or len(buf) - pos < layout.size:
        raise CorruptIndexError(f"{what} at byte {pos} runs past the end ({len(buf)} bytes)")
    return layout.unpack_from(buf, pos)
