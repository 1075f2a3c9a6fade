"""The one walk of commitlog records, over any buffer: a mapped segment or a `pread` block.

A `LogWindow` is some bytes of one segment: buf[0] is at commit position `base_pos`, and the
segment ends at `segment_end_pos`. The walk follows TOTALSIZE from a record start and decides,
in one place, what a position holds. The stop rules, shared by every form of the walk:
- a record that would end past the requested `end_pos` is not read (Stop.CROSSES_END);
- an end-of-file filler (BLANK_MAGIC, TOTALSIZE = space left) sends the walk to the next
  segment's base; a filler of any other size is a CorruptRecordError;
- zero TOTALSIZE and magic is unwritten space (Stop.UNWRITTEN): whether it is a clean end (only
  zeros to the end of the log) or damage is for the caller, who can read past the window;
- a record that runs past the window but not past its segment needs more bytes (NeedBytes).
Bad bytes raise CorruptRecordError (OnBadBytes.RAISE), or are reported as a BadRegion and
walked past (OnBadBytes.RESYNC, see `resync`).

Forms: `step` (one record, any decoder), `step_run` (a run of records checked together by the
batch codec, engine.formats.record.spans), `walk` (record by record with the resync policy) and
`hop_heads` (heads only: TOTALSIZE and magic, for planning splits). No I/O here: windows are
given by a thin layer (engine.log.scan and engine.log.walk_past over mapped segments,
tools.spark.partitions over pread blocks).
"""

from __future__ import annotations

import functools
import itertools
import struct
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from enum import Enum
from typing import NamedTuple

import numpy as np

from engine.errors import CorruptRecordError
from engine.formats.record import (
    BLANK_MAGIC,
    FILLER_SIZE,
    MAGIC_OFFSET,
    MAGIC_V1,
    MAGIC_V2,
    RECORD_FIXED_SIZE,
    Filler,
    Record,
    RecordHeader,
    Verify,
    decode_header,
    decode_record,
)
from engine.formats.record.spans import RecordSpans, find_starts, verify_spans

Decoder = Callable[[object, int, int], Record | RecordHeader | Filler]  # (buf, pos in buf, base_pos)
Item = Record | RecordHeader | Filler

_HEAD = struct.Struct(">iI")  # TOTALSIZE, MAGICCODE: what decides a position
_RECORD_MAGICS = (MAGIC_V1, MAGIC_V2)
_MAGICS = tuple(magic.to_bytes(4, "big") for magic in _RECORD_MAGICS)
_MAGIC_CHUNK_BYTES = 1 << 20
UNWRITTEN_REASON = "unwritten space (zero TOTALSIZE and magic)"


class Stop(Enum):
    """Why a walk yields no record at a position."""

    END = "end"  # the position is at or past the requested end
    SEGMENT_END = "segment_end"  # the position is the segment's end: go on at the next base
    CROSSES_END = "crosses_end"  # the record there would end past the requested end
    UNWRITTEN = "unwritten"  # zero TOTALSIZE and magic


class OnBadBytes(Enum):
    """What a walk does at a record that does not decode."""

    RAISE = "raise"  # CorruptRecordError at the record's position
    RESYNC = "resync"  # a BadRegion, then on where valid data resumes


class NeedBytes(NamedTuple):
    """The record at `pos` runs past the window: read `size_bytes` from there and step again."""

    pos: int
    size_bytes: int


@dataclass(frozen=True, slots=True)
class LogWindow:
    """Bytes of one segment: buf[0] is at commit position `base_pos`; the segment ends at
    `segment_end_pos` (a mapped segment's window is the whole segment)."""

    buf: object
    base_pos: int
    segment_end_pos: int
    path: str = ""

    @property
    def end_pos(self) -> int:
        return self.base_pos + len(self.buf)


@dataclass(frozen=True)
class BadRegion:
    """Bytes [start_pos, resume_pos) that hold no valid record, in the segment at `path`."""

    start_pos: int
    resume_pos: int
    reason: str
    path: str


@functools.cache
def record_decoder(verify: Verify) -> Decoder:
    """Full Records, checked at `verify` (one decoder per level: walks ask for it per record)."""
    return lambda buf, pos, base_pos: decode_record(buf, pos, verify=verify, base_pos=base_pos)


def header_decoder(buf, pos: int, base_pos: int) -> RecordHeader | Filler:
    """RecordHeaders (structure checked, no CRCs): what dispatch needs."""
    return decode_header(buf, pos, base_pos=base_pos)


def run_decoder(verify: Verify) -> Decoder:
    """What a batch walk decodes one at a time: headers for STRUCTURE, else Records at `verify`."""
    return header_decoder if verify is Verify.STRUCTURE else record_decoder(verify)


# ---------------------------------------------------------------- one step


def step(window: LogWindow, pos: int, end_pos: int, decode: Decoder) -> Item | Stop | NeedBytes:
    """The record or filler at commit position `pos` (a record start), or why there is none;
    a record that does not decode raises the decoder's CorruptRecordError."""
    if pos >= end_pos:
        return Stop.END
    if pos >= window.segment_end_pos:
        return Stop.SEGMENT_END
    buf, off = window.buf, pos - window.base_pos
    space_left = window.segment_end_pos - pos
    if space_left >= FILLER_SIZE and len(buf) - off >= FILLER_SIZE:
        size, magic = _HEAD.unpack_from(buf, off)
        if size == 0 and magic == 0:
            return Stop.UNWRITTEN
        if 0 < size <= space_left and pos + size > end_pos:  # a filler too: it ends its segment
            return Stop.CROSSES_END
        if magic == BLANK_MAGIC:
            if size != space_left:
                raise CorruptRecordError(f"filler of {size} bytes with {space_left} left in the "
                                         "segment", pos=pos, size=size)
            return Filler(pos, size)
        if magic in _RECORD_MAGICS and 0 < size <= space_left and off + size > len(buf):
            return NeedBytes(pos, size)  # a record's only: garbage could ask for a whole segment
    elif space_left > len(buf) - off:
        return NeedBytes(pos, min(FILLER_SIZE, space_left))
    return decode(buf, off, window.base_pos)


def step_run(window: LogWindow, pos: int, end_pos: int, verify: Verify,
             run_bytes: int) -> RecordSpans | None:
    """The leading records from `pos` (a record start) that end within `end_pos`, the window
    and `run_bytes`, and pass every check of verify_spans(verify); None when the first does
    not (`step` then reads it: a filler, a v2 or IPv6 record, non-ASCII text, damage)."""
    return verify_run(window, run_starts(window, pos, end_pos, run_bytes), verify)


def run_starts(window: LogWindow, pos: int, end_pos: int, run_bytes: int) -> np.ndarray:
    """Buffer positions of the TOTALSIZE chain from `pos` while each record ends within
    `end_pos`, the window, its segment and `run_bytes` (step_run's first half)."""
    limit = min(end_pos, window.segment_end_pos, window.end_pos, pos + run_bytes) - window.base_pos
    return find_starts(window.buf, pos - window.base_pos, limit, window.base_pos)


def verify_run(window: LogWindow, starts: np.ndarray, verify: Verify) -> RecordSpans | None:
    """The leading records of `starts` the batch codec accepts at `verify`; None for none
    (step_run's second half)."""
    if not len(starts):
        return None
    spans = verify_spans(window.buf, starts, window.base_pos, verify)
    return spans if spans.count else None


# ---------------------------------------------------------------- bad bytes


def resync(window: LogWindow, pos: int, error: CorruptRecordError, limit_pos: int,
           verify: Verify) -> BadRegion:
    """The bad bytes from `pos` (where `error` was raised) to where valid data resumes: at the
    end its TOTALSIZE claims if a record starts there, else at the next record found by its
    magic, else at `limit_pos` (at most the window's end). A record found after bad bytes is
    genuine: a valid record holds its own commit position, and positions are never reused."""
    base = window.base_pos
    limit = min(limit_pos, window.end_pos, window.segment_end_pos) - base
    off = pos - base
    claimed = [off + error.size] if error.size > 0 and off + error.size < limit else []
    decode = record_decoder(verify)
    for candidate in itertools.chain(claimed, _magic_candidates(window.buf, off + 1, limit)):
        try:  # a candidate is judged as a walk from it would judge it
            found = step(window, base + candidate, window.segment_end_pos, decode)
        except CorruptRecordError:
            continue
        if isinstance(found, Record | RecordHeader | Filler):
            return BadRegion(pos, base + candidate, error.reason, window.path)
    return BadRegion(pos, base + limit, error.reason, window.path)


def _magic_candidates(buf, start: int, limit: int) -> Iterator[int]:
    """Buffer positions start <= p < limit whose bytes at p + MAGIC_OFFSET are a record magic."""
    limit_at = min(limit + MAGIC_OFFSET, len(buf))
    at = start + MAGIC_OFFSET
    while at < limit_at:
        chunk = bytes(buf[at:min(limit_at, at + _MAGIC_CHUNK_BYTES + 3)])
        hits = sorted(i for magic in _MAGICS for i in _find_all(chunk, magic))
        yield from (at + i - MAGIC_OFFSET for i in hits)
        at += _MAGIC_CHUNK_BYTES


def _find_all(data: bytes, needle: bytes) -> Iterator[int]:
    i = data.find(needle)
    while i >= 0:
        yield i
        i = data.find(needle, i + 1)


# ---------------------------------------------------------------- record by record


def walk(window: LogWindow, pos: int, end_pos: int, decode: Decoder, verify: Verify,
         on_bad: OnBadBytes) -> Iterator[Item | BadRegion | Stop | NeedBytes]:
    """Every record, filler and (RESYNC) bad region of the window from `pos`, in order; the
    last thing yielded is a filler, a Stop or a NeedBytes, where the caller takes over (next
    segment, clean end or not, more bytes). `verify` is what a resync candidate must pass."""
    while True:
        try:
            item = step(window, pos, end_pos, decode)
        except CorruptRecordError as exc:
            if on_bad is OnBadBytes.RAISE:
                raise
            region = resync(window, pos, exc, end_pos, verify)
            yield region
            pos = region.resume_pos
            continue
        yield item
        if isinstance(item, Filler | Stop | NeedBytes):
            return
        pos += item.total_size


# ---------------------------------------------------------------- heads only


class HopEnd(Enum):
    """Where a walk of record heads stopped."""

    REACHED = "reached"  # at the first record start at or past the target
    CHAIN_END = "chain_end"  # at a position that holds no record (filler, zeros, garbage)
    WINDOW_END = "window_end"  # the next head lies past the window: read on from `pos`


def hop_heads(window: LogWindow, pos: int, stop_pos: int) -> tuple[int, HopEnd]:
    """Follow TOTALSIZE from the record start `pos` while below `stop_pos`, reading only each
    record's 8-byte head (a record: magic v1/v2 and RECORD_FIXED_SIZE <= TOTALSIZE <= space
    left in the segment). No checks beyond that: planning bounds, not reading records."""
    unpack = _HEAD.unpack_from
    buf, segment_end = window.buf, window.segment_end_pos
    off = pos - window.base_pos
    last = min(len(buf), segment_end - window.base_pos) - FILLER_SIZE  # the last head that fits
    while pos < stop_pos:
        if off > last:
            return pos, HopEnd.CHAIN_END if segment_end - pos < FILLER_SIZE else HopEnd.WINDOW_END
        total_size, magic = unpack(buf, off)
        if (magic != MAGIC_V1 and magic != MAGIC_V2) or not (
                RECORD_FIXED_SIZE <= total_size <= segment_end - pos):
            return pos, HopEnd.CHAIN_END
        pos += total_size
        off += total_size
    return pos, HopEnd.REACHED


def is_filler_head(window: LogWindow, pos: int) -> bool:
    """Whether the 8 bytes at `pos` (in the window) are an end-of-file filler's head."""
    off = pos - window.base_pos
    return len(window.buf) - off >= FILLER_SIZE and _HEAD.unpack_from(window.buf, off)[1] == BLANK_MAGIC
