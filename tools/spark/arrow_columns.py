"""Arrow record batches of many records at once, from the spans the batch scanner accepted.

`engine.formats.record.spans.verify_spans` accepts leading runs of plain records (v1, IPv4
hosts, ASCII topic and properties; with every CRC checked unless verify is NONE). This module
turns such a run into one `pyarrow.RecordBatch` in the source's schema (scan.arrow_schema)
with whole-array work: header fields are numpy gathers, text and bodies are Arrow arrays
built from offsets into one copy of the bytes (no Python object per field).

The result is the one `scan.message_values` / `scan.dispatch_values` give for the same
records through `record.decode_record` (tests/spark/test_scan_batches.py compares them).
Properties are parsed as `properties.decode_properties` does; a run in which a record repeats
a property name (a later duplicate wins in a dict, and keeps the first one's place) is left to
the scalar path: `message_batch` returns None.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from engine.dispatch import unindexed_rollbacks
from engine.formats.crc32c_property import CRC32C_PREFIX, CRC32C_PROP_SIZE
from engine.formats.properties import (
    KEYS_SEPARATOR,
    PROP_CRC32C,
    PROP_KEYS,
    PROP_TAGS,
    PROP_UNIQ_KEY,
    SEP_KV,
    SEP_PROP,
)
from engine.formats.record import PROPERTIES_LENGTH_SIZE
from engine.formats.record.arrays import gather, gather_field, gather_int, int_view
from engine.formats.record.dispatch_columns import decode_dispatch
from engine.formats.record.layout import HEADER_DTYPE
from engine.formats.record.spans import RecordSpans

_SEP_KV, _SEP_PROP, _SPACE = SEP_KV[0], SEP_PROP[0], KEYS_SEPARATOR.encode()[0]
_PREFIX_U8 = np.frombuffer(CRC32C_PREFIX, dtype=np.uint8)
_HEX_U8 = np.frombuffer(b"0123456789ABCDEF", dtype=np.uint8)
_NIBBLE_SHIFTS = np.arange(60, -4, -4, dtype=np.int64)  # 16 hex digits of a 64-bit value, MSB first
_NIBBLE_SHIFTS_U = _NIBBLE_SHIFTS.astype(np.uint64)
_TS = pa.timestamp("us", tz="UTC")


def _field_offset(name: str) -> int:
    return HEADER_DTYPE.fields[name][1]


# ---------------------------------------------------------------- arrays from spans


def take_spans(u8: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(int32 offsets, bytes) of the spans u8[starts[i]:ends[i]] laid end to end."""
    lens = ends - starts
    offsets = np.zeros(len(lens) + 1, dtype=np.int64)
    np.cumsum(lens, out=offsets[1:])
    index = np.repeat(starts - offsets[:-1], lens) + np.arange(offsets[-1], dtype=np.int64)
    return offsets.astype(np.int32), u8[index]


def string_array(u8: np.ndarray, starts: np.ndarray, ends: np.ndarray,
                 valid: np.ndarray | None = None) -> pa.Array:
    """An Arrow string array of the spans (ASCII, as verify_spans accepted); null where `valid`
    is False."""
    offsets, data = take_spans(u8, starts, ends)
    bitmap = None if valid is None else pa.py_buffer(np.packbits(valid, bitorder="little"))
    buffers = [bitmap, pa.py_buffer(offsets), pa.py_buffer(data)]
    return pa.Array.from_buffers(pa.string(), len(starts), buffers)


def body_array(chunk: bytes, starts: np.ndarray, ends: np.ndarray) -> pa.Array:
    """Bodies as an Arrow binary array: one join of slices (bodies are large; no index array)."""
    offsets = np.zeros(len(starts) + 1, dtype=np.int64)
    np.cumsum(ends - starts, out=offsets[1:])
    data = b"".join(map(chunk.__getitem__, map(slice, starts.tolist(), ends.tolist())))
    return pa.Array.from_buffers(pa.binary(), len(starts),
                                 [None, pa.py_buffer(offsets.astype(np.int32)), pa.py_buffer(data)])


def _row_offsets(rows: np.ndarray, n: int) -> np.ndarray:
    """List offsets for items belonging to `rows` (sorted), n rows."""
    offsets = np.zeros(n + 1, dtype=np.int32)
    np.cumsum(np.bincount(rows, minlength=n), out=offsets[1:])
    return offsets


def _list_array(rows: np.ndarray, n: int, values: pa.Array) -> pa.Array:
    return pa.ListArray.from_arrays(pa.array(_row_offsets(rows, n)), values)


# ---------------------------------------------------------------- properties


def _props_blob(chunk: bytes, spans: RecordSpans) -> tuple[np.ndarray, np.ndarray]:
    """Every record's properties end to end (u8, then 8 bytes of padding) and each record's
    end in it."""
    pieces = list(map(chunk.__getitem__, map(slice, spans.props_pos.tolist(), spans.ends.tolist())))
    blob = b"".join([*pieces, bytes(8)])
    return np.frombuffer(blob, dtype=np.uint8), np.cumsum(spans.ends - spans.props_pos)


def parse_pieces(u8: np.ndarray, row_ends: np.ndarray) -> tuple[np.ndarray, ...] | None:
    """(rows, key starts, separators, value ends, key heads) of every key/value pair, in record
    order, as decode_properties finds them; None if a record may repeat a key. `u8` ends with
    8 bytes of padding; a key head is its first 8 bytes (less if shorter) as a little-endian int."""
    n = len(row_ends)
    row_starts = np.concatenate([[0], row_ends[:-1]])
    p2 = np.flatnonzero(u8 == _SEP_PROP)
    p1 = np.flatnonzero(u8 == _SEP_KV)
    starts = np.concatenate([row_starts, p2 + 1])
    rows = np.concatenate([np.arange(n), np.searchsorted(row_ends, p2, side="right")])
    order = np.lexsort((starts, rows))
    starts, rows = starts[order], rows[order]
    keep = rows < n
    starts, rows = starts[keep], rows[keep]
    limit = row_ends[rows]
    nxt = np.searchsorted(p2, starts)
    nxt_pos = p2[np.minimum(nxt, len(p2) - 1)] if len(p2) else limit
    ends = np.where((nxt < len(p2)) & (nxt_pos < limit), nxt_pos, limit)
    j = np.searchsorted(p1, starts)
    kv = p1[np.minimum(j, len(p1) - 1)] if len(p1) else starts
    pair = (j < len(p1)) & (kv > starts) & (kv < ends - 1)
    rows, starts, kv, ends = rows[pair], starts[pair], kv[pair], ends[pair]
    heads = _key_heads(u8, starts, kv)
    if _may_repeat_keys(u8, rows, starts, kv, heads):
        return None
    return rows, starts, kv, ends, heads


def _key_heads(u8: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    lens = np.minimum(ends - starts, 8).astype(np.uint64)
    masks = np.where(lens >= 8, np.uint64(2**64 - 1), (np.uint64(1) << (lens * np.uint64(8))) - np.uint64(1))
    return int_view(u8, "<u8")[starts] & masks


def _name_head(name: str) -> tuple[int, np.uint64]:
    raw = name.encode()
    assert len(raw) <= 8
    return len(raw), np.uint64(int.from_bytes(raw, "little"))


def _may_repeat_keys(u8: np.ndarray, rows: np.ndarray, starts: np.ndarray, ends: np.ndarray,
                     heads: np.ndarray) -> bool:
    """True when some record may hold one key twice: same length, first and last 8 bytes
    (exact up to 16 bytes; a longer look-alike only sends the run to the scalar path)."""
    if not len(rows):
        return False
    lens = ends - starts
    tails = np.where(lens > 8, int_view(u8, "<u8")[np.maximum(ends - 8, 0)], np.uint64(0))
    order = np.lexsort((tails, heads, lens, rows))
    same = np.ones(len(rows) - 1, dtype=bool)
    for column in (rows, lens, heads, tails):
        ordered = column[order]
        same &= ordered[1:] == ordered[:-1]
    return bool(same.any())


def _named(starts: np.ndarray, kv: np.ndarray, heads: np.ndarray, name: str) -> np.ndarray:
    """Which pairs have the key `name` (at most 8 bytes: the key head is the whole key)."""
    length, head = _name_head(name)
    return (kv - starts == length) & (heads == head)


def _value_column(u8: np.ndarray, n: int, rows: np.ndarray, kv: np.ndarray, ends: np.ndarray,
                  mask: np.ndarray) -> pa.Array:
    """A string column: the value of the masked pair of each row, null where there is none."""
    starts, stops = np.zeros(n, dtype=np.int64), np.zeros(n, dtype=np.int64)
    starts[rows[mask]], stops[rows[mask]] = kv[mask] + 1, ends[mask]
    valid = np.zeros(n, dtype=bool)
    valid[rows[mask]] = True
    return string_array(u8, starts, stops, valid=valid)


def _key_tokens(u8: np.ndarray, n: int, rows: np.ndarray, starts: np.ndarray,
                ends: np.ndarray) -> pa.Array:
    """list<string>: each row's KEYS value split on spaces, empty tokens dropped (split_keys)."""
    spaces = np.flatnonzero(u8 == _SPACE)
    inside = np.searchsorted(starts, spaces, side="right") - 1
    spaces = spaces[(inside >= 0) & (spaces < ends[np.maximum(inside, 0)])] if len(starts) else spaces[:0]
    t_start = np.sort(np.concatenate([starts, spaces + 1]))
    t_end = np.sort(np.concatenate([ends, spaces]))
    nonempty = t_end > t_start
    t_start, t_end = t_start[nonempty], t_end[nonempty]
    t_rows = rows[np.searchsorted(starts, t_start, side="right") - 1] if len(starts) else rows
    return _list_array(t_rows, n, string_array(u8, t_start, t_end))


def _has_crc_tail(chunk_u8: np.ndarray, spans: RecordSpans) -> np.ndarray:
    """Per record: a well-formed __CRC32C tail ends it (decode_record then drops that key)."""
    tails = gather(chunk_u8, spans.ends - CRC32C_PROP_SIZE, CRC32C_PROP_SIZE)
    digits = tails[:, len(CRC32C_PREFIX):-1]
    return ((spans.ends - spans.props_pos >= CRC32C_PROP_SIZE)
            & (tails[:, :len(CRC32C_PREFIX)] == _PREFIX_U8).all(axis=1) & (tails[:, -1] == _SEP_PROP)
            & ((digits >= ord("0")) & (digits <= ord("9"))).all(axis=1))


# ---------------------------------------------------------------- hosts and ids


def _host_columns(chunk_u8: np.ndarray, starts: np.ndarray, prefix: str) -> tuple[pa.Array, np.ndarray]:
    """`ip:port` text of each record's born or store host, and the packed (ip << 32 | port)."""
    ip = gather_int(chunk_u8, starts + _field_offset(f"{prefix}_ip"), ">u4").astype(np.uint64)
    port = gather_int(chunk_u8, starts + _field_offset(f"{prefix}_port"), ">u4").astype(np.uint64)
    packed = (ip << np.uint64(32)) | port
    distinct, inverse = np.unique(packed, return_inverse=True)
    texts = [f"{v >> 56}.{(v >> 48) & 255}.{(v >> 40) & 255}.{(v >> 32) & 255}:{_signed32(v)}"
             for v in distinct.tolist()]
    return pa.array(texts, type=pa.string()).take(pa.array(inverse.ravel())), packed


def _signed32(packed: int) -> int:
    port = packed & 0xFFFFFFFF
    return port - (1 << 32) if port >= 1 << 31 else port


def msg_id_array(store_packed: np.ndarray, commit_pos: np.ndarray) -> pa.Array:
    """make_msg_id of IPv4 store hosts: 32 upper-case hex digits (ip, port, commit_pos)."""
    n = len(commit_pos)
    digits = np.empty((n, 32), dtype=np.uint8)
    digits[:, :16] = _HEX_U8[(store_packed[:, None] >> _NIBBLE_SHIFTS_U) & np.uint64(0xF)]
    digits[:, 16:] = _HEX_U8[(commit_pos[:, None] >> _NIBBLE_SHIFTS) & 0xF]
    offsets = np.arange(0, 32 * n + 1, 32, dtype=np.int32)
    return pa.Array.from_buffers(pa.string(), n, [None, pa.py_buffer(offsets), pa.py_buffer(digits)])


# ---------------------------------------------------------------- batches


def _topic_array(topics: list[str], topic_index: np.ndarray) -> pa.Array:
    return pa.array(topics, type=pa.string()).take(pa.array(topic_index))


def _int_array(values: np.ndarray, kind: pa.DataType) -> pa.Array:
    return pa.array(values.astype(kind.to_pandas_dtype()), type=kind)


def message_batch(chunk: bytes, spans: RecordSpans, base_pos: int,
                  schema: pa.Schema) -> pa.RecordBatch | None:
    """The MESSAGES view of the accepted records of `chunk` (None: duplicate property keys)."""
    chunk_u8 = np.frombuffer(chunk, dtype=np.uint8)
    n, starts = spans.count, spans.starts
    u8, row_ends = _props_blob(chunk, spans)
    pieces = parse_pieces(u8, row_ends)
    if pieces is None:
        return None
    rows, k_start, kv, v_end, heads = pieces
    drop = _named(k_start, kv, heads, PROP_CRC32C) & _has_crc_tail(chunk_u8, spans)[rows]
    if drop.any():
        rows, k_start, kv, v_end, heads = (a[~drop] for a in (rows, k_start, kv, v_end, heads))
    keys_mask = _named(k_start, kv, heads, PROP_KEYS)
    props = pa.MapArray.from_arrays(pa.array(_row_offsets(rows, n)), string_array(u8, k_start, kv),
                                    string_array(u8, kv + 1, v_end))
    born, _ = _host_columns(chunk_u8, starts, "born")
    store, store_packed = _host_columns(chunk_u8, starts, "store")
    commit_pos = base_pos + starts
    body_pos = starts + HEADER_DTYPE.itemsize
    columns = [
        pa.array(commit_pos), _int_array(spans.ends - starts, pa.int32()),
        string_array(chunk_u8, spans.topic_pos, spans.props_pos - PROPERTIES_LENGTH_SIZE),
        _int_array(gather_field(chunk_u8, starts, "queue_id"), pa.int32()),
        pa.array(gather_field(chunk_u8, starts, "queue_offset")),
        _value_column(u8, n, rows, kv, v_end, _named(k_start, kv, heads, PROP_TAGS)),
        _key_tokens(u8, n, rows[keys_mask], kv[keys_mask] + 1, v_end[keys_mask]),
        _value_column(u8, n, rows, kv, v_end, _named(k_start, kv, heads, PROP_UNIQ_KEY)),
        msg_id_array(store_packed, commit_pos),
        pa.array(gather_field(chunk_u8, starts, "born_ts_ms") * 1000, type=_TS),
        pa.array(gather_field(chunk_u8, starts, "store_ts_ms") * 1000, type=_TS), born, store,
        _int_array(gather_field(chunk_u8, starts, "sys_flag"), pa.int32()),
        _int_array(gather_field(chunk_u8, starts, "reconsume_times"), pa.int32()), props,
        body_array(chunk, body_pos, body_pos + spans.body_lens),
    ]
    return _with_error_column(columns, n, schema)


def dispatch_batch(chunk: bytes, spans: RecordSpans, base_pos: int, schema: pa.Schema) -> pa.RecordBatch:
    """The DISPATCH view of the accepted records of `chunk` (index keys: none for rollbacks)."""
    cols = decode_dispatch(chunk, spans, base_pos)
    n = cols.count
    key_u8 = np.frombuffer(cols.key_blob, dtype=np.uint8)
    keep = ~unindexed_rollbacks(cols.sys_flag[cols.key_rows], cols.queue_offset[cols.key_rows])
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
