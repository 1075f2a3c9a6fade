"""What one Spark partition reads and returns: its scan ranges, the rows kept, the columns asked.

A partition holds one or more consecutive ScanRanges, each with the store it belongs to
(a read may cover several stores): small segments are packed together up to
`maxPartitionBytes`, so a store of many small segments is not one task per segment. The
batch and the streaming reader both read partitions here.

A range whose segment file is gone when the executor opens it (retention ran between planning
and reading) is lost data: `DataLoss.FAIL` raises DataLossError naming its commit positions,
`DataLoss.SKIP` logs a warning naming them and reads on.
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql.datasource import InputPartition

from engine.errors import DataLossError
from tools.spark.kafka_view import kafka_batch
from tools.spark.options import DataLoss, OutputView
from tools.spark.partitions import ScanRange
from tools.spark.scan import ScanSpec, read_batches
from tools.spark.stores import STORE_COLUMN, with_store_column

LOG = logging.getLogger("mqstore.spark")
DATA_LOSS_HINT = 'set the source option failOnDataLoss to "false" to go on without them'


@dataclass(frozen=True)
class StoreScan:
    """A store's name (the `store` column's value) and how its records are scanned."""

    store: str
    spec: ScanSpec


@dataclass(frozen=True)
class StoreRanges:
    """The planned ranges of one store."""

    source: StoreScan
    ranges: tuple[ScanRange, ...]


class RangePartition(InputPartition):
    """Consecutive ScanRanges read by one task (picklable, shipped to an executor); `sources`
    holds the store of each range, so an executor needs nothing else to read them."""

    def __init__(self, ranges: Sequence[ScanRange], sources: Sequence[StoreScan]):
        super().__init__(tuple(ranges))
        self.sources = tuple(sources)


def pack_ranges(planned: Sequence[StoreRanges], target_bytes: int) -> list[RangePartition]:
    """Group consecutive ranges into partitions of at most `target_bytes` (a larger range
    stays alone): many small segments, of one store or several, become a few tasks."""
    out: list[tuple[list[ScanRange], list[StoreScan]]] = []
    size_bytes = 0
    for store_ranges in planned:
        for rng in store_ranges.ranges:
            length_bytes = rng.end - rng.start
            if not out or size_bytes + length_bytes > target_bytes:
                out.append(([], []))
                size_bytes = 0
            out[-1][0].append(rng)
            out[-1][1].append(store_ranges.source)
            size_bytes += length_bytes
    return [RangePartition(ranges, sources) for ranges, sources in out]


@dataclass(frozen=True)
class RowSelection:
    """Rows and columns a partition returns beyond the scan filter: pushed-down queue_id and
    queue_offset predicates (exact), the output view's shape, and the columns of a user-given
    schema, in its order."""

    queue_ids: frozenset[int] | None = None
    min_queue_offset: int | None = None
    end_queue_offset: int | None = None
    columns: tuple[str, ...] | None = None
    output: OutputView = OutputView.MESSAGES

    def scan_columns(self) -> frozenset[str] | None:
        """The scanned columns these rows and columns are made of (None: all): a user-given
        schema's, and the ones the pushed-down predicates read."""
        if self.columns is None or self.output is not OutputView.MESSAGES:
            return None
        needed = set(self.columns) - {STORE_COLUMN}
        if self.queue_ids is not None:
            needed.add("queue_id")
        if self.min_queue_offset is not None or self.end_queue_offset is not None:
            needed.add("queue_offset")
        return frozenset(needed)

    def apply(self, batch: pa.RecordBatch, store: str) -> pa.RecordBatch:
        """The rows kept of a scanned `batch` of `store`, in the output's shape and columns."""
        mask = np.ones(batch.num_rows, dtype=bool)
        if self.queue_ids is not None:
            ids = pa.array(sorted(self.queue_ids), type=pa.int32())
            mask &= pc.is_in(batch.column("queue_id"), value_set=ids).to_numpy(zero_copy_only=False)
        if self.min_queue_offset is not None or self.end_queue_offset is not None:
            offsets = batch.column("queue_offset").to_numpy(zero_copy_only=False)
            if self.min_queue_offset is not None:
                mask &= offsets >= self.min_queue_offset
            if self.end_queue_offset is not None:
                mask &= offsets < self.end_queue_offset
        if not mask.all():
            batch = batch.filter(pa.array(mask))
        if self.output is OutputView.KAFKA:
            batch = kafka_batch(batch)
        batch = with_store_column(batch, store)
        return batch if self.columns is None else batch.select(list(self.columns))


ALL_ROWS = RowSelection()


def lost(rng: ScanRange) -> DataLossError:
    return DataLossError(rng.base_pos + rng.start, rng.base_pos + rng.end, path=rng.path, hint=DATA_LOSS_HINT)


def report_loss(error: DataLossError, on_loss: DataLoss) -> None:
    """Raise `error` (FAIL) or log what is skipped (SKIP)."""
    if on_loss is DataLoss.FAIL:
        raise error
    LOG.warning("mqstore: skipping commit positions [%d, %d) (%d bytes): %s", error.lost_from_pos,
                error.lost_to_pos, error.lost_to_pos - error.lost_from_pos, error.message)


def read_partition(partition: RangePartition | None, selection: RowSelection,
                   on_loss: DataLoss) -> Iterator[pa.RecordBatch]:
    """The batches of every range of a partition (None or InputPartition(None): Spark's
    stand-in for an empty plan)."""
    if partition is None or partition.value is None:
        return
    for rng, source in zip(partition.value, partition.sources, strict=True):
        batches = read_batches(rng, source.spec)
        try:
            first = next(batches)
        except StopIteration:
            continue
        except FileNotFoundError:  # read_batches opens the segment before its first batch
            report_loss(lost(rng), on_loss)
            continue
        for batch in itertools.chain((first,), batches):
            batch = selection.apply(batch, source.store)
            if batch.num_rows:
                yield batch
