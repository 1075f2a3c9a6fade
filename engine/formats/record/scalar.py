"""The scalar record codec, the reference: one record encoded, stamped, checked, decoded.

The layout is `layout`'s; what makes a record structurally valid is `structure`'s (its scalar
form). The batch paths (encode_many, stamp_many, spans, view) give the same bytes and verdicts.
"""

from __future__ import annotations

import socket
import struct
import zlib
from collections.abc import Mapping
from dataclasses import dataclass
from enum import Enum
from typing import NamedTuple

import crc32c

from engine.errors import BadInputError, CorruptRecordError
from engine.formats.crc32c_property import (
    CRC32C_PREFIX,
    CRC32C_PROP_SIZE,
    CRC32C_RESERVED,
    read_crc32c_tail,
    seal_crc32c,
)
from engine.formats.java_hash import tags_code as _tags_code
from engine.formats.msg_id import decode_host, make_msg_id
from engine.formats.properties import (
    PROP_CRC32C,
    PROP_KEYS,
    PROP_TAGS,
    PROP_UNIQ_KEY,
    decode_properties,
    encode_properties,
    split_keys,
)
from engine.formats.record.layout import (
    BLANK_MAGIC,
    BODY_CRC_MASK,
    BODY_OFFSET,
    BORNHOST_V6,
    DEFAULT_MAX_BODY_BYTES,
    FIELD_INDEX,
    FILLER_FMT,
    FILLER_SIZE,
    HOST_V4_FMT,
    HOST_V6_FMT,
    HOSTS_V6,
    MAGIC_OFFSET,
    MAGIC_V1,
    MAGIC_V2,
    MAX_PROPERTIES_BYTES,
    MAX_TOPIC_BYTES,
    PHYSICAL_OFFSET_OFFSET,
    PROPERTIES_LENGTH_SIZE,
    QUEUE_OFFSET_OFFSET,
    RECORD_FIXED_SIZE,
    RECORD_HEAD_FMT,
    RECORD_HEAD_SIZE,
    RECORD_MID_FMT,
    RECORD_MID_SIZE,
    STORE_TS_OFFSET,
    STORE_TS_OFFSET_BORN_V6,
    STOREHOST_V6,
    SYS_FLAG_OFFSET,
    V4_HEADER_FMT,
    V4_HEADER_SIZE,
    check_properties_bytes,
)
from engine.formats.record.structure import (
    check_head,
    check_header_fits,
    check_position,
    locate_parts,
)

_V4_HEADER = struct.Struct(V4_HEADER_FMT)
_HEAD = struct.Struct(RECORD_HEAD_FMT)
_HOST_V4 = struct.Struct(HOST_V4_FMT)
_HOST_V6 = struct.Struct(HOST_V6_FMT)
_MID = struct.Struct(RECORD_MID_FMT)
_FILLER = struct.Struct(FILLER_FMT)
_STAMP = struct.Struct(">qq")  # QUEUEOFFSET PHYSICALOFFSET, adjacent
_I16, _I32, _U32, _I64 = (struct.Struct(f) for f in (">h", ">i", ">I", ">q"))
assert QUEUE_OFFSET_OFFSET + 8 == PHYSICAL_OFFSET_OFFSET
# Indexes into the unpacked header tuple (also produced, in the same order, for IPv6 hosts).
_F_PHYSICAL_OFFSET, _F_SYS_FLAG, _F_BODY_LENGTH = (
    FIELD_INDEX["commit_pos"], FIELD_INDEX["sys_flag"], FIELD_INDEX["body_length"])


class Verify(Enum):
    """How much decode_record checks beyond structure (lengths, magic, PHYSICALOFFSET)."""

    STRUCTURE = "structure"  # no checksums
    ROCKETMQ = "rocketmq"  # + BODYCRC, + CRC32C when the __CRC32C property is present
    MQSTORE = "mqstore"  # + BODYCRC + CRC32C, which must be present


@dataclass(frozen=True, slots=True)
class Filler:
    """The end-of-file filler: the rest of the segment, from commit position `pos`, is unused."""

    pos: int
    size: int

    @property
    def end_pos(self) -> int:
        return self.pos + self.size


@dataclass(frozen=True, slots=True)
class Record:
    """One decoded commitlog record; `properties` omits the __CRC32C tail (see `stored_crc32c`)."""

    total_size: int
    magic: int
    body_crc: int
    queue_id: int
    flag: int
    queue_offset: int
    commit_pos: int
    sys_flag: int
    born_ts_ms: int
    born_host: tuple[str, int]
    store_ts_ms: int
    store_host: tuple[str, int]
    reconsume_times: int
    prepared_tx_offset: int
    body: bytes
    topic: str
    properties: dict[str, str]
    stored_crc32c: int | None = None  # value of the __CRC32C tail, None when the record has none

    @property
    def tags(self) -> str | None:
        return self.properties.get(PROP_TAGS)

    @property
    def keys(self) -> tuple[str, ...]:
        return split_keys(self.properties.get(PROP_KEYS))

    @property
    def uniq_key(self) -> str | None:
        return self.properties.get(PROP_UNIQ_KEY)

    @property
    def tags_code(self) -> int:
        return _tags_code(self.tags)

    @property
    def end_pos(self) -> int:
        return self.commit_pos + self.total_size

    @property
    def msg_id(self) -> str:
        return make_msg_id(self.store_host, self.commit_pos)


@dataclass(frozen=True, slots=True)
class RecordHeader:
    """What dispatch needs from a record, decoded without copying the body or checking CRCs."""

    total_size: int
    queue_id: int
    queue_offset: int
    commit_pos: int
    sys_flag: int
    store_ts_ms: int
    topic: str
    tags_code: int
    keys: tuple[str, ...]
    uniq_key: str | None

    @property
    def end_pos(self) -> int:
        return self.commit_pos + self.total_size


class _Layout(NamedTuple):
    fields: tuple  # V4_HEADER order: total..born_ts, born_ip, born_port, store_ts, store_ip, ...
    body_pos: int
    body_end: int
    topic_pos: int
    props_pos: int
    end: int


# ---------------------------------------------------------------- encoding


def encode_record(topic: str, body: bytes, *, queue_id: int, properties: Mapping[str, str] | None = None,
                  born_ts_ms: int, born_host: tuple[str, int], store_host: tuple[str, int], flag: int = 0,
                  sys_flag: int = 0, reconsume_times: int = 0,
                  max_body_bytes: int = DEFAULT_MAX_BODY_BYTES) -> bytearray:
    """A complete v1 IPv4 record with zero QUEUEOFFSET/PHYSICALOFFSET/STORETIMESTAMP and a
    reserved CRC32C tail; `stamp_record` fills those in at append time."""
    topic_raw = _encode_topic(topic)
    if not isinstance(body, bytes | bytearray | memoryview):
        raise BadInputError("body", f"must be bytes, not {type(body).__name__}")
    if len(body) > max_body_bytes:
        raise BadInputError("body", f"{len(body)} bytes exceeds the maximum of {max_body_bytes}")
    props_raw = _encode_props_with_crc_slot(properties)
    born_ip, born_port = _pack_ipv4(born_host, "born_host")
    store_ip, store_port = _pack_ipv4(store_host, "store_host")
    _check_int("queue_id", queue_id, 0, 2**31 - 1)
    _check_int("flag", flag, -(2**31), 2**31 - 1)
    _check_int("sys_flag", sys_flag, 0, 2**31 - 1)
    _check_int("reconsume_times", reconsume_times, 0, 2**31 - 1)
    _check_int("born_ts_ms", born_ts_ms, 0, 2**63 - 1)
    if sys_flag & HOSTS_V6:
        raise BadInputError("sys_flag", "IPv6 host bits are set but records are written with IPv4 hosts")
    body_len, topic_len = len(body), len(topic_raw)
    total = RECORD_FIXED_SIZE + body_len + topic_len + len(props_raw)
    out = bytearray(total)
    _V4_HEADER.pack_into(out, 0, total, MAGIC_V1, zlib.crc32(body) & BODY_CRC_MASK, queue_id, flag, 0, 0,
                         sys_flag, born_ts_ms, born_ip, born_port, 0, store_ip, store_port,
                         reconsume_times, 0, body_len)
    at = BODY_OFFSET + body_len
    out[BODY_OFFSET:at] = body
    out[at] = topic_len
    out[at + 1 : at + 1 + topic_len] = topic_raw
    at += 1 + topic_len
    _I16.pack_into(out, at, len(props_raw))
    out[at + PROPERTIES_LENGTH_SIZE :] = props_raw
    return out


def stamp_record(buf: bytearray | memoryview, pos: int, *, queue_offset: int, commit_pos: int,
                 store_ts_ms: int) -> None:
    """Patch QUEUEOFFSET, PHYSICALOFFSET, STORETIMESTAMP in place, then seal the CRC32C tail."""
    total_size = _I32.unpack_from(buf, pos)[0]
    crc_pos = pos + total_size - CRC32C_PROP_SIZE
    if total_size < RECORD_FIXED_SIZE + CRC32C_PROP_SIZE or crc_pos + CRC32C_PROP_SIZE > len(buf):
        raise BadInputError("record", f"TOTALSIZE {total_size} at {pos} is not a record in this buffer")
    if buf[crc_pos : crc_pos + len(CRC32C_PREFIX)] != CRC32C_PREFIX:
        raise BadInputError("record", f"record at {pos} has no reserved __CRC32C tail")
    born_v6 = _I32.unpack_from(buf, pos + SYS_FLAG_OFFSET)[0] & BORNHOST_V6
    _STAMP.pack_into(buf, pos + QUEUE_OFFSET_OFFSET, queue_offset, commit_pos)
    _I64.pack_into(buf, pos + (STORE_TS_OFFSET_BORN_V6 if born_v6 else STORE_TS_OFFSET), store_ts_ms)
    seal_crc32c(buf, pos, crc_pos)


def encode_filler(space_left: int) -> bytes:
    """The 8-byte end-of-file filler claiming the `space_left` bytes to the end of the segment."""
    if not isinstance(space_left, int) or not FILLER_SIZE <= space_left < 2**31:
        raise BadInputError("space_left", f"{space_left!r} is not in {FILLER_SIZE}..2**31-1")
    return _FILLER.pack(space_left, BLANK_MAGIC)


def _encode_topic(topic: object) -> bytes:
    if not isinstance(topic, str):
        raise BadInputError("topic", f"must be a str, not {type(topic).__name__}")
    try:
        raw = topic.encode("utf-8")
    except UnicodeEncodeError:
        raise BadInputError("topic", "is not valid UTF-8 text") from None
    if not raw or len(raw) > MAX_TOPIC_BYTES:
        raise BadInputError("topic", f"must be 1..{MAX_TOPIC_BYTES} bytes of UTF-8, not {len(raw)}")
    return raw


def _encode_props_with_crc_slot(properties: Mapping[str, str] | None) -> bytes:
    if properties and PROP_CRC32C in properties:
        raise BadInputError("properties", f"{PROP_CRC32C!r} is reserved for the store")
    raw = encode_properties(properties) if properties else b""
    if len(raw) + CRC32C_PROP_SIZE > MAX_PROPERTIES_BYTES:
        check_properties_bytes(len(raw) + CRC32C_PROP_SIZE)
    return raw + CRC32C_RESERVED


def _check_int(field: str, value: object, low: int, high: int) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= high:
        raise BadInputError(field, f"{value!r} is not an int in {low}..{high}")


def _pack_ipv4(host: object, field: str) -> tuple[bytes, int]:
    try:
        ip, port = host  # type: ignore[misc]
        packed = socket.inet_pton(socket.AF_INET, ip)
    except (TypeError, ValueError, OSError):
        raise BadInputError(field, f"{host!r} is not an (IPv4 address, port) pair") from None
    _check_int(f"{field} port", port, 0, 2**31 - 1)
    return packed, port


# ---------------------------------------------------------------- decoding


def decode_record(buf, pos: int = 0, *, verify: Verify = Verify.MQSTORE,
                  base_pos: int = 0) -> Record | Filler:
    """Decode and check the record at buf[pos:] (commit position base_pos+pos); raise CorruptRecordError."""
    commit_pos = base_pos + pos
    layout = _locate(buf, pos, commit_pos)
    if isinstance(layout, Filler):
        return layout
    f = layout.fields
    crc_tail = read_crc32c_tail(buf, layout.end, layout.props_pos)
    with memoryview(buf) as view:
        body = view[layout.body_pos : layout.body_end]
        if verify is not Verify.STRUCTURE:
            if zlib.crc32(body) & BODY_CRC_MASK != f[2]:
                raise CorruptRecordError("BODYCRC mismatch", pos=commit_pos, size=f[0])
            if crc_tail is not None and crc32c.crc32c(view[pos : layout.end - CRC32C_PROP_SIZE]) != crc_tail:
                raise CorruptRecordError("CRC32C mismatch", pos=commit_pos, size=f[0])
        body = bytes(body)
    topic, props = _decode_text(buf, layout, commit_pos)
    if crc_tail is not None:
        props.pop(PROP_CRC32C, None)
    elif verify is Verify.MQSTORE or (verify is Verify.ROCKETMQ and PROP_CRC32C in props):
        raise CorruptRecordError("missing or malformed __CRC32C property", pos=commit_pos, size=f[0])
    return Record(f[0], f[1], f[2], f[3], f[4], f[5], f[6], f[7], f[8], decode_host(f[9], f[10]), f[11],
                  decode_host(f[12], f[13]), f[14], f[15], body, topic, props, crc_tail)


def decode_header(buf, pos: int = 0, *, base_pos: int = 0) -> RecordHeader | Filler:
    """Structure-checked decode of what dispatch needs; no body copy, no CRC checks."""
    commit_pos = base_pos + pos
    layout = _locate(buf, pos, commit_pos)
    if isinstance(layout, Filler):
        return layout
    f = layout.fields
    topic, props = _decode_text(buf, layout, commit_pos)
    return RecordHeader(f[0], f[3], f[5], f[6], f[7], f[11], topic, _tags_code(props.get(PROP_TAGS)),
                        split_keys(props.get(PROP_KEYS)), props.get(PROP_UNIQ_KEY))


def store_ts_at(buf, pos: int, *, base_pos: int = 0) -> int:
    """STORETIMESTAMP of the record at buf[pos:], honouring SysFlag.BORNHOST_V6 (no other checks)."""
    if len(buf) - pos < V4_HEADER_SIZE:
        raise CorruptRecordError("too few bytes for a record header", pos=base_pos + pos)
    magic = _U32.unpack_from(buf, pos + MAGIC_OFFSET)[0]
    if magic not in (MAGIC_V1, MAGIC_V2):
        raise CorruptRecordError(f"not a record (magic 0x{magic:08X})", pos=base_pos + pos)
    born_v6 = _I32.unpack_from(buf, pos + SYS_FLAG_OFFSET)[0] & BORNHOST_V6
    return _I64.unpack_from(buf, pos + (STORE_TS_OFFSET_BORN_V6 if born_v6 else STORE_TS_OFFSET))[0]


def _locate(buf, pos: int, commit_pos: int) -> _Layout | Filler:
    """Check the structure (structure's rules); return the fixed fields and where the parts lie."""
    avail = len(buf) - pos
    if avail < FILLER_SIZE:
        raise CorruptRecordError(f"only {avail} bytes left, fewer than a record header", pos=commit_pos)
    total_size, magic = _FILLER.unpack_from(buf, pos)
    if magic == BLANK_MAGIC:
        if not FILLER_SIZE <= total_size <= avail:
            raise CorruptRecordError(f"filler TOTALSIZE {total_size} outside {FILLER_SIZE}..{avail}",
                                     pos=commit_pos)
        return Filler(commit_pos, total_size)
    check_head(total_size, magic, avail, commit_pos)
    fields = _V4_HEADER.unpack_from(buf, pos)
    body_pos = pos + BODY_OFFSET
    if fields[_F_SYS_FLAG] & HOSTS_V6:
        fields, body_pos = _unpack_v6_header(buf, pos, total_size, commit_pos)
    check_position(fields[_F_PHYSICAL_OFFSET], commit_pos, total_size)
    body_end, topic_pos, props_pos = locate_parts(buf, pos, total_size, magic, body_pos,
                                                  fields[_F_BODY_LENGTH], commit_pos)
    return _Layout(fields, body_pos, body_end, topic_pos, props_pos, pos + total_size)


def _unpack_v6_header(buf, pos: int, total_size: int, commit_pos: int) -> tuple[tuple, int]:
    """Fixed fields of a record with an IPv6 born and/or store host, in V4_HEADER order, and
    where its body starts."""
    head = _HEAD.unpack_from(buf, pos)
    born = _HOST_V6 if head[_F_SYS_FLAG] & BORNHOST_V6 else _HOST_V4
    store = _HOST_V6 if head[_F_SYS_FLAG] & STOREHOST_V6 else _HOST_V4
    at = pos + RECORD_HEAD_SIZE
    body_pos = at + born.size + 8 + store.size + RECORD_MID_SIZE
    check_header_fits(body_pos, pos + total_size, commit_pos, total_size)
    born_host = born.unpack_from(buf, at)
    store_ts = _I64.unpack_from(buf, at + born.size)
    store_host = store.unpack_from(buf, at + born.size + 8)
    mid = _MID.unpack_from(buf, at + born.size + 8 + store.size)
    return head + born_host + store_ts + store_host + mid, body_pos


def _decode_text(buf, parts: _Layout, commit_pos: int) -> tuple[str, dict[str, str]]:
    topic_len = parts.props_pos - PROPERTIES_LENGTH_SIZE - parts.topic_pos
    try:
        topic = str(buf[parts.topic_pos : parts.topic_pos + topic_len], "utf-8")
        props = decode_properties(buf[parts.props_pos : parts.end])
    except UnicodeDecodeError as exc:
        raise CorruptRecordError(f"topic or properties are not UTF-8 ({exc.reason})",
                                 pos=commit_pos, size=parts.end - parts.props_pos) from None
    return topic, props
