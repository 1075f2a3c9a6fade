"""The SQLite peer of `mqstore bench`: real database files in tmp_path, and a real run beside a
started store. Nothing here needs Redis."""

from __future__ import annotations

import json
import sqlite3
import threading
import time

import pytest

from tests.bench.test_runs import SHORT_RUN, _assert_complete, bench
from tools.bench import report, sqlite_peer
from tools.bench.bench_body import BODY_HEADER, BatchBuilder
from tools.bench.cli import bench_parser
from tools.bench.sqlite_peer import SqliteDatabase, SqliteReceiver, SqliteSender
from tools.bench.worker_records import WorkerSpec

STREAMS = (("bench-0", 0), ("bench-0", 1), ("bench-1", 0))
SIZE_BYTES = 48


def spec_of(db: SqliteDatabase, role: str, **fields) -> WorkerSpec:
    return WorkerSpec(role=role, backend="sqlite", worker_id=fields.pop("worker_id", 2), target=db.target,
                      streams=fields.pop("streams", STREAMS), size_bytes=SIZE_BYTES, flush=db.flush,
                      **fields)


def stored_rows(db: SqliteDatabase) -> list[tuple]:
    with sqlite3.connect(db.path) as reader:
        return reader.execute("SELECT topic, queue_id, key, body FROM messages ORDER BY id").fetchall()


@pytest.mark.parametrize("flush, synchronous", [("sync", 2), ("async", 1)])  # FULL, NORMAL
def test_sender_writes_exactly_the_rows_asked_with_durable_settings(tmp_path, flush, synchronous):
    with SqliteDatabase(flush, workdir=str(tmp_path)) as db:
        spec = spec_of(db, "producer", batch=5, keys=True)
        sender = SqliteSender(spec)
        try:
            assert sender.db.execute("PRAGMA journal_mode").fetchone() == ("wal",)
            assert sender.db.execute("PRAGMA synchronous").fetchone() == (synchronous,)
            assert sender.db.execute("PRAGMA busy_timeout").fetchone() == (sqlite_peer.BUSY_TIMEOUT_MS,)
            builder = BatchBuilder(spec, bytes(SIZE_BYTES - BODY_HEADER.size))
            expected = []
            for j in range(3):
                batch = builder.build(j * 5, 1000 + j)
                expected += [(t, q, k, b) for (t, q), k, b in zip(batch.streams, batch.keys, batch.bodies,
                                                                    strict=True)]
                assert sender.result(sender.submit(batch)) == {"OK": 5}
            assert sender.counters() == {"busy_retries": 0}
        finally:
            sender.close()
        assert stored_rows(db) == expected
        assert len({key for _, _, key, _ in expected}) == 15
        with sqlite3.connect(db.path) as reader:
            indexes = {row[1] for row in reader.execute("PRAGMA index_list(messages)")}
        assert indexes == {"messages_key", "messages_queue"}
    assert list(tmp_path.iterdir()) == []  # the run's directory is removed


def test_a_busy_begin_is_retried_and_counted_then_the_batch_commits(tmp_path, monkeypatch):
    monkeypatch.setattr(sqlite_peer, "BUSY_TIMEOUT_MS", 20)  # each BEGIN gives up after 20 ms
    with SqliteDatabase("sync", workdir=str(tmp_path)) as db:
        spec = spec_of(db, "producer", batch=4)
        sender = SqliteSender(spec)
        locked, released = threading.Event(), threading.Event()

        def hold_the_write_lock() -> None:  # another writer, until the sender has retried twice
            blocker = sqlite3.connect(db.path, isolation_level=None)
            blocker.execute("BEGIN IMMEDIATE")
            locked.set()
            deadline = time.monotonic() + 10
            while sender.busy_retries < 2 and time.monotonic() < deadline:
                time.sleep(0.005)
            blocker.execute("COMMIT")
            blocker.close()
            released.set()

        thread = threading.Thread(target=hold_the_write_lock)
        thread.start()
        assert locked.wait(10)
        pending = sender.submit(BatchBuilder(spec, bytes(SIZE_BYTES - BODY_HEADER.size)).build(0, 7))
        thread.join(10)
        sender.close()
        assert released.is_set() and sender.busy_retries >= 2
        assert sender.result(pending) == {"OK": 4}
        assert len(stored_rows(db)) == 4


def test_a_batch_still_busy_after_every_retry_fails_whole_and_writes_nothing(tmp_path, monkeypatch):
    monkeypatch.setattr(sqlite_peer, "BUSY_TIMEOUT_MS", 1)
    with SqliteDatabase("sync", workdir=str(tmp_path)) as db:
        spec = spec_of(db, "producer", batch=3)
        sender = SqliteSender(spec)
        blocker = sqlite3.connect(db.path, isolation_level=None)
        blocker.execute("BEGIN IMMEDIATE")
        try:
            pending = sender.submit(BatchBuilder(spec, bytes(SIZE_BYTES - BODY_HEADER.size)).build(0, 7))
        finally:
            blocker.execute("ROLLBACK")
            blocker.close()
        assert sender.result(pending) == {"SQLITE_BUSY": 3} and pending.done_ns > 0
        assert sender.busy_retries == sqlite_peer.MAX_BUSY_RETRIES
        assert not sender.db.in_transaction
        sender.close()
        assert stored_rows(db) == []


def _send_one_at_a_time(db: SqliteDatabase, first_seq: int, count: int) -> dict[int, tuple[str, int]]:
    """Messages first_seq.. (batch 1, intended time = seq) round robin over STREAMS and one
    stream no receiver reads; returns seq -> stream of the ones in STREAMS."""
    streams = (*STREAMS, ("other", 0))
    spec = spec_of(db, "producer", worker_id=0, batch=1, streams=streams)
    builder, sender, where = BatchBuilder(spec, bytes(SIZE_BYTES - BODY_HEADER.size)), SqliteSender(spec), {}
    try:
        for seq in range(first_seq, first_seq + count):
            batch = builder.build(seq, seq)
            assert sender.result(sender.submit(batch)) == {"OK": 1}
            if batch.streams[0] in STREAMS:
                where[seq] = batch.streams[0]
    finally:
        sender.close()
    return where


def _read_all(receiver: SqliteReceiver) -> list[int]:
    seen: list[int] = []
    while (got := receiver.poll(0.0)).count:
        assert got.count == len(got.intended_ns)  # every row is a bench body
        seen += got.intended_ns.tolist()
    return seen


def test_receiver_reads_each_row_once_in_order_per_queue(tmp_path):
    with SqliteDatabase("sync", workdir=str(tmp_path)) as db:
        where = _send_one_at_a_time(db, 0, 40)
        receiver = SqliteReceiver(spec_of(db, "consumer", consume_from="start", pull_count=3))
        from_end = SqliteReceiver(spec_of(db, "consumer", consume_from="end"))
        try:
            assert receiver.backlog_at_start_msgs == len(where) == 30 and from_end.backlog_at_start_msgs == 0
            seen = _read_all(receiver)
            assert sorted(seen) == sorted(where)  # each once, nothing of the stream it does not read
            for stream in STREAMS:
                in_stream = [s for s in where if where[s] == stream]
                assert [s for s in seen if where[s] == stream] == sorted(in_stream)
            later = _send_one_at_a_time(db, 40, 8)
            assert sorted(_read_all(receiver)) == sorted(later) == sorted(_read_all(from_end))
            began = time.monotonic()
            assert receiver.poll(0.05).count == 0 and time.monotonic() - began >= 0.05  # waited, nothing came
        finally:
            receiver.close()
            from_end.close()


def test_peer_values_parse_and_a_bad_one_is_refused_before_anything_starts(tmp_path, capsys):
    parser = bench_parser("mqstore")
    assert parser.parse_args(["bench", "--start", "--peer", "redis,sqlite"]).peer == ("redis", "sqlite")
    assert parser.parse_args(["bench", "--start", "--peer", "sqlite"]).peer == ("sqlite",)
    assert parser.parse_args(["bench", "--start"]).peer == ()
    for value, message in (("mongo", "'mongo' is not a peer: give one or more of redis, sqlite"),
                           ("redis,", "'' is not a peer"),
                           ("sqlite,sqlite", "peer sqlite given twice in 'sqlite,sqlite'")):
        with pytest.raises(SystemExit) as exit_info:
            parser.parse_args(["bench", "--start", "--workdir", str(tmp_path), "--peer", value])
        assert exit_info.value.code == 2
        assert message in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []


@pytest.mark.slow
def test_peer_sqlite_runs_side_by_side_with_ratios(tmp_path):
    result = bench("--start", "--workdir", str(tmp_path), *SHORT_RUN, "--producers", "2", "--seconds", "1",
                   "--peer", "sqlite", "--json", str(tmp_path / "r.json"))
    assert result.returncode == 0, result.stdout + result.stderr
    doc = json.loads((tmp_path / "r.json").read_text())
    assert report.check_document(doc) == []
    _assert_complete(doc, "mqstore", [1.0])
    run = _assert_complete(doc, "sqlite", [1.0])
    assert run["peer_setting"] == "WAL, synchronous FULL" and set(run["peer_counters"]) == {"busy_retries"}
    workers = {"bench-worker-0", "bench-worker-1", "bench-worker-2"}  # the CPU of every process of it
    assert workers <= set(run["store"]["cpu"]["pct_of_one_core"])
    ratios = doc["ratios"]["sqlite"]
    assert ratios["pub_msgs_per_s"] == round(doc["runs"]["mqstore"]["summary"]["pub_msgs_per_s"]
                                             / run["summary"]["pub_msgs_per_s"], 3)
    assert "sqlite summary: 1 s measured" in result.stdout
    assert "mqstore vs sqlite (WAL, synchronous FULL), same run:" in result.stdout
    assert "  counters  busy_retries " in result.stdout
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r.json"]  # store and database removed


@pytest.mark.slow
def test_peer_redis_and_sqlite_run_one_after_the_other_with_ratios_for_each(tmp_path):
    # `make test` installs redis-server and the redis package (Makefile: os-packages, [redis])
    result = bench("--start", "--workdir", str(tmp_path), *SHORT_RUN, "--seconds", "1",
                   "--peer", "redis,sqlite", "--json", str(tmp_path / "r.json"))
    assert result.returncode == 0, result.stdout + result.stderr
    doc = json.loads((tmp_path / "r.json").read_text())
    assert report.check_document(doc) == [] and list(doc["runs"]) == ["mqstore", "redis", "sqlite"]
    for name in ("redis", "sqlite"):
        run = _assert_complete(doc, name, [1.0])
        assert doc["ratios"][name]["pub_msgs_per_s"] == round(
            doc["runs"]["mqstore"]["summary"]["pub_msgs_per_s"] / run["summary"]["pub_msgs_per_s"], 3)
    assert result.stdout.index("mqstore vs redis (appendfsync always)") < result.stdout.index(
        "mqstore vs sqlite (WAL, synchronous FULL)")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r.json"]
