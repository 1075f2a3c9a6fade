"""`spark.readStream.format("mqstore")`: a micro-batch source over a live store.

Offsets are commit positions, `{"commit_pos": N}`. The latest offset is what the store has
made durable *and* dispatched: min(commitlog flushed position, consume-queue durable
position) from the checkpoint file, which the writer replaces atomically. Both are record
boundaries, and every byte below them is on disk and never rewritten, so a batch
[start, end) is replayable: with Spark's checkpointLocation and an idempotent sink
(files, Delta, ...) every message is delivered exactly once across restarts.

The stream reads files with pread, never through the writer's mappings. Latency: a message
becomes visible once a checkpoint covers it. The in-process MessageStore writes one every
`cq_flush_interval_ms` (1 s) on its put path and on close; a store that stops receiving
puts keeps its last checkpoint until it is closed. Add the trigger interval on top.

A directory without an mqstore checkpoint (a RocketMQ-written or stopped copy) is read up to
the end of its valid data.

Data loss: retention may delete segments the stream has not read yet (a stopped query, a
slow one). With failOnDataLoss=true (default) the query fails naming the lost commit
positions, at planning or, when the segment goes between planning and reading, on the
executor; with false it logs a warning naming them and reads on from the first segment left.

Rate limits: maxRecordsPerTrigger / maxBytesPerTrigger bound a batch by commitlog records /
bytes from its start (whatever the topic filter keeps); a batch holds at least one record.
Trigger.AvailableNow reads, in as many limited batches as needed, up to the durable position
seen when the query started, and nothing newer.
"""

from __future__ import annotations

from collections.abc import Iterator

import pyarrow as pa
from pyspark.sql.datasource import DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxBytes,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)

from engine.errors import BadInputError, DataLossError
from tools.spark.layout import StoreLayout, read_durable_pos, read_layout
from tools.spark.options import DataLoss, SourceOptions
from tools.spark.partitions import (
    BlockReader,
    ScanFilter,
    chain_end,
    first_record_at,
    next_record_pos,
    plan_scan,
    pread_reader,
)
from tools.spark.read_plan import (
    ALL_ROWS,
    DATA_LOSS_HINT,
    RowSelection,
    pack_ranges,
    read_partition,
    report_loss,
)

OFFSET_KEY = "commit_pos"
_NO_LIMIT = 2**63 - 1


def data_end_pos(layout: StoreLayout) -> int:
    """End of the valid record chain of the last non-empty segment (stores without a checkpoint)."""
    for seg in reversed(layout.segments):
        with open(seg.path, "rb") as f:
            blocks = BlockReader(pread_reader(f.fileno()))
            end = chain_end(blocks, 0, layout.segment_bytes)
        if end > 0:
            return seg.base_pos + end
    return layout.min_pos


def readable_end_pos(layout: StoreLayout) -> int:
    """What may be read now: the checkpoint's durable position, else the end of the data."""
    durable = read_durable_pos(layout.root)
    return durable if durable is not None else data_end_pos(layout)


def _segment_of(layout: StoreLayout, commit_pos: int):
    for seg in layout.segments:
        if seg.base_pos <= commit_pos < seg.base_pos + layout.segment_bytes:
            return seg
    return None


def is_record_start(layout: StoreLayout, commit_pos: int) -> bool:
    """True when a record (or the end of a segment's chain) starts at `commit_pos`."""
    seg = _segment_of(layout, commit_pos)
    if seg is None or commit_pos == seg.base_pos:
        return seg is not None
    with open(seg.path, "rb") as f:
        found = first_record_at(BlockReader(pread_reader(f.fileno())), 0, commit_pos - seg.base_pos,
                                layout.segment_bytes)
    return found == commit_pos - seg.base_pos


def advance(layout: StoreLayout, start_pos: int, end_pos: int, max_records: int, max_bytes: int) -> int:
    """The record start after at most `max_records` records and `max_bytes` bytes from the
    record start `start_pos` (at least one record), never past `end_pos`."""
    pos, count = start_pos, 0
    while pos < end_pos and count < max_records:
        seg = _segment_of(layout, pos)
        if seg is None:
            break
        with open(seg.path, "rb") as f:
            blocks = BlockReader(pread_reader(f.fileno()))
            while pos < end_pos and count < max_records:
                nxt = next_record_pos(blocks, pos - seg.base_pos, layout.segment_bytes)
                if nxt is None:  # filler or end of the chain: the next record opens the next segment
                    pos = seg.base_pos + layout.segment_bytes
                    break
                if count and seg.base_pos + nxt - start_pos > max_bytes:
                    return pos
                pos, count = seg.base_pos + nxt, count + 1
    return min(pos, end_pos)


class MqstoreStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Micro-batches of the records between two commit positions."""

    def __init__(self, opts: SourceOptions, selection: RowSelection = ALL_ROWS):
        self.opts = opts
        self.selection = selection
        self.layout = read_layout(opts.root, opts.store_format)
        self.spec = opts.scan_spec(self.layout)
        self.target_pos: int | None = None  # Trigger.AvailableNow's end, fixed at the start

    def durable_pos(self) -> int:
        """What may be read now (see readable_end_pos), re-reading the store's segment list."""
        self.layout = read_layout(self.opts.root, self.opts.store_format)
        return readable_end_pos(self.layout)

    def initialOffset(self) -> dict:  # noqa: N802 - the PySpark API's name
        start = self.opts.starting_offsets
        if start == "earliest":
            return {OFFSET_KEY: self.layout.min_pos}
        if start == "latest":
            return {OFFSET_KEY: self.durable_pos()}
        if not start.isdigit():
            raise BadInputError("startingOffsets", f"{start!r} is not earliest, latest or a commit position")
        pos, end = int(start), self.durable_pos()
        if not self.layout.min_pos <= pos <= end:
            raise BadInputError("startingOffsets", f"{pos} is outside the store's readable commit "
                                f"positions [{self.layout.min_pos}, {end}]")
        if pos != end and not is_record_start(self.layout, pos):
            raise BadInputError("startingOffsets", f"{pos} is not the commit position of a record start "
                                "(take one from the commit_pos column)")
        return {OFFSET_KEY: pos}

    def getDefaultReadLimit(self) -> ReadLimit:  # noqa: N802 - the PySpark API's name
        if self.opts.max_records_per_trigger is not None:
            return ReadMaxRows(self.opts.max_records_per_trigger)
        if self.opts.max_bytes_per_trigger is not None:
            return ReadMaxBytes(self.opts.max_bytes_per_trigger)
        return ReadAllAvailable()

    def prepareForTriggerAvailableNow(self) -> None:  # noqa: N802 - the PySpark API's name
        self.target_pos = self.durable_pos()

    def latestOffset(self, start: dict | None = None, limit: ReadLimit | None = None) -> dict:  # noqa: N802
        end = self.durable_pos()
        if self.target_pos is not None:
            end = min(end, self.target_pos)
        if start is None or limit is None or isinstance(limit, ReadAllAvailable):
            return {OFFSET_KEY: end}
        start_pos = self._first_readable(int(start[OFFSET_KEY]))
        if start_pos >= end:
            return {OFFSET_KEY: max(int(start[OFFSET_KEY]), end)}
        max_records, max_bytes = self._limits(limit)
        return {OFFSET_KEY: advance(self.layout, start_pos, end, max_records, max_bytes)}

    def reportLatestOffset(self) -> dict:  # noqa: N802 - the PySpark API's name
        return {OFFSET_KEY: self.durable_pos()}

    def _limits(self, limit: ReadLimit) -> tuple[int, int]:
        """The record and byte bounds of one batch: the engine's limit and both options."""
        max_records = min(filter(None, (self.opts.max_records_per_trigger, _NO_LIMIT,
                                        limit.max_rows if isinstance(limit, ReadMaxRows) else None)))
        max_bytes = min(filter(None, (self.opts.max_bytes_per_trigger, _NO_LIMIT,
                                      limit.max_bytes if isinstance(limit, ReadMaxBytes) else None)))
        return max_records, max_bytes

    def _first_readable(self, start_pos: int) -> int:
        """`start_pos`, or the store's first position when retention deleted what lay between
        (failOnDataLoss=true: DataLossError instead)."""
        if start_pos >= self.layout.min_pos:
            return start_pos
        error = DataLossError(start_pos, self.layout.min_pos, path=self.opts.root, hint=DATA_LOSS_HINT)
        if self.opts.on_data_loss is DataLoss.FAIL:
            raise error
        return self.layout.min_pos

    def partitions(self, start: dict, end: dict) -> list[InputPartition]:
        start_pos, end_pos = int(start[OFFSET_KEY]), int(end[OFFSET_KEY])
        if end_pos <= start_pos:
            return []
        self.layout = read_layout(self.opts.root, self.opts.store_format)
        if start_pos < self.layout.min_pos:
            lost = DataLossError(start_pos, min(self.layout.min_pos, end_pos), path=self.opts.root,
                                 hint=DATA_LOSS_HINT)
            report_loss(lost, self.opts.on_data_loss)
        f = self.opts.scan_filter
        scan_filter = ScanFilter(max(start_pos, self.layout.min_pos), end_pos, f.start_ms, f.end_ms,
                                 f.topics if self.opts.prune_topics else None, f.time_slack_ms)
        ranges = plan_scan(self.layout, scan_filter, target_bytes=self.opts.target_bytes,
                           split_mode=self.opts.split_mode, known_start=start_pos)
        return list(pack_ranges(ranges, self.opts.target_bytes))

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        return read_partition(partition.value, self.spec, self.selection, self.opts.on_data_loss)

    def commit(self, end: dict) -> None:
        """Nothing to release: the store keeps its files whatever the stream has read."""
