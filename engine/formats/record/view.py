"""Records at known positions in one buffer, read as numpy columns (the consumer's batch read).

A consumer knows where its records are (the consume-queue entries' commit positions), so no
walk is needed: `gather_records` copies the fixed header of all of them with one fancy index
over `np.frombuffer(buffer, np.uint8)` (88-byte items viewed as layout.HEADER_DTYPE) and
locates body, topic and properties by structure.frame_many, the structural rules of the
reference decoder for v1 and v2 records with IPv4 or IPv6 hosts; no Python runs per record.

`entry_mismatches` compares the records with the consume-queue entries that led to them, whole
arrays at a time: a sound frame (magic, TOTALSIZE inside the buffer, PHYSICALOFFSET == its
position, lengths summing to TOTALSIZE: structure.frame_many), TOTALSIZE equal to the
entry's size, queue id and queue offset equal to the entry's, and the topic bytes equal to the
requested topic. It checks no CRC: see ipc.consumer for why that is the caller's choice.

A RecordView keeps the buffer: a body is a memoryview slice of it (no copy), properties are
decoded only when asked, and `to_records` gives the reference decoder's Record objects.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from engine.formats.properties import PROP_CRC32C, SEP_KV, SEP_PROP, decode_properties
from engine.formats.record.arrays import clip, gather, gather_int, take_spans
from engine.formats.record.scalar import Record, Verify, decode_record
from engine.formats.record.structure import frame_many


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

    def property_in(self, name: bytes, wanted: frozenset[bytes]) -> tuple[np.ndarray, np.ndarray]:
        """(mask, undecodable): a mask of the records whose property `name` is one of `wanted`,
        as decode_properties reads it (the last pair with that key), for all records at once,
        and the rows the decoder had to read and could not (not UTF-8: corrupt bytes; False in
        the mask).

        A pair starts the properties or follows a 0x02, its key runs to its first 0x01 and its
        value, non-empty, to the next 0x02; a record whose last `name 0x01` starts an empty
        value (no pair) is decided by the decoder itself. Matches are searched in the records'
        properties laid end to end, so one that runs past its record's end is dropped."""
        u8 = np.frombuffer(self.buf, dtype=np.uint8)
        offsets, blob = take_spans(u8, self.props_pos, self.end_pos)
        offsets = offsets.astype(np.int64)
        head = np.frombuffer(name + SEP_KV, dtype=np.uint8)
        width = len(head)
        if len(blob) < width:
            return np.zeros(self.count, dtype=bool), np.zeros(0, dtype=np.int64)
        at = np.ones(len(blob) - width + 1, dtype=bool)
        for k, byte in enumerate(head.tolist()):
            at &= blob[k:len(blob) - width + 1 + k] == byte
        starts = np.flatnonzero(at)
        rows = np.searchsorted(offsets, starts, side="right") - 1
        at_pair = (starts == offsets[rows]) | (blob[np.maximum(starts - 1, 0)] == SEP_PROP[0])
        at_pair &= starts + width <= offsets[rows + 1]  # `name 0x01` inside one record's properties
        starts, rows = starts[at_pair], rows[at_pair]
        last = np.ones(len(rows), dtype=bool)
        last[:-1] = rows[1:] != rows[:-1]
        starts, rows = starts[last] + width, rows[last]
        seps = np.append(np.flatnonzero(blob == SEP_PROP[0]), len(blob))  # the end stops a value too
        ends = np.minimum(seps[np.searchsorted(seps, starts)], offsets[rows + 1])
        keep = np.zeros(self.count, dtype=bool)
        lengths = ends - starts
        for value in wanted:
            same = np.flatnonzero(lengths == len(value))
            if len(same) and value:
                same = same[(gather(blob, starts[same], len(value))
                             == np.frombuffer(value, dtype=np.uint8)).all(axis=1)]
            keep[rows[same]] = True
        undecodable = []
        for row in rows[lengths == 0].tolist():  # not a pair: an earlier one may be the value
            try:
                found = self.properties(row).get(name.decode())
            except UnicodeDecodeError:
                undecodable.append(row)
                continue
            keep[row] = found is not None and found.encode() in wanted
        return keep, np.array(undecodable, dtype=np.int64)

    def body_prefix(self, width_bytes: int) -> tuple[np.ndarray, np.ndarray]:
        """(rows, heads): the first `width_bytes` of every body at least that long, as an
        (len(rows), width_bytes) uint8 array (one gather), and which records those are."""
        rows = np.flatnonzero(self.body_len >= width_bytes)
        return rows, gather(np.frombuffer(self.buf, dtype=np.uint8), self.body_pos[rows], width_bytes)

    def to_records(self, verify: Verify = Verify.STRUCTURE) -> list[Record]:
        """Record objects by the reference decoder (scalar.decode_record at `verify`)."""
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

    The frame, and the IPv4 header of every record (one fancy index of 88-byte rows viewed as
    layout.HEADER_DTYPE), come from structure.frame_many; an IPv6 host shifts STORETIMESTAMP."""
    view = memoryview(buf)  # a view of its own: the caller's buffer stays releasable
    u8 = np.frombuffer(view, dtype=np.uint8)
    pos = np.asarray(positions, dtype=np.int64)
    frame = frame_many(u8, pos, base_pos)
    header = frame.header
    store_ts_ms = header["store_ts_ms"].astype(np.int64)
    if len(frame.v6_rows):  # STORETIMESTAMP follows the born host
        rows = frame.v6_rows
        store_ts_ms[rows] = gather_int(u8, clip(frame.store_ts_pos[rows], frame.framed[rows]), ">i8")
    return RecordView(view, base_pos, base_pos + pos, frame.total_size, header["queue_id"].astype(np.int64),
                      header["queue_offset"].astype(np.int64), store_ts_ms,
                      header["born_ts_ms"].astype(np.int64), frame.body_pos, frame.body_len,
                      header["flag"].astype(np.int64), frame.sys_flag, frame.topic_pos, frame.topic_len,
                      frame.props_pos, frame.framed)


def entry_mismatches(records: RecordView, sizes: np.ndarray, topic_raw: bytes, queue_id: int,
                     queue_offsets: np.ndarray) -> np.ndarray:
    """Indexes of the records that are not what their consume-queue entries say: no sound
    frame, TOTALSIZE != the entry's size, another queue id, queue offset or topic."""
    ok = (records.framed & (records.total_size == sizes) & (records.queue_id == queue_id)
          & (records.queue_offset == queue_offsets) & (records.topic_len == len(topic_raw)))
    u8 = np.frombuffer(records.buf, dtype=np.uint8)
    topic_pos = clip(records.topic_pos, ok)  # a framed record's topic lies inside the buffer
    ok &= (gather(u8, topic_pos, len(topic_raw)) == np.frombuffer(topic_raw, dtype=np.uint8)).all(axis=1)
    return np.flatnonzero(~ok)
