"""What dispatch needs from many verified records, as columns (RecordHeader, columnar).

`decode_dispatch` reads queue id and offset, store time, topic, tags code and the index keys
(UNIQ_KEY, KEYS tokens) of the records spans.verify_spans accepted, with whole-array work:
header fields are gathers, properties are parsed with numpy as properties.decode_properties
does. `columns_from_headers` builds the same columns from scalar.decode_header's records (the
reference, and what tests compare).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from engine.formats.java_hash import tags_code
from engine.formats.properties import KEYS_SEPARATOR, PROP_KEYS, PROP_TAGS, PROP_UNIQ_KEY, SEP_KV, SEP_PROP
from engine.formats.record.arrays import gather, gather_field, slices
from engine.formats.record.layout import PROPERTIES_LENGTH_SIZE
from engine.formats.record.scalar import RecordHeader
from engine.formats.record.spans import RecordSpans

_SEP_KV, _SEP_PROP = SEP_KV[0], SEP_PROP[0]
_KEYS_B, _TAGS_B, _UNIQ_B = PROP_KEYS.encode(), PROP_TAGS.encode(), PROP_UNIQ_KEY.encode()
_KEYS_SEP_B = KEYS_SEPARATOR.encode()


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
        return list(slices(self.key_blob, self.key_starts, self.key_ends))


def decode_dispatch(buf, spans: RecordSpans, base_pos: int) -> DispatchColumns:
    """The DispatchColumns of records accepted by `verify_spans` (any verify level)."""
    u8 = np.frombuffer(buf, dtype=np.uint8)
    n = spans.count
    with memoryview(buf) as view:  # only the topics and properties are copied, not the bodies
        topics, topic_index = _topics(u8, view, spans)
        props = b"".join(slices(view, spans.props_pos, spans.ends))
    props_ends = np.cumsum(spans.ends - spans.props_pos)
    values = _props_values(props, props_ends, (_TAGS_B, _KEYS_B, _UNIQ_B))
    tags = np.zeros(n, dtype=np.int64)
    rows, v_start, v_end = values[_TAGS_B]
    tags[rows] = np.fromiter(map(_tags_code_of, slices(props, v_start, v_end)),
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
    raws = list(map(bytes, slices(view, spans.topic_pos, spans.topic_pos + topic_lens)))
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
