"""option("view", "kafka"): the columns of Spark's Kafka source, from the messages."""

from __future__ import annotations

import pytest

from tools.spark.kafka_view import LOG_APPEND_TIME
from tools.spark.options import parse_options
from tools.spark.read_plan import RowSelection
from tools.spark.source import MqstoreDataSource, MqstoreReader


def test_kafka_rows_carry_the_messages(store_dir, records):
    source = MqstoreDataSource({"path": str(store_dir), "view": "kafka"})
    assert source.schema().startswith("key binary, value binary, topic string, partition int, offset bigint")
    opts = parse_options(source.options)
    reader = MqstoreReader(opts, RowSelection(output=opts.output))
    rows = [r for p in reader.partitions() for b in reader.read(p) for r in b.to_pylist()]
    assert len(rows) == len(records)
    by_place = {(r.topic, r.queue_id, r.queue_offset): r for r in records.values()}
    for row in rows:
        rec = by_place[(row["topic"], row["partition"], row["offset"])]
        assert row["value"] == rec.body
        assert row["key"] == (" ".join(rec.keys).encode() if rec.keys else None)
        assert int(row["timestamp"].timestamp() * 1000) == rec.store_ts_ms
        assert row["timestampType"] == LOG_APPEND_TIME
        assert {h["key"]: h["value"].decode() for h in row["headers"]} == rec.properties


@pytest.mark.slow
def test_a_job_written_for_the_kafka_source_runs(spark, store_dir, records):
    df = (spark.read.format("mqstore").option("view", "kafka").load(str(store_dir))
          .selectExpr("CAST(key AS STRING) AS k", "CAST(value AS STRING) AS v", "topic", "partition",
                      "offset", "filter(headers, h -> h.key = 'seq')[0].value AS seq"))
    got = {(r.topic, r.partition, r.offset): r for r in df.collect()}
    assert len(got) == len(records)
    for rec in records.values():
        row = got[(rec.topic, rec.queue_id, rec.queue_offset)]
        assert row.v == rec.body.decode() and row.k == (" ".join(rec.keys) or None)
        assert bytes(row.seq).decode() == rec.properties["seq"]


KAFKA_COLUMNS = ["key", "value", "topic", "partition", "offset", "timestamp", "timestampType", "headers"]


def schema_columns(options: dict) -> list[str]:
    return [column.split()[0] for column in MqstoreDataSource(options).schema().split(", ")]


def test_the_kafka_view_of_one_store_has_exactly_the_kafka_sources_columns(store_dir):
    assert schema_columns({"path": str(store_dir), "view": "kafka"}) == KAFKA_COLUMNS
    assert schema_columns({"path": str(store_dir)})[-1] == "store"  # the messages view keeps it


def test_the_kafka_view_of_several_stores_tells_them_apart_by_a_store_column(store_dir, tmp_path):
    other = tmp_path / "other"
    other.mkdir()
    assert schema_columns({"path": f"{store_dir},{other}", "view": "kafka"}) == [*KAFKA_COLUMNS, "store"]
    assert schema_columns({"path": str(tmp_path / "*"), "view": "kafka"}) == [*KAFKA_COLUMNS, "store"]


@pytest.mark.slow
def test_a_kafka_view_read_of_one_store_has_no_store_column(spark, store_dir, records):
    df = spark.read.format("mqstore").option("view", "kafka").load(str(store_dir))
    assert df.columns == KAFKA_COLUMNS
    rows = df.collect()
    assert len(rows) == len(records) and "store" not in rows[0].asDict()
