"""Walking the commitlog forward over its mapped segments: Scanner (record by record) and
BatchScanner (runs of records checked together). The walk and its stop rules are
engine.log.walker's; this module only hands it one segment after another.

Segments come from a `WindowSource` (CommitLog.window_at: the mapped segment holding a
position, as a LogWindow), so this module does not know the CommitLog class.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import NamedTuple

from engine.errors import CorruptRecordError
from engine.formats.record import Filler, Record, RecordHeader, Verify
from engine.formats.record.dispatch_columns import DispatchColumns, columns_from_headers, decode_dispatch
from engine.formats.record.spans import RecordSpans
from engine.log.walker import UNWRITTEN_REASON, Decoder, LogWindow, Stop, run_decoder, step, step_run

WindowSource = Callable[[int], LogWindow | None]  # the whole segment holding a position, or None


class Scanner:
    """Iterator over the records of [start_pos, end_pos), following fillers to the next segment.

    `pos` is always where the next record would start: after a normal end it is where the scan
    stopped (>= end_pos, or the start of a record that would cross end_pos, or the base of a
    segment that is not there); after a CorruptRecordError it is the bad record's commit_pos,
    the cut point for recovery. Unwritten (zero) bytes raise CorruptRecordError too: whether
    that is a clean end is the caller's decision. `fillers` counts the fillers crossed.
    """

    def __init__(self, windows: WindowSource, start_pos: int, end_pos: int, decode: Decoder):
        self.pos = start_pos
        self.end_pos = end_pos
        self.fillers = 0
        self._windows = windows
        self._decode = decode
        self._window: LogWindow | None = None

    def __iter__(self) -> Iterator:
        return self

    def __next__(self) -> Record | RecordHeader:
        while self.pos < self.end_pos:
            window = self.window()
            if window is None:
                break
            item = step(window, self.pos, self.end_pos, self._decode)
            if isinstance(item, Filler):
                self.fillers += 1
                self.pos = window.segment_end_pos
                continue
            if item is Stop.UNWRITTEN:
                raise CorruptRecordError(UNWRITTEN_REASON, pos=self.pos)
            if isinstance(item, Record | RecordHeader):
                self.pos += item.total_size
                return item
            break  # the requested end, or a record crossing it
        raise StopIteration

    def window(self) -> LogWindow | None:
        """The segment holding `pos` (kept while the walk stays in it)."""
        window = self._window
        if window is None or not window.base_pos <= self.pos < window.segment_end_pos:
            window = self._window = self._windows(self.pos)
        return window


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


class BatchScanner:
    """Scanner's rules, many records per step: yields ScannedRuns from `start_pos`.

    Each step walks and checks up to `run_bytes` of one segment (log_walker.step_run); the
    first record the batch path does not accept (a filler, a v2 or IPv6 record, non-ASCII
    text, damage) is read by a one-step Scanner with the reference decoder, which yields it or
    raises CorruptRecordError at its position. So `pos`, `fillers` and the errors are those of
    `CommitLog.scan` (verify given) or `scan_headers` (Verify.STRUCTURE).
    """

    def __init__(self, windows: WindowSource, start_pos: int, end_pos: int, verify: Verify,
                 run_bytes: int = 1 << 20):
        self.pos = start_pos
        self.end_pos = end_pos
        self.verify = verify
        self.run_bytes = run_bytes
        self._records = Scanner(windows, start_pos, end_pos, run_decoder(verify))

    def __iter__(self) -> Iterator[ScannedRun]:
        return self

    @property
    def fillers(self) -> int:
        """The fillers crossed: only the one-step Scanner crosses them (a run stops before one)."""
        return self._records.fillers

    def __next__(self) -> ScannedRun:
        records = self._records
        records.pos = self.pos
        if self.pos >= self.end_pos:
            raise StopIteration
        window = records.window()
        if window is None:
            raise StopIteration
        spans = step_run(window, self.pos, self.end_pos, self.verify, self.run_bytes)
        if spans is not None:
            self.pos = window.base_pos + int(spans.ends[-1])
            return ScannedRun(window.buf, window.base_pos, spans, None)
        try:
            return ScannedRun(None, 0, None, next(records))
        finally:
            self.pos = records.pos

