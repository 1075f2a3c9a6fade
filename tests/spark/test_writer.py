"""df.write.format("mqstore") and the streaming sink: rows into a running store (a real
`mqstore start` process), read back by the engine message by message."""

from __future__ import annotations

import pytest
from pyspark.errors import PySparkException
from pyspark.sql import Row
from pyspark.sql.types import ArrayType, BinaryType, IntegerType, StringType, StructField, StructType

from engine.errors import BadInputError
from engine.message import Message
from engine.store import MessageStore
from tests.spark.stores import T0_MS, FakeClock, message_batches, write_store
from tests.workers.store_harness import assert_check_clean, checked_store, start_store
from tools.spark.writer import to_message, writer_columns

ROWS_SCHEMA = StructType([
    StructField("topic", StringType()), StructField("body", BinaryType()),
    StructField("keys", ArrayType(StringType())), StructField("tags", StringType()),
    StructField("queue_id", IntegerType()),
])


def stored(root) -> list:
    """Every message of a stopped store, in commit order, as the engine reads it."""
    out = []
    with MessageStore.open(root) as store:
        for queue in store.queues:
            offset = queue.min_offset
            while offset < queue.max_offset:
                result = store.get_messages(queue.topic, queue.queue_id, offset, 64)
                out += result.messages
                offset = result.next_offset
    return sorted(out, key=lambda r: r.commit_pos)


def write(df, store, **options) -> None:
    df.write.format("mqstore").options(**options).mode("append").save(str(store))


def test_rows_are_written_into_a_running_store(spark, tmp_path):
    root = tmp_path / "store"
    rows = [(f"T{i % 2}", f"body-{i}".encode(), [f"k{i}", f"g{i % 3}"] if i % 4 else None,
             f"tag{i % 3}" if i % 5 else None, i % 4 if i % 2 else None) for i in range(300)]
    kafka_rows = [("K", f"value-{i}", f"key-{i}") for i in range(40)]
    with checked_store(root):
        write(spark.createDataFrame(rows, ROWS_SCHEMA).repartition(3), root, batchSize="50")
        write(spark.createDataFrame(kafka_rows, "topic string, value string, key string"), root)
    messages = stored(root)
    by_body = {r.body: r for r in messages}
    assert len(messages) == len(by_body) == 340
    for topic, body, keys, tags, queue_id in rows:
        record = by_body[body]
        assert (record.topic, record.keys, record.tags) == (topic, tuple(keys or ()), tags)
        if queue_id is not None:
            assert record.queue_id == queue_id
    for topic, value, key in kafka_rows:
        record = by_body[value.encode()]
        assert (record.topic, record.keys) == (topic, (key,))


def test_the_streaming_sink_copies_a_store_into_a_running_one(spark, tmp_path):
    source, root = tmp_path / "source", tmp_path / "store"
    write_store(source, message_batches(4, 10), FakeClock(T0_MS))
    with checked_store(root):
        query = (spark.readStream.format("mqstore").load(str(source)).select("topic", "body", "keys", "tags")
                 .writeStream.format("mqstore").option("path", str(root))
                 .option("checkpointLocation", str(tmp_path / "checkpoint"))
                 .trigger(availableNow=True).start())
        query.awaitTermination(180)
        assert query.exception() is None
    copied = stored(root)
    originals = [m for batch in message_batches(4, 10) for m in batch]
    assert sorted((r.topic, r.body, r.keys, r.tags) for r in copied) == sorted(
        (m.topic, m.body, m.keys, m.tags) for m in originals)


def test_no_running_store_is_an_error_naming_the_path(spark, tmp_path):
    df = spark.createDataFrame([("T", b"x")], "topic string, body binary")
    stopped = tmp_path / "stopped"
    running = start_store(stopped)
    assert running.stop() == 0
    with pytest.raises(PySparkException, match=f"no supervisor runs on this store \\[{stopped}\\]"):
        write(df, stopped)
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(PySparkException, match=f"no store here and no supervisor runs on it \\[{empty}\\]"):
        write(df, empty)
    assert list(empty.iterdir()) == []
    assert stored(stopped) == []
    assert_check_clean(stopped)


def test_a_message_the_store_refuses_fails_the_task_naming_status_and_row(spark, tmp_path):
    root = tmp_path / "store"
    rows = [("T", b"fine")] * 3 + [("T", b"x" * 9000)]  # max_body_bytes is 8192
    with checked_store(root), pytest.raises(PySparkException, match="row 3 was not stored: MESSAGE_ILLEGAL"):
            write(spark.createDataFrame(rows, "topic string, body binary").coalesce(1), root, batchSize="2")
    assert [r.body for r in stored(root)] == [b"fine"] * 3  # every row before it, acknowledged


def test_bad_columns_and_options_are_refused_before_anything_is_written(spark, tmp_path):
    root = tmp_path / "store"
    with checked_store(root):
        cases = [
            ("topic string, body binary, partition int", "unknown column 'partition'"),
            ("topic string, body binary, value binary", "exactly one of the columns body and value"),
            ("body binary", "needs a topic column"),
            ("topic string, body int", "column 'body' is int"),
            ("topic string, body binary, keys array<int>", "column 'keys' is array<int>"),
        ]
        for ddl, words in cases:
            with pytest.raises(BadInputError, match=words):
                writer_columns(StructType.fromDDL(ddl))
        df = spark.createDataFrame([("T", b"x", 1)], "topic string, body binary, partition int")
        with pytest.raises(PySparkException, match="unknown column 'partition'"):
            write(df, root)
        with pytest.raises(PySparkException, match="unknown mqstore writer option; did you mean 'batchSize'"):
            write(df.drop("partition"), root, batchsise="10")
        with pytest.raises(PySparkException, match="a store cannot be overwritten"):
            df.drop("partition").write.format("mqstore").mode("overwrite").save(str(root))
    assert stored(root) == []


def test_a_null_topic_or_body_or_a_key_that_is_not_text_names_its_row():
    columns = writer_columns(StructType.fromDDL("topic string, value binary, key binary"))
    assert to_message(Row(topic="T", value=b"v", key=b"k1"), columns, 0) == Message("T", b"v", keys=("k1",))
    cases = [(Row(topic=None, value=b"v", key=None), "row 7 has a null topic"),
             (Row(topic="T", value=None, key=None), "row 7 has a null value"),
             (Row(topic="T", value=b"v", key=b"\xff"), "row 7 has a key that is not UTF-8 text")]
    for row, words in cases:
        with pytest.raises(BadInputError, match=words):
            to_message(row, columns, 7)
