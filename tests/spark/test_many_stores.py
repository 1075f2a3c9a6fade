"""Many stores as one DataFrame: several paths or a glob, the `store` column, pruning by store,
and a stream with an offset per store."""

from __future__ import annotations

import json
import os
import re

import pytest
from pyspark.sql.datasource import EqualTo, In

from engine.check.fsck import check as engine_check
from engine.errors import BadInputError, DataLossError
from tests.spark.stores import T0_MS, FakeClock, message_batches, run_available_now, write_store
from tools.spark.options import parse_options
from tools.spark.source import PushdownReader
from tools.spark.stream import MqstoreStreamReader

SIZES = {"host-a": 2, "host-b": 3, "host-c": 5}  # batches of 10 messages per store


@pytest.fixture(scope="module")
def hosts(tmp_path_factory):
    """Three closed stores, <base>/host-X/store, of 20, 30 and 50 messages."""
    base = tmp_path_factory.mktemp("hosts")
    for host, batch_count in SIZES.items():
        write_store(base / host / "store", message_batches(batch_count, 10), FakeClock(T0_MS))
    return base


def store_of(base, host: str) -> str:
    return str(base / host / "store")


def counts_by_store(df) -> dict[str, int]:
    return {r.store: r["count"] for r in df.groupBy("store").count().collect()}


def test_two_and_three_stores_read_as_one_dataframe(spark, hosts):
    a, b, c = (store_of(hosts, h) for h in SIZES)
    two = spark.read.format("mqstore").load(f"{a},{b}")
    assert counts_by_store(two) == {a: 20, b: 30}
    three = spark.read.format("mqstore").load([a, b, c])
    assert counts_by_store(three) == {a: 20, b: 30, c: 50}
    globbed = spark.read.format("mqstore").load(str(hosts / "host-*" / "store"))
    assert counts_by_store(globbed) == {a: 20, b: 30, c: 50}
    seqs = globbed.selectExpr("store", "properties['seq'] AS seq").collect()
    assert len({(r.store, r.seq) for r in seqs}) == 100  # no message twice, none missing


def test_one_path_reads_as_before_with_its_store_column(spark, hosts):
    path = store_of(hosts, "host-a")
    df = spark.read.format("mqstore").load(path + "/")
    assert df.columns[-1] == "store"
    rows = df.collect()
    assert len(rows) == 20 and {r.store for r in rows} == {path}
    assert sorted(int(r.properties["seq"]) for r in rows) == list(range(20))


def test_where_store_prunes_whole_stores(spark, hosts):
    a, b, c = (store_of(hosts, h) for h in SIZES)
    reader = PushdownReader(parse_options({"path": str(hosts / "host-*" / "store")}))
    assert reader.pushFilters([EqualTo(("store",), b), EqualTo(("topic",), "orders")]) == []
    planned = {source.store for p in reader.partitions() for source in p.sources}
    assert planned == {b}  # the other stores are not even planned
    reader = PushdownReader(parse_options({"path": str(hosts / "host-*" / "store")}))
    reader.pushFilters([In(("store",), (a, c, "/no/such/store"))])
    assert {source.store for p in reader.partitions() for source in p.sources} == {a, c}
    df = spark.read.format("mqstore").option("filterPushdown", "true").load(str(hosts / "host-*" / "store"))
    assert counts_by_store(df.where(f"store IN ('{a}', '{c}')")) == {a: 20, c: 50}


def test_a_glob_matching_nothing_or_a_missing_path_is_refused(hosts):
    with pytest.raises(BadInputError, match=r"the glob .*host-z\*.* matches no store directory"):
        PushdownReader(parse_options({"path": str(hosts / "host-z*" / "store")}))
    missing = str(hosts / "host-d" / "store")
    with pytest.raises(BadInputError, match=f"{missing!r} is not a directory"):
        PushdownReader(parse_options({"path": f"{store_of(hosts, 'host-a')},{missing}"}))
    with pytest.raises(BadInputError, match="not a JSON array of paths"):
        parse_options({"paths": "[1, 2]"})


def test_stream_offsets_are_per_store_and_data_loss_names_its_store(tmp_path):
    a, b = tmp_path / "a" / "store", tmp_path / "b" / "store"
    write_store(a, message_batches(12, 10), FakeClock(T0_MS))
    write_store(b, message_batches(2, 10), FakeClock(T0_MS))
    glob = str(tmp_path / "*" / "store")
    reader = MqstoreStreamReader(parse_options({"path": glob}))
    start = reader.initialOffset()
    assert set(start["stores"]) == {str(a), str(b)}
    first_segment = sorted((a / "commitlog").iterdir())[0]
    os.unlink(first_segment)  # retention ran on store a before the stream read it
    end = reader.latestOffset(start, reader.getDefaultReadLimit())
    with pytest.raises(DataLossError, match=r"commit positions \[0, \d+\) .*" + re.escape(f"[{a}]")):
        reader.partitions(start, end)
    skipping = MqstoreStreamReader(parse_options({"path": glob, "failOnDataLoss": "false",
                                                  "maxRecordsPerTrigger": "15"}))
    end = skipping.latestOffset(start, skipping.getDefaultReadLimit())
    rows = [r for p in skipping.partitions(start, end) for b in skipping.read(p) for r in b.to_pylist()]
    by_store = {s: sum(1 for r in rows if r["store"] == s) for s in (str(a), str(b))}
    assert by_store == {str(a): 15, str(b): 15}  # the limit holds for each store on its own


def _run_stream(spark, glob, out, checkpoint) -> None:
    frame = spark.readStream.format("mqstore").load(glob).selectExpr("store", "properties['seq'] AS seq",
                                                                      "commit_pos")
    run_available_now(frame, out, checkpoint, 180)


@pytest.mark.slow
def test_stream_over_stores_delivers_every_message_once_across_restarts(spark, tmp_path):
    base, out, checkpoint = tmp_path / "hosts", tmp_path / "out", tmp_path / "checkpoint"
    glob = str(base / "host-*" / "store")
    clocks = {h: FakeClock(T0_MS) for h in ("host-a", "host-b", "host-c")}
    batches = message_batches(6, 10)
    write_store(base / "host-a" / "store", batches[:2], clocks["host-a"])
    write_store(base / "host-b" / "store", batches[:1], clocks["host-b"])
    _run_stream(spark, glob, out, checkpoint)
    write_store(base / "host-a" / "store", batches[2:5], clocks["host-a"])  # more on a
    write_store(base / "host-c" / "store", batches[:3], clocks["host-c"])  # a store appears
    _run_stream(spark, glob, out, checkpoint)
    _run_stream(spark, glob, out, checkpoint)  # nothing new: nothing twice
    rows = spark.read.parquet(str(out)).collect()
    stores = {h: str(base / h / "store") for h in clocks}
    seen = [(r.store, int(r.seq)) for r in rows]
    assert len(seen) == len(set(seen)) == 50 + 10 + 30
    expected = {"host-a": 50, "host-b": 10, "host-c": 30}
    assert {s: sorted(q for st, q in seen if st == s) for s in stores.values()} == {
        stores[h]: list(range(n)) for h, n in expected.items()}
    last_batch = max(int(p.name) for p in (checkpoint / "offsets").iterdir() if p.name.isdigit())
    last = json.loads((checkpoint / "offsets" / str(last_batch)).read_text().splitlines()[-1])
    assert set(last["stores"]) == set(stores.values())
    for root in stores.values():
        assert engine_check(root) == []


def test_a_store_that_appears_later_is_read_from_its_beginning(tmp_path):
    a, b = tmp_path / "a" / "store", tmp_path / "b" / "store"
    write_store(a, message_batches(2, 10), FakeClock(T0_MS))
    reader = MqstoreStreamReader(parse_options({"path": str(tmp_path / "*" / "store"),
                                                "maxRecordsPerTrigger": "12"}))
    start = reader.latestOffset(reader.initialOffset(), reader.getDefaultReadLimit())
    assert list(start["stores"]) == [str(a)]
    write_store(b, message_batches(3, 10), FakeClock(T0_MS))
    end = reader.latestOffset(start, reader.getDefaultReadLimit())
    rows = [r for p in reader.partitions(start, end) for batch in reader.read(p) for r in batch.to_pylist()]
    assert sorted(int(dict(r["properties"])["seq"]) for r in rows if r["store"] == str(b)) == list(range(12))
    assert sum(1 for r in rows if r["store"] == str(a)) == 8  # a's next 12 hold its last 8
    with pytest.raises(BadInputError, match=r"offset .* is of a single store; this stream reads 2"):
        reader.latestOffset({"commit_pos": 0}, reader.getDefaultReadLimit())
