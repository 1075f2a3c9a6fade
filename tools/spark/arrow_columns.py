"""Arrow record batches of many records at once, from the spans the batch scanner accepted.

`engine.formats.record.spans.verify_spans` accepts leading runs of plain records (v1, IPv4
hosts, ASCII topic and properties; with every CRC checked unless verify is NONE). This module
turns such a run into one `pyarrow.RecordBatch` in the source's schema (scan.arrow_schema),
or only the columns a scan asks for (the others are not decoded), with whole-array work. It
knows nothing of the record layout: header fields, hosts, msgIds, the __CRC32C tail and the
properties come from the record codec (engine.formats.record.arrays, hosts, spans,
props_many); text and bodies become Arrow arrays built from offsets into one copy of the
bytes (no Python object per field).

The result is the one `scan.message_values` / `scan.dispatch_values` give for the same
records through `record.decode_record` (tests/spark/test_scan_batches.py compares them).
Properties are parsed as `properties.decode_properties` does; a run in which a record repeats
a property name (a later duplicate wins in a dict, and keeps the first one's place) is left to
the scalar path: `message_batch` returns None.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from engine.formats.properties import PROP_CRC32C, PROP_KEYS, PROP_TAGS, PROP_UNIQ_KEY
from engine.formats.record.arrays import gather_field, slices, take_spans
from engine.formats.record.dispatch_columns import decode_dispatch
from engine.formats.record.hosts import MSG_ID_V4_CHARS, Host, host_texts, msg_id_digits, packed_hosts
from engine.formats.record.layout import BODY_OFFSET, PROPERTIES_LENGTH_SIZE
from engine.formats.record.props_many import (
    key_heads,
    may_repeat_keys,
    name_head,
    split_pairs,
    split_tokens,
)
from engine.formats.record.spans import RecordSpans, crc32c_tails
from engine.record_rules import unindexed_rollback_mask

_TS = pa.timestamp("us", tz="UTC")
_PADDING_BYTES = 8  # after the properties blob: a key head reads 8 bytes at any key start


# ---------------------------------------------------------------- arrays from spans


def spans_in_order(buf, starts: np.ndarray, ends: np.ndarray) -> pa.Array:
    """The spans buf[starts[i]:ends[i]], each at or after the previous one's end (within 2 GiB),
    as a binary array copied once by Arrow's take: `buf`, viewed without a copy as alternating
    spans and the bytes between them, keeps every other value (no Python object per span)."""
    n = len(starts)
    bounds = np.zeros(2 * n + 1, dtype=np.int32)  # span i is value 2i, the gap after it 2i + 1
    if n:
        bounds[0:-1:2], bounds[1::2], bounds[-1] = starts, ends, ends[-1]
    view = pa.Array.from_buffers(pa.binary(), 2 * n, [None, pa.py_buffer(bounds), pa.py_buffer(buf)])
    return view.take(pa.array(np.arange(0, 2 * n, 2)))


def string_array(u8: np.ndarray, starts: np.ndarray, ends: np.ndarray,
                 valid: np.ndarray | None = None) -> pa.Array:
    """An Arrow string array of the spans (ASCII, as verify_spans accepted); null where `valid`
    is False. Spans in order (topics, keys, tokens) take one Arrow copy, others a gather."""
    if not len(starts) or (starts[0] >= 0 and (starts[1:] >= ends[:-1]).all()):
        offsets, data = spans_in_order(u8, starts, ends).buffers()[1:]
    else:
        offsets, data = (pa.py_buffer(a) for a in take_spans(u8, starts, ends))
    bitmap = None if valid is None else pa.py_buffer(np.packbits(valid, bitorder="little"))
    return pa.Array.from_buffers(pa.string(), len(starts), [bitmap, offsets, data])


def body_array(chunk: bytes, starts: np.ndarray, ends: np.ndarray) -> pa.Array:
    """Bodies as an Arrow binary array (records, and so bodies, are in order)."""
    return spans_in_order(chunk, starts, ends)


def _row_offsets(rows: np.ndarray, n: int) -> np.ndarray:
    """List offsets for items belonging to `rows` (sorted), n rows."""
    offsets = np.zeros(n + 1, dtype=np.int32)
    np.cumsum(np.bincount(rows, minlength=n), out=offsets[1:])
    return offsets


def _list_array(rows: np.ndarray, n: int, values: pa.Array) -> pa.Array:
    return pa.ListArray.from_arrays(pa.array(_row_offsets(rows, n)), values)


# ---------------------------------------------------------------- properties


def _props_blob(chunk: bytes, spans: RecordSpans) -> tuple[np.ndarray, np.ndarray]:
    """Every record's properties end to end (u8, then padding) and each record's end in it."""
    blob = b"".join([*slices(chunk, spans.props_pos, spans.ends), bytes(_PADDING_BYTES)])
    return np.frombuffer(blob, dtype=np.uint8), np.cumsum(spans.ends - spans.props_pos)


def parse_pieces(u8: np.ndarray, row_ends: np.ndarray) -> tuple[np.ndarray, ...] | None:
    """(rows, key starts, separators, value ends, key heads) of every key/value pair, in record
    order, as decode_properties finds them; None if a record may repeat a key (a dict keeps the
    first one's place and the last one's value: left to the scalar path). `u8` ends with
    padding (props_many.key_heads)."""
    pairs = split_pairs(u8, row_ends)
    heads = key_heads(u8, pairs)
    if may_repeat_keys(u8, pairs, heads):
        return None
    return (*pairs, heads)


def _named(starts: np.ndarray, kv: np.ndarray, heads: np.ndarray, name: str) -> np.ndarray:
    """Which pairs have the key `name` (at most 8 bytes: the key head is the whole key)."""
    length, head = name_head(name)
    return (kv - starts == length) & (heads == head)


def _value_column(u8: np.ndarray, n: int, rows: np.ndarray, kv: np.ndarray, ends: np.ndarray,
                  mask: np.ndarray) -> pa.Array:
    """A string column: the value of the masked pair of each row, null where there is none."""
    starts, stops = np.zeros(n, dtype=np.int64), np.zeros(n, dtype=np.int64)
    starts[rows[mask]], stops[rows[mask]] = kv[mask] + 1, ends[mask]
    valid = np.zeros(n, dtype=bool)
    valid[rows[mask]] = True
    # a row without the value gets an empty span where the one before ended: spans stay in order
    stops = np.maximum.accumulate(stops)
    return string_array(u8, np.where(valid, starts, stops), stops, valid=valid)


def _key_tokens(u8: np.ndarray, n: int, rows: np.ndarray, starts: np.ndarray,
                ends: np.ndarray) -> pa.Array:
    """list<string>: each row's KEYS value split on spaces, empty tokens dropped (split_keys)."""
    t_rows, t_start, t_end = split_tokens(u8, rows, starts, ends)
    return _list_array(t_rows, n, string_array(u8, t_start, t_end))


def msg_id_array(store_packed: np.ndarray, commit_pos: np.ndarray) -> pa.Array:
    """make_msg_id of IPv4 store hosts, as an Arrow string array."""
    n = len(commit_pos)
    digits = msg_id_digits(store_packed, commit_pos)
    offsets = np.arange(0, MSG_ID_V4_CHARS * n + 1, MSG_ID_V4_CHARS, dtype=np.int32)
    return pa.Array.from_buffers(pa.string(), n, [None, pa.py_buffer(offsets), pa.py_buffer(digits)])


# ---------------------------------------------------------------- batches


def _topic_array(topics: list[str], topic_index: np.ndarray) -> pa.Array:
    return pa.array(topics, type=pa.string()).take(pa.array(topic_index))


def _int_array(values: np.ndarray, kind: pa.DataType) -> pa.Array:
    return pa.array(values.astype(kind.to_pandas_dtype()), type=kind)


_PROPERTY_COLUMNS = frozenset({"tags", "keys", "uniq_key", "properties"})


class _Run:
    """One run's bytes and spans, and the columns of the MESSAGES view built from them on
    demand: a column nobody asked for costs nothing (a `.schema("body binary")` read decodes
    only bodies), and the properties are parsed once for the four columns made of them."""

    def __init__(self, chunk: bytes, spans: RecordSpans, base_pos: int):
        self.chunk, self.spans, self.base_pos = chunk, spans, base_pos
        self.u8 = np.frombuffer(chunk, dtype=np.uint8)
        self.commit_pos = base_pos + spans.starts
        self._store_packed: np.ndarray | None = None

    def pieces(self) -> tuple[np.ndarray, ...] | None:
        """(props blob, rows, key starts, separators, value ends, key heads) without the
        __CRC32C tail decode_record drops; None: a record may repeat a key."""
        u8, row_ends = _props_blob(self.chunk, self.spans)
        pieces = parse_pieces(u8, row_ends)
        if pieces is None:
            return None
        rows, k_start, kv, v_end, heads = pieces
        has_tail, _ = crc32c_tails(self.u8, self.spans.props_pos, self.spans.ends)
        drop = _named(k_start, kv, heads, PROP_CRC32C) & has_tail[rows]
        if drop.any():
            rows, k_start, kv, v_end, heads = (a[~drop] for a in (rows, k_start, kv, v_end, heads))
        return u8, rows, k_start, kv, v_end, heads

    def field(self, name: str) -> np.ndarray:
        return gather_field(self.u8, self.spans.starts, name)

    def packed_host(self, host: Host) -> np.ndarray:
        """(ip << 32 | port) of each record's born or store host (the store's kept for msg_id)."""
        if host is Host.BORN:
            return packed_hosts(self.u8, self.spans.starts, host)
        if self._store_packed is None:
            self._store_packed = packed_hosts(self.u8, self.spans.starts, host)
        return self._store_packed

    def host(self, host: Host) -> pa.Array:
        """`ip:port` text of each record's born or store host."""
        texts, inverse = host_texts(self.packed_host(host))
        return pa.array(texts, type=pa.string()).take(pa.array(inverse))

    def msg_id(self) -> pa.Array:
        return msg_id_array(self.packed_host(Host.STORE), self.commit_pos)

    def body(self) -> pa.Array:
        body_pos = self.spans.starts + BODY_OFFSET
        return body_array(self.chunk, body_pos, body_pos + self.spans.body_lens)


def _property_columns(pieces: tuple[np.ndarray, ...], n: int) -> dict[str, pa.Array]:
    """tags, keys, uniq_key and properties of a run, as decode_record gives them."""
    u8, rows, k_start, kv, v_end, heads = pieces
    keys_mask = _named(k_start, kv, heads, PROP_KEYS)
    return {
        "tags": _value_column(u8, n, rows, kv, v_end, _named(k_start, kv, heads, PROP_TAGS)),
        "keys": _key_tokens(u8, n, rows[keys_mask], kv[keys_mask] + 1, v_end[keys_mask]),
        "uniq_key": _value_column(u8, n, rows, kv, v_end, _named(k_start, kv, heads, PROP_UNIQ_KEY)),
        "properties": pa.MapArray.from_arrays(pa.array(_row_offsets(rows, n)), string_array(u8, k_start, kv),
                                              string_array(u8, kv + 1, v_end)),
    }


_MESSAGE_COLUMNS = {
    "commit_pos": lambda r: pa.array(r.commit_pos),
    "size": lambda r: _int_array(r.spans.ends - r.spans.starts, pa.int32()),
    "topic": lambda r: string_array(r.u8, r.spans.topic_pos, r.spans.props_pos - PROPERTIES_LENGTH_SIZE),
    "queue_id": lambda r: _int_array(r.field("queue_id"), pa.int32()),
    "queue_offset": lambda r: pa.array(r.field("queue_offset")),
    "msg_id": _Run.msg_id,
    "born_ts": lambda r: pa.array(r.field("born_ts_ms") * 1000, type=_TS),
    "store_ts": lambda r: pa.array(r.field("store_ts_ms") * 1000, type=_TS),
    "born_host": lambda r: r.host(Host.BORN),
    "store_host": lambda r: r.host(Host.STORE),
    "sys_flag": lambda r: _int_array(r.field("sys_flag"), pa.int32()),
    "reconsume_times": lambda r: _int_array(r.field("reconsume_times"), pa.int32()),
    "body": _Run.body,
}


def message_batch(chunk: bytes, spans: RecordSpans, base_pos: int,
                  schema: pa.Schema) -> pa.RecordBatch | None:
    """The MESSAGES view of the accepted records of `chunk`, only the columns `schema` names
    (any subset of the view's, an `error` column all null); None: duplicate property keys."""
    run, n = _Run(chunk, spans, base_pos), spans.count
    props: dict[str, pa.Array] = {}
    if _PROPERTY_COLUMNS.intersection(schema.names):
        pieces = run.pieces()
        if pieces is None:
            return None
        props = _property_columns(pieces, n)
    columns = [pa.nulls(n, type=pa.string()) if name == "error" else
               props[name] if name in props else _MESSAGE_COLUMNS[name](run) for name in schema.names]
    return pa.RecordBatch.from_arrays(columns, schema=schema)


def dispatch_batch(chunk: bytes, spans: RecordSpans, base_pos: int, schema: pa.Schema) -> pa.RecordBatch:
    """The DISPATCH view of the accepted records of `chunk` (index keys: none for rollbacks)."""
    cols = decode_dispatch(chunk, spans, base_pos)
    n = cols.count
    key_u8 = np.frombuffer(cols.key_blob, dtype=np.uint8)
    keep = ~unindexed_rollback_mask(cols.sys_flag[cols.key_rows], cols.queue_offset[cols.key_rows])
    keys = _list_array(cols.key_rows[keep], n,
                       string_array(key_u8, cols.key_starts[keep], cols.key_ends[keep]))
    columns = [
        pa.array(cols.commit_pos), _int_array(cols.total_size, pa.int32()),
        _topic_array(cols.topics, cols.topic_index), _int_array(cols.queue_id, pa.int32()),
        pa.array(cols.queue_offset), _int_array(cols.sys_flag, pa.int32()), pa.array(cols.tags_code),
        pa.array(cols.store_ts_ms), keys,
    ]
    return _with_error_column(columns, n, schema)


def _with_error_column(columns: list[pa.Array], n: int, schema: pa.Schema) -> pa.RecordBatch:
    if len(columns) < len(schema):
        columns.append(pa.nulls(n, type=pa.string()))
    return pa.RecordBatch.from_arrays(columns, schema=schema)
