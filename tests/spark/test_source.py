"""spark.read.format("mqstore"): content, partitions, filters, verification, RocketMQ stores."""

from __future__ import annotations

import shutil
import socket
import struct
import zlib
from dataclasses import replace

import pytest
from pyspark.sql.types import IntegerType, LongType, StructField, StructType

from engine.errors import BadInputError
from engine.formats.msg_id import make_msg_id
from engine.formats.record import BODY_OFFSET, MAGIC_V2, SysFlag
from engine.store import MessageStore
from tests.conftest import ROCKETMQ_SAMPLES as SAMPLES_DIR
from tests.spark.stores import SMALL_CONFIG, T0_MS
from tools.spark.layout import read_layout
from tools.spark.options import parse_options
from tools.spark.scan import host_text
from tools.spark.source import MqstoreDataSource, MqstoreReader, register


def load(spark, path, **options):
    return spark.read.format("mqstore").options(**options).load(str(path))


@pytest.mark.slow
def test_format_is_found_without_registration(spark):
    """Spark 4 imported pyspark_mqstore by itself and registered its DefaultSource statically."""
    jvm = spark.sparkContext._jvm
    manager = getattr(jvm.org.apache.spark.sql.execution.datasources, "DataSourceManager$")
    assert spark._jsparkSession.sessionState().dataSourceManager().dataSourceExists("mqstore")
    static = manager.__getattr__("MODULE$").dataSourceBuilders().get()
    assert static.contains("mqstore")
    register(spark)  # idempotent, where spark.dataSource.register would now raise ALREADY_EXISTS
    register(spark)


@pytest.mark.slow
def test_rows_equal_what_the_engine_reads(spark, store_dir, records):
    rows = {r.commit_pos: r for r in load(spark, store_dir).collect()}
    assert rows.keys() == records.keys()
    for pos, rec in records.items():
        row = rows[pos]
        assert (row.size, row.topic, row.queue_id, row.queue_offset) == (
            rec.total_size, rec.topic, rec.queue_id, rec.queue_offset)
        assert (row.tags, tuple(row.keys), row.uniq_key, row.msg_id) == (rec.tags, rec.keys, rec.uniq_key,
                                                                       rec.msg_id)
        assert int(row.born_ts.timestamp() * 1000) == rec.born_ts_ms
        assert int(row.store_ts.timestamp() * 1000) == rec.store_ts_ms
        assert (row.born_host, row.store_host) == (host_text(rec.born_host), host_text(rec.store_host))
        assert (row.sys_flag, row.reconsume_times) == (rec.sys_flag, rec.reconsume_times)
        assert row.properties == rec.properties
        assert bytes(row.body) == rec.body


@pytest.mark.parametrize("mode", ["sample", "walk"])
def test_byte_range_partitions_read_every_record_once(store_dir, records, mode):
    """Below the option's floor (1 MiB) only through SourceOptions: ranges inside segments."""
    opts = replace(parse_options({"path": str(store_dir), "splitMode": mode}), target_bytes=4000)
    reader = MqstoreReader(opts)
    parts = reader.partitions()
    assert len(parts) > 8  # more ranges than segments
    positions = [p for part in parts for b in reader.read(part) for p in b.column("commit_pos").to_pylist()]
    assert sorted(positions) == sorted(records)


@pytest.mark.slow
def test_small_segments_are_packed_into_few_partitions(spark, store_dir, records):
    layout = read_layout(store_dir)
    assert len(layout.segments) > 4  # 16 KiB segments
    df = load(spark, store_dir)
    assert df.rdd.getNumPartitions() == 1  # all of them fit maxPartitionBytes (128 MiB)
    assert sorted(r.commit_pos for r in df.select("commit_pos").collect()) == sorted(records)


@pytest.fixture(scope="module")
def empty_store(tmp_path_factory):
    root = tmp_path_factory.mktemp("empty") / "store"
    MessageStore.open(root, SMALL_CONFIG).close()
    return root


@pytest.mark.slow
def test_an_empty_plan_reads_zero_rows(spark, empty_store, store_dir):
    assert load(spark, empty_store).count() == 0
    assert load(spark, store_dir, startPos=str(10**12)).count() == 0
    assert load(spark, store_dir, startTime=str(T0_MS + 10_000), endTime=str(T0_MS)).count() == 0


@pytest.mark.slow
def test_a_schema_with_some_columns_returns_those_columns(spark, store_dir, records):
    df = spark.read.format("mqstore").schema("topic string, commit_pos bigint").load(str(store_dir))
    rows = df.collect()
    assert df.columns == ["topic", "commit_pos"]
    assert {(r.commit_pos, r.topic) for r in rows} == {(p, r.topic) for p, r in records.items()}


@pytest.mark.slow
def test_a_body_schema_sums_the_bodies_of_the_rows_kept(spark, store_dir, records):
    """The scan of bodies decodes only bodies, yet a topics option and a pushed-down queue_id
    filter still keep exactly their rows."""
    df = (spark.read.format("mqstore").schema("queue_id int, body binary").option("topics", "orders")
          .option("filterPushdown", "true").load(str(store_dir)).where("queue_id = 1"))
    row = df.selectExpr("count(*) AS n", "sum(length(body)) AS body_bytes").first()
    kept = [r for r in records.values() if r.topic == "orders" and r.queue_id == 1]
    assert (row.n, row.body_bytes) == (len(kept), sum(len(r.body) for r in kept))
    assert 0 < len(kept) < len(records)


def test_a_schema_naming_an_unknown_column_or_a_wrong_type_is_refused(store_dir):
    source = MqstoreDataSource({"path": str(store_dir)})
    with pytest.raises(BadInputError, match="'partition' is not a column of the messages view"):
        source.reader(StructType([StructField("commit_pos", LongType()),
                                  StructField("partition", IntegerType())]))
    with pytest.raises(BadInputError, match="column 'commit_pos' is bigint, not int"):
        source.reader(StructType([StructField("commit_pos", IntegerType())]))


def test_unknown_options_are_refused_with_a_suggestion(store_dir):
    with pytest.raises(BadInputError, match="invalid topic: unknown mqstore option; did you mean 'topics'"):
        parse_options({"path": str(store_dir), "topic": "orders"})
    assert parse_options({"PATH": str(store_dir), "TOPICS": "orders"}).scan_filter.topics == {"orders"}


def test_max_partition_bytes_has_a_floor(store_dir):
    with pytest.raises(BadInputError, match="maxPartitionBytes: 1000 is below the floor of 1048576"):
        parse_options({"path": str(store_dir), "maxPartitionBytes": "1000"})
    assert parse_options({"path": str(store_dir), "maxPartitionBytes": str(1 << 20)}).target_bytes == 1 << 20


@pytest.mark.slow
def test_topic_time_and_commit_filters(spark, store_dir, records):
    times = sorted({r.store_ts_ms for r in records.values()})
    start_ms, end_ms = times[3], times[9]
    df = load(spark, store_dir, topics="orders,audit", startTime=str(start_ms), endTime=str(end_ms))
    got = sorted(r.commit_pos for r in df.select("commit_pos").collect())
    assert got == sorted(p for p, r in records.items()
                         if r.topic in ("orders", "audit") and start_ms <= r.store_ts_ms < end_ms)
    positions = sorted(records)
    lo, hi = positions[20] + 1, positions[100]
    got = sorted(r.commit_pos for r in load(spark, store_dir, startPos=str(lo), endPos=str(hi))
                 .select("commit_pos").collect())
    assert got == [p for p in positions if lo <= p < hi]


@pytest.mark.slow
def test_iso_time_options_are_utc(spark, store_dir, records):
    first = min(r.store_ts_ms for r in records.values())
    df = load(spark, store_dir, startTime="2023-11-14T22:13:20", endTime="2023-11-14T22:13:20.001Z")
    assert first == 1_700_000_000_000
    assert df.count() == sum(r.store_ts_ms == first for r in records.values())


@pytest.fixture
def flipped_store(tmp_path, store_dir, records):
    """A copy of the store with one body byte flipped (structure intact, CRCs broken)."""
    copy = tmp_path / "flipped"
    shutil.copytree(store_dir, copy)
    victim = sorted(records)[5]
    segment = copy / "commitlog" / f"{0:020d}"
    with open(segment, "r+b") as f:
        f.seek(victim + BODY_OFFSET)
        byte = f.read(1)
        f.seek(victim + BODY_OFFSET)
        f.write(bytes([byte[0] ^ 0x40]))
    return copy, victim


@pytest.mark.slow
def test_verify_fail_raises_on_a_flipped_byte(spark, flipped_store):
    copy, _ = flipped_store
    with pytest.raises(Exception, match="BODYCRC mismatch"):
        load(spark, copy, verify="fail").count()


@pytest.mark.slow
def test_verify_report_flags_the_flipped_record(spark, flipped_store, records):
    copy, victim = flipped_store
    rows = load(spark, copy, verify="report").select("commit_pos", "topic", "error").collect()
    assert len(rows) == len(records)
    bad = [r for r in rows if r.error]
    assert [(r.commit_pos, r.topic) for r in bad] == [(victim, records[victim].topic)]
    assert "BODYCRC" in bad[0].error


@pytest.mark.skipif(not SAMPLES_DIR.is_dir(), reason="shared/data/rocketmq-samples not present")
@pytest.mark.slow
def test_rocketmq_written_stores_are_read(spark):
    for name in ("store-2021", "store-2019"):
        rows = load(spark, SAMPLES_DIR / name, verify="fail").collect()
        assert len(rows) == 47
        assert {r.topic for r in rows} == {"abc"}
        assert {bytes(r.body) for r in rows} == {b"Once, there was a chance for me!"}
        assert [r.queue_offset for r in rows] == list(range(47))
        assert all(r.size == 172 and r.tags == "TAG1" and len(r.keys) == 1 for r in rows)


def _rocketmq_v2_ipv6_record(commit_pos: int, queue_offset: int, body: bytes) -> bytes:
    """A record as RocketMQ 5 writes it for a long topic: magic v2 (2-byte TOPICLENGTH), IPv6
    born and store hosts, BODYCRC only (no __CRC32C property)."""
    topic = ("t" * 130).encode()
    props = b"TAGS\x01v6\x02KEYS\x01a b\x02"
    head = struct.pack(">iiiqqiq", zlib.crc32(body) & 0x7FFFFFFF, 3, 0, queue_offset, commit_pos,
                       SysFlag.BORNHOST_V6 | SysFlag.STOREHOST_V6, 1_600_000_000_000)
    born = socket.inet_pton(socket.AF_INET6, "2001:db8::1") + struct.pack(">i", 4242)
    store = socket.inet_pton(socket.AF_INET6, "::1") + struct.pack(">i", 10911)
    rest = (struct.pack(">q", 1_600_000_000_123) + store + struct.pack(">iqi", 0, 0, len(body)) + body
            + struct.pack(">h", len(topic)) + topic + struct.pack(">h", len(props)) + props)
    record = struct.pack(">I", MAGIC_V2) + head + born + rest
    return struct.pack(">i", len(record) + 4) + record


def test_rocketmq_v2_records_with_ipv6_hosts_are_read(tmp_path):
    """No Spark needed: the reader's partitions and batches, on a RocketMQ-layout directory."""
    segment = bytearray(4096)
    pos = 0
    for i in range(3):
        raw = _rocketmq_v2_ipv6_record(pos, i, b"body-%d" % i)
        segment[pos:pos + len(raw)] = raw
        pos += len(raw)
    (tmp_path / "commitlog").mkdir()
    (tmp_path / "commitlog" / f"{0:020d}").write_bytes(bytes(segment))
    reader = MqstoreReader(parse_options({"path": str(tmp_path), "verify": "fail"}))
    rows = [row for p in reader.partitions() for b in reader.read(p) for row in b.to_pylist()]
    assert [r["queue_offset"] for r in rows] == [0, 1, 2]
    first = rows[0]
    assert first["topic"] == "t" * 130 and first["queue_id"] == 3 and first["body"] == b"body-0"
    assert first["born_host"] == "[2001:db8::1]:4242" and first["store_host"] == "[::1]:10911"
    assert first["keys"] == ["a", "b"] and first["tags"] == "v6"
    assert first["msg_id"] == make_msg_id(("::1", 10911), 0) and len(first["msg_id"]) == 56
