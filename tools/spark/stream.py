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
the end of its valid data. Retention deleting a segment that a restarted query still has to
read loses those messages (the batch then starts at the first segment left).
"""

from __future__ import annotations

from collections.abc import Iterator

import pyarrow as pa
from pyspark.sql.datasource import DataSourceStreamReader, InputPartition

from engine.errors import BadInputError
from tools.spark.layout import StoreLayout, read_durable_pos, read_layout
from tools.spark.partitions import (
    BlockReader,
    ScanFilter,
    chain_end,
    plan_scan,
    pread_reader,
)
from tools.spark.scan import read_batches
from tools.spark.source import RangePartition, SourceOptions

OFFSET_KEY = "commit_pos"


def data_end_pos(layout: StoreLayout) -> int:
    """End of the valid record chain of the last non-empty segment (stores without a checkpoint)."""
    for seg in reversed(layout.segments):
        with open(seg.path, "rb") as f:
            blocks = BlockReader(pread_reader(f.fileno()))
            end = chain_end(blocks, 0, layout.segment_bytes)
        if end > 0:
            return seg.base_pos + end
    return layout.min_pos


class MqstoreStreamReader(DataSourceStreamReader):
    """Micro-batches of the records between two commit positions."""

    def __init__(self, opts: SourceOptions):
        self.opts = opts
        self.layout = read_layout(opts.root, opts.store_format)
        self.spec = opts.scan_spec(self.layout)

    def _refresh(self) -> None:
        self.layout = read_layout(self.opts.root, self.opts.store_format)

    def durable_pos(self) -> int:
        """What may be read now: the checkpoint's durable position, else the end of the data."""
        self._refresh()
        durable = read_durable_pos(self.opts.root)
        return durable if durable is not None else data_end_pos(self.layout)

    def initialOffset(self) -> dict:  # noqa: N802 - the PySpark API's name
        start = self.opts.starting_offsets
        if start == "earliest":
            return {OFFSET_KEY: self.layout.min_pos}
        if start == "latest":
            return {OFFSET_KEY: self.durable_pos()}
        if start.isdigit():
            return {OFFSET_KEY: int(start)}
        raise BadInputError("startingOffsets", f"{start!r} is not earliest, latest or a commit position")

    def latestOffset(self) -> dict:  # noqa: N802 - the PySpark API's name
        return {OFFSET_KEY: self.durable_pos()}

    def partitions(self, start: dict, end: dict) -> list[InputPartition]:
        start_pos, end_pos = int(start[OFFSET_KEY]), int(end[OFFSET_KEY])
        if end_pos <= start_pos:
            return []
        self._refresh()
        f = self.opts.scan_filter
        scan_filter = ScanFilter(max(start_pos, self.layout.min_pos), end_pos, f.start_ms, f.end_ms,
                                 f.topics if self.opts.prune_topics else None, f.time_slack_ms)
        ranges = plan_scan(self.layout, scan_filter, target_bytes=self.opts.target_bytes,
                           split_mode=self.opts.split_mode, known_start=start_pos)
        return [RangePartition(r) for r in ranges]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        return read_batches(partition.value, self.spec)

    def commit(self, end: dict) -> None:
        """Nothing to release: the store keeps its files whatever the stream has read."""
