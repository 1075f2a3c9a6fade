"""Filter pushdown: Spark's where() on topic, queue_id, commit_pos, queue_offset, store_ts."""

from __future__ import annotations

import re
from datetime import UTC, datetime

import pytest
from pyspark.sql.datasource import EqualTo, GreaterThanOrEqual, In, LessThan, StringStartsWith

from engine.errors import BadInputError
from tools.spark.options import parse_options
from tools.spark.partitions import ScanRange
from tools.spark.scan import RowFilter, ScanSpec, VerifyMode, iter_range
from tools.spark.source import PushdownReader


def decoded_records(reader: PushdownReader) -> int:
    """Records in the ranges the reader planned: what its partitions decode, before filters."""
    spec = ScanSpec(VerifyMode.NONE, reader.layout.full_verify, RowFilter())
    ranges: list[ScanRange] = [r for p in reader.partitions() for r in p.value]
    return sum(1 for r in ranges for _ in iter_range(r, spec))


def rows_of(reader: PushdownReader) -> list[dict]:
    return [row for p in reader.partitions() for b in reader.read(p) for row in b.to_pylist()]


def test_pushed_filters_cut_what_the_source_decodes(store_dir, records):
    positions = sorted(records)
    cut = positions[len(positions) // 2]
    reader = PushdownReader(parse_options({"path": str(store_dir)}))
    assert decoded_records(reader) == len(records)
    unhandled = StringStartsWith(("tags",), "t1")
    rest = reader.pushFilters([EqualTo(("topic",), "orders"), In(("queue_id",), (0, 2)),
                               GreaterThanOrEqual(("commit_pos",), cut), LessThan(("queue_offset",), 40),
                               unhandled])
    assert rest == [unhandled]
    expected = {p for p, r in records.items()
                if r.topic == "orders" and r.queue_id in (0, 2) and p >= cut and r.queue_offset < 40}
    assert {r["commit_pos"] for r in rows_of(reader)} == expected
    decoded = decoded_records(reader)
    assert len(expected) <= decoded < len(records) // 2 + 1  # the first half was never read


def test_store_ts_prunes_but_spark_checks_the_rows(store_dir, records):
    times = sorted({r.store_ts_ms for r in records.values()})
    start = datetime.fromtimestamp(times[-3] / 1000, UTC)
    reader = PushdownReader(parse_options({"path": str(store_dir), "timeSlackMs": "0"}))
    time_filter = GreaterThanOrEqual(("store_ts",), start)
    assert reader.pushFilters([time_filter]) == [time_filter]
    assert decoded_records(reader) < len(records) // 2
    assert {r["commit_pos"] for r in rows_of(reader)} >= {
        p for p, r in records.items() if r.store_ts_ms >= times[-3]}


def test_nothing_is_claimed_when_bad_records_become_rows(store_dir):
    reader = PushdownReader(parse_options({"path": str(store_dir), "verify": "report"}))
    topic = EqualTo(("topic",), "orders")
    assert reader.pushFilters([topic]) == [topic]


@pytest.mark.slow
def test_where_clauses_are_pushed_and_answer_as_spark_would(spark, store_dir, records):
    positions = sorted(records)
    cut = positions[100]
    times = sorted({r.store_ts_ms for r in records.values()})
    df = (spark.read.format("mqstore").option("filterPushdown", "true").load(str(store_dir))
          .where(f"topic IN ('orders', 'audit') AND queue_id = 1 AND commit_pos > {cut} "
                 f"AND queue_offset >= 5 AND store_ts < timestamp_millis({times[-2]})"))
    got = sorted(r.commit_pos for r in df.select("commit_pos").collect())
    assert got == sorted(p for p, r in records.items()
                         if r.topic in ("orders", "audit") and r.queue_id == 1 and p > cut
                         and r.queue_offset >= 5 and r.store_ts_ms < times[-2])
    plan = df._jdf.queryExecution().executedPlan().toString()  # what Spark itself still filters
    assert re.search(r"store_ts#\d+ <", plan)
    assert not re.search(r"queue_id#\d+ = 1|topic#\d+ IN|commit_pos#\d+ >|queue_offset#\d+ >=", plan), plan
    plain = spark.read.format("mqstore").load(str(store_dir)).where("topic = 'orders'")
    assert plain.count() == sum(r.topic == "orders" for r in records.values())


def test_tags_option_and_pushed_tags_use_the_consumers_rule(store_dir, records):
    reader = PushdownReader(parse_options({"path": str(store_dir), "tags": " t1 || t2 "}))
    assert {r["commit_pos"] for r in rows_of(reader)} == {
        p for p, r in records.items() if r.tags in ("t1", "t2")}
    rest = reader.pushFilters([EqualTo(("tags",), "t2"), In(("tags",), ("t0", "t1 || t2"))])
    assert rest == [In(("tags",), ("t0", "t1 || t2"))]  # not a tag: Spark evaluates it
    assert {r["tags"] for r in rows_of(reader)} == {"t2"}
    emptied = PushdownReader(parse_options({"path": str(store_dir), "tags": "t1"}))
    no_tag_left = In(("tags",), ("t0", "t2"))
    assert emptied.pushFilters([no_tag_left]) == [no_tag_left]  # an empty set would mean `*`
    with pytest.raises(BadInputError, match="names no tag"):
        parse_options({"path": str(store_dir), "tags": " || "})
    with pytest.raises(BadInputError, match="dispatch view"):
        parse_options({"path": str(store_dir), "tags": "t1", "view": "dispatch"})


@pytest.mark.slow
def test_spark_reads_a_tag_subscription_and_pushes_tags_in(spark, store_dir, records):
    base = spark.read.format("mqstore").option("filterPushdown", "true").load(str(store_dir))
    by_option = (spark.read.format("mqstore").option("tags", "t0 || t1").load(str(store_dir))
                 .select("commit_pos").collect())
    assert {r.commit_pos for r in by_option} == {p for p, r in records.items() if r.tags in ("t0", "t1")}
    pushed = base.where("tags IN ('t1', 't2') AND topic = 'orders'")
    plan = pushed._jdf.queryExecution().executedPlan().toString()
    assert not re.search(r"tags#\d+ IN|topic#\d+ =", plan), plan  # both claimed by the source
    assert {r.commit_pos for r in pushed.select("commit_pos").collect()} == {
        p for p, r in records.items() if r.tags in ("t1", "t2") and r.topic == "orders"}
