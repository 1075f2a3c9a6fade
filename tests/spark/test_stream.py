"""spark.readStream.format("mqstore"): durable offsets, and exactly once across query restarts."""

from __future__ import annotations

import logging
import os
import re

import pytest
from pyspark.errors import StreamingQueryException
from pyspark.sql.streaming.datasource import ReadMaxBytes
from pyspark.sql.types import BinaryType, StructField, StructType

from engine.check.fsck import check as engine_check
from engine.errors import BadInputError, DataLossError
from engine.recovery.checkpoint import load_checkpoint
from engine.retention.line import raise_retention_line
from engine.store import MessageStore
from tests.conftest import ROCKETMQ_SAMPLES
from tests.spark.stores import (
    SMALL_CONFIG,
    T0_MS,
    FakeClock,
    engine_records,
    message_batches,
    run_available_now,
    start_available_now,
    write_store,
)
from tools.spark.options import parse_options
from tools.spark.source import MqstoreDataSource, MqstoreReader
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


def test_a_stream_decodes_only_the_columns_of_its_schema(store_dir, records, monkeypatch):
    """readStream with `.schema("body binary")` decodes bodies alone, as a batch read does."""
    def refuse(*_args):
        raise AssertionError("decoded a column nobody asked for")

    for name in ("parse_pieces", "packed_hosts", "msg_id_array"):
        monkeypatch.setattr(f"tools.spark.arrow_columns.{name}", refuse)
    source = MqstoreDataSource({"path": str(store_dir)})
    reader = source.streamReader(StructType([StructField("body", BinaryType())]))
    parts = reader.partitions(reader.initialOffset(), reader.latestOffset())
    rows = [row for part in parts for batch in reader.read(part) for row in batch.to_pylist()]
    assert sorted(row["body"] for row in rows) == sorted(r.body for r in records.values())
    assert {tuple(row) for row in rows} == {("body",)}


def _run_once(spark, root, out, checkpoint) -> None:
    run_available_now(spark.readStream.format("mqstore").load(str(root)), out, checkpoint, 120)


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


def _segments(root):
    return sorted((root / "commitlog").iterdir())


def _retention(root, keep_from_pos: int) -> int:
    """Delete the oldest segments wholly below `keep_from_pos`, as retention does (never the
    last one); returns the new first position."""
    segments = _segments(root)
    going = [path for path in segments[:-1]
             if int(path.name) + SMALL_CONFIG.commitlog_file_size <= keep_from_pos]
    if going:  # the line first, as engine.retention.expiry.remove_segments
        raise_retention_line(root, int(going[-1].name) + SMALL_CONFIG.commitlog_file_size)
    for path in going:
        path.unlink()
    return int(_segments(root)[0].name)


def _stream(spark, root, out, checkpoint, **options):
    return start_available_now(spark.readStream.format("mqstore").options(**options).load(str(root)),
                               out, checkpoint)


@pytest.mark.slow
def test_a_restart_after_retention_fails_naming_the_lost_positions(spark, tmp_path):
    root, out, checkpoint = tmp_path / "store", tmp_path / "out", tmp_path / "checkpoint"
    batches, clock = message_batches(12, 10), FakeClock(T0_MS)
    write_store(root, batches[:2], clock)
    _run_once(spark, root, out, checkpoint)
    read_to = load_checkpoint(root).checkpoint.commitlog_flushed_pos
    write_store(root, batches[2:], clock)
    first_left = _retention(root, read_to + 2 * SMALL_CONFIG.commitlog_file_size)
    assert first_left > read_to
    query = _stream(spark, root, out, checkpoint)
    with pytest.raises(StreamingQueryException) as failed:
        query.awaitTermination(120)
    error = str(failed.value)
    assert f"commit positions [{read_to}, {first_left}) are no longer in the store" in error
    assert "failOnDataLoss" in error
    assert spark.read.parquet(str(out)).count() == 20  # nothing after the loss was delivered
    query = _stream(spark, root, out, checkpoint, failOnDataLoss="false")
    query.awaitTermination(120)
    assert query.exception() is None
    rows = spark.read.parquet(str(out)).select("commit_pos").collect()
    kept = MqstoreReader(parse_options({"path": str(root), "startPos": str(first_left)}))
    left = sum(b.num_rows for p in kept.partitions() for b in kept.read(p))
    assert len(rows) == 20 + left and min(r.commit_pos for r in rows if r.commit_pos >= read_to) == first_left
    assert engine_check(root) == []


def test_a_segment_deleted_between_planning_and_reading_is_named(tmp_path, caplog):
    root = tmp_path / "store"
    write_store(root, message_batches(12, 10), FakeClock(T0_MS))
    failing = MqstoreStreamReader(parse_options({"path": str(root)}))
    skipping = MqstoreStreamReader(parse_options({"path": str(root), "failOnDataLoss": "false"}))
    start, end = failing.initialOffset(), failing.latestOffset()
    parts = failing.partitions(start, end)
    assert len(parts) == 1 and len(parts[0].value) > 2  # small segments packed into one partition
    victim = parts[0].value[1]
    os.unlink(victim.path)
    lost = f"[{victim.base_pos + victim.start}, {victim.base_pos + victim.end})"
    with pytest.raises(DataLossError, match=re.escape(f"commit positions {lost} are no longer")):
        list(failing.read(parts[0]))
    with caplog.at_level(logging.WARNING, logger="mqstore.spark"):
        rows = sum(b.num_rows for b in skipping.read(parts[0]))
    assert f"skipping commit positions {lost}" in caplog.text
    assert 0 < rows < 120


@pytest.mark.slow
def test_available_now_reads_everything_in_limited_batches(spark, tmp_path):
    root, out, checkpoint = tmp_path / "store", tmp_path / "out", tmp_path / "checkpoint"
    write_store(root, message_batches(6, 10), FakeClock(T0_MS))
    query = _stream(spark, root, out, checkpoint, maxRecordsPerTrigger="25")
    query.awaitTermination(120)
    assert query.exception() is None
    assert [p["numInputRows"] for p in query.recentProgress if p["numInputRows"]] == [25, 25, 10]
    assert spark.read.parquet(str(out)).count() == 60


def test_available_now_stops_at_what_was_durable_when_it_started(tmp_path):
    root, clock = tmp_path / "store", FakeClock(T0_MS)
    batches = message_batches(6, 10)
    write_store(root, batches[:3], clock)
    reader = MqstoreStreamReader(parse_options({"path": str(root), "maxBytesPerTrigger": "3000"}))
    reader.prepareForTriggerAvailableNow()
    (store,) = reader.streams.values()
    target = store.target_pos
    write_store(root, batches[3:], clock)  # newer data, durable after the query started
    assert store.durable_pos() > target
    limit = reader.getDefaultReadLimit()
    assert limit == ReadMaxBytes(3000)
    start, rows, steps = reader.initialOffset(), 0, 0
    while (end := reader.latestOffset(start, limit)) != start:
        assert 0 < end["commit_pos"] - start["commit_pos"] <= 3000
        rows += sum(b.num_rows for p in reader.partitions(start, end) for b in reader.read(p))
        start, steps = end, steps + 1
    assert start == {"commit_pos": target} and rows == 30 and steps >= 3  # 8 KiB in steps of <= 3000 bytes


def test_starting_offsets_must_be_a_record_start(tmp_path):
    root = tmp_path / "store"
    write_store(root, message_batches(2, 10), FakeClock(T0_MS))
    second = sorted(engine_records(root))[1]
    assert MqstoreStreamReader(parse_options({"path": str(root), "startingOffsets": str(second)})
                               ).initialOffset() == {"commit_pos": second}
    inside = MqstoreStreamReader(parse_options({"path": str(root), "startingOffsets": str(second + 3)}))
    with pytest.raises(BadInputError, match=f"{second + 3} is not the commit position of a record start"):
        inside.initialOffset()
    past = MqstoreStreamReader(parse_options({"path": str(root), "startingOffsets": str(10**9)}))
    with pytest.raises(BadInputError, match="outside the store's readable commit positions"):
        past.initialOffset()
