"""Walking the commitlog forward: Scanner (record by record, with the reference decoders) and
BatchScanner (runs of records checked together by engine.formats.record.spans). Both follow
fillers to the next segment and stop at a record that would cross `end_pos`; see
engine.commitlog for the layout they walk."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, NamedTuple

from engine.errors import BadInputError, CorruptRecordError
from engine.formats.record import (
    TOTAL_SIZE_FIELD,
    Filler,
    Record,
    RecordHeader,
    Verify,
    decode_header,
    decode_record,
)
from engine.formats.record.dispatch_columns import DispatchColumns, columns_from_headers, decode_dispatch
from engine.formats.record.spans import RecordSpans, find_starts, verify_spans
from engine.mapped_file import Access, MappedFile

if TYPE_CHECKING:
    from engine.commitlog import CommitLog

Decoder = Callable[[memoryview, int, int], Record | RecordHeader | Filler]


class _LogWalk:
    """A walk of the log from `start_pos` to `end_pos` (default: the end of the last segment):
    `pos` is where the next record starts, `fillers` counts the fillers crossed."""

    def __init__(self, log: CommitLog, start_pos: int, end_pos: int | None):
        if start_pos < log.min_pos:
            raise BadInputError("start_pos", f"{start_pos} is below the log start {log.min_pos}")
        self.log = log
        self.pos = start_pos
        self.end_pos = log.segments.end_pos if end_pos is None else end_pos
        self.fillers = 0

    def _segment(self) -> MappedFile | None:
        """The segment holding `pos` (a reader adopts segments the writer has made since)."""
        segment = self.log.segments.find(self.pos)
        if segment is None and self.log.segments.access is Access.READ_ONLY:
            self.log.refresh()
            segment = self.log.segments.find(self.pos)
        return segment


class Scanner(_LogWalk):
    """Iterator over the records of [start_pos, end_pos), following fillers to the next segment.

    `pos` is always where the next record would start: after a normal end it is where the scan
    stopped (>= end_pos, or the start of a record that would cross end_pos, or the base of a
    segment that is not there); after a CorruptRecordError it is the bad record's commit_pos,
    the cut point for recovery. Unwritten (zero) bytes raise CorruptRecordError too: whether
    that is a clean end is the caller's decision. `end_pos` defaults to the end of the last
    segment. `fillers` counts the fillers crossed.
    """

    def __init__(self, log: CommitLog, start_pos: int, end_pos: int | None, decode: Decoder):
        super().__init__(log, start_pos, end_pos)
        self._decode = decode

    def __iter__(self) -> Iterator:
        return self

    def __next__(self):
        while self.pos < self.end_pos:
            segment = self._segment()
            if segment is None:
                break
            base_pos = self.log.segments.base_of(segment)
            file_pos = self.pos - base_pos
            space_left = segment.size_bytes - file_pos
            if space_left >= TOTAL_SIZE_FIELD.size:
                size = TOTAL_SIZE_FIELD.unpack_from(segment.buf, file_pos)[0]
                if 0 < size <= space_left and self.pos + size > self.end_pos:
                    break  # a record past the requested end: stop before it
            item = self._decode(segment.buf, file_pos, base_pos)
            if isinstance(item, Filler):
                if item.size != space_left:
                    raise CorruptRecordError(f"filler of {item.size} bytes, {space_left} left in "
                                             "the segment", pos=self.pos, size=item.size)
                self.fillers += 1
                self.pos = base_pos + segment.size_bytes
                continue
            if item.total_size <= 0:  # defensive: a decoder must never yield this
                raise CorruptRecordError("non-positive TOTALSIZE", pos=self.pos)
            self.pos += item.total_size
            return item
        raise StopIteration


class ScannedRun(NamedTuple):
    """One step of a BatchScanner: a run of records checked together in one segment (`spans`
    over `buf`), or one record the reference decoder read (`single`)."""

    buf: memoryview | None
    base_pos: int
    spans: RecordSpans | None
    single: Record | RecordHeader | None

    @property
    def count(self) -> int:
        return 1 if self.spans is None else self.spans.count

    @property
    def byte_count(self) -> int:
        if self.spans is None:
            return self.single.total_size
        return int(self.spans.ends[-1] - self.spans.starts[0])

    def columns(self) -> DispatchColumns:
        """What dispatch needs from these records."""
        if self.spans is None:
            return columns_from_headers([self.single])
        return decode_dispatch(self.buf, self.spans, self.base_pos)


class BatchScanner(_LogWalk):
    """Scanner's rules, many records per step: yields ScannedRuns from `start_pos`.

    Each step walks and checks up to `run_bytes` of one segment with the batch codec
    (engine.formats.record.spans); the first record the batch path does not accept (a filler,
    a v2 or IPv6 record, non-ASCII text, damage) is read by a one-step Scanner with the
    reference decoder, which yields it or raises CorruptRecordError at its position. So `pos`,
    `fillers` and the errors are those of `CommitLog.scan` (verify given) or `scan_headers`
    (Verify.STRUCTURE).
    """

    def __init__(self, log: CommitLog, start_pos: int, end_pos: int | None, verify: Verify,
                 run_bytes: int = 1 << 20):
        super().__init__(log, start_pos, end_pos)
        self.verify = verify
        self.run_bytes = run_bytes

    def __iter__(self) -> Iterator[ScannedRun]:
        return self

    def __next__(self) -> ScannedRun:
        if self.pos >= self.end_pos:
            raise StopIteration
        probe = Scanner(self.log, self.pos, self.end_pos, self._decode)  # for what the batch path refuses
        segment = probe._segment()
        if segment is None:
            raise StopIteration
        base_pos = self.log.segments.base_of(segment)
        file_pos = self.pos - base_pos
        limit = min(self.end_pos - base_pos, segment.size_bytes, file_pos + self.run_bytes)
        starts = find_starts(segment.buf, file_pos, limit, base_pos)
        if len(starts):
            spans = verify_spans(segment.buf, starts, base_pos, self.verify)
            if spans.count:
                self.pos = base_pos + int(spans.ends[-1])
                return ScannedRun(segment.buf, base_pos, spans, None)
        try:
            return ScannedRun(None, 0, None, next(probe))
        finally:
            self.pos, self.fillers = probe.pos, self.fillers + probe.fillers

    def _decode(self, buf, pos: int, base_pos: int) -> Record | RecordHeader | Filler:
        if self.verify is Verify.STRUCTURE:
            return decode_header(buf, pos, base_pos=base_pos)
        return decode_record(buf, pos, verify=self.verify, base_pos=base_pos)
