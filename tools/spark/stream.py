"""`spark.readStream.format("mqstore")`: a micro-batch source over a live store.

Offsets are commit positions, one per store: `{"stores": {STORE: N, ...}}`, or `{"commit_pos":
N}` when the source is one plain path (the format from before several stores were possible, so
those checkpoints resume). A glob is expanded again for every batch: a store that appears later
is read from its beginning; one no longer matched keeps its position and is not read. Rate
limits and failOnDataLoss apply to each store on its own. The latest offset of a store is what
it has made durable *and* dispatched: min(commitlog flushed position, consume-queue durable
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
from dataclasses import replace

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
    StoreRanges,
    StoreScan,
    pack_ranges,
    read_partition,
    report_loss,
)

OFFSET_KEY = "commit_pos"
STORES_KEY = "stores"
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


class StoreStream:
    """The stream of one store: its readable end, its batch bounds, its ranges. `columns`:
    the scanned columns the rows need (None: all), the only ones decoded, as in a batch read."""

    def __init__(self, store: str, opts: SourceOptions, columns: frozenset[str] | None = None):
        self.store = store
        self.opts = opts
        self.layout = read_layout(store, opts.store_format)
        self.source = StoreScan(store, opts.scan_spec(self.layout, columns))
        self.target_pos: int | None = None  # Trigger.AvailableNow's end, fixed at the start

    def durable_pos(self) -> int:
        """What may be read now (see readable_end_pos), re-reading the store's segment list."""
        self.layout = read_layout(self.store, self.opts.store_format)
        return readable_end_pos(self.layout)

    def initial_pos(self, start: str) -> int:
        """The commit position `startingOffsets` names: earliest, latest or a record start."""
        if start == "earliest":
            return self.layout.min_pos
        if start == "latest":
            return self.durable_pos()
        if not start.isdigit():
            raise BadInputError("startingOffsets", f"{start!r} is not earliest, latest or a commit position")
        pos, end = int(start), self.durable_pos()
        if not self.layout.min_pos <= pos <= end:
            raise BadInputError("startingOffsets", f"{pos} is outside the store's readable commit "
                                f"positions [{self.layout.min_pos}, {end}]")
        if pos != end and not is_record_start(self.layout, pos):
            raise BadInputError("startingOffsets", f"{pos} is not the commit position of a record start "
                                "(take one from the commit_pos column)")
        return pos

    def latest_pos(self, start_pos: int | None, bounds: tuple[int, int] | None) -> int:
        """The end of the next batch from `start_pos`: all that is readable, or at most
        `bounds` (records, bytes) of it; never past an availableNow target."""
        end = self.durable_pos()
        if self.target_pos is not None:
            end = min(end, self.target_pos)
        if start_pos is None or bounds is None:
            return end
        first = self._first_readable(start_pos)
        if first >= end:
            return max(start_pos, end)
        return advance(self.layout, first, end, *bounds)

    def _first_readable(self, start_pos: int) -> int:
        """`start_pos`, or the store's first position when retention deleted what lay between
        (failOnDataLoss=true: DataLossError instead)."""
        if start_pos >= self.layout.min_pos:
            return start_pos
        error = DataLossError(start_pos, self.layout.min_pos, path=self.store, hint=DATA_LOSS_HINT)
        if self.opts.on_data_loss is DataLoss.FAIL:
            raise error
        return self.layout.min_pos

    def plan(self, start_pos: int | None, end_pos: int) -> StoreRanges:
        """The ranges of [start_pos, end_pos); None: a store new to the stream, from its start."""
        self.layout = read_layout(self.store, self.opts.store_format)
        if start_pos is None:
            start_pos = self.layout.min_pos
        if end_pos <= start_pos:
            return StoreRanges(self.source, ())
        if start_pos < self.layout.min_pos:
            lost = DataLossError(start_pos, min(self.layout.min_pos, end_pos), path=self.store,
                                 hint=DATA_LOSS_HINT)
            report_loss(lost, self.opts.on_data_loss)
        scan_filter = replace(self.opts.pruning_filter(), start_pos=max(start_pos, self.layout.min_pos),
                              end_pos=end_pos)
        ranges = plan_scan(self.layout, scan_filter, target_bytes=self.opts.target_bytes,
                           split_mode=self.opts.split_mode, known_start=start_pos)
        return StoreRanges(self.source, tuple(ranges))


class MqstoreStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Micro-batches of the records between two offsets, a commit position per store."""

    def __init__(self, opts: SourceOptions, selection: RowSelection = ALL_ROWS):
        self.opts = opts
        self.selection = selection
        self.streams: dict[str, StoreStream] = {}
        self.available_now = False
        self._refresh()

    def _refresh(self) -> list[StoreStream]:
        """The streams of the stores the paths name now (a glob may match new ones)."""
        current = self.opts.paths.resolve()
        for store in current:
            if store not in self.streams:
                self.streams[store] = self._new_stream(store)
                if self.available_now:  # the run reads what was there when it started: not this one
                    self.streams[store].target_pos = self.streams[store].layout.min_pos
        return [self.streams[store] for store in current]

    def _new_stream(self, store: str) -> StoreStream:
        return StoreStream(store, self.opts, self.selection.scan_columns())

    def _encode(self, positions: dict[str, int]) -> dict:
        """The offset JSON: {"commit_pos": N} for one plain path (as before several stores
        were possible, so older checkpoints resume), else {"stores": {store: N}}."""
        if self.opts.paths.is_single:
            return {OFFSET_KEY: positions[next(iter(self.streams))]}
        return {STORES_KEY: dict(sorted(positions.items()))}

    def _decode(self, offset: dict | None) -> dict[str, int]:
        if offset is None:
            return {}
        if OFFSET_KEY in offset:
            if len(self.streams) != 1:
                raise BadInputError("checkpoint", f"offset {offset} is of a single store; this "
                                    f"stream reads {len(self.streams)}")
            return {next(iter(self.streams)): int(offset[OFFSET_KEY])}
        return {store: int(pos) for store, pos in offset[STORES_KEY].items()}

    def initialOffset(self) -> dict:  # noqa: N802 - the PySpark API's name
        start = self.opts.starting_offsets
        streams = self._refresh()
        if start.isdigit() and not self.opts.paths.is_single:
            raise BadInputError("startingOffsets", "a commit position needs a single store: use "
                                "earliest or latest with several")
        return self._encode({s.store: s.initial_pos(start) for s in streams})

    def getDefaultReadLimit(self) -> ReadLimit:  # noqa: N802 - the PySpark API's name
        if self.opts.max_records_per_trigger is not None:
            return ReadMaxRows(self.opts.max_records_per_trigger)
        if self.opts.max_bytes_per_trigger is not None:
            return ReadMaxBytes(self.opts.max_bytes_per_trigger)
        return ReadAllAvailable()

    def prepareForTriggerAvailableNow(self) -> None:  # noqa: N802 - the PySpark API's name
        self.available_now = True
        for stream in self._refresh():
            stream.target_pos = stream.durable_pos()

    def latestOffset(self, start: dict | None = None, limit: ReadLimit | None = None) -> dict:  # noqa: N802
        """Each store's next end; a store gone from the paths keeps its position."""
        positions = self._decode(start)
        bounds = None if start is None or limit is None or isinstance(limit, ReadAllAvailable) \
            else self._limits(limit)
        for stream in self._refresh():
            # a store new to a running stream is read from its first position, in bounds too
            first = None if start is None else stream.layout.min_pos
            positions[stream.store] = stream.latest_pos(positions.get(stream.store, first), bounds)
        return self._encode(positions)

    def reportLatestOffset(self) -> dict:  # noqa: N802 - the PySpark API's name
        return self._encode({s.store: s.durable_pos() for s in self._refresh()})

    def _limits(self, limit: ReadLimit) -> tuple[int, int]:
        """The record and byte bounds of one batch, per store: the engine's limit and both options."""
        max_records = min(filter(None, (self.opts.max_records_per_trigger, _NO_LIMIT,
                                        limit.max_rows if isinstance(limit, ReadMaxRows) else None)))
        max_bytes = min(filter(None, (self.opts.max_bytes_per_trigger, _NO_LIMIT,
                                      limit.max_bytes if isinstance(limit, ReadMaxBytes) else None)))
        return max_records, max_bytes

    def partitions(self, start: dict, end: dict) -> list[InputPartition]:
        start_positions, planned = self._decode(start), []
        for store, end_pos in self._decode(end).items():
            start_pos = start_positions.get(store)
            if start_pos is not None and end_pos <= start_pos:
                continue  # nothing new, or a store no longer matched: its directory is not needed
            if store not in self.streams:
                self.streams[store] = self._new_stream(store)
            planned.append(self.streams[store].plan(start_pos, end_pos))
        return list(pack_ranges(planned, self.opts.target_bytes))

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        return read_partition(partition, self.selection, self.opts.on_data_loss)

    def commit(self, end: dict) -> None:
        """Nothing to release: the store keeps its files whatever the stream has read."""
