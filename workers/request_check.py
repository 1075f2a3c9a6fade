"""Structural checks of the records a producer put in its mailbox slot, before any is appended.

Producers encode records themselves (encode_record), so the supervisor only stamps and copies;
this module is what stops a buggy or hostile producer from getting garbage into the log. A
record passes when its framing and every length agree, its magic is v1 with IPv4 hosts, its
BODYCRC matches its body, its topic is valid, its properties are UTF-8 and end with the
reserved __CRC32C slot, its queue id is in range and it fits a segment. QUEUEOFFSET,
PHYSICALOFFSET and STORETIMESTAMP are overwritten by stamp_record, so they are not checked.
Anything else raises BadInputError: the record gets MESSAGE_ILLEGAL and never reaches the log.

`check_request` applies the same checks to a whole request with whole-array operations (the
per-record C calls left are one zlib.crc32 per body and one bytes() per topic); only the records
it rejects are run through `check` again, for the reason to log.
"""

from __future__ import annotations

import struct
import zlib
from typing import NamedTuple

import numpy as np

from engine.errors import BadInputError
from engine.formats.record import (
    BODY_CRC_MASK,
    BODY_OFFSET,
    CRC32C_PREFIX,
    CRC32C_PROP_SIZE,
    FILLER_SIZE,
    MAGIC_V1,
    MAX_PROPERTIES_BYTES,
    PROPERTIES_LENGTH_SIZE,
    RECORD_FIXED_SIZE,
    V4_HEADER_FMT,
    SysFlag,
)
from engine.formats.record_batch import HEADER_DTYPE, gather
from engine.formats.record_scan import walk_starts
from engine.naming import validate_topic

_HEADER = struct.Struct(V4_HEADER_FMT)
_I8 = struct.Struct(">b")
_I16 = struct.Struct(">h")
_HOSTS_V6 = int(SysFlag.BORNHOST_V6 | SysFlag.STOREHOST_V6)
_MAX_TOPIC_CACHE = 4096
_PREFIX_U8 = np.frombuffer(CRC32C_PREFIX, dtype=np.uint8)


class CheckedRequest(NamedTuple):
    """The records of one request: where each lies, which passed, and their routing."""

    starts: np.ndarray  # int64
    sizes: np.ndarray  # int64
    ok: np.ndarray  # bool
    topics: list[str | None]  # None where not ok
    queue_ids: np.ndarray  # int64
    reasons: dict[int, str]  # why each rejected record was rejected


class RecordChecker:
    """Checks request records against one store's limits; caches validated topics."""

    def __init__(self, *, max_body_bytes: int, queue_count: int, segment_bytes: int):
        self.max_body_bytes = max_body_bytes
        self.queue_count = queue_count
        self.max_record_bytes = segment_bytes - FILLER_SIZE
        self._topics: dict[bytes, str] = {}

    def check(self, record: memoryview) -> tuple[str, int]:
        """(topic, queue_id) of a well-formed record; BadInputError naming what is wrong."""
        size = len(record)
        if size < RECORD_FIXED_SIZE + CRC32C_PROP_SIZE:
            raise BadInputError("record", f"{size} bytes is too short for a record")
        if size > self.max_record_bytes:
            raise BadInputError("record", f"{size} bytes does not fit a commitlog segment")
        fields = _HEADER.unpack_from(record, 0)
        total, magic, body_crc, queue_id, sys_flag, body_len = (
            fields[0], fields[1], fields[2], fields[3], fields[7], fields[16])
        if total != size:
            raise BadInputError("record", f"TOTALSIZE {total} but {size} bytes")
        if magic != MAGIC_V1:
            raise BadInputError("record", f"magic 0x{magic:08X} is not message version 1")
        if sys_flag & _HOSTS_V6 or sys_flag < 0:
            raise BadInputError("record", "IPv6 host flags are not accepted from producers")
        if not 0 <= queue_id < self.queue_count:
            raise BadInputError("queue_id", f"{queue_id} is outside 0..{self.queue_count - 1}")
        if not 0 <= body_len <= self.max_body_bytes:
            raise BadInputError("body", f"BODYLENGTH {body_len} exceeds {self.max_body_bytes}")
        topic_len_pos = BODY_OFFSET + body_len
        if topic_len_pos + 1 + PROPERTIES_LENGTH_SIZE > size:
            raise BadInputError("record", f"BODYLENGTH {body_len} does not fit TOTALSIZE {size}")
        (topic_len,) = _I8.unpack_from(record, topic_len_pos)
        props_len_pos = topic_len_pos + 1 + topic_len
        if topic_len <= 0 or props_len_pos + PROPERTIES_LENGTH_SIZE > size:
            raise BadInputError("record", f"TOPICLENGTH {topic_len} does not fit TOTALSIZE {size}")
        (props_len,) = _I16.unpack_from(record, props_len_pos)
        props_pos = props_len_pos + PROPERTIES_LENGTH_SIZE
        if props_len < CRC32C_PROP_SIZE or props_pos + props_len != size \
                or props_len > MAX_PROPERTIES_BYTES:
            raise BadInputError("record", f"PROPERTIESLENGTH {props_len} does not fit TOTALSIZE {size}")
        crc_pos = size - CRC32C_PROP_SIZE
        if record[crc_pos:crc_pos + len(CRC32C_PREFIX)] != CRC32C_PREFIX or record[size - 1] != 0x02:
            raise BadInputError("record", "properties do not end with the reserved __CRC32C slot")
        if zlib.crc32(record[BODY_OFFSET:topic_len_pos]) & BODY_CRC_MASK != body_crc:
            raise BadInputError("body", "BODYCRC does not match the body")
        try:
            bytes(record[props_pos:crc_pos]).decode("utf-8")
        except UnicodeDecodeError:
            raise BadInputError("properties", "are not valid UTF-8") from None
        return self._topic(bytes(record[topic_len_pos + 1:props_len_pos])), queue_id

    def check_request(self, data: bytearray, count: int) -> CheckedRequest:
        """Check the `count` records laid end to end in `data` (BadInputError if the framing
        itself is broken: then no record can be trusted)."""
        starts = walk_starts(data, 0, len(data), max_count=count)
        ends = np.empty_like(starts)
        if len(starts):
            ends[:-1] = starts[1:]
            ends[-1] = starts[-1] + int.from_bytes(data[starts[-1]:starts[-1] + 4], "big")
        if len(starts) != count or not len(starts) or int(ends[-1]) != len(data):
            raise BadInputError("request", f"{count} records announced in {len(data)} bytes, "
                                f"framing finds {len(starts)} ending at {int(ends[-1]) if len(ends) else 0}")
        sizes = ends - starts
        u8 = np.frombuffer(data, dtype=np.uint8)
        safe = np.where(sizes >= RECORD_FIXED_SIZE + CRC32C_PROP_SIZE, starts, 0)
        header = gather(u8, safe, BODY_OFFSET).view(HEADER_DTYPE).ravel()
        queue_ids = header["queue_id"].astype(np.int64)
        body_len = header["body_length"].astype(np.int64)
        sys_flag = header["sys_flag"].astype(np.int64)
        ok = ((safe == starts) & (header["total_size"] == sizes) & (header["magic"] == MAGIC_V1)
              & (sys_flag >= 0) & ((sys_flag & _HOSTS_V6) == 0) & (sizes <= self.max_record_bytes)
              & (queue_ids >= 0) & (queue_ids < self.queue_count)
              & (body_len >= 0) & (body_len <= self.max_body_bytes))
        topic_len_pos = starts + BODY_OFFSET + body_len
        ok &= topic_len_pos + 1 + PROPERTIES_LENGTH_SIZE <= ends
        topic_len = u8[np.where(ok, topic_len_pos, 0)].astype(np.int8).astype(np.int64)
        props_len_pos = topic_len_pos + 1 + topic_len
        ok &= (topic_len > 0) & (props_len_pos + PROPERTIES_LENGTH_SIZE <= ends)
        props_len = gather(u8, np.where(ok, props_len_pos, 0), 2).view(">i2").ravel().astype(np.int64)
        props_pos = props_len_pos + PROPERTIES_LENGTH_SIZE
        ok &= (props_len >= CRC32C_PROP_SIZE) & (props_pos + props_len == ends)
        crc_pos = np.where(ok, ends - CRC32C_PROP_SIZE, 0)
        ok &= (gather(u8, crc_pos, len(CRC32C_PREFIX)) == _PREFIX_U8).all(axis=1)
        ok &= u8[np.where(ok, ends - 1, 0)] == 0x02
        topics: list[str | None] = [None] * count
        with memoryview(data) as view:
            rows = np.flatnonzero(ok)
            body_crcs = np.fromiter(map(zlib.crc32, map(view.__getitem__, map(
                slice, (starts[rows] + BODY_OFFSET).tolist(), topic_len_pos[rows].tolist()))),
                dtype=np.int64, count=len(rows)) & BODY_CRC_MASK
            ok[rows] &= body_crcs == header["body_crc"][rows]
            rows = np.flatnonzero(ok)
            props = list(map(view.__getitem__, map(slice, props_pos[rows].tolist(),
                                                   crc_pos[rows].tolist())))
            if not b"".join(props).isascii():  # rare: decode each, as the reader will
                for i, raw in zip(rows.tolist(), props, strict=True):
                    try:
                        bytes(raw).decode("utf-8")
                    except UnicodeDecodeError:
                        ok[i] = False
            self._route_topics(view, u8, np.flatnonzero(ok), topic_len_pos + 1, topic_len, ok, topics)
            reasons = {}
            for i in np.flatnonzero(~ok).tolist():
                topics[i] = None
                try:
                    self.check(view[starts[i]:ends[i]])
                    reasons[i] = "refused by the batch check"  # pragma: no cover - same rules
                except BadInputError as exc:
                    reasons[i] = str(exc)
        return CheckedRequest(starts, sizes, ok, topics, queue_ids, reasons)

    def _route_topics(self, view: memoryview, u8: np.ndarray, rows: np.ndarray, topic_pos: np.ndarray,
                      topic_len: np.ndarray, ok: np.ndarray, topics: list[str | None]) -> None:
        """Fill `topics` for `rows`; the common case (one topic per request) is compared as a
        whole, the rest validated one by one (a bad topic clears `ok`)."""
        if not len(rows):
            return
        first = int(rows[0])
        length, at = int(topic_len[first]), int(topic_pos[first])
        raw = bytes(view[at:at + length])
        same = topic_len[rows] == length
        same[same] = (gather(u8, topic_pos[rows[same]], length)
                      == np.frombuffer(raw, dtype=np.uint8)).all(axis=1)
        try:
            topic = self._topic(raw)
        except BadInputError:
            topic = None
        for i, is_same in zip(rows.tolist(), same.tolist(), strict=True):
            if is_same:
                name = topic
            else:
                at, length = int(topic_pos[i]), int(topic_len[i])
                try:
                    name = self._topic(bytes(view[at:at + length]))
                except BadInputError:
                    name = None
            if name is None:
                ok[i] = False
            topics[i] = name

    def _topic(self, raw: bytes) -> str:
        topic = self._topics.get(raw)
        if topic is None:
            try:
                topic = validate_topic(raw.decode("utf-8"))
            except UnicodeDecodeError:
                raise BadInputError("topic", "is not valid UTF-8") from None
            if len(self._topics) >= _MAX_TOPIC_CACHE:
                self._topics.clear()
            self._topics[raw] = topic
        return topic
