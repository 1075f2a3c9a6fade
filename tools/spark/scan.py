"""Reading one ScanRange as Arrow record batches in the source's schema.

Runs on executors. Files are read with pread (never mapped), so a live store is safe to read
below its durable position. The chain rules (see partitions.py) decide which records a range
owns; the walk over the pread blocks is engine.log.walker's (step, run_starts, verify_run);
this module decodes the records, applies the row filters and verification.

Two paths, same rows (tests/spark/test_scan_batches.py): `read_batches` reads RUN_BYTES at a
time and hands the leading records the batch scanner accepts (engine.formats.record.spans:
find_starts + verify_spans, which checks every CRC unless verify is NONE) to
tools.spark.arrow_columns, which builds one Arrow batch per run with whole-array work; the
first record it refuses (a filler, unwritten space, damage, a v2/IPv6 record, non-ASCII
text) and the next SCALAR_RUN records go through `record.decode_record` one at a time, as
`iter_range` / `read_scalar_batches` (the reference path) read every record.

Verification (`VerifyMode`): NONE checks structure only (framing, lengths, PHYSICALOFFSET);
FAIL also checks every CRC and raises on the first bad record; REPORT checks every CRC and
yields bad records as rows with an `error`: a record whose CRC fails but whose structure
holds keeps its fields; a structurally broken one ends its segment's chain (a row with only
commit_pos and error), and so do unwritten bytes followed by data.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass
from enum import Enum
from typing import NamedTuple

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from engine.dispatch.record import index_keys
from engine.errors import CorruptRecordError
from engine.filters.tag_expression import MATCH_ALL_TAGS, TagExpression
from engine.formats.record import FILLER_SIZE, Filler, Record, Verify, decode_record
from engine.formats.record.arrays import gather_field
from engine.formats.record.spans import RecordSpans
from engine.log.walker import LogWindow, NeedBytes, record_decoder, run_starts, step, verify_run
from tools.spark.arrow_columns import dispatch_batch, message_batch
from tools.spark.partitions import BlockReader, ScanRange, first_record_at, pread_reader

READ_BLOCK_BYTES = 4 << 20
BATCH_ROWS = 4096
BATCH_BODY_BYTES = 32 << 20
RUN_BYTES = 4 << 20  # one batch-scanner run: one pread, one Arrow batch
SCALAR_RUN = 64  # records read by the reference decoder after one the batch path refused
_ZERO_CHECK_BYTES = 1 << 20


class VerifyMode(Enum):
    NONE = "none"
    FAIL = "fail"
    REPORT = "report"


class View(Enum):
    """MESSAGES: one full row per message. DISPATCH: what consume queues and the index need."""

    MESSAGES = "messages"
    DISPATCH = "dispatch"


class SegmentEnd(Enum):
    FILLER = "filler"  # the end-of-file filler: the next record is in the next segment
    UNWRITTEN = "unwritten"  # zero TOTALSIZE and magic: nothing written from here


@dataclass(frozen=True)
class RowFilter:
    topics: frozenset[str] | None = None
    start_ms: int | None = None
    end_ms: int | None = None
    tags: TagExpression = MATCH_ALL_TAGS  # the consumers' tag rule (engine.filters.tag_expression)

    def accepts(self, record: Record) -> bool:
        if self.topics is not None and record.topic not in self.topics:
            return False
        if not self.tags.matches(record.tags):
            return False
        if self.start_ms is not None and record.store_ts_ms < self.start_ms:
            return False
        return self.end_ms is None or record.store_ts_ms < self.end_ms


@dataclass(frozen=True)
class ScanSpec:
    """Everything an executor needs besides the range (picklable). `columns`: the columns the
    reader returns (None: all of the view's); only those are decoded."""

    verify_mode: VerifyMode
    full_verify: Verify
    row_filter: RowFilter
    view: View = View.MESSAGES
    columns: frozenset[str] | None = None

    @property
    def verify(self) -> Verify:
        return Verify.STRUCTURE if self.verify_mode is VerifyMode.NONE else self.full_verify

    @property
    def schema(self) -> pa.Schema:
        """The batches' columns: `columns`, the topic when the row filter reads it, and the
        error, in the view's order."""
        full = arrow_schema(self.view, self.verify_mode)
        if self.columns is None:
            return full
        read = {"topic"} if self.row_filter.topics is not None else set()
        if not self.row_filter.tags.matches_all:
            read.add("tags")
        kept = self.columns | {ERROR_FIELD[0]} | read
        return pa.schema([f for f in full if f.name in kept])


@dataclass(frozen=True)
class BadRecord:
    """A record that failed verification; `record` is its structure-only decode, if any."""

    commit_pos: int
    reason: str
    record: Record | None = None


# ------------------------------------------------------------------------- iteration


def iter_range(rng: ScanRange, spec: ScanSpec) -> Iterator[Record | BadRecord]:
    """The records the range owns, in commit order, one at a time through the reference
    decoder (see the module doc for bad ones); read_batches gives the same rows faster."""
    fd = os.open(rng.path, os.O_RDONLY)
    try:
        blocks = BlockReader(pread_reader(fd), READ_BLOCK_BYTES)
        pos = first_record_at(blocks, rng.walk_from, rng.start, rng.segment_bytes)
        while pos is not None and pos < rng.end:
            item, pos = _step(fd, blocks, rng, pos, spec)
            if item is not None:
                yield item
    finally:
        os.close(fd)


def _step(fd: int, blocks: BlockReader, rng: ScanRange, pos: int,
          spec: ScanSpec) -> tuple[Record | BadRecord | None, int | None]:
    """The item at file_pos `pos` and where the chain goes on (None: the segment's data ends)."""
    item = _decode_at(blocks, rng, pos, spec)
    if isinstance(item, SegmentEnd):
        if item is SegmentEnd.UNWRITTEN and spec.verify_mode is VerifyMode.REPORT \
                and _data_after(fd, rng, pos):
            return BadRecord(rng.base_pos + pos, "unwritten bytes followed by data"), None
        return None, None
    if isinstance(item, BadRecord):
        return item, None if item.record is None else pos + item.record.total_size
    return item, pos + item.total_size


def _decode_at(blocks: BlockReader, rng: ScanRange, pos: int,
               spec: ScanSpec) -> Record | BadRecord | SegmentEnd:
    """The record at file_pos `pos`, or how the segment's data ends there (engine.log.walker.step
    over the cached block, read again from `pos` where the record runs past it)."""
    commit_pos = rng.base_pos + pos
    decode = record_decoder(spec.verify)
    window = blocks.window(pos, FILLER_SIZE, rng.base_pos, rng.segment_bytes)
    try:
        item = step(window, commit_pos, window.segment_end_pos, decode)
        if isinstance(item, NeedBytes):
            window = blocks.window(pos, item.size_bytes, rng.base_pos, rng.segment_bytes)
            if window.end_pos - commit_pos < item.size_bytes:
                return _bad(rng, pos, spec, f"only {window.end_pos - commit_pos} bytes left in the file")
            item = step(window, commit_pos, window.segment_end_pos, decode)
    except CorruptRecordError as exc:
        if spec.verify_mode is not VerifyMode.REPORT:
            exc.path = rng.path
            raise
        return BadRecord(commit_pos, exc.reason, _structure_only(window, commit_pos))
    if isinstance(item, Filler):
        return SegmentEnd.FILLER
    if isinstance(item, Record):
        return item
    return SegmentEnd.UNWRITTEN  # Stop.UNWRITTEN: a range's record start is below its segment's end


def _structure_only(window: LogWindow, commit_pos: int) -> Record | None:
    """The record at `commit_pos` decoded without checksums, None when its structure is bad too."""
    try:
        item = step(window, commit_pos, window.segment_end_pos, record_decoder(Verify.STRUCTURE))
    except CorruptRecordError:
        return None
    return item if isinstance(item, Record) else None


def _bad(rng: ScanRange, pos: int, spec: ScanSpec, reason: str) -> BadRecord:
    if spec.verify_mode is not VerifyMode.REPORT:
        raise CorruptRecordError(reason, pos=rng.base_pos + pos, path=rng.path)
    return BadRecord(rng.base_pos + pos, reason)


def _data_after(fd: int, rng: ScanRange, pos: int) -> bool:
    """True when any byte in [pos, segment end) is not zero (reads the rest of the segment)."""
    for at in range(pos, rng.segment_bytes, _ZERO_CHECK_BYTES):
        chunk = os.pread(fd, min(_ZERO_CHECK_BYTES, rng.segment_bytes - at), at)
        if np.frombuffer(chunk, dtype=np.uint8).any():
            return True
    return False


# ------------------------------------------------------------------------------- rows


MESSAGE_FIELDS = (
    ("commit_pos", pa.int64()), ("size", pa.int32()), ("topic", pa.string()),
    ("queue_id", pa.int32()), ("queue_offset", pa.int64()), ("tags", pa.string()),
    ("keys", pa.list_(pa.string())), ("uniq_key", pa.string()), ("msg_id", pa.string()),
    ("born_ts", pa.timestamp("us", tz="UTC")), ("store_ts", pa.timestamp("us", tz="UTC")),
    ("born_host", pa.string()), ("store_host", pa.string()), ("sys_flag", pa.int32()),
    ("reconsume_times", pa.int32()), ("properties", pa.map_(pa.string(), pa.string())),
    ("body", pa.binary()),
)
DISPATCH_FIELDS = (
    ("commit_pos", pa.int64()), ("size", pa.int32()), ("topic", pa.string()),
    ("queue_id", pa.int32()), ("queue_offset", pa.int64()), ("sys_flag", pa.int32()),
    ("tags_code", pa.int64()), ("store_ts_ms", pa.int64()), ("index_keys", pa.list_(pa.string())),
)
ERROR_FIELD = ("error", pa.string())


def arrow_schema(view: View, verify_mode: VerifyMode) -> pa.Schema:
    fields = MESSAGE_FIELDS if view is View.MESSAGES else DISPATCH_FIELDS
    if verify_mode is VerifyMode.REPORT:
        fields = (*fields, ERROR_FIELD)
    return pa.schema([pa.field(name, kind) for name, kind in fields])


def host_text(host: tuple[str, int]) -> str:
    ip, port = host
    return f"[{ip}]:{port}" if ":" in ip else f"{ip}:{port}"


def message_values(r: Record) -> tuple:
    return (r.commit_pos, r.total_size, r.topic, r.queue_id, r.queue_offset, r.tags, list(r.keys),
            r.uniq_key, r.msg_id, r.born_ts_ms * 1000, r.store_ts_ms * 1000, host_text(r.born_host),
            host_text(r.store_host), r.sys_flag, r.reconsume_times, list(r.properties.items()), r.body)


def dispatch_values(r: Record) -> tuple:
    return (r.commit_pos, r.total_size, r.topic, r.queue_id, r.queue_offset, r.sys_flag, r.tags_code,
            r.store_ts_ms, index_keys(r))


class BatchBuilder:
    """Collects rows and turns them into Arrow record batches (columns by one transpose) of
    the spec's schema."""

    def __init__(self, spec: ScanSpec):
        self.schema = arrow_schema(spec.view, spec.verify_mode)
        self.output_schema = spec.schema
        self._values = message_values if spec.view is View.MESSAGES else dispatch_values
        self._with_error = spec.verify_mode is VerifyMode.REPORT
        self._rows: list[tuple] = []
        self._body_bytes = 0

    @property
    def row_count(self) -> int:
        return len(self._rows)

    @property
    def is_full(self) -> bool:
        return len(self._rows) >= BATCH_ROWS or self._body_bytes >= BATCH_BODY_BYTES

    def add(self, item: Record | BadRecord) -> None:
        if isinstance(item, Record):
            self._body_bytes += len(item.body)
            values = self._values(item)
            self._rows.append((*values, None) if self._with_error else values)
        elif item.record is not None:
            self._rows.append((*self._values(item.record), item.reason))
        else:  # only commit_pos and the error are known
            self._rows.append((item.commit_pos, *(None,) * (len(self.schema) - 2), item.reason))

    def flush(self) -> pa.RecordBatch:
        columns = zip(*self._rows, strict=True)
        arrays = [pa.array(column, type=field.type)
                  for column, field in zip(columns, self.schema, strict=True)]
        self._rows = []
        self._body_bytes = 0
        return pa.RecordBatch.from_arrays(arrays, schema=self.schema).select(self.output_schema.names)


def read_scalar_batches(rng: ScanRange, spec: ScanSpec) -> Iterator[pa.RecordBatch]:
    """read_batches through the reference decoder only, one record at a time (for tests)."""
    builder = BatchBuilder(spec)
    accepts = spec.row_filter.accepts
    for item in iter_range(rng, spec):
        record = item.record if isinstance(item, BadRecord) else item
        if record is not None and not accepts(record):
            continue
        builder.add(item)
        if builder.is_full:
            yield builder.flush()
    if builder.row_count:
        yield builder.flush()


def read_batches(rng: ScanRange, spec: ScanSpec) -> Iterator[pa.RecordBatch]:
    """Arrow batches of the range's rows that pass the row filter (bad records always pass).

    Runs of plain records go through the batch scanner (engine.formats.record.spans: framing,
    and every CRC unless verify is NONE) into whole Arrow batches (tools.spark.arrow_columns);
    the first record it does not accept, and the next SCALAR_RUN after it, go through the
    reference decoder, which decodes it, reports it or raises, as iter_range does."""
    builder = BatchBuilder(spec)
    fd = os.open(rng.path, os.O_RDONLY)
    try:
        blocks = BlockReader(pread_reader(fd), READ_BLOCK_BYTES)
        pos = first_record_at(blocks, rng.walk_from, rng.start, rng.segment_bytes)
        scalar_left = 0
        while pos is not None and pos < rng.end:
            run = None if scalar_left else read_run(fd, rng, pos, spec.verify)
            if run is not None:
                if builder.row_count:
                    yield builder.flush()
                yield from _run_batches(run, spec, builder)
                pos += int(run.spans.ends[-1])
                continue
            scalar_left = scalar_left - 1 if scalar_left else SCALAR_RUN
            item, pos = _step(fd, blocks, rng, pos, spec)
            if item is not None and _accepts_item(item, spec.row_filter):
                builder.add(item)
                if builder.is_full:
                    yield builder.flush()
    finally:
        os.close(fd)
    if builder.row_count:
        yield builder.flush()


def _accepts_item(item: Record | BadRecord, row_filter: RowFilter) -> bool:
    record = item.record if isinstance(item, BadRecord) else item
    return record is None or row_filter.accepts(record)


# ------------------------------------------------------------------------ batch runs


class Run(NamedTuple):
    """Records the batch scanner accepted: `spans` over `chunk`, whose first byte is at
    commit position `base_pos`."""

    chunk: bytes
    spans: RecordSpans
    base_pos: int


def read_run(fd: int, rng: ScanRange, pos: int, verify: Verify) -> Run | None:
    """The leading records from file_pos `pos` (a record start) that lie in RUN_BYTES, start
    below the range end and pass verify_spans(verify); None when the first one does not."""
    chunk = os.pread(fd, min(RUN_BYTES, rng.segment_bytes - pos), pos)
    window = LogWindow(chunk, rng.base_pos + pos, rng.base_pos + rng.segment_bytes, rng.path)
    starts = run_starts(window, window.base_pos, window.segment_end_pos, RUN_BYTES)
    spans = verify_run(window, starts[starts < rng.end - pos], verify)  # the range owns what starts in it
    return None if spans is None else Run(chunk, spans, window.base_pos)


def _run_batches(run: Run, spec: ScanSpec, builder: BatchBuilder) -> Iterator[pa.RecordBatch]:
    if spec.view is View.DISPATCH:
        batch = dispatch_batch(run.chunk, run.spans, run.base_pos, builder.schema).select(
            builder.output_schema.names)
    else:
        batch = message_batch(run.chunk, run.spans, run.base_pos, builder.output_schema)
    if batch is None:  # a record repeats a property name: the reference decoder's dict decides
        for start in run.spans.starts.tolist():
            record = decode_record(run.chunk, start, verify=spec.verify, base_pos=run.base_pos)
            if spec.row_filter.accepts(record):
                builder.add(record)
        if builder.row_count:
            yield builder.flush()
        return
    mask = _filter_mask(run, spec.row_filter, batch)
    if mask is not None:
        batch = batch.filter(pa.array(mask))
    if batch.num_rows:
        yield batch


def _filter_mask(run: Run, f: RowFilter, batch: pa.RecordBatch) -> np.ndarray | None:
    """The rows of a run's batch that pass the row filter (None: no filter)."""
    if f.topics is None and f.start_ms is None and f.end_ms is None and f.tags.matches_all:
        return None
    mask = np.ones(batch.num_rows, dtype=bool)
    if f.topics is not None:
        topics = pa.array(sorted(f.topics), type=pa.string())
        mask &= pc.is_in(batch.column("topic"), value_set=topics).to_numpy(zero_copy_only=False)
    if not f.tags.matches_all:  # exact TAGS (an untagged row is null: never in the set)
        tags = pa.array(sorted(f.tags.tags), type=pa.string())
        mask &= pc.fill_null(pc.is_in(batch.column("tags"), value_set=tags), False).to_numpy(
            zero_copy_only=False)
    store_ts_ms = gather_field(np.frombuffer(run.chunk, dtype=np.uint8), run.spans.starts, "store_ts_ms")
    if f.start_ms is not None:
        mask &= store_ts_ms >= f.start_ms
    if f.end_ms is not None:
        mask &= store_ts_ms < f.end_ms
    return mask
