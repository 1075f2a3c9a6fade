"""Commitlog records many at a time, byte-identical to `scalar.encode_record`.

`encode_records`: messages of any topics with their encoded properties. The fixed 88-byte
headers are filled by a few whole-array writes into a layout.HEADER_DTYPE array; per record
only one zlib.crc32 of the body runs (a C call, driven by `map`); the bytes are joined with
one `bytearray.join`.

`encode_columns`: one topic from columns. A producer's batch call (ipc.Producer.send_columns)
gives the bodies, one key per message (or none), one TAGS for all and the UNIQ_KEYs as one
prefix + consecutive counters (engine.message.UniqKeyBlock). The properties are
engine.message.build_properties' for such a message (TAGS, KEYS, UNIQ_KEY, in that order), so
every record is

    header   88 bytes (layout.V4_HEADER_FMT); per record only TOTALSIZE, BODYCRC, QUEUEID and
             BODYLENGTH differ: the 68 bytes between QUEUEID and BODYLENGTH are packed once
    body
    after    TOPICLENGTH topic PROPERTIESLENGTH [TAGS 0x01 t 0x02] [KEYS 0x01 k 0x02]
             UNIQ_KEY 0x01 <prefix><6 hex digits> 0x02 __CRC32C 0x01 0000000000 0x02

and the whole batch is one `bytes % args` of a per-record template repeated: header and body
go in as %b, the key as %b, the counter as %06X, PROPERTIESLENGTH as %b only when the keys
differ in length (else it is part of the template). Per record that leaves one struct pack
and one zlib.crc32, both C calls driven by `map`; no Python runs per record. From
JOIN_MIN_BODY_BYTES per body on average, the template without its header and body is applied
per record and the pieces are joined once instead (one `%` over megabytes of bodies copies
them several times as its output grows).

`encode_one`: the same record for one message as bytes, with no numpy and no lists: one
struct pack and one `%` of a template cached per (topic, tags, keyed), for a blocking send.
"""

from __future__ import annotations

import functools
import re
import socket
import struct
import zlib
from collections.abc import Sequence
from itertools import accumulate, repeat
from typing import NamedTuple

import numpy as np

from engine.errors import BadInputError
from engine.formats.crc32c_property import CRC32C_PROP_SIZE, CRC32C_RESERVED
from engine.formats.properties import PROP_KEYS, PROP_TAGS, PROP_UNIQ_KEY, SEP_KV, SEP_PROP
from engine.formats.record.layout import (
    BODY_CRC_MASK,
    BODY_LENGTH_OFFSET,
    FLAG_OFFSET,
    HEADER_DTYPE,
    MAGIC_V1,
    MAX_PROPERTIES_BYTES,
    MAX_TOPIC_BYTES,
    PROPERTIES_LENGTH_SIZE,
    RECORD_FIXED_SIZE,
    TOPIC_LENGTH_SIZE_V1,
    V4_HEADER_FMT,
    V4_HEADER_SIZE,
    check_properties_bytes,
)
from engine.formats.uniq_key import UNIQ_COUNTER_DIGITS, UNIQ_COUNTER_MASK, UNIQ_KEY_CHARS, UNIQ_PREFIX_CHARS
from engine.tuning import JOIN_MIN_BODY_BYTES, STRUCT_PATH_MAX_RECORDS


class EncodedRecords(NamedTuple):
    """Records laid end to end in `buf`; record i is buf[starts[i]:starts[i] + sizes[i]]."""

    buf: bytearray
    starts: np.ndarray  # int64, position of each record in buf
    sizes: np.ndarray  # int64, each record's TOTALSIZE

# ---------------------------------------------------------------- many messages, any topics


def encode_records(topic_raws: Sequence[bytes], bodies: Sequence[bytes], props_raws: Sequence[bytes],
                   queue_ids: Sequence[int], *, born_ts_ms: int, born_host: tuple[str, int],
                   store_host: tuple[str, int], flag: int = 0, sys_flag: int = 0) -> EncodedRecords:
    """Many `scalar.encode_record` results end to end, byte for byte.

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
    if len(props_lens):  # once a batch: no inline compare needed
        check_properties_bytes(int(props_lens.max()))


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


# ---------------------------------------------------------------- one topic, from columns

# V4_HEADER_FMT split where the per-record fields end: TOTALSIZE MAGIC BODYCRC QUEUEID | the
# fields from FLAG to PREPAREDTXOFFSET (same in every record of a batch) | BODYLENGTH.
_CODES = re.findall(r"\d*[a-zA-Z]", V4_HEADER_FMT.lstrip(">"))
_SAME_FMT = ">" + "".join(_CODES[4:-1])
_SAME_HEADER = struct.Struct(_SAME_FMT)
_SAME_SIZE = _SAME_HEADER.size
_HEADER = struct.Struct(">" + "".join(_CODES[:4]) + f"{_SAME_SIZE}s" + _CODES[-1])
_FULL_HEADER = struct.Struct(V4_HEADER_FMT)  # every field, for encode_one
assert _HEADER.size == V4_HEADER_SIZE and struct.calcsize(">" + "".join(_CODES[:4])) == FLAG_OFFSET
assert FLAG_OFFSET + _SAME_SIZE == BODY_LENGTH_OFFSET
_PROPS_LENGTH = struct.Struct(">h")


def encode_columns(topic_raw: bytes, bodies: Sequence[bytes], queue_ids: Sequence[int] | int, *,
                   keys_raw: Sequence[bytes] | None, tags_raw: bytes | None, uniq_prefix: str,
                   first_counter: int, born_ts_ms: int, born_host: tuple[str, int],
                   store_host: tuple[str, int]) -> EncodedRecords:
    """The records of messages i = 0..n-1 of one topic, end to end: body bodies[i], queue
    queue_ids[i] (or one int for all), KEYS keys_raw[i] (UTF-8, one key; None: no KEYS), TAGS
    tags_raw (None: none), UNIQ_KEY uniq_prefix + the hex of (first_counter + i) mod 2**24.

    Text is assumed validated (engine.message.key_column, tags_text); counts, the topic and the
    properties length are checked here as a whole, BadInputError if off. `buf` is bytes."""
    n = len(bodies)
    _check_columns(topic_raw, n, queue_ids, keys_raw, uniq_prefix)
    if not n:
        return EncodedRecords(b"", np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64))
    if n <= STRUCT_PATH_MAX_RECORDS:
        return _encode_few(topic_raw, bodies, queue_ids, keys_raw, tags_raw, uniq_prefix,
                           first_counter, born_ts_ms, born_host, store_host)
    return _encode_vector(topic_raw, bodies, queue_ids, keys_raw, tags_raw, uniq_prefix, first_counter,
                          born_ts_ms, born_host, store_host)


def _encode_vector(topic_raw: bytes, bodies: Sequence[bytes], queue_ids: Sequence[int] | int,
                   keys_raw: Sequence[bytes] | None, tags_raw: bytes | None, uniq_prefix: str,
                   first_counter: int, born_ts_ms: int, born_host: tuple[str, int],
                   store_host: tuple[str, int]) -> EncodedRecords:
    """encode_columns for many records: one `%` (or one join) over columns built by C calls."""
    n = len(bodies)
    body_lens = list(map(len, bodies))
    key_lens = list(map(len, keys_raw)) if keys_raw is not None else [0]
    props_base = _props_base_bytes(tags_raw, keys_raw is not None)
    check_properties_bytes(props_base + max(key_lens))
    sizes, starts = _sizes_and_starts(RECORD_FIXED_SIZE + len(topic_raw) + props_base, body_lens,
                                      key_lens, n)
    same = _SAME_HEADER.pack(0, 0, 0, 0, born_ts_ms, *_ipv4(born_host), 0, *_ipv4(store_host), 0, 0)
    columns: list = [map(_HEADER.pack, sizes.tolist(), repeat(MAGIC_V1),
                         map(BODY_CRC_MASK.__and__, map(zlib.crc32, bodies)),
                         repeat(queue_ids, n) if isinstance(queue_ids, int) else queue_ids,
                         repeat(same), body_lens), bodies]
    props_len = props_base + key_lens[0] if min(key_lens) == max(key_lens) else None
    if keys_raw is not None:
        if props_len is None:
            packed = {k: _PROPS_LENGTH.pack(props_base + k) for k in set(key_lens)}
            columns.append(map(packed.__getitem__, key_lens))
        columns.append(keys_raw)
    counters = range(first_counter, first_counter + n)
    columns.append(counters if counters.stop <= UNIQ_COUNTER_MASK + 1
                   else [c & UNIQ_COUNTER_MASK for c in counters])
    after = _after_template(topic_raw, tags_raw, keys_raw is not None, uniq_prefix, props_len)
    if sum(body_lens) >= JOIN_MIN_BODY_BYTES * n:
        buf = _join_records(columns, after, n)
    else:
        args: list = [None] * (len(columns) * n)
        for i, column in enumerate(columns):
            args[i::len(columns)] = column
        buf = (b"%b%b" + after) * n % tuple(args)
    assert len(buf) == int(starts[-1] + sizes[-1]), "record sizes disagree with the template"
    return EncodedRecords(buf, starts, sizes)


def _join_records(columns: list, after: bytes, n: int) -> bytes:
    """The batch as header, body and `after % (its arguments)` of each record, joined once: for
    large bodies, where one `%` over everything costs several times the copy (its output buffer
    grows and is copied as it goes; join sizes it once)."""
    pieces: list = [None] * (3 * n)
    pieces[0::3] = columns[0]
    pieces[1::3] = columns[1]
    pieces[2::3] = map(after.__mod__, zip(*columns[2:], strict=True))
    return b"".join(pieces)


def _encode_few(topic_raw: bytes, bodies: Sequence[bytes], queue_ids: Sequence[int] | int,
                keys_raw: Sequence[bytes] | None, tags_raw: bytes | None, uniq_prefix: str,
                first_counter: int, born_ts_ms: int, born_host: tuple[str, int],
                store_host: tuple[str, int]) -> EncodedRecords:
    """encode_columns for a few records, record by record with struct and a cached template:
    below STRUCT_PATH_MAX_RECORDS the vector path's numpy set-up costs more than the records."""
    props_base = _props_base_bytes(tags_raw, keys_raw is not None)
    keys = keys_raw if keys_raw is not None else repeat(b"", len(bodies))
    after = _cached_after(topic_raw, tags_raw, keys_raw is not None)
    prefix = uniq_prefix.encode("ascii")
    same = _SAME_HEADER.pack(0, 0, 0, 0, born_ts_ms, *_cached_ipv4(born_host), 0,
                             *_cached_ipv4(store_host), 0, 0)
    fixed = RECORD_FIXED_SIZE + len(topic_raw) + props_base
    queue_ids = repeat(queue_ids) if isinstance(queue_ids, int) else queue_ids
    pieces: list[bytes] = []
    sizes: list[int] = []
    for counter, body, key, queue_id in zip(range(first_counter, first_counter + len(bodies)),
                                            bodies, keys, queue_ids, strict=False):
        if props_base + len(key) > MAX_PROPERTIES_BYTES:
            check_properties_bytes(props_base + len(key))
        size = fixed + len(body) + len(key)
        sizes.append(size)
        pieces.append(_HEADER.pack(size, MAGIC_V1, zlib.crc32(body) & BODY_CRC_MASK, queue_id,
                                   same, len(body)))
        pieces.append(body)
        props_len = _PROPS_LENGTH.pack(props_base + len(key))
        pieces.append(after % ((props_len, key, prefix, counter & UNIQ_COUNTER_MASK) if keys_raw is not None
                               else (props_len, prefix, counter & UNIQ_COUNTER_MASK)))
    starts = np.array(list(accumulate(sizes[:-1], initial=0)), dtype=np.int64)
    return EncodedRecords(b"".join(pieces), starts, np.array(sizes, dtype=np.int64))


@functools.lru_cache(maxsize=64)
def _cached_after(topic_raw: bytes, tags_raw: bytes | None, with_key: bool) -> bytes:
    """_after_template with PROPERTIESLENGTH and the UNIQ_KEY prefix as %b (the prefix holds
    the clock's milliseconds: in the template it would miss the cache at every tick)."""
    return _after_template(topic_raw, tags_raw, with_key, None, None)


@functools.lru_cache(maxsize=64)
def _one_template(topic_raw: bytes, tags_raw: bytes | None, with_key: bool, born_host: tuple[str, int],
                  store_host: tuple[str, int]) -> tuple[bytes, int, int, bytes, int, bytes, int]:
    """encode_one's `%` template of a whole record (header %b, body %b, then _cached_after's),
    the record's size less its body and key, PROPERTIESLENGTH less the key's length, and the
    hosts packed: what a producer's records of one topic, tags and keyed share."""
    _check_topic(topic_raw)
    props_base = _props_base_bytes(tags_raw, with_key)
    return (b"%b%b" + _cached_after(topic_raw, tags_raw, with_key), RECORD_FIXED_SIZE + len(topic_raw)
            + props_base, props_base, *_ipv4(born_host), *_ipv4(store_host))


def encode_one(topic_raw: bytes, body: bytes, queue_id: int, *, key_raw: bytes | None,
               tags_raw: bytes | None, uniq_prefix: str, counter: int, born_ts_ms: int,
               born_host: tuple[str, int], store_host: tuple[str, int]) -> bytes:
    """encode_columns' record of one message (key_raw None: no KEYS), as bytes: one struct pack
    and one `%` of a cached template, no numpy and no lists, for a blocking one-message send
    (ipc.Producer), where _encode_few's set-up cost as much as the record."""
    template, fixed_bytes, props_base, born_ip, born_port, store_ip, store_port = _one_template(
        topic_raw, tags_raw, key_raw is not None, born_host, store_host)
    key_bytes = 0 if key_raw is None else len(key_raw)
    if props_base + key_bytes > MAX_PROPERTIES_BYTES:
        check_properties_bytes(props_base + key_bytes)
    if len(uniq_prefix) != UNIQ_PREFIX_CHARS or not uniq_prefix.isascii():
        _check_uniq_prefix(uniq_prefix)
    head = _FULL_HEADER.pack(fixed_bytes + len(body) + key_bytes, MAGIC_V1,
                             zlib.crc32(body) & BODY_CRC_MASK, queue_id, 0, 0, 0, 0, born_ts_ms,
                             born_ip, born_port, 0, store_ip, store_port, 0, 0, len(body))
    props_len = _PROPS_LENGTH.pack(props_base + key_bytes)
    prefix, counter = uniq_prefix.encode("ascii"), counter & UNIQ_COUNTER_MASK
    if key_raw is None:
        return template % (head, body, props_len, prefix, counter)
    return template % (head, body, props_len, key_raw, prefix, counter)


def _cached_ipv4(host: tuple[str, int]) -> tuple[bytes, int]:
    """_ipv4, remembered for hashable hosts (a producer has two)."""
    try:
        return _IPV4_CACHE[host]
    except (KeyError, TypeError):
        packed = _ipv4(host)
    if len(_IPV4_CACHE) < 64:
        _IPV4_CACHE[host] = packed
    return packed


_IPV4_CACHE: dict[tuple[str, int], tuple[bytes, int]] = {}


def _check_columns(topic_raw: bytes, n: int, queue_ids: Sequence[int] | int,
                   keys_raw: Sequence[bytes] | None, uniq_prefix: str) -> None:
    if keys_raw is not None and len(keys_raw) != n:
        raise BadInputError("keys", f"{len(keys_raw)} keys for {n} bodies")
    if not isinstance(queue_ids, int) and len(queue_ids) != n:
        raise BadInputError("queue_ids", f"{len(queue_ids)} queue ids for {n} bodies")
    _check_topic(topic_raw)
    _check_uniq_prefix(uniq_prefix)


def _check_topic(topic_raw: bytes) -> None:
    if not 1 <= len(topic_raw) <= MAX_TOPIC_BYTES:
        raise BadInputError("topic", f"must be 1..{MAX_TOPIC_BYTES} bytes of UTF-8")


def _check_uniq_prefix(uniq_prefix: str) -> None:
    if len(uniq_prefix) != UNIQ_PREFIX_CHARS or not uniq_prefix.isascii():
        raise BadInputError("uniq_prefix", f"{uniq_prefix!r} is not {UNIQ_PREFIX_CHARS} hex digits")


def _props_base_bytes(tags_raw: bytes | None, with_key: bool) -> int:
    """PROPERTIESLENGTH of a record less its key's length (the CRC32C property included)."""
    tags = len(PROP_TAGS) + len(tags_raw) + 2 if tags_raw is not None else 0
    keys = len(PROP_KEYS) + 2 if with_key else 0
    return tags + keys + len(PROP_UNIQ_KEY) + 2 + UNIQ_KEY_CHARS + CRC32C_PROP_SIZE


def _sizes_and_starts(fixed: int, body_lens: list[int], key_lens: list[int], n: int
                      ) -> tuple[np.ndarray, np.ndarray]:
    """TOTALSIZE of each record and its position in the batch (int64)."""
    if min(body_lens) == max(body_lens) and min(key_lens) == max(key_lens):
        size = fixed + body_lens[0] + key_lens[0]
        return np.full(n, size, dtype=np.int64), np.arange(0, n * size, size, dtype=np.int64)
    sizes = np.fromiter(body_lens, dtype=np.int64, count=n) + fixed
    if len(key_lens) == n:
        sizes += np.fromiter(key_lens, dtype=np.int64, count=n)
    starts = np.zeros(n, dtype=np.int64)
    np.cumsum(sizes[:-1], out=starts[1:])
    return sizes, starts


def _after_template(topic_raw: bytes, tags_raw: bytes | None, with_key: bool, uniq_prefix: str | None,
                    props_len: int | None) -> bytes:
    """The `%` template of what follows a body. It takes, in order: PROPERTIESLENGTH (%b, only
    when `props_len` is None, i.e. the keys differ in length), the key (%b, `with_key`), the
    UNIQ_KEY prefix (%b, only when `uniq_prefix` is None) and the UNIQ_KEY counter (%06X)."""
    kv, end = SEP_KV, SEP_PROP
    literal = (bytes((len(topic_raw),)) + topic_raw).replace(b"%", b"%%")
    literal += _PROPS_LENGTH.pack(props_len).replace(b"%", b"%%") if props_len is not None else b"%b"
    if tags_raw is not None:
        literal += (PROP_TAGS.encode() + kv + tags_raw + end).replace(b"%", b"%%")
    if with_key:
        literal += PROP_KEYS.encode() + kv + b"%b" + end
    literal += (PROP_UNIQ_KEY.encode() + kv).replace(b"%", b"%%")
    literal += b"%b" if uniq_prefix is None else uniq_prefix.encode("ascii").replace(b"%", b"%%")
    return literal + b"%0" + str(UNIQ_COUNTER_DIGITS).encode() + b"X" + end \
        + CRC32C_RESERVED.replace(b"%", b"%%")

