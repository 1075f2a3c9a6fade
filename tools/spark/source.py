"""The `mqstore` PySpark data source: `spark.read.format("mqstore").load(STORE_DIR)`.

One row per message (see `MESSAGE_FIELDS` in scan.py), and last a `store` column naming the
store it came from: `load` takes one store, several (comma-separated or a list) or globs, all
read as one DataFrame (tools/spark/stores.py). Options: tools/spark/options.py and
docs/SPARK.md (unknown ones are refused). A user-given schema (`.schema("commit_pos bigint,
topic string")`) may name any subset of the view's columns, with their types; the rows then
hold those columns in that order.

Filters on store, topic, queue_id, commit_pos, queue_offset and store_ts are pushed into the scan
(tools/spark/pushdown.py) with `option("filterPushdown", "true")`, which needs the session
conf `spark.sql.python.filterPushdown.enabled=true` (off by default; Spark refuses to plan a
reader that implements pushFilters while it is off, hence the option: a session without the
conf still reads, unfiltered). `tools.spark.session` sets both.

A batch read of a running store (its lock is held) stops at the checkpoint's durable
position, as the stream does; a stopped store is read to the end of its valid data.

Registration: Spark >= 4 (verified on 4.0.1: pyspark/sql/worker/lookup_data_sources.py)
imports every top-level module named pyspark_* that `pkgutil.iter_modules()` lists on the
Python workers' path and registers its `DefaultSource` under `DefaultSource.name()`, once per
JVM. So `pyspark_mqstore` makes format("mqstore") work with no call, wherever mqstore is
installed normally or editable in compat/strict mode (a default, "lenient" setuptools editable
install hides the module from iter_modules), or its directory is on PYTHONPATH. Registering over
a discovered source raised DATA_SOURCE_ALREADY_EXISTS up to Spark 4.2; 4.3 replaces it with a
warning ("replaced a statically registered data source"). `register(spark)` therefore asks the
session first and registers only a source it does not know.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace

import pyarrow as pa
from pyspark.sql.datasource import DataSource, DataSourceReader, Filter, InputPartition
from pyspark.sql.types import StructType

from engine.errors import BadInputError
from engine.files.store_dir import holder_pid
from tools.spark.kafka_view import HEADER_TYPE, KAFKA_FIELDS
from tools.spark.layout import StoreLayout, read_durable_pos, read_layout
from tools.spark.options import OutputView, SourceOptions, parse_options
from tools.spark.partitions import plan_scan
from tools.spark.pushdown import push, push_stores
from tools.spark.read_plan import ALL_ROWS, RowSelection, StoreRanges, StoreScan, pack_ranges, read_partition
from tools.spark.scan import ScanSpec, VerifyMode, View, arrow_schema
from tools.spark.stores import STORE_COLUMN, only_stores
from tools.spark.stream import MqstoreStreamReader
from tools.spark.writer import MqstoreStreamWriter, MqstoreWriter, refuse_overwrite, writer_columns

SOURCE_NAME = "mqstore"
_DDL_TYPES = {
    pa.int64(): "bigint", pa.int32(): "int", pa.string(): "string", pa.binary(): "binary",
    pa.timestamp("us", tz="UTC"): "timestamp", pa.list_(pa.string()): "array<string>",
    pa.map_(pa.string(), pa.string()): "map<string,string>",
    pa.list_(HEADER_TYPE): "array<struct<key:string,value:binary>>",
}


def output_columns(opts: SourceOptions) -> dict[str, str]:
    """Name -> Spark type of every column the reader yields, in order.

    The kafka view of one store has exactly the columns of Spark's Kafka source, so a job
    written for format("kafka") sees the same schema; with several stores it needs `store` to
    tell rows of the same topic and partition apart, so every view of several stores has it."""
    if opts.output is OutputView.KAFKA:
        fields = [pa.field(name, kind) for name, kind in KAFKA_FIELDS]
        fields += [f for f in arrow_schema(View.MESSAGES, opts.verify_mode) if f.name == "error"]
    else:
        fields = list(arrow_schema(opts.output.scan_view, opts.verify_mode))
    columns = {f.name: _DDL_TYPES[f.type] for f in fields}
    if opts.output is not OutputView.KAFKA or not opts.paths.is_single:
        columns[STORE_COLUMN] = "string"
    return columns


def schema_ddl(opts: SourceOptions) -> str:
    """The Spark schema (DDL) matching the Arrow batches the reader yields."""
    return ", ".join(f"{name} {kind}" for name, kind in output_columns(opts).items())


def selected_columns(schema: StructType, opts: SourceOptions) -> tuple[str, ...] | None:
    """The columns a user-given schema asks for (None: the full schema, in order); each must
    be one of the view's columns with its type. A view without the `store` column names its
    columns, so the rows drop the one every scan adds."""
    full = output_columns(opts)
    names = tuple(schema.fieldNames())
    if names == tuple(full):
        return None if STORE_COLUMN in full else names
    output = opts.output
    for field in schema.fields:
        if field.name not in full:
            raise BadInputError("schema", f"{field.name!r} is not a column of the {output.value} view "
                                f"(columns: {', '.join(full)})")
        if field.dataType.simpleString() != full[field.name]:
            raise BadInputError("schema", f"column {field.name!r} is {full[field.name]}, not "
                                f"{field.dataType.simpleString()}")
    return names


class MqstoreDataSource(DataSource):
    """Batch and streaming reads of mqstore (or RocketMQ-written) store directories, and
    writes into a running store (tools/spark/writer.py)."""

    @classmethod
    def name(cls) -> str:
        return SOURCE_NAME

    def schema(self) -> str:
        opts = parse_options(self.options)
        return schema_ddl(opts)

    def _read_options(self, schema: StructType) -> tuple[SourceOptions, RowSelection]:
        """The parsed options, and the view and columns of `schema` the rows are shaped to."""
        opts = parse_options(self.options)
        columns = selected_columns(schema, opts)
        return opts, RowSelection(columns=columns, output=opts.output)

    def reader(self, schema: StructType) -> DataSourceReader:
        opts, selection = self._read_options(schema)
        reader_class = PushdownReader if opts.filter_pushdown else MqstoreReader
        return reader_class(opts, selection)

    def streamReader(self, schema: StructType):  # noqa: N802 - the PySpark API's name
        return MqstoreStreamReader(*self._read_options(schema))

    def writer(self, schema: StructType, overwrite: bool) -> MqstoreWriter:
        refuse_overwrite(overwrite)
        return MqstoreWriter(self.options, writer_columns(schema))

    def streamWriter(self, schema: StructType, overwrite: bool) -> MqstoreStreamWriter:  # noqa: N802
        refuse_overwrite(overwrite)
        return MqstoreStreamWriter(self.options, writer_columns(schema))


class MqstoreReader(DataSourceReader):
    """Plans ranges of every store on the driver; reads one partition's ranges on an executor."""

    def __init__(self, opts: SourceOptions, selection: RowSelection = ALL_ROWS):
        self.opts = opts
        self.selection = selection
        self.layouts = {store: read_layout(store, opts.store_format) for store in opts.paths.resolve()}
        self.specs = self._scan_specs()

    def _scan_specs(self) -> dict[str, ScanSpec]:
        """Each store's scan, decoding only the columns the selection needs."""
        columns = self.selection.scan_columns()
        return {store: self.opts.scan_spec(layout, columns)
                for store, layout in self.layouts.items()}

    @property
    def layout(self) -> StoreLayout:
        """The layout of a one-store read (the jobs read one store)."""
        (layout,) = self.layouts.values()
        return layout

    @property
    def spec(self) -> ScanSpec:
        """The scan spec of a one-store read."""
        (spec,) = self.specs.values()
        return spec

    def partitions(self) -> list[InputPartition]:
        planned = [StoreRanges(StoreScan(store, self.specs[store]), tuple(self._plan_store(store)))
                   for store in only_stores(list(self.layouts), self.opts.stores)]
        return list(pack_ranges(planned, self.opts.target_bytes))

    def _plan_store(self, store: str):
        """One store's ranges; a running store (its lock is held) up to its durable position."""
        scan_filter = self.opts.pruning_filter()
        if scan_filter.end_pos is None and holder_pid(store) is not None:
            scan_filter = replace(scan_filter, end_pos=read_durable_pos(store))
        return plan_scan(self.layouts[store], scan_filter, target_bytes=self.opts.target_bytes,
                         split_mode=self.opts.split_mode)

    def read(self, partition: InputPartition | None) -> Iterator[pa.RecordBatch]:
        # Spark reads one InputPartition(None) when the plan is empty
        return read_partition(partition, self.selection, self.opts.on_data_loss)


class PushdownReader(MqstoreReader):
    """MqstoreReader that also takes Spark's filters into the scan (option filterPushdown)."""

    def pushFilters(self, filters: list[Filter]) -> list[Filter]:  # noqa: N802 - the PySpark API's name
        """Apply what the scan can (see tools/spark/pushdown.py); return what Spark must."""
        stores, filters = push_stores(list(filters), self.opts.stores)
        self.opts = replace(self.opts, stores=stores)
        if self.opts.verify_mode is VerifyMode.REPORT or self.opts.output is OutputView.KAFKA:
            return list(filters)
        columns = frozenset(output_columns(self.opts))
        pushed, rest = push(list(filters), self.opts.scan_filter, self.selection, columns)
        self.opts = replace(self.opts, scan_filter=pushed.scan_filter)
        self.selection = pushed.selection
        self.specs = self._scan_specs()
        return rest


def register(spark) -> None:
    """Make format("mqstore") resolve in `spark` unless discovery already did (idempotent).
    Over Spark Connect, where the session cannot be asked, it registers through the public API."""
    from pyspark.errors import AnalysisException

    if known_to_session(spark):
        return
    try:
        spark.dataSource.register(MqstoreDataSource)
    except AnalysisException as exc:  # a statically discovered source cannot be registered again
        if exc.getCondition() != "DATA_SOURCE_ALREADY_EXISTS":
            raise


def known_to_session(spark) -> bool:
    """True when a classic session's JVM already resolves format("mqstore") (discovered or
    registered); False over Spark Connect, which has no JVM handle to ask."""
    from py4j.protocol import Py4JError

    session = getattr(spark, "_jsparkSession", None)
    if session is None:
        return False
    try:
        return bool(session.sessionState().dataSourceManager().dataSourceExists(MqstoreDataSource.name()))
    except Py4JError:  # a Spark without DataSourceManager.dataSourceExists: register as before
        return False
