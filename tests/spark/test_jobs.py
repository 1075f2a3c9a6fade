"""The Spark jobs: rebuild (byte-identical), check (finds planted damage), stats, export, CLI."""

from __future__ import annotations

import argparse
import base64
import functools
import json
import shutil
import struct
from collections import Counter
from datetime import UTC, datetime
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from engine.check.findings import FindingKind
from engine.check.fsck import check as engine_check
from engine.dispatch.record import index_keys
from engine.errors import BadInputError
from engine.formats.cq_entry import CQ_ENTRY_SIZE
from engine.formats.record import BODY_OFFSET
from engine.store import MessageStore
from tests.spark.stores import SMALL_CONFIG, T0_MS, FakeClock, message_batches, write_store
from tools.spark import jobs
from tools.spark.cli import _run_job, add_spark_parser

pytestmark = pytest.mark.slow  # Spark jobs


def file_bytes(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def test_rebuild_writes_what_the_dispatcher_wrote(spark, store_dir, records, tmp_path):
    copy = tmp_path / "copy"
    copy.mkdir()
    shutil.copytree(store_dir / "commitlog", copy / "commitlog")
    shutil.copy(store_dir / "store.json", copy / "store.json")
    report = jobs.rebuild(spark, copy)
    original = file_bytes(store_dir / "consumequeue")
    assert len(original) > 12  # several queues, rolled files
    assert file_bytes(copy / "consumequeue") == original
    for shard in range(2):
        old = sorted((store_dir / "index" / str(shard)).iterdir())
        new = sorted((copy / "index" / str(shard)).iterdir())
        assert len(old) > 1 and [p.read_bytes() for p in new] == [p.read_bytes() for p in old]
    assert report.queues == 12 and report.cq_entries == len(records)
    assert sum(report.index_keys.values()) == sum(len(index_keys(r)) for r in records.values())
    assert not (copy / ".rebuild").exists()
    with MessageStore.open(copy, SMALL_CONFIG) as store:  # opens cleanly: nothing to redo
        done = store.recovery_report
        assert done.records_scanned <= 1  # recovery re-verifies the last record only
        assert done.cq_entries_redispatched == done.index_keys_redispatched == 0
        assert len(store.query_by_key("orders", "g3")) > 0


def _flip(path: Path, pos: int, mask: int = 0x40) -> None:
    with open(path, "r+b") as f:
        f.seek(pos)
        byte = f.read(1)[0]
        f.seek(pos)
        f.write(bytes([byte ^ mask]))


def test_check_finds_a_bad_record_a_bad_entry_and_a_missing_index_file(spark, store_dir, records, tmp_path):
    copy = tmp_path / "damaged"
    shutil.copytree(store_dir, copy)
    victim = sorted(records)[3]
    _flip(copy / "commitlog" / f"{0:020d}", victim + BODY_OFFSET)
    queue_file = sorted((copy / "consumequeue" / "payments" / "1").iterdir())[0]
    with open(queue_file, "r+b") as f:  # entry 2: size field + 1
        f.seek(2 * CQ_ENTRY_SIZE + 8)
        size = struct.unpack(">i", f.read(4))[0]
        f.seek(2 * CQ_ENTRY_SIZE + 8)
        f.write(struct.pack(">i", size + 1))
    sorted((copy / "index" / "1").iterdir())[0].unlink()
    report = jobs.check(spark, copy)
    kinds = Counter(f.kind for f in report.findings)
    assert [f.pos for f in report.findings if f.kind is FindingKind.CORRUPT_RECORD] == [victim]
    assert kinds[FindingKind.CQ_ENTRY_MISMATCH] == 1  # the edited entry; the corrupt record's is sound
    assert kinds[FindingKind.INDEX_KEY_MISSING] > 0
    assert report.records == len(records)  # the bad one included: its structure holds


def test_one_bad_record_is_one_finding_as_in_the_engine_check(spark, store_dir, records, tmp_path):
    copy = tmp_path / "one-bad"
    shutil.copytree(store_dir, copy)
    victim = next(p for p in sorted(records) if records[p].keys)  # it has an entry and index keys
    _flip(copy / "commitlog" / f"{0:020d}", victim + BODY_OFFSET)
    found = [(f.kind, f.pos) for f in jobs.check(spark, copy).findings]
    assert found == [(FindingKind.CORRUPT_RECORD, victim)]
    assert [(f.kind, f.pos) for f in engine_check(copy)] == found


def test_check_cli_reports_a_clean_store_as_json(spark, store_dir, capsys):
    parser = argparse.ArgumentParser(prog="mqstore")
    add_spark_parser(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["spark", "check", "--store", str(store_dir), "--json"])
    assert args.master is None  # spark_session then uses spark.master if configured, else local[*]
    assert _run_job(jobs, spark, args, str(store_dir)) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["ok"] and out["findings"] == [] and out["records"] == 288
    assert engine_check(store_dir) == []  # the single-process fsck agrees
    assert out["cq_entries"] == 288 and out["index_entries"] > 288


def test_stats_match_the_records(spark, store_dir, records, tmp_path):
    report = jobs.stats(spark, store_dir, plot_path=tmp_path / "stats.png")
    recs = list(records.values())
    assert report.records == len(recs) and report.bytes == sum(r.total_size for r in recs)
    by_queue = Counter((r.topic, r.queue_id) for r in recs)
    assert {(q["topic"], q["queue_id"]): q["messages"] for q in report.queues} == by_queue
    for t in report.topics:
        mine = [r for r in recs if r.topic == t["topic"]]
        assert t["bytes"] == sum(r.total_size for r in mine)
        assert t["distinct_keys"] == len({k for r in mine for k in r.keys})
    minutes = Counter((r.topic, r.store_ts_ms // 60_000) for r in recs)
    got = {(m["topic"], int(datetime.fromisoformat(m["minute"]).replace(tzinfo=UTC).timestamp()) // 60):
           m["messages"] for m in report.per_minute}
    assert got == minutes
    sizes = Counter(r.total_size.bit_length() - 1 for r in recs)
    assert {h["log2"]: h["count"] for h in report.size_histogram} == sizes
    assert (tmp_path / "stats.png").stat().st_size > 1000


def test_export_writes_parquet_by_topic_and_date(spark, store_dir, records, tmp_path):
    out = tmp_path / "export"
    result = jobs.export(spark, store_dir, out)
    assert result.rows == len(records)
    dates = {(r.topic, datetime.fromtimestamp(r.store_ts_ms / 1000, UTC).date().isoformat())
             for r in records.values()}
    assert len({d for _, d in dates}) == 2  # the fake clock jumps a day
    assert result.partitions == sorted(f"topic={t}/date={d}" for t, d in dates)
    back = spark.read.parquet(str(out))
    assert back.count() == len(records)
    assert {r.commit_pos for r in back.select("commit_pos").collect()} == set(records)
    part = next(out.rglob("*.parquet"))
    assert pq.read_schema(part).field("store_ts").type == pa.timestamp("us", tz="UTC")  # not INT96


def test_a_second_append_reports_what_it_wrote(spark, store_dir, records, tmp_path):
    out = tmp_path / "export"
    assert jobs.export(spark, store_dir, out, options={"topics": "orders"}).rows == 96
    again = jobs.export(spark, store_dir, out, mode=jobs.ExportMode.APPEND)
    assert again.rows == len(records)  # what this run wrote, not what the directory holds
    assert spark.read.parquet(str(out)).count() == 96 + len(records)


def _export_count(spark, out) -> Counter:
    return Counter(r.commit_pos for r in spark.read.parquet(str(out)).select("commit_pos").collect())


def test_incremental_export_resumes_and_a_rerun_writes_nothing_twice(spark, tmp_path):
    root, out, clock = tmp_path / "store", tmp_path / "export", FakeClock(T0_MS)
    batches = message_batches(6, 10)
    write_store(root, batches[:3], clock)
    incremental = functools.partial(jobs.export, spark, root, out, mode=jobs.ExportMode.INCREMENTAL)
    first = incremental()
    assert (first.rows, first.start_pos) == (30, 0)
    assert incremental().rows == 0
    write_store(root, batches[3:], clock)
    ledger = (out / "_mqstore_export.json").read_bytes()
    assert incremental().rows == 30
    (out / "_mqstore_export.json").write_bytes(ledger)  # as if that run died before its ledger
    redo = incremental()
    assert (redo.rows, redo.start_pos) == (30, first.end_pos)
    counts = _export_count(spark, out)
    assert len(counts) == 60 and set(counts.values()) == {1}
    with pytest.raises(BadInputError, match="was written with options"):
        incremental(options={"topics": "orders"})


def test_csv_export_flattens_keys_properties_and_body(spark, store_dir, records, tmp_path):
    out = tmp_path / "csv"
    result = jobs.export(spark, store_dir, out, fmt="csv", options={"topics": "audit"})
    assert result.rows == sum(r.topic == "audit" for r in records.values())
    rows = spark.read.option("header", "true").csv(str(out)).collect()
    for row in rows:
        rec = records[int(row.commit_pos)]
        assert base64.b64decode(row.body) == rec.body
        assert (row.keys or "") == " ".join(rec.keys)
        assert json.loads(row.properties) == rec.properties


def test_an_unknown_export_format_is_refused(store_dir, tmp_path):
    with pytest.raises(BadInputError, match="invalid format: 'avro' is not one of parquet, json, orc, csv"):
        jobs.export(None, store_dir, tmp_path / "out", fmt="avro")
    assert not (tmp_path / "out").exists()
