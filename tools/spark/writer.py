"""`df.write.format("mqstore").option("path", STORE).save()` and the streaming sink: rows put
into a running store on the executor's host through `ipc.producer.Producer`.

Columns (any other is refused, before any task runs):
    topic      string                 required
    body|value binary or string       required, one of them (a string is sent as UTF-8)
    keys|key   array<string> | string at most one of them (a binary key is decoded as UTF-8)
    tags       string                 optional
    queue_id   int or bigint          optional (null or absent: the producer picks the queue)
Each task opens one Producer, sends its rows in batches of `batchSize` messages, waits for
every ack and fails on the first row not stored (PutFailedError naming its status and its
index in the task). A store with no running supervisor, or a path that is no store, fails the
task with the producer's error naming the path.

Guarantee: at least once. A failed or retried task sends its rows again, and messages an
aborted job already stored stay stored: the record format has no producer id and sequence
number the store could deduplicate by, so exactly-once is not offered.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass

from pyspark.sql.datasource import DataSourceStreamWriter, DataSourceWriter, WriterCommitMessage
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    DataType,
    IntegerType,
    LongType,
    StringType,
    StructType,
)

from engine.errors import BadInputError, PutFailedError
from engine.message import Message
from tools.spark.options import option_value, refuse_options

DEFAULT_BATCH_SIZE = 256
# checkpointLocation is Spark's (a streaming query hands it to its sink too); the sink keeps no state
WRITER_OPTIONS = {"path": None, "batchSize": str(DEFAULT_BATCH_SIZE), "checkpointLocation": None}
_TEXT_OR_BYTES = (StringType, BinaryType)
_COLUMN_TYPES: dict[str, tuple[type[DataType], ...]] = {
    "topic": (StringType,), "body": _TEXT_OR_BYTES, "value": _TEXT_OR_BYTES, "key": _TEXT_OR_BYTES,
    "keys": (ArrayType,), "tags": (StringType,), "queue_id": (IntegerType, LongType),
}


@dataclass(frozen=True)
class WriterColumns:
    """Which input column holds what (None: absent)."""

    body: str
    keys: str | None = None
    tags: bool = False
    queue_id: bool = False


def _check_type(name: str, kind: DataType) -> None:
    allowed = _COLUMN_TYPES[name]
    ok = isinstance(kind, allowed)
    if name == "keys":
        ok = ok and isinstance(kind.elementType, StringType)
    if not ok:
        raise BadInputError("schema", f"column {name!r} is {kind.simpleString()}; the mqstore writer "
                            f"takes {' or '.join(t.typeName() for t in allowed)} there"
                            + (" (array<string>)" if name == "keys" else ""))


def writer_columns(schema: StructType) -> WriterColumns:
    """The columns a DataFrame to write must have (BadInputError naming the offending one)."""
    names = schema.fieldNames()
    for field in schema.fields:
        if field.name not in _COLUMN_TYPES:
            raise BadInputError("schema", f"unknown column {field.name!r} for the mqstore writer "
                                f"(columns: {', '.join(_COLUMN_TYPES)})")
        _check_type(field.name, field.dataType)
    if "topic" not in names:
        raise BadInputError("schema", "the mqstore writer needs a topic column")
    bodies = [n for n in ("body", "value") if n in names]
    keys = [n for n in ("keys", "key") if n in names]
    if len(bodies) != 1:
        raise BadInputError("schema", "the mqstore writer needs exactly one of the columns body and value")
    if len(keys) > 1:
        raise BadInputError("schema", "give keys (array<string>) or key, not both")
    return WriterColumns(bodies[0], keys[0] if keys else None, "tags" in names, "queue_id" in names)


def refuse_overwrite(overwrite: bool) -> None:
    """A store is only appended to: mode("overwrite") and the complete output mode are refused."""
    if overwrite:
        raise BadInputError("mode", "a store cannot be overwritten, only appended to: use mode('append') "
                            "(streams: outputMode('append'))")


@dataclass(frozen=True)
class WriteTarget:
    """Where and how a write sends: the store directory and the messages per request."""

    store: str
    batch_size: int


def parse_writer_options(options: Mapping[str, str]) -> WriteTarget:
    refuse_options(options, WRITER_OPTIONS, "mqstore writer option")
    store = (option_value(options, "path") or "").strip()
    if not store or "," in store:
        raise BadInputError("path", "give the one store to write into: .option('path', STORE_DIR)")
    text = option_value(options, "batchSize") or str(DEFAULT_BATCH_SIZE)
    if not text.strip().isdigit() or int(text) < 1:
        raise BadInputError("batchSize", f"{text!r} is not a positive number")
    return WriteTarget(store, int(text))


def _bytes(value, row_index: int, name: str) -> bytes:
    if isinstance(value, str):
        return value.encode("utf-8")
    if value is None:
        raise BadInputError(name, f"row {row_index} has a null {name}")
    return bytes(value)


def _text(value, row_index: int, name: str) -> str:
    if isinstance(value, str):
        return value
    try:
        return bytes(value).decode("utf-8")
    except UnicodeDecodeError:
        raise BadInputError(name, f"row {row_index} has a {name} that is not UTF-8 text") from None


def to_message(row, columns: WriterColumns, row_index: int) -> Message:
    """The message of one input row (BadInputError for a null topic or body)."""
    topic = row["topic"]
    if topic is None:
        raise BadInputError("topic", f"row {row_index} has a null topic")
    keys: tuple[str, ...] = ()
    if columns.keys == "keys" and row["keys"] is not None:
        keys = tuple(row["keys"])
    elif columns.keys == "key" and row["key"] is not None:
        keys = (_text(row["key"], row_index, "key"),)
    return Message(topic, _bytes(row[columns.body], row_index, columns.body), keys=keys,
                   tags=row["tags"] if columns.tags else None,
                   queue_id=row["queue_id"] if columns.queue_id else None)


@dataclass
class WriteCount(WriterCommitMessage):
    """What one task stored."""

    messages: int


def write_rows(target: WriteTarget, columns: WriterColumns, rows: Iterator) -> WriteCount:
    """Send every row through one Producer, `batch_size` at a time, each ack awaited; the
    first row not stored raises PutFailedError."""
    from ipc.producer import Producer

    sent = 0
    with Producer(target.store) as producer:
        batch: list[Message] = []
        for row in rows:
            batch.append(to_message(row, columns, sent + len(batch)))
            if len(batch) >= target.batch_size:
                sent = _send(producer, batch, sent, target.store)
        if batch:
            sent = _send(producer, batch, sent, target.store)
    return WriteCount(sent)


def _send(producer, batch: list[Message], sent: int, store: str) -> int:
    """Send `batch` (rows from index `sent` of the task) and empty it; the new sent count."""
    for i, result in enumerate(producer.send_batch(batch)):
        if not result.ok:
            raise PutFailedError(result.status.name, sent + i, result.reason, path=store)
    sent += len(batch)
    batch.clear()
    return sent


class _RowSender:
    """What a task of either writer does: parse the options once, send its rows (write_rows)."""

    def __init__(self, options: Mapping[str, str], columns: WriterColumns):
        self.target = parse_writer_options(options)
        self.columns = columns

    def write(self, iterator: Iterator) -> WriteCount:
        return write_rows(self.target, self.columns, iterator)


class MqstoreWriter(_RowSender, DataSourceWriter):
    """A batch write: every task sends its rows; nothing to commit beyond the acks."""


class MqstoreStreamWriter(_RowSender, DataSourceStreamWriter):
    """The streaming sink: every micro-batch's tasks send their rows (at least once)."""

    def commit(self, messages: list, batchId: int) -> None:  # noqa: N803 - the PySpark API's name
        """Nothing to do: every row was acknowledged before its task ended."""

    def abort(self, messages: list, batchId: int) -> None:  # noqa: N803 - the PySpark API's name
        """Nothing to undo: stored messages stay (the batch is sent again, at least once)."""
