"""What one Spark partition reads and returns: its scan ranges, the rows kept, the columns asked.

A partition holds one or more consecutive ScanRanges: small segments are packed together up
to `maxPartitionBytes`, so a store of many small segments is not one task per segment. The
batch and the streaming reader both read partitions here.

A range whose segment file is gone when the executor opens it (retention ran between planning
and reading) is lost data: `DataLoss.FAIL` raises DataLossError naming its commit positions,
`DataLoss.SKIP` logs a warning naming them and reads on.
"""

from __future__ import annotations

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

LOG = logging.getLogger("mqstore.spark")
DATA_LOSS_HINT = 'set the source option failOnDataLoss to "false" to go on without them'


class RangePartition(InputPartition):
    """Consecutive ScanRanges read by one task (picklable, shipped to an executor)."""

    def __init__(self, ranges: Sequence[ScanRange]):
        super().__init__(tuple(ranges))


def pack_ranges(ranges: Sequence[ScanRange], target_bytes: int) -> list[RangePartition]:
    """Group consecutive ranges into partitions of at most `target_bytes` (a larger range
    stays alone): many small segments become a few tasks."""
    out: list[list[ScanRange]] = []
    size_bytes = 0
    for rng in ranges:
        length_bytes = rng.end - rng.start
        if not out or size_bytes + length_bytes > target_bytes:
            out.append([])
            size_bytes = 0
        out[-1].append(rng)
        size_bytes += length_bytes
    return [RangePartition(group) for group in out]


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

    def apply(self, batch: pa.RecordBatch) -> pa.RecordBatch:
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


def read_partition(ranges: Sequence[ScanRange] | None, spec: ScanSpec, selection: RowSelection,
                   on_loss: DataLoss) -> Iterator[pa.RecordBatch]:
    """The batches of every range of a partition (None: Spark's stand-in for an empty plan)."""
    for rng in ranges or ():
        batches = read_batches(rng, spec)
        try:
            first = next(batches)
        except StopIteration:
            continue
        except FileNotFoundError:  # read_batches opens the segment before its first batch
            report_loss(lost(rng), on_loss)
            continue
        for batch in _chain(first, batches):
            batch = selection.apply(batch)
            if batch.num_rows:
                yield batch


def _chain(first: pa.RecordBatch, rest: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    yield first
    yield from rest
