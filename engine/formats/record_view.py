"""Records at known positions in one buffer, read as numpy columns (the consumer's batch read).

A consumer knows where its records are (the consume-queue entries' commit positions), so no
walk is needed: `gather_records` copies the fixed header of all of them with one fancy index
over `np.frombuffer(buffer, np.uint8)` (88-byte items viewed as record_batch.HEADER_DTYPE) and
locates body, topic and properties with a few more; no Python runs per record. The layout is
record.py's: offsets are imported from there, or derived from its constants for v2 records
(2-byte TOPICLENGTH) and IPv6 hosts (each shifts what follows it by HOST_V6_SIZE -
HOST_V4_SIZE), so every record the reference decodes is read here.

`entry_mismatches` compares the records with the consume-queue entries that led to them, whole
arrays at a time: a sound frame (magic, TOTALSIZE inside the buffer, PHYSICALOFFSET == its
position, lengths summing to TOTALSIZE, as `record._locate` checks), TOTALSIZE equal to the
entry's size, queue id and queue offset equal to the entry's, and the topic bytes equal to the
requested topic. It checks no CRC: see ipc.consumer for why that is the caller's choice.

A RecordView keeps the buffer: a body is a memoryview slice of it (no copy), properties are
decoded only when asked, and `to_records` gives the reference decoder's Record objects.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from engine.formats.properties import PROP_CRC32C, decode_properties
from engine.formats.record import (
    BODY_LENGTH_OFFSET,
    BODY_OFFSET,
    BORN_HOST_OFFSET,
    HOST_V4_SIZE,
    HOST_V6_SIZE,
    MAGIC_V1,
    MAGIC_V2,
    PROPERTIES_LENGTH_SIZE,
    RECONSUME_TIMES_OFFSET,
    RECORD_FIXED_SIZE,
    STORE_HOST_OFFSET,
    STORE_TS_OFFSET,
    TOPIC_LENGTH_SIZE_V1,
    TOPIC_LENGTH_SIZE_V2,
    V4_HEADER_SIZE,
    Record,
    SysFlag,
    Verify,
    decode_record,
)
from engine.formats.record_batch import HEADER_DTYPE, gather, gather_int

# Where the host-dependent fields lie, from record.py's IPv4 offsets: STORETIMESTAMP follows the
# born host, the store host follows STORETIMESTAMP, RECONSUMETIMES..BODYLENGTH follow the store host.
_STORE_TS_AFTER_BORN_HOST = STORE_TS_OFFSET - BORN_HOST_OFFSET - HOST_V4_SIZE
_STORE_TS_SIZE = STORE_HOST_OFFSET - STORE_TS_OFFSET
_BODY_LENGTH_AFTER_STORE_HOST = BODY_LENGTH_OFFSET - RECONSUME_TIMES_OFFSET
_BODY_AFTER_BODY_LENGTH = BODY_OFFSET - BODY_LENGTH_OFFSET
_BORNHOST_V6, _STOREHOST_V6 = int(SysFlag.BORNHOST_V6), int(SysFlag.STOREHOST_V6)
_HOSTS_V6 = _BORNHOST_V6 | _STOREHOST_V6
# Read from the IPv4 header for every record: these lie before the born host, IPv6 or not.
assert all(HEADER_DTYPE.fields[name][1] < BORN_HOST_OFFSET
           for name in ("total_size", "magic", "queue_id", "flag", "queue_offset", "commit_pos", "sys_flag",
                        "born_ts_ms"))
assert HEADER_DTYPE.itemsize == V4_HEADER_SIZE == BODY_OFFSET


@dataclass(frozen=True, slots=True, eq=False)
class RecordView:
    """Records of one buffer as columns (int64, one entry per record); positions are in `buf`.

    `commit_pos` is the record's position in the log (base_pos + its position in `buf`);
    `body_pos` where its body starts in `buf`. `framed` is False where the bytes at a position
    are not a sound record frame (the other columns are then meaningless there)."""

    buf: memoryview
    base_pos: int
    commit_pos: np.ndarray
    total_size: np.ndarray
    queue_id: np.ndarray
    queue_offset: np.ndarray
    store_ts_ms: np.ndarray
    born_ts_ms: np.ndarray
    body_pos: np.ndarray
    body_len: np.ndarray
    flag: np.ndarray
    sys_flag: np.ndarray
    topic_pos: np.ndarray
    topic_len: np.ndarray
    props_pos: np.ndarray
    framed: np.ndarray

    @property
    def count(self) -> int:
        return len(self.commit_pos)

    def __len__(self) -> int:
        return len(self.commit_pos)

    @property
    def end_pos(self) -> np.ndarray:
        """Where each record ends, in `buf`."""
        return self.commit_pos - self.base_pos + self.total_size

    def body(self, i: int) -> memoryview:
        """Record i's body: a view of the buffer, valid while the buffer is mapped."""
        start = int(self.body_pos[i])
        return self.buf[start:start + int(self.body_len[i])]

    def topic(self, i: int) -> str:
        start = int(self.topic_pos[i])
        return str(self.buf[start:start + int(self.topic_len[i])], "utf-8")

    def properties(self, i: int) -> dict[str, str]:
        """Record i's properties, decoded now (without the store's __CRC32C property)."""
        start = int(self.props_pos[i])
        end = int(self.commit_pos[i] - self.base_pos + self.total_size[i])
        props = decode_properties(self.buf[start:end])
        props.pop(PROP_CRC32C, None)
        return props

    def body_prefix(self, width_bytes: int) -> tuple[np.ndarray, np.ndarray]:
        """(rows, heads): the first `width_bytes` of every body at least that long, as an
        (len(rows), width_bytes) uint8 array (one gather), and which records those are."""
        rows = np.flatnonzero(self.body_len >= width_bytes)
        return rows, gather(np.frombuffer(self.buf, dtype=np.uint8), self.body_pos[rows], width_bytes)

    def to_records(self, verify: Verify = Verify.STRUCTURE) -> list[Record]:
        """Record objects by the reference decoder (record.decode_record at `verify`)."""
        base_pos = self.base_pos
        return [decode_record(self.buf, pos, verify=verify, base_pos=base_pos)
                for pos in (self.commit_pos - base_pos).tolist()]

    def describe(self, i: int) -> str:
        """What is at record i's position, for an error message."""
        if not self.framed[i]:
            return f"no sound record at commit position {int(self.commit_pos[i])}"
        return (f"a record of {self.topic(i)!r}/{int(self.queue_id[i])} offset "
                f"{int(self.queue_offset[i])} ({int(self.total_size[i])} bytes)")


def gather_records(buf, positions: np.ndarray, base_pos: int) -> RecordView:
    """The records at `positions` (int64 positions in `buf`, which starts at commit position
    `base_pos`), fields gathered for all at once; never raises on bad bytes (see `framed`).

    The IPv4 header of every record is copied in one fancy index (88-byte rows viewed as
    record_batch.HEADER_DTYPE); records with an IPv6 host have their shifted fields re-read."""
    view = memoryview(buf)  # a view of its own: the caller's buffer stays releasable
    u8 = np.frombuffer(view, dtype=np.uint8)
    size = len(u8)
    if size < V4_HEADER_SIZE:  # holds no record; gathers at 0 need a header's bytes
        u8 = np.zeros(V4_HEADER_SIZE, dtype=np.uint8)
    pos = np.asarray(positions, dtype=np.int64)
    inside = (pos >= 0) & (pos + V4_HEADER_SIZE <= size)  # an IPv4 header: the shortest
    head = np.where(inside, pos, 0)
    header = gather(u8, head, V4_HEADER_SIZE).view(HEADER_DTYPE).reshape(len(pos))
    total, magic, sys_flag, body_len, store_ts_ms = (
        header[name].astype(np.int64) for name in ("total_size", "magic", "sys_flag", "body_length",
                                                   "store_ts_ms"))
    body_pos = head + BODY_OFFSET
    v6 = np.flatnonzero(sys_flag & _HOSTS_V6)
    if len(v6):
        header_inside, body_pos[v6], body_len[v6], store_ts_ms[v6] = _v6_fields(u8, head[v6], sys_flag[v6])
        inside[v6] &= header_inside
    end = head + total
    v1 = magic == MAGIC_V1
    length_size = np.where(v1, TOPIC_LENGTH_SIZE_V1, TOPIC_LENGTH_SIZE_V2)
    framed = (inside & (v1 | (magic == MAGIC_V2)) & (total >= RECORD_FIXED_SIZE) & (end <= size)
              & (header["commit_pos"] == base_pos + pos) & (body_len >= 0)
              & (body_pos + body_len + length_size <= end))
    topic_len_pos = body_pos + body_len
    framed &= topic_len_pos + TOPIC_LENGTH_SIZE_V2 <= size  # a v1 record has >= 3 bytes after it
    topic_len_pos = _clip(topic_len_pos, framed)
    topic_len = gather_int(u8, topic_len_pos, ">i2")  # v2: TOPICLENGTH; v1: its first byte is
    topic_len = np.where(v1, topic_len >> 8, topic_len)  # the signed byte TOPICLENGTH
    topic_pos = topic_len_pos + length_size
    framed &= (topic_len >= 0) & (topic_pos + topic_len + PROPERTIES_LENGTH_SIZE <= end)
    props_len_pos = _clip(topic_pos + topic_len, framed)
    props_pos = props_len_pos + PROPERTIES_LENGTH_SIZE
    framed &= props_pos + gather_int(u8, props_len_pos, ">i2") == end
    return RecordView(view, base_pos, base_pos + pos, total, header["queue_id"].astype(np.int64),
                      header["queue_offset"].astype(np.int64), store_ts_ms,
                      header["born_ts_ms"].astype(np.int64), body_pos, body_len,
                      header["flag"].astype(np.int64), sys_flag, topic_pos, topic_len, props_pos, framed)


def _v6_fields(u8: np.ndarray, head: np.ndarray, sys_flag: np.ndarray) -> tuple[np.ndarray, ...]:
    """(header inside the buffer, body position, BODYLENGTH, STORETIMESTAMP) of records with an
    IPv6 host: each such host is HOST_V6_SIZE bytes and shifts what follows it."""
    born_host = np.where(sys_flag & _BORNHOST_V6, HOST_V6_SIZE, HOST_V4_SIZE)
    store_host = np.where(sys_flag & _STOREHOST_V6, HOST_V6_SIZE, HOST_V4_SIZE)
    store_ts_pos = head + BORN_HOST_OFFSET + born_host + _STORE_TS_AFTER_BORN_HOST
    body_len_pos = store_ts_pos + _STORE_TS_SIZE + store_host + _BODY_LENGTH_AFTER_STORE_HOST
    body_pos = body_len_pos + _BODY_AFTER_BODY_LENGTH
    inside = body_pos <= len(u8)  # the whole header, IPv6 hosts included
    body_len = gather_int(u8, _clip(body_len_pos, inside), ">i4")
    return inside, body_pos, body_len, gather_int(u8, _clip(store_ts_pos, inside), ">i8")


def entry_mismatches(records: RecordView, sizes: np.ndarray, topic_raw: bytes, queue_id: int,
                     queue_offsets: np.ndarray) -> np.ndarray:
    """Indexes of the records that are not what their consume-queue entries say: no sound
    frame, TOTALSIZE != the entry's size, another queue id, queue offset or topic."""
    ok = (records.framed & (records.total_size == sizes) & (records.queue_id == queue_id)
          & (records.queue_offset == queue_offsets) & (records.topic_len == len(topic_raw)))
    u8 = np.frombuffer(records.buf, dtype=np.uint8)
    topic_pos = _clip(records.topic_pos, ok)  # a framed record's topic lies inside the buffer
    ok &= (gather(u8, topic_pos, len(topic_raw)) == np.frombuffer(topic_raw, dtype=np.uint8)).all(axis=1)
    return np.flatnonzero(~ok)


def _clip(positions: np.ndarray, valid: np.ndarray) -> np.ndarray:
    """Positions where `valid` (rows whose field is known to lie in the buffer), 0 elsewhere:
    a gather at them stays in the buffer whatever the other rows hold."""
    return np.where(valid, positions, 0)
