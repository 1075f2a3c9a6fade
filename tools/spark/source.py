"""The `mqstore` PySpark data source: `spark.read.format("mqstore").load(STORE_DIR)`.

One row per message (see `MESSAGE_FIELDS` in scan.py). Options (all optional, strings):

    topics             comma-separated topic names (rows and, through consume queues, ranges)
    startTime endTime  store-time range [start, end): epoch ms or ISO-8601 (naive = UTC)
    startPos endPos    commit-position range [start, end): records starting in it
    verify             none (structure only, default) | fail (every CRC, raise) |
                       report (every CRC, adds an `error` column; bad records become rows)
    format             auto (default) | mqstore | rocketmq (no store.json, no __CRC32C;
                       the segment size is the size of the segment files)
    maxPartitionBytes  bytes of commitlog per partition (default 128 MiB)
    splitMode          sample (bounds at record starts found by the planner, default) | walk
    topicPruning       consumequeue (default) | off
    timeSlackMs        how far store time may step back when pruning by time (default 60000)
    view               messages (default) | dispatch (the columns consume queues and index use)
    startingOffsets    streaming only: earliest (default) | latest | a commit position

A batch read of a running store (its lock is held) stops at the checkpoint's durable
position, as the stream does; a stopped store is read to the end of its valid data.

Registration: Spark >= 4 (verified on 4.0.1: pyspark/sql/worker/lookup_data_sources.py)
imports every top-level module named pyspark_* that `pkgutil.iter_modules()` lists on the
Python workers' path and registers its `DefaultSource` under `DefaultSource.name()`, once per
JVM. So `pyspark_mqstore` makes format("mqstore") work with no call, wherever mqstore is
installed normally or editable in compat/strict mode (a default, "lenient" setuptools editable
install hides the module from iter_modules), or its directory is on PYTHONPATH. A discovered
source cannot be registered again: `spark.dataSource.register(MqstoreDataSource)` then raises
DATA_SOURCE_ALREADY_EXISTS, so call `register(spark)`, which registers only when needed.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, replace
from datetime import UTC, datetime

import pyarrow as pa
from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition

from engine.errors import BadInputError
from engine.store_dir import holder_pid
from tools.spark.layout import StoreFormat, StoreLayout, read_durable_pos, read_layout
from tools.spark.partitions import (
    DEFAULT_PARTITION_BYTES,
    ScanFilter,
    ScanRange,
    SplitMode,
    plan_scan,
)
from tools.spark.scan import RowFilter, ScanSpec, VerifyMode, View, arrow_schema, read_batches

SOURCE_NAME = "mqstore"
_DDL_TYPES = {
    pa.int64(): "bigint", pa.int32(): "int", pa.string(): "string", pa.binary(): "binary",
    pa.timestamp("us", tz="UTC"): "timestamp", pa.list_(pa.string()): "array<string>",
    pa.map_(pa.string(), pa.string()): "map<string,string>",
}


@dataclass(frozen=True)
class SourceOptions:
    """The parsed options of one read."""

    root: str
    scan_filter: ScanFilter
    verify_mode: VerifyMode = VerifyMode.NONE
    store_format: StoreFormat | None = None
    target_bytes: int = DEFAULT_PARTITION_BYTES
    split_mode: SplitMode = SplitMode.SAMPLE
    prune_topics: bool = True
    view: View = View.MESSAGES
    starting_offsets: str = "earliest"

    def scan_spec(self, layout: StoreLayout) -> ScanSpec:
        f = self.scan_filter
        return ScanSpec(self.verify_mode, layout.full_verify, RowFilter(f.topics, f.start_ms, f.end_ms),
                        self.view)

    def pruning_filter(self) -> ScanFilter:
        """The filter the planner prunes with (topics only when topic pruning is on)."""
        if self.prune_topics:
            return self.scan_filter
        return ScanFilter(self.scan_filter.start_pos, self.scan_filter.end_pos, self.scan_filter.start_ms,
                          self.scan_filter.end_ms, None, self.scan_filter.time_slack_ms)


def _option(options: Mapping[str, str], name: str, default: str | None = None) -> str | None:
    """Case-insensitive lookup (Spark lower-cases option names on some paths)."""
    lowered = name.lower()
    for key, value in options.items():
        if key.lower() == lowered:
            return value
    return default


def _choice(options: Mapping[str, str], name: str, default: str, allowed: tuple[str, ...]) -> str:
    value = (_option(options, name, default) or default).strip().lower()
    if value not in allowed:
        raise BadInputError(name, f"{value!r} is not one of {', '.join(allowed)}")
    return value


def _int_option(options: Mapping[str, str], name: str, default: int | None) -> int | None:
    text = _option(options, name)
    if text is None or not text.strip():
        return default
    try:
        return int(text)
    except ValueError:
        raise BadInputError(name, f"{text!r} is not an integer") from None


def parse_time_ms(name: str, text: str | None) -> int | None:
    """Epoch milliseconds from digits or an ISO-8601 time (a naive time is UTC)."""
    if text is None or not text.strip():
        return None
    text = text.strip()
    if text.lstrip("-").isdigit():
        return int(text)
    try:
        moment = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise BadInputError(name, f"{text!r} is neither epoch ms nor an ISO-8601 time") from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return int(moment.timestamp() * 1000)


def parse_options(options: Mapping[str, str]) -> SourceOptions:
    """Validate the reader options (BadInputError names the bad option)."""
    root = _option(options, "path") or _option(options, "store")
    if not root:
        raise BadInputError("path", "give the store directory: .load(STORE_DIR)")
    topics_text = _option(options, "topics")
    topics = frozenset(t.strip() for t in topics_text.split(",") if t.strip()) if topics_text else None
    scan_filter = ScanFilter(
        start_pos=_int_option(options, "startPos", 0) or 0, end_pos=_int_option(options, "endPos", None),
        start_ms=parse_time_ms("startTime", _option(options, "startTime")),
        end_ms=parse_time_ms("endTime", _option(options, "endTime")), topics=topics,
        time_slack_ms=_int_option(options, "timeSlackMs", 60_000) or 0)
    store_format = _choice(options, "format", "auto", ("auto", "mqstore", "rocketmq"))
    target_bytes = _int_option(options, "maxPartitionBytes", DEFAULT_PARTITION_BYTES)
    if target_bytes is None or target_bytes < 1:
        raise BadInputError("maxPartitionBytes", "must be a positive number of bytes")
    return SourceOptions(
        root=root, scan_filter=scan_filter,
        verify_mode=VerifyMode(_choice(options, "verify", "none", ("none", "fail", "report"))),
        store_format=None if store_format == "auto" else StoreFormat(store_format),
        target_bytes=target_bytes,
        split_mode=SplitMode(_choice(options, "splitMode", "sample", ("sample", "walk"))),
        prune_topics=_choice(options, "topicPruning", "consumequeue", ("consumequeue", "off")) != "off",
        view=View(_choice(options, "view", "messages", ("messages", "dispatch"))),
        starting_offsets=(_option(options, "startingOffsets", "earliest") or "earliest").strip().lower())


def schema_ddl(view: View, verify_mode: VerifyMode) -> str:
    """The Spark schema (DDL) matching the Arrow batches the reader yields."""
    return ", ".join(f"{f.name} {_DDL_TYPES[f.type]}" for f in arrow_schema(view, verify_mode))


class RangePartition(InputPartition):
    """One ScanRange (picklable, shipped to an executor)."""

    def __init__(self, scan_range: ScanRange):
        super().__init__(scan_range)


class MqstoreDataSource(DataSource):
    """Batch and streaming reads of an mqstore (or RocketMQ-written) store directory."""

    @classmethod
    def name(cls) -> str:
        return SOURCE_NAME

    def schema(self) -> str:
        opts = parse_options(self.options)
        return schema_ddl(opts.view, opts.verify_mode)

    def reader(self, schema) -> DataSourceReader:
        return MqstoreReader(parse_options(self.options))

    def streamReader(self, schema):  # noqa: N802 - the PySpark API's name
        from tools.spark.stream import MqstoreStreamReader

        return MqstoreStreamReader(parse_options(self.options))


class MqstoreReader(DataSourceReader):
    """Plans ranges on the driver; reads one range per partition on the executors."""

    def __init__(self, opts: SourceOptions):
        self.opts = opts
        self.layout = read_layout(opts.root, opts.store_format)
        self.spec = opts.scan_spec(self.layout)

    def partitions(self) -> list[InputPartition]:
        scan_filter = self.opts.pruning_filter()
        if scan_filter.end_pos is None and holder_pid(self.opts.root) is not None:
            scan_filter = replace(scan_filter, end_pos=read_durable_pos(self.opts.root))
        ranges = plan_scan(self.layout, scan_filter, target_bytes=self.opts.target_bytes,
                           split_mode=self.opts.split_mode)
        return [RangePartition(r) for r in ranges]

    def read(self, partition: InputPartition | None) -> Iterator[pa.RecordBatch]:
        if partition is None:  # Spark reads one empty partition when the plan has none
            return iter(())
        return read_batches(partition.value, self.spec)


def register(spark) -> None:
    """Make format("mqstore") resolve in `spark` unless discovery already did (idempotent)."""
    manager = spark._jsparkSession.sessionState().dataSourceManager()
    if not manager.dataSourceExists(SOURCE_NAME):
        spark.dataSource.register(MqstoreDataSource)
