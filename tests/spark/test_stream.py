"""spark.readStream.format("mqstore"): durable offsets, and exactly once across query restarts."""

from __future__ import annotations

import pytest

from engine.checkpoint import load_checkpoint
from engine.store import MessageStore
from tests.conftest import ROCKETMQ_SAMPLES
from tests.spark.stores import SMALL_CONFIG, T0_MS, FakeClock, message_batches, write_store
from tools.spark.source import MqstoreReader, parse_options
from tools.spark.stream import MqstoreStreamReader


def test_latest_offset_is_what_the_checkpoint_says_is_durable(tmp_path):
    root = tmp_path / "live"
    write_store(root, message_batches(4, 10), FakeClock(T0_MS))
    reader = MqstoreStreamReader(parse_options({"path": str(root)}))
    cp = load_checkpoint(root).checkpoint
    assert reader.latestOffset() == {"commit_pos": min(cp.commitlog_flushed_pos, cp.cq_durable_pos)}
    before = reader.latestOffset()["commit_pos"]
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr("engine.store._now_ms", FakeClock(T0_MS + 10_000))  # no checkpoint falls due
        store = MessageStore.open(root, SMALL_CONFIG)
        try:
            recovered = reader.latestOffset()["commit_pos"]
            store.put("orders", b"not yet in a checkpoint")
            assert reader.latestOffset()["commit_pos"] == recovered == before
            parts = reader.partitions({"commit_pos": 0}, reader.latestOffset())
            rows = sum(b.num_rows for p in parts for b in reader.read(p))
            assert rows == 40
        finally:
            store.close()
    assert reader.latestOffset()["commit_pos"] > before


def _run_once(spark, root, out, checkpoint) -> None:
    query = (spark.readStream.format("mqstore").load(str(root))
             .writeStream.format("parquet").option("path", str(out))
             .option("checkpointLocation", str(checkpoint)).trigger(availableNow=True).start())
    query.awaitTermination(120)
    assert query.exception() is None


@pytest.mark.slow
def test_stream_delivers_every_message_once_across_restarts(spark, tmp_path):
    root, out, checkpoint = tmp_path / "store", tmp_path / "out", tmp_path / "checkpoint"
    batches = message_batches(6, 10)
    clock = FakeClock(T0_MS)
    write_store(root, batches[:3], clock)
    _run_once(spark, root, out, checkpoint)
    assert spark.read.parquet(str(out)).count() == 30
    write_store(root, batches[3:], clock)
    _run_once(spark, root, out, checkpoint)
    _run_once(spark, root, out, checkpoint)  # nothing new: no duplicates
    rows = spark.read.parquet(str(out)).select("commit_pos", "properties").collect()
    seqs = sorted(int(r.properties["seq"]) for r in rows)
    assert seqs == list(range(60))
    assert len({r.commit_pos for r in rows}) == 60


@pytest.mark.skipif(not ROCKETMQ_SAMPLES.is_dir(), reason="shared/data/rocketmq-samples not present")
def test_a_store_without_an_mqstore_checkpoint_streams_to_the_end_of_its_data():
    for name in ("store-2021", "store-2019"):  # 2019 has a RocketMQ-written checkpoint
        reader = MqstoreStreamReader(parse_options({"path": str(ROCKETMQ_SAMPLES / name)}))
        start, end = reader.initialOffset(), reader.latestOffset()
        # 47 records of 172 bytes, then the end-of-file filler: the data ends with the segment
        assert (start, end) == ({"commit_pos": 0}, {"commit_pos": 8192})
        parts = reader.partitions(start, end)
        assert sum(b.num_rows for p in parts for b in reader.read(p)) == 47
        assert reader.partitions(end, end) == []


def test_a_batch_read_of_a_running_store_stops_at_the_durable_position(tmp_path):
    root = tmp_path / "running"
    write_store(root, message_batches(2, 10), FakeClock(T0_MS))
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr("engine.store._now_ms", FakeClock(T0_MS + 10_000))
        with MessageStore.open(root, SMALL_CONFIG) as store:  # holds the lock, like a supervisor
            store.put("orders", b"appended after the last checkpoint")
            reader = MqstoreReader(parse_options({"path": str(root)}))
            rows = sum(b.num_rows for p in reader.partitions() for b in reader.read(p))
            assert rows == 20
    reader = MqstoreReader(parse_options({"path": str(root)}))
    assert sum(b.num_rows for p in reader.partitions() for b in reader.read(p)) == 21
