"""What dispatch needs from many verified records, as columns (RecordHeader, columnar).

`decode_dispatch` reads queue id and offset, store time, topic, tags code and the index keys
(UNIQ_KEY, KEYS tokens) of the records spans.verify_spans accepted, with whole-array work:
header fields are gathers, properties are parsed by props_many as properties.decode_properties
does. `columns_from_headers` builds the same columns from scalar.decode_header's records (the
reference, and what tests compare).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from engine.formats.java_hash import tags_code
from engine.formats.properties import PROP_KEYS, PROP_TAGS, PROP_UNIQ_KEY
from engine.formats.record.arrays import gather, gather_field, slices
from engine.formats.record.layout import PROPERTIES_LENGTH_SIZE
from engine.formats.record.props_many import last_values, split_pairs, split_tokens
from engine.formats.record.scalar import RecordHeader
from engine.formats.record.spans import RecordSpans

_KEYS_B, _TAGS_B, _UNIQ_B = PROP_KEYS.encode(), PROP_TAGS.encode(), PROP_UNIQ_KEY.encode()


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
    props_u8 = np.frombuffer(props, dtype=np.uint8)
    pairs = split_pairs(props_u8, np.cumsum(spans.ends - spans.props_pos))
    tags = np.zeros(n, dtype=np.int64)
    rows, v_start, v_end = last_values(props_u8, pairs, _TAGS_B)
    tags[rows] = np.fromiter(map(_tags_code_of, slices(props, v_start, v_end)),
                             dtype=np.int64, count=len(rows))
    key_rows, key_starts, key_ends = _index_keys(props_u8, last_values(props_u8, pairs, _UNIQ_B),
                                                 last_values(props_u8, pairs, _KEYS_B))
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


def _index_keys(u8: np.ndarray, uniq: tuple, keys: tuple) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(rows, starts, ends) of each record's UNIQ_KEY then its KEYS tokens, in record order."""
    uniq_rows, u_start, u_end = uniq
    t_rows, t_start, t_end = split_tokens(u8, *keys)
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
