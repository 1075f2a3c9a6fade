"""What makes a record structurally valid, written once, in a scalar and a vector form.

A record at commit position P in a buffer is sound when (the rules, in the order checked):

    TOTAL_SIZE         RECORD_FIXED_SIZE <= TOTALSIZE <= the bytes left in the buffer
    MAGIC              MAGICCODE is v1 or v2 (v2: TOPICLENGTH is 2 bytes)
    HEADER             the fixed header, with its IPv6 hosts, lies within TOTALSIZE
    POSITION           PHYSICALOFFSET == P (producers' unstamped records are exempt)
    BODY_LENGTH        BODYLENGTH >= 0, and the body, TOPICLENGTH and PROPERTIESLENGTH lie
                       within TOTALSIZE
    TOPIC_LENGTH       TOPICLENGTH >= 1 (a record names its topic), and the topic and
                       PROPERTIESLENGTH lie within TOTALSIZE
    PROPERTIES_LENGTH  PROPERTIESLENGTH >= 0, and the properties end exactly at TOTALSIZE

The scalar form (`check_head`, `check_header_fits`, `check_position`, `locate_parts`) raises
CorruptRecordError naming the rule broken; it is what decode_record and the supervisor's
request check run. The vector form (`frame_many`) applies the same rules to many records at
once and gives a mask; it is what the batch scanner and the consumer's gather run. Checksums
(BODYCRC, the __CRC32C tail) are integrity, not structure: decode_record checks them at its
Verify level.
"""

from __future__ import annotations

import struct
from typing import NamedTuple

import numpy as np

from engine.errors import CorruptRecordError
from engine.formats.record.arrays import clip, gather_int, int_view
from engine.formats.record.layout import (
    BODY_LENGTH_OFFSET,
    BODY_OFFSET,
    BORNHOST_V6,
    HEADER_DTYPE,
    HOST_V6_SHIFT,
    HOSTS_V6,
    MAGIC_V1,
    MAGIC_V2,
    PROPERTIES_LENGTH_SIZE,
    RECORD_FIXED_SIZE,
    STORE_TS_OFFSET,
    STOREHOST_V6,
    TOPIC_LENGTH_SHIFT_V2,
    TOPIC_LENGTH_SIZE_V1,
    TOPIC_LENGTH_SIZE_V2,
    V4_HEADER_SIZE,
)

_I8, _I16 = struct.Struct(">b"), struct.Struct(">h")
RECORD_MAGICS = (MAGIC_V1, MAGIC_V2)
_HEADER_VOID = f"V{V4_HEADER_SIZE}"


# ---------------------------------------------------------------- scalar form


def check_head(total_size: int, magic: int, avail: int, commit_pos: int) -> None:
    """Rules MAGIC and TOTAL_SIZE for a piece that is not a filler (`avail`: bytes left)."""
    if magic not in RECORD_MAGICS:
        reason = ("unwritten space (zero TOTALSIZE and magic)" if total_size == 0 and magic == 0
                  else f"unknown magic 0x{magic:08X}")
        raise CorruptRecordError(reason, pos=commit_pos)
    if not RECORD_FIXED_SIZE <= total_size <= avail:
        raise CorruptRecordError(f"TOTALSIZE {total_size} outside {RECORD_FIXED_SIZE}..{avail} "
                                 "(bytes left in the buffer)", pos=commit_pos)


def check_header_fits(body_pos: int, end: int, commit_pos: int, total_size: int) -> None:
    """Rule HEADER: a header with IPv6 hosts is longer; it must still lie within TOTALSIZE."""
    if body_pos > end:
        raise _size_mismatch("the header with IPv6 hosts", commit_pos, total_size)


def check_position(physical_offset: int, commit_pos: int, total_size: int) -> None:
    """Rule POSITION: a stored record names its own commit position."""
    if physical_offset != commit_pos:
        raise CorruptRecordError(f"PHYSICALOFFSET {physical_offset} is not the record's position",
                                 pos=commit_pos, size=total_size)


def locate_parts(buf, pos: int, total_size: int, magic: int, body_pos: int, body_len: int,
                 commit_pos: int) -> tuple[int, int, int]:
    """Rules BODY_LENGTH, TOPIC_LENGTH, PROPERTIES_LENGTH for the record at buf[pos:], whose
    header has been read: (body end, topic start, properties start), positions in `buf` (a plain
    tuple: this runs once per record on the supervisor's and the decoder's hot paths)."""
    end = pos + total_size
    length_size = TOPIC_LENGTH_SIZE_V1 if magic == MAGIC_V1 else TOPIC_LENGTH_SIZE_V2
    body_end = body_pos + body_len
    if body_len < 0 or body_end + length_size + PROPERTIES_LENGTH_SIZE > end:
        raise _size_mismatch(f"BODYLENGTH {body_len}", commit_pos, total_size)
    topic_len = (_I8 if length_size == TOPIC_LENGTH_SIZE_V1 else _I16).unpack_from(buf, body_end)[0]
    topic_pos = body_end + length_size
    if topic_len < 1:
        raise CorruptRecordError(f"TOPICLENGTH {topic_len} names no topic", pos=commit_pos, size=total_size)
    if topic_pos + topic_len + PROPERTIES_LENGTH_SIZE > end:
        raise _size_mismatch(f"TOPICLENGTH {topic_len}", commit_pos, total_size)
    props_len = _I16.unpack_from(buf, topic_pos + topic_len)[0]
    props_pos = topic_pos + topic_len + PROPERTIES_LENGTH_SIZE
    if props_len < 0 or props_pos + props_len != end:
        raise _size_mismatch(f"PROPERTIESLENGTH {props_len}", commit_pos, total_size)
    return body_end, topic_pos, props_pos


def _size_mismatch(what: str, commit_pos: int, total_size: int) -> CorruptRecordError:
    return CorruptRecordError(f"{what} does not fit TOTALSIZE {total_size}", pos=commit_pos, size=total_size)


# ---------------------------------------------------------------- vector form


class FrameColumns(NamedTuple):
    """The frame of many records (one entry per record; positions in the buffer, int64).

    `framed` is False where a rule is broken; the other columns are then meaningless there
    (`arrays.clip` positions by `framed` before gathering at them)."""

    framed: np.ndarray  # bool
    header: np.ndarray  # layout.HEADER_DTYPE rows: the IPv4 header at each record's position
    v6_rows: np.ndarray  # the records with an IPv6 host: their fields after the host moved
    total_size: np.ndarray
    magic: np.ndarray
    sys_flag: np.ndarray
    store_ts_pos: np.ndarray
    body_pos: np.ndarray
    body_len: np.ndarray
    topic_pos: np.ndarray
    topic_len: np.ndarray
    props_pos: np.ndarray
    ends: np.ndarray


def frame_many(u8: np.ndarray, positions: np.ndarray, base_pos: int) -> FrameColumns:
    """Every rule at the `positions` of the stored records in `u8` (which starts at commit
    position `base_pos`), whole arrays at a time: one gather of all headers, a few of the
    lengths."""
    size = len(u8)
    if size < V4_HEADER_SIZE:  # holds no record; the gathers at 0 below need a header's bytes
        u8 = np.zeros(V4_HEADER_SIZE, dtype=np.uint8)
    pos = np.asarray(positions, dtype=np.int64)
    inside = (pos >= 0) & (pos <= size - V4_HEADER_SIZE)  # an IPv4 header: the shortest
    head = clip(pos, inside)
    header = int_view(u8, _HEADER_VOID)[head].view(HEADER_DTYPE)
    total, magic, sys_flag, body_len = (header[name].astype(np.int64) for name in
                                        ("total_size", "magic", "sys_flag", "body_length"))
    store_ts_pos = head + STORE_TS_OFFSET
    body_pos = head + BODY_OFFSET
    v6 = np.flatnonzero(sys_flag & HOSTS_V6)
    if len(v6):
        inside[v6] &= _v6_shift(u8, head[v6], sys_flag[v6], store_ts_pos, body_pos, body_len, v6)
    end = head + total
    framed = (inside & (total >= RECORD_FIXED_SIZE) & (end <= size) & (body_len >= 0)
              & (header["commit_pos"] == base_pos + pos))
    v1 = magic == MAGIC_V1
    all_v1 = bool(v1.all())
    if all_v1:  # the common case: a one-byte TOPICLENGTH everywhere
        length_size = TOPIC_LENGTH_SIZE_V1
    else:
        framed &= v1 | (magic == MAGIC_V2)
        length_size = np.where(v1, TOPIC_LENGTH_SIZE_V1, TOPIC_LENGTH_SIZE_V2)
    topic_len_pos = body_pos + body_len
    framed &= topic_len_pos + length_size + PROPERTIES_LENGTH_SIZE <= end
    topic_len_pos = clip(topic_len_pos, framed)
    if all_v1:
        topic_len = u8[topic_len_pos].view(np.int8).astype(np.int64)
    else:  # a v1 TOPICLENGTH is the first byte of the two read
        topic_len = gather_int(u8, topic_len_pos, ">i2")
        topic_len = np.where(v1, topic_len >> (8 * TOPIC_LENGTH_SHIFT_V2), topic_len)
    topic_pos = topic_len_pos + length_size
    props_len_pos = topic_pos + topic_len
    framed &= (topic_len >= 1) & (props_len_pos + PROPERTIES_LENGTH_SIZE <= end)
    props_len_pos = clip(props_len_pos, framed)
    props_pos = props_len_pos + PROPERTIES_LENGTH_SIZE
    framed &= props_pos + gather_int(u8, props_len_pos, ">i2") == end
    return FrameColumns(framed, header, v6, total, magic, sys_flag, store_ts_pos, body_pos, body_len,
                        topic_pos, topic_len, props_pos, end)


def _v6_shift(u8: np.ndarray, head: np.ndarray, sys_flag: np.ndarray, store_ts_pos: np.ndarray,
              body_pos: np.ndarray, body_len: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """Move STORETIMESTAMP and the body of the `rows` with an IPv6 host (each such host shifts
    what follows it by HOST_V6_SHIFT) and re-read their BODYLENGTH; which headers lie inside."""
    born_shift = np.where(sys_flag & BORNHOST_V6, HOST_V6_SHIFT, 0)
    shift = born_shift + np.where(sys_flag & STOREHOST_V6, HOST_V6_SHIFT, 0)
    store_ts_pos[rows] += born_shift
    body_pos[rows] += shift
    inside = body_pos[rows] <= len(u8)  # the whole header, IPv6 hosts included
    body_len[rows] = gather_int(u8, clip(head + BODY_LENGTH_OFFSET + shift, inside), ">i4")
    return inside
