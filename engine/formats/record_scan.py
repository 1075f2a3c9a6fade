"""Scanning commitlog bytes many records at a time: walk, verify, decode what dispatch needs.

The batch path accepts only what it can check completely with whole-array operations: v1
records with IPv4 hosts, ASCII topic and properties, and (when verifying) a well-formed
__CRC32C tail. It returns how many *leading* records pass; the caller hands the first record it
did not accept to `record.decode_record` / `decode_header`, the reference, which either decodes
it (a filler, a v2 or IPv6 record, UTF-8 text) or raises the exact CorruptRecordError. So a
batch scan yields the same records and stops at the same position as a record-by-record scan.

Steps for one run of records in a buffer:
1. `walk_starts`: the TOTALSIZE chain (inherently sequential: a tight struct loop);
2. `verify_spans`: every structural check of `record._locate` at all starts at once (magic,
   PHYSICALOFFSET == position, lengths summing to TOTALSIZE), ASCII text, then BODYCRC and
   CRC32C (one C call per record each) and the stored CRC digits compared as numbers;
3. `decode_dispatch`: queue id and offset, store time, topic, tags code and the index keys
   (UNIQ_KEY, KEYS tokens) of all accepted records, properties parsed with numpy.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from functools import lru_cache
from typing import NamedTuple

import numpy as np

from engine.formats.crc32c_property import CRC32C_PREFIX, CRC32C_PROP_SIZE
from engine.formats.java_hash import tags_code
from engine.formats.properties import KEYS_SEPARATOR, PROP_KEYS, PROP_TAGS, PROP_UNIQ_KEY, SEP_KV, SEP_PROP
from engine.formats.record import (
    BODY_CRC_MASK,
    BODY_OFFSET,
    FILLER_SIZE,
    MAGIC_OFFSET,
    MAGIC_V1,
    PHYSICAL_OFFSET_OFFSET,
    PROPERTIES_LENGTH_SIZE,
    RECORD_FIXED_SIZE,
    TOPIC_LENGTH_SIZE_V1,
    TOTAL_SIZE_FIELD,
    V4_HEADER_SIZE,
    RecordHeader,
    Verify,
)
from engine.formats.record_batch import (
    crc32_each,
    crc32c_each,
    digits_value,
    gather,
    gather_field,
    gather_int,
    hosts_v6,
)

_PREFIX_U8 = np.frombuffer(CRC32C_PREFIX, dtype=np.uint8)
_SEP_KV, _SEP_PROP = SEP_KV[0], SEP_PROP[0]
_KEYS_B, _TAGS_B, _UNIQ_B = PROP_KEYS.encode(), PROP_TAGS.encode(), PROP_UNIQ_KEY.encode()
_KEYS_SEP_B = KEYS_SEPARATOR.encode()
_ASCII_LIMIT = 0x80
_MAGIC_U8 = np.frombuffer(struct.pack(">I", MAGIC_V1), dtype=np.uint8)
_MAGIC_TAIL_BYTES = len(_MAGIC_U8) - 1
# find_starts walks this many records first, and walks on where they average this many bytes:
# a step of the walk (~0.4 us) then costs less than the search's passes over every byte.
_WALK_FIRST_RECORDS = 8
_WALK_MIN_AVG_BYTES = 2048


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


@dataclass(frozen=True, slots=True)
class DispatchColumns:
    """What dispatch needs from many records, one array entry per record (RecordHeader, columnar).

    The index keys of every record, its UNIQ_KEY then its KEYS tokens, in record order, are
    spans of `key_blob` (UTF-8, without the `topic#` prefix); `key_rows` is the record each
    belongs to (rollbacks included: dispatch decides what to index)."""

    commit_pos: np.ndarray
    total_size: np.ndarray
    queue_id: np.ndarray
    queue_offset: np.ndarray
    sys_flag: np.ndarray
    store_ts_ms: np.ndarray
    tags_code: np.ndarray
    topics: list[str]  # distinct topics
    topic_index: np.ndarray  # per record, into `topics`
    key_rows: np.ndarray
    key_blob: bytes
    key_starts: np.ndarray
    key_ends: np.ndarray

    @property
    def count(self) -> int:
        return len(self.commit_pos)

    @property
    def end_pos(self) -> int:
        return int(self.commit_pos[-1] + self.total_size[-1]) if self.count else 0

    @property
    def keys(self) -> list[bytes]:
        """The index keys as bytes objects (for tests and tools; dispatch works on the spans)."""
        return list(_slices(self.key_blob, self.key_starts, self.key_ends))


# ---------------------------------------------------------------- walk and verify


def walk_starts(buf, pos: int, end: int, max_count: int = 1 << 20) -> np.ndarray:
    """Start positions of the TOTALSIZE chain from `pos` while each piece lies within `end`.

    Stops at a TOTALSIZE below the filler size or one running past `end`; what the piece there
    is (a filler, a tear, unwritten space) is for the reference decoder to say."""
    unpack = TOTAL_SIZE_FIELD.unpack_from
    starts: list[int] = []
    append = starts.append
    limit = min(end, len(buf))
    while pos + FILLER_SIZE <= limit and len(starts) < max_count:
        size = unpack(buf, pos)[0]
        if size < FILLER_SIZE or pos + size > limit:
            break
        append(pos)
        pos += size
    return np.array(starts, dtype=np.int64)


def find_starts(buf, pos: int, end: int, base_pos: int) -> np.ndarray:
    """walk_starts, found without walking where it pays: the first records are walked, and
    if they are large (_WALK_MIN_AVG_BYTES on average) the walk goes on, one step per record.
    Otherwise the v1 records whose MAGICCODE and PHYSICALOFFSET (== base_pos + position) match
    are located with whole-array searches over every byte, and kept as far as they chain (each
    starts where the previous one ends); the walk goes on from there (a filler, a v2 record, a
    tear). Same result as walk_starts."""
    head = walk_starts(buf, pos, end, _WALK_FIRST_RECORDS)
    if len(head) < _WALK_FIRST_RECORDS:  # the walk stopped by itself
        return head
    next_pos = int(head[-1]) + TOTAL_SIZE_FIELD.unpack_from(buf, int(head[-1]))[0]
    if next_pos - pos >= _WALK_MIN_AVG_BYTES * len(head):
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
    k = _first_false(chained)
    next_pos = int(cand[k - 1] + sizes[k - 1]) if k else pos
    return np.concatenate([cand[:k], walk_starts(buf, next_pos, end)])


def verify_spans(buf, starts: np.ndarray, base_pos: int, verify: Verify) -> RecordSpans:
    """The leading records of `starts` that pass every check of decode_record(verify)
    (STRUCTURE: those of decode_header), restricted to the batch path's plain records."""
    u8 = np.frombuffer(buf, dtype=np.uint8)
    starts = starts[: _first_false(_prefix_sizes_ok(u8, starts))]
    sizes = gather_field(u8, starts, "total_size")
    ends = starts + sizes
    body_lens = gather_field(u8, starts, "body_length")
    ok = ((gather_field(u8, starts, "magic") == MAGIC_V1)
          & ~hosts_v6(gather_field(u8, starts, "sys_flag"))
          & (gather_field(u8, starts, "commit_pos") == base_pos + starts) & (body_lens >= 0)
          & (starts + BODY_OFFSET + body_lens + TOPIC_LENGTH_SIZE_V1 + PROPERTIES_LENGTH_SIZE <= ends))
    k = _first_false(ok)
    topic_len_pos = starts[:k] + BODY_OFFSET + body_lens[:k]
    topic_lens = u8[topic_len_pos].view(np.int8).astype(np.int64)
    topic_pos = topic_len_pos + TOPIC_LENGTH_SIZE_V1
    plen_pos = topic_pos + topic_lens
    ok = (topic_lens >= 0) & (plen_pos + PROPERTIES_LENGTH_SIZE <= ends[:k])
    k = _first_false(ok)
    props_lens = gather_int(u8, plen_pos[:k], ">i2")
    props_pos = plen_pos[:k] + PROPERTIES_LENGTH_SIZE
    k = _first_false((props_lens >= 1) & (props_pos + props_lens == ends[:k]))
    spans = RecordSpans(starts[:k], body_lens[:k], topic_pos[:k], props_pos[:k], ends[:k])
    spans = _take(spans, _first_false(_text_is_ascii(u8, spans)))
    if verify is not Verify.STRUCTURE:
        spans = _take(spans, _first_false(_checksums_ok(buf, u8, spans)))
    return spans


def _prefix_sizes_ok(u8: np.ndarray, starts: np.ndarray) -> np.ndarray:
    """TOTALSIZE >= a record's fixed part and the header lies in the buffer (so gathers are safe)."""
    if not len(starts):
        return np.zeros(0, dtype=bool)
    sizes = gather_int(u8, starts, ">i4")
    return (sizes >= RECORD_FIXED_SIZE) & (starts + sizes <= len(u8)) & (starts + V4_HEADER_SIZE <= len(u8))


def _first_false(ok: np.ndarray) -> int:
    return len(ok) if ok.all() else int(np.argmin(ok))


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


def _checksums_ok(buf, u8: np.ndarray, spans: RecordSpans) -> np.ndarray:
    """BODYCRC, and a well-formed __CRC32C tail whose digits equal the CRC32C of the record.

    A record without the tail is left to the reference (Verify.ROCKETMQ then looks for a
    __CRC32C property; Verify.MQSTORE refuses the record)."""
    tail_pos = spans.ends - CRC32C_PROP_SIZE
    tails = gather(u8, tail_pos, CRC32C_PROP_SIZE)
    stored, digits_ok = digits_value(tails[:, len(CRC32C_PREFIX):-1])
    has_tail = ((spans.ends - spans.props_pos >= CRC32C_PROP_SIZE) & digits_ok
                & (tails[:, :len(CRC32C_PREFIX)] == _PREFIX_U8).all(axis=1) & (tails[:, -1] == _SEP_PROP))
    ok = has_tail.copy()
    k = _first_false(ok)
    if not k:
        return ok
    body_starts = spans.starts[:k] + BODY_OFFSET
    body_crcs = crc32_each(buf, body_starts, body_starts + spans.body_lens[:k]) & BODY_CRC_MASK
    ok[:k] &= body_crcs == gather_field(u8, spans.starts[:k], "body_crc")
    ok[:k] &= crc32c_each(buf, spans.starts[:k], tail_pos[:k]) == stored[:k]
    return ok


# ---------------------------------------------------------------- decode for dispatch


def decode_dispatch(buf, spans: RecordSpans, base_pos: int) -> DispatchColumns:
    """The DispatchColumns of records accepted by `verify_spans` (any verify level)."""
    u8 = np.frombuffer(buf, dtype=np.uint8)
    n = spans.count
    with memoryview(buf) as view:  # only the topics and properties are copied, not the bodies
        topics, topic_index = _topics(u8, view, spans)
        props = b"".join(_slices(view, spans.props_pos, spans.ends))
    props_ends = np.cumsum(spans.ends - spans.props_pos)
    values = _props_values(props, props_ends, (_TAGS_B, _KEYS_B, _UNIQ_B))
    tags = np.zeros(n, dtype=np.int64)
    rows, v_start, v_end = values[_TAGS_B]
    tags[rows] = np.fromiter(map(_tags_code_of, _slices(props, v_start, v_end)),
                             dtype=np.int64, count=len(rows))
    key_rows, key_starts, key_ends = _index_keys(props, values[_UNIQ_B], values[_KEYS_B])
    return DispatchColumns(
        commit_pos=base_pos + spans.starts, total_size=spans.ends - spans.starts,
        queue_id=gather_field(u8, spans.starts, "queue_id"),
        queue_offset=gather_field(u8, spans.starts, "queue_offset"),
        sys_flag=gather_field(u8, spans.starts, "sys_flag"),
        store_ts_ms=gather_field(u8, spans.starts, "store_ts_ms"),
        tags_code=tags, topics=topics, topic_index=topic_index, key_rows=key_rows, key_blob=props,
        key_starts=key_starts, key_ends=key_ends)


def _slices(chunk: bytes | memoryview, starts: np.ndarray, ends: np.ndarray):
    return map(chunk.__getitem__, map(slice, starts.tolist(), ends.tolist()))


@lru_cache(maxsize=4096)
def _tags_code_of(raw: bytes) -> int:
    return tags_code(raw.decode("ascii"))


def _topics(u8: np.ndarray, view: memoryview, spans: RecordSpans) -> tuple[list[str], np.ndarray]:
    """Distinct topics and each record's index into them (one comparison when all are equal)."""
    n = spans.count
    if not n:
        return [], np.zeros(0, dtype=np.int64)
    topic_lens = spans.props_pos - PROPERTIES_LENGTH_SIZE - spans.topic_pos
    first_len = int(topic_lens[0])
    if (topic_lens == first_len).all():
        raw = gather(u8, spans.topic_pos, first_len)
        if (raw == raw[0]).all():
            return [bytes(raw[0]).decode("ascii")], np.zeros(n, dtype=np.int64)
    raws = list(map(bytes, _slices(view, spans.topic_pos, spans.topic_pos + topic_lens)))
    ids = {raw: i for i, raw in enumerate(dict.fromkeys(raws))}
    index = np.fromiter(map(ids.__getitem__, raws), dtype=np.int64, count=n)
    return [raw.decode("ascii") for raw in ids], index


def _props_values(props: bytes, ends: np.ndarray, names: tuple[bytes, ...]) -> dict:
    """For each property name: (rows, value starts, value ends in `props`) of the records that
    have it, parsed as properties.decode_properties does (split on 0x02, first 0x01 strictly
    inside the piece, later duplicates win). `props` holds every record's properties end to
    end; record i's end at ends[i]."""
    n = len(ends)
    u8 = np.frombuffer(props, dtype=np.uint8)
    starts = np.concatenate([[0], ends[:-1]]) if n else ends
    p2 = np.flatnonzero(u8 == _SEP_PROP)
    p1 = np.flatnonzero(u8 == _SEP_KV)
    seg_start = np.concatenate([starts, p2 + 1])
    seg_row = np.concatenate([np.arange(n), np.searchsorted(ends, p2, side="right")])
    order = np.argsort(seg_start, kind="stable")
    seg_start, seg_row = seg_start[order], seg_row[order]
    nxt = np.searchsorted(p2, seg_start)
    nxt_pos = p2[np.minimum(nxt, len(p2) - 1)] if len(p2) else np.zeros(len(seg_start), np.int64)
    seg_end = np.where((nxt < len(p2)) & (nxt_pos < ends[np.minimum(seg_row, n - 1)]), nxt_pos,
                       ends[np.minimum(seg_row, n - 1)])
    j = np.searchsorted(p1, seg_start)
    first_kv = p1[np.minimum(j, len(p1) - 1)] if len(p1) else np.zeros(len(seg_start), np.int64)
    pair = (j < len(p1)) & (first_kv > seg_start) & (first_kv < seg_end - 1) & (seg_row < n)
    out = {}
    for name in names:
        cand = np.flatnonzero(pair & (first_kv - seg_start == len(name)))
        if len(cand):
            same = (gather(u8, seg_start[cand], len(name)) == np.frombuffer(name, np.uint8)).all(axis=1)
            cand = cand[same]
        rows = seg_row[cand]
        last = np.ones(len(cand), dtype=bool)
        last[:-1] = rows[1:] != rows[:-1]  # a later duplicate wins
        cand = cand[last]
        out[name] = (seg_row[cand], first_kv[cand] + 1, seg_end[cand])
    return out


def _index_keys(props: bytes, uniq: tuple, keys: tuple) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(rows, starts, ends) of each record's UNIQ_KEY then its KEYS tokens (split on spaces,
    empty tokens dropped, as split_keys does), in record order."""
    uniq_rows, u_start, u_end = uniq
    key_rows, k_start, k_end = keys
    spaces = np.flatnonzero(np.frombuffer(props, dtype=np.uint8) == _KEYS_SEP_B[0])
    if not len(k_start):
        spaces = spaces[:0]
    inside = np.searchsorted(k_start, spaces, side="right") - 1
    spaces = spaces[(inside >= 0) & (spaces < k_end[np.maximum(inside, 0)])]
    t_start = np.sort(np.concatenate([k_start, spaces + 1]))
    t_end = np.sort(np.concatenate([k_end, spaces]))
    nonempty = t_end > t_start
    t_start, t_end = t_start[nonempty], t_end[nonempty]
    t_rows = key_rows[np.searchsorted(k_start, t_start, side="right") - 1]
    rows = np.concatenate([uniq_rows, t_rows])
    order = np.argsort(rows, kind="stable")  # UNIQ_KEY first within a record
    return rows[order], np.concatenate([u_start, t_start])[order], np.concatenate([u_end, t_end])[order]


def columns_from_headers(headers: list[RecordHeader]) -> DispatchColumns:
    """DispatchColumns of scalar-decoded headers (the reference path, and what tests compare)."""
    topics = list(dict.fromkeys(h.topic for h in headers))
    ids = {t: i for i, t in enumerate(topics)}
    key_rows, index_keys = [], []
    for row, h in enumerate(headers):
        keys = ([h.uniq_key] if h.uniq_key else []) + [k for k in h.keys if k]
        key_rows += [row] * len(keys)
        index_keys += [k.encode() for k in keys]
    key_ends = np.cumsum(np.array([len(k) for k in index_keys], dtype=np.int64))
    key_starts = key_ends - np.array([len(k) for k in index_keys], dtype=np.int64)

    def col(name: str) -> np.ndarray:
        return np.array([getattr(h, name) for h in headers], dtype=np.int64)

    return DispatchColumns(col("commit_pos"), col("total_size"), col("queue_id"), col("queue_offset"),
                           col("sys_flag"), col("store_ts_ms"), col("tags_code"), topics,
                           np.array([ids[h.topic] for h in headers], dtype=np.int64),
                           np.array(key_rows, dtype=np.int64), b"".join(index_keys), key_starts, key_ends)
