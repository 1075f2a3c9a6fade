"""Locating and verifying commitlog records many at a time (the batch scanner's first steps).

The batch path accepts only what it can check completely with whole-array operations: v1
records with IPv4 hosts, ASCII topic and properties, and (when verifying) a well-formed
__CRC32C tail. It returns how many *leading* records pass; the caller hands the first record it
did not accept to `scalar.decode_record` / `decode_header`, the reference, which either decodes
it (a filler, a v2 or IPv6 record, UTF-8 text) or raises the exact CorruptRecordError. So a
batch scan yields the same records and stops at the same position as a record-by-record scan.

Steps for one run of records in a buffer:
1. `walk_starts` / `find_starts`: the TOTALSIZE chain (a tight struct loop, or a search);
2. `verify_spans`: the structural rules (structure.frame_many, the same as decode_record's) at
   all starts at once, ASCII text, then BODYCRC and CRC32C (one C call per record each) and
   the stored CRC digits compared as numbers;
3. dispatch_columns.decode_dispatch: what dispatch needs from the accepted records.
"""

from __future__ import annotations

import struct
from typing import NamedTuple

import numpy as np

from engine.formats.crc32c_property import CRC32C_PREFIX, CRC32C_PROP_SIZE
from engine.formats.properties import SEP_PROP
from engine.formats.record.arrays import (
    crc32_each,
    crc32c_each,
    digits_value,
    first_false,
    gather,
    gather_field,
    gather_int,
    hosts_v6,
)
from engine.formats.record.layout import (
    BODY_CRC_MASK,
    BODY_OFFSET,
    FILLER_SIZE,
    MAGIC_OFFSET,
    MAGIC_V1,
    PHYSICAL_OFFSET_OFFSET,
    PROPERTIES_LENGTH_SIZE,
    RECORD_FIXED_SIZE,
    TOTAL_SIZE_FIELD,
    V4_HEADER_SIZE,
)
from engine.formats.record.scalar import Verify
from engine.formats.record.structure import frame_many
from engine.tuning import WALK_FIRST_RECORDS, WALK_MIN_AVG_BYTES

_PREFIX_U8 = np.frombuffer(CRC32C_PREFIX, dtype=np.uint8)
_SEP_PROP = SEP_PROP[0]
_ASCII_LIMIT = 0x80
_MAGIC_U8 = np.frombuffer(struct.pack(">I", MAGIC_V1), dtype=np.uint8)
_MAGIC_TAIL_BYTES = len(_MAGIC_U8) - 1


class RecordSpans(NamedTuple):
    """The accepted records of one buffer: where each starts, its body length, where its topic
    and properties start, and where it ends (positions in the buffer)."""

    starts: np.ndarray  # int64 file positions
    body_lens: np.ndarray
    topic_pos: np.ndarray
    props_pos: np.ndarray
    ends: np.ndarray

    @property
    def count(self) -> int:
        return len(self.starts)


# ---------------------------------------------------------------- walk and verify


def walk_starts(buf, pos: int, end: int, max_count: int = 1 << 20) -> np.ndarray:
    """Start positions of the TOTALSIZE chain from `pos` while each piece lies within `end`.

    Stops at a TOTALSIZE below the filler size or one running past `end`; what the piece there
    is (a filler, a tear, unwritten space) is for the reference decoder to say."""
    return np.array(walk_chain(buf, pos, end, max_count)[0], dtype=np.int64)


def walk_chain(buf, pos: int, end: int, max_count: int) -> tuple[list[int], list[int]]:
    """walk_starts as lists of starts and sizes (for callers that go on record by record)."""
    unpack = TOTAL_SIZE_FIELD.unpack_from
    starts: list[int] = []
    sizes: list[int] = []
    limit = len(buf) if end > len(buf) else end  # not min(): this runs per request, often for one record
    for _ in range(max_count):
        if pos + FILLER_SIZE > limit:
            break
        size = unpack(buf, pos)[0]
        if size < FILLER_SIZE or pos + size > limit:
            break
        starts.append(pos)
        sizes.append(size)
        pos += size
    return starts, sizes


def find_starts(buf, pos: int, end: int, base_pos: int) -> np.ndarray:
    """walk_starts, found without walking where it pays: the first records are walked, and
    if they are large (WALK_MIN_AVG_BYTES on average) the walk goes on, one step per record.
    Otherwise the v1 records whose MAGICCODE and PHYSICALOFFSET (== base_pos + position) match
    are located with whole-array searches over every byte, and kept as far as they chain (each
    starts where the previous one ends); the walk goes on from there (a filler, a v2 record, a
    tear). Same result as walk_starts."""
    head = walk_starts(buf, pos, end, WALK_FIRST_RECORDS)
    if len(head) < WALK_FIRST_RECORDS:  # the walk stopped by itself
        return head
    next_pos = int(head[-1]) + TOTAL_SIZE_FIELD.unpack_from(buf, int(head[-1]))[0]
    if next_pos - pos >= WALK_MIN_AVG_BYTES * len(head):
        return np.concatenate([head, walk_starts(buf, next_pos, end)])
    return np.concatenate([head, _search_starts(buf, next_pos, end, base_pos)])


def _search_starts(buf, pos: int, end: int, base_pos: int) -> np.ndarray:
    """find_starts by the whole-array search from `pos`."""
    u8 = np.frombuffer(buf, dtype=np.uint8)
    limit = min(end, len(u8))
    window = u8[pos + MAGIC_OFFSET:limit]
    hits = np.flatnonzero(window == _MAGIC_U8[0])
    hits = hits[hits + _MAGIC_TAIL_BYTES + 1 <= len(window)]
    for i in range(1, len(_MAGIC_U8)):
        hits = hits[window[hits + i] == _MAGIC_U8[i]]
    cand = hits + pos
    cand = cand[cand + V4_HEADER_SIZE <= limit]
    cand = cand[gather_int(u8, cand + PHYSICAL_OFFSET_OFFSET, ">i8") == base_pos + cand]
    sizes = gather_int(u8, cand, ">i4")
    chained = (cand + sizes <= limit) & (sizes >= RECORD_FIXED_SIZE)
    chained[0:1] &= cand[0:1] == pos
    chained[1:] &= cand[1:] == cand[:-1] + sizes[:-1]
    k = first_false(chained)
    next_pos = int(cand[k - 1] + sizes[k - 1]) if k else pos
    return np.concatenate([cand[:k], walk_starts(buf, next_pos, end)])


def verify_spans(buf, starts: np.ndarray, base_pos: int, verify: Verify) -> RecordSpans:
    """The leading records of `starts` that pass every check of decode_record(verify)
    (STRUCTURE: those of decode_header), restricted to the batch path's plain records: v1,
    IPv4 hosts, non-empty properties (which the ASCII check needs) and ASCII text."""
    u8 = np.frombuffer(buf, dtype=np.uint8)
    frame = frame_many(u8, starts, base_pos)
    ends = frame.ends
    k = first_false(frame.framed & (frame.magic == MAGIC_V1) & ~hosts_v6(frame.sys_flag)
                    & (ends > frame.props_pos))
    spans = RecordSpans(starts[:k], frame.body_len[:k], frame.topic_pos[:k], frame.props_pos[:k], ends[:k])
    spans = _take(spans, first_false(_text_is_ascii(u8, spans)))
    if verify is not Verify.STRUCTURE:
        spans = _take(spans, first_false(_checksums_ok(buf, u8, spans)))
    return spans


def _take(spans: RecordSpans, k: int) -> RecordSpans:
    return spans if k == spans.count else RecordSpans(*(column[:k] for column in spans))


def _text_is_ascii(u8: np.ndarray, spans: RecordSpans) -> np.ndarray:
    """Per record: topic and properties are ASCII (valid UTF-8 beyond doubt), by one reduceat."""
    n = spans.count
    if not n:
        return np.zeros(0, dtype=bool)
    lo = int(spans.starts[0])
    topic_ends = spans.props_pos - PROPERTIES_LENGTH_SIZE
    bounds = np.stack([spans.topic_pos, topic_ends, spans.props_pos, spans.ends], axis=1).ravel()[:-1]
    highest = np.maximum.reduceat(u8[lo:int(spans.ends[-1])], bounds - lo)
    topic_max = np.where(topic_ends > spans.topic_pos, highest[0::4], 0)
    return (topic_max < _ASCII_LIMIT) & (highest[2::4] < _ASCII_LIMIT)


def crc32c_tails(u8: np.ndarray, props_pos: np.ndarray, ends: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(has_tail, stored CRC32C) of the records whose properties are u8[props_pos:ends]: the
    vector form of crc32c_property.read_crc32c_tail (a well-formed 20-byte __CRC32C tail)."""
    tails = gather(u8, ends - CRC32C_PROP_SIZE, CRC32C_PROP_SIZE)
    stored, digits_ok = digits_value(tails[:, len(CRC32C_PREFIX):-1])
    has_tail = ((ends - props_pos >= CRC32C_PROP_SIZE) & digits_ok
                & (tails[:, :len(CRC32C_PREFIX)] == _PREFIX_U8).all(axis=1) & (tails[:, -1] == _SEP_PROP))
    return has_tail, stored


def _checksums_ok(buf, u8: np.ndarray, spans: RecordSpans) -> np.ndarray:
    """BODYCRC, and a well-formed __CRC32C tail whose digits equal the CRC32C of the record.

    A record without the tail is left to the reference (Verify.ROCKETMQ then looks for a
    __CRC32C property; Verify.MQSTORE refuses the record)."""
    has_tail, stored = crc32c_tails(u8, spans.props_pos, spans.ends)
    ok = has_tail.copy()
    k = first_false(ok)
    if not k:
        return ok
    body_starts = spans.starts[:k] + BODY_OFFSET
    body_crcs = crc32_each(buf, body_starts, body_starts + spans.body_lens[:k]) & BODY_CRC_MASK
    ok[:k] &= body_crcs == gather_field(u8, spans.starts[:k], "body_crc")
    ok[:k] &= crc32c_each(buf, spans.starts[:k], spans.ends[:k] - CRC32C_PROP_SIZE) == stored[:k]
    return ok
