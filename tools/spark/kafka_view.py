"""`option("view", "kafka")`: rows shaped as Spark's Kafka source gives them, so jobs written
for `format("kafka")` run on mqstore.

    key            binary     the KEYS property (keys joined by spaces, UTF-8); null without keys
    value          binary     the body
    topic          string     the topic
    partition      int        the queue id
    offset         bigint     the queue offset (the entry index in the queue, as Kafka's offset)
    timestamp      timestamp  the store time (when the store appended it)
    timestampType  int        1, Kafka's LogAppendTime: the store sets the time
    headers        array<struct<key:string,value:binary>>  every property, values UTF-8
The rows come from the messages view, converted batch by batch; filters are not pushed down. A
read of several stores adds the `store` column (tools.spark.source.output_columns).
"""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc

LOG_APPEND_TIME = 1  # Kafka's timestampType for a broker-set time
HEADER_TYPE = pa.struct([("key", pa.string()), ("value", pa.binary())])
KAFKA_FIELDS = (
    ("key", pa.binary()), ("value", pa.binary()), ("topic", pa.string()), ("partition", pa.int32()),
    ("offset", pa.int64()), ("timestamp", pa.timestamp("us", tz="UTC")), ("timestampType", pa.int32()),
    ("headers", pa.list_(HEADER_TYPE)),
)


def _headers(properties: pa.Array) -> pa.Array:
    props = pa.concat_arrays([properties])  # rebased: offsets from 0 over its own children
    pairs = pa.StructArray.from_arrays([props.keys, props.items.cast(pa.binary())], fields=list(HEADER_TYPE))
    return pa.ListArray.from_arrays(props.offsets, pairs, type=pa.list_(HEADER_TYPE), mask=props.is_null())


def kafka_batch(batch: pa.RecordBatch) -> pa.RecordBatch:
    """The Kafka-shaped batch of a messages-view batch (an `error` column is kept last)."""
    keys = batch.column("keys")
    joined = pc.binary_join(keys, " ")
    key = pc.if_else(pc.greater(pc.list_value_length(keys), 0), joined, pa.scalar(None, pa.string()))
    columns = [key.cast(pa.binary()), batch.column("body"), batch.column("topic"), batch.column("queue_id"),
               batch.column("queue_offset"), batch.column("store_ts"),
               pa.array([LOG_APPEND_TIME] * batch.num_rows, pa.int32()), _headers(batch.column("properties"))]
    fields = [pa.field(name, kind) for name, kind in KAFKA_FIELDS]
    if "error" in batch.schema.names:
        columns.append(batch.column("error"))
        fields.append(pa.field("error", pa.string()))
    return pa.RecordBatch.from_arrays(columns, schema=pa.schema(fields))
