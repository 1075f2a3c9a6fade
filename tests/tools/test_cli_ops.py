"""The operator commands against a real store: topics, groups, lag, status --watch, check's
progress, --log-level, and the Prometheus exporter scraped over real HTTP (issue 22)."""

from __future__ import annotations

import json
import queue
import signal
import subprocess
import sys
import threading
import urllib.request
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from engine.formats.cq_entry import CQ_ENTRY_SIZE
from ipc.consumer import Consumer
from ipc.producer import Producer
from tests.helpers import snapshot
from tests.workers.store_harness import assert_check_clean, checked_store, cli, start_store, wait_for
from workers.child_env import REPO_ROOT, child_env

SENT = {("Orders", 0): 6, ("Orders", 1): 2, ("Audit", 3): 3}
COMMITTED = {("Orders", 0): 4}  # group billing; Orders/1 never committed
EXIT_BAD_INPUT = 2


def produce(root: Path) -> dict[tuple[str, int], list]:
    """Send SENT through the real Producer; the records per queue as a consumer reads them."""
    with Producer(root) as producer:
        for (topic, queue_id), count in SENT.items():
            for i in range(count):
                assert producer.send(topic, f"{topic}-{i}".encode() * (i + 1), queue_id=queue_id).ok
    wait_for(lambda: _dispatched_all(root), "the messages to be dispatched")
    with Consumer(root, "reader") as consumer:
        return {key: consumer.pull(*key, 0, max_count=32).messages for key in SENT}


def _dispatched_all(root: Path) -> bool:
    from ipc.control_block import ControlBlock

    with ControlBlock.attach(root) as ctl:
        p = ctl.snapshot()
    return p.dispatched_pos == p.written_pos and p.dispatched_msgs >= sum(SENT.values())


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    running = start_store(tmp_path_factory.mktemp("ops") / "store")
    running.records = produce(running.root)
    with Consumer(running.root, "billing") as consumer:
        for (topic, queue_id), offset in COMMITTED.items():
            consumer.commit(topic, queue_id, offset)
    running.wait_caught_up()
    yield running
    if running.running:
        assert running.stop() == 0
    assert_check_clean(running.root)


def ok_json(*args: str):
    result = cli(*args, "--json")
    assert result.returncode == 0, result.stderr.decode()
    return json.loads(result.stdout)


def ok_text(*args: str) -> list[list[str]]:
    result = cli(*args)
    assert result.returncode == 0, result.stderr.decode()
    return [line.split() for line in result.stdout.decode().splitlines()]


# ---------------------------------------------------------------------------------- tables
@pytest.mark.slow
def test_topics_text_and_json_show_what_was_produced(store):
    rows = ok_json("topics", "--store", str(store.root))
    got = {(r["topic"], r["queue_id"]): r for r in rows}
    assert set(got) == set(SENT)
    for key, records in store.records.items():
        row = got[key]
        assert (row["min_offset"], row["max_offset"], row["messages"]) == (0, SENT[key], SENT[key])
        assert row["stored_bytes"] == sum(r.total_size for r in records)
        assert row["cq_used_bytes"] == SENT[key] * CQ_ENTRY_SIZE  # the queue's files from offset 0
        assert row["cq_used_bytes"] <= row["cq_allocated_bytes"] <= 64 << 10  # a first reserve step
        assert (row["oldest_store_time_ms"], row["newest_store_time_ms"]) == (
            records[0].store_ts_ms, records[-1].store_ts_ms)
    table = ok_text("topics", "--store", str(store.root))
    assert table[0][:5] == ["topic", "queue", "min", "offset", "max"]
    assert [(line[0], int(line[1]), int(line[3]), int(line[4])) for line in table[1:]] == sorted(
        (topic, qid, count, count) for (topic, qid), count in SENT.items())


@pytest.mark.slow
def test_groups_and_lag_text_and_json_follow_the_commits(store):
    groups = ok_json("groups", "--store", str(store.root))
    assert [(g["group"], g["queue_count"]) for g in groups] == [("billing", 1)]
    assert [(c["topic"], c["queue_id"], c["committed_offset"]) for c in groups[0]["committed"]] == [
        ("Orders", 0, 4)]
    lag = ok_json("lag", "--store", str(store.root), "--group", "billing")
    assert [(r["topic"], r["queue_id"], r["committed_offset"], r["max_offset"], r["lag_messages"])
            for r in lag] == [("Orders", 0, 4, 6, 2), ("Orders", 1, None, 2, 2)]
    assert all(r["lag_ms"] > 0 for r in lag)
    assert lag[0]["last_commit_time_ms"] == groups[0]["committed"][0]["commit_time_ms"]
    text = ok_text("lag", "--store", str(store.root))
    assert [line[:6] for line in text[1:]] == [["billing", "Orders", "0", "4", "6", "2"],
                                               ["billing", "Orders", "1", "-", "2", "2"]]
    assert ok_text("groups", "--store", str(store.root))[1][:4] == ["billing", "Orders", "0", "4"]


@pytest.mark.slow
@pytest.mark.parametrize("args, words", [
    (("lag", "--group", "nobody"), "'nobody' has committed no offset"),
    (("lag", "--group", "no/slash"), "invalid group"),
    (("topics", "--log-level", "LOUD"), "invalid choice"),
])
def test_bad_input_exits_2_with_one_line_and_changes_nothing(store, args, words):
    before = snapshot(store.root / "config")
    result = cli(*args, "--store", str(store.root))
    assert result.returncode == EXIT_BAD_INPUT, result.stderr.decode()
    assert words in result.stderr.decode() and "Traceback" not in result.stderr.decode()
    assert snapshot(store.root / "config") == before


@pytest.mark.parametrize("command", ["topics", "groups", "lag"])
def test_not_a_store_exits_2_and_changes_nothing(tmp_path, command):
    (tmp_path / "notes.txt").write_text("mine")
    before = snapshot(tmp_path)
    for store_dir in (tmp_path, tmp_path / "missing"):
        result = cli(command, "--store", str(store_dir))
        assert result.returncode == EXIT_BAD_INPUT
        assert result.stderr.decode().startswith("mqstore: error:"), result.stderr.decode()
    assert snapshot(tmp_path) == before


# ---------------------------------------------------------------------------------- exporter
class Lines:
    """A child's stdout, line by line, read by a thread so the test can poll with a deadline."""

    def __init__(self, proc: subprocess.Popen):
        self.proc = proc
        self.lines: queue.Queue[str] = queue.Queue()
        self.seen: list[str] = []
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for raw in self.proc.stdout:
            self.lines.put(raw.decode(errors="replace"))

    def wait_for(self, predicate, what: str) -> list[str]:
        def found():
            while not self.lines.empty():
                self.seen.append(self.lines.get())
            return predicate(self.seen)

        wait_for(found, what)
        return self.seen


def spawn_cli(*args: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "tools.cli", *args], cwd=REPO_ROOT,
                            env=child_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def scrape(root: Path) -> tuple[dict, subprocess.Popen]:
    """Start an exporter on a free loopback port, scrape it once, stop it with SIGTERM."""
    proc = spawn_cli("exporter", "--store", str(root), "--listen", "127.0.0.1:0")
    try:
        out = Lines(proc)
        [line] = out.wait_for(lambda seen: seen, "the exporter to listen")
        url = line.split()[3]
        assert url.startswith("http://127.0.0.1:") and url.endswith("/metrics"), line
        with urllib.request.urlopen(url, timeout=30) as response:
            assert response.status == 200
            text = response.read().decode()
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0, proc.stderr.read().decode()
    samples = {}
    for family in text_string_to_metric_families(text):
        assert family.documentation, family.name  # every metric has HELP text
        for sample in family.samples:
            samples[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return samples, proc


def value(samples: dict, name: str, **labels) -> float:
    return samples[(name, tuple(sorted(labels.items())))]


@pytest.mark.slow
def test_exporter_scraped_over_http_matches_the_store(store):
    positions = store.positions()
    samples, _ = scrape(store.root)
    assert value(samples, "mqstore_up") == 1
    assert value(samples, "mqstore_put_messages_total") == positions.appended_msgs == sum(SENT.values())
    assert value(samples, "mqstore_dispatched_messages_total") == positions.dispatched_msgs
    assert value(samples, "mqstore_flushes_total") == positions.flush_count
    for stage, pos in (("written", positions.written_pos), ("flushed", positions.flushed_pos),
                       ("dispatched", positions.dispatched_pos)):
        assert value(samples, "mqstore_position_bytes", stage=stage) == pos
    assert value(samples, "mqstore_lag_bytes", stage="dispatch") == 0
    for (topic, qid), records in store.records.items():
        labels = {"topic": topic, "queue": str(qid)}
        assert value(samples, "mqstore_queue_messages", **labels) == SENT[(topic, qid)]
        assert value(samples, "mqstore_queue_stored_bytes", **labels) == sum(r.total_size for r in records)
        assert value(samples, "mqstore_queue_used_bytes", **labels) == SENT[(topic, qid)] * CQ_ENTRY_SIZE
        assert 0 < value(samples, "mqstore_queue_allocated_bytes", **labels) <= 64 << 10
    billing = {"group": "billing", "topic": "Orders"}
    assert value(samples, "mqstore_group_committed_offset", queue="0", **billing) == 4
    assert value(samples, "mqstore_group_lag_messages", queue="0", **billing) == 2
    assert value(samples, "mqstore_group_lag_messages", queue="1", **billing) == 2
    assert value(samples, "mqstore_group_lag_seconds", queue="0", **billing) > 0
    oldest_ms = min(r[0].store_ts_ms for r in store.records.values())
    assert value(samples, "mqstore_oldest_message_timestamp_seconds") == oldest_ms / 1000
    for role, shard in (("supervisor", "0"), ("dispatcher", "0"), ("index_builder", "1")):
        assert value(samples, "mqstore_process_up", role=role, shard=shard) == 1
        assert value(samples, "mqstore_process_restarts_total", role=role, shard=shard) == 0
        assert value(samples, "mqstore_process_resident_memory_bytes", role=role, shard=shard) > 0
    for part in ("commitlog", "consumequeue", "index"):
        assert 0 < value(samples, "mqstore_disk_used_bytes", part=part) \
            <= value(samples, "mqstore_disk_allocated_bytes", part=part)
    queue_bytes = sum(SENT.values()) * CQ_ENTRY_SIZE
    assert value(samples, "mqstore_disk_used_bytes", part="consumequeue") == queue_bytes
    assert all(value(samples, "mqstore_scrape_error", part=part) == 0
               for part in ("status", "disk", "queues", "groups"))


@pytest.mark.slow
def test_exporter_of_a_stopped_store_serves_its_files_and_up_0(tmp_path):
    with checked_store(tmp_path / "store") as running:
        records = produce(running.root)
    before = snapshot(running.root)
    samples, _ = scrape(running.root)
    assert snapshot(running.root) == before
    assert value(samples, "mqstore_up") == 0
    assert ("mqstore_put_messages_total", ()) not in samples
    for (topic, qid), recs in records.items():
        assert value(samples, "mqstore_queue_max_offset", topic=topic, queue=str(qid)) == len(recs)


@pytest.mark.parametrize("listen, words", [
    ("nonsense", "is not HOST:PORT"),
    ("127.0.0.1:70000", "port in 0..65535"),
    ("::1:9460", "IPv6 address in brackets"),
    ("0.0.0.0:0", "needs --allow-remote"),
])
def test_exporter_refuses_a_bad_or_remote_listen_address(tmp_path, listen, words):
    (tmp_path / "store").mkdir()
    before = snapshot(tmp_path)
    result = cli("exporter", "--store", str(tmp_path / "store"), "--listen", listen, timeout=30)
    assert result.returncode == EXIT_BAD_INPUT, result.stderr.decode()
    assert words in result.stderr.decode() and "Traceback" not in result.stderr.decode()
    assert snapshot(tmp_path) == before


def test_exporter_refuses_a_directory_that_is_not_a_store(tmp_path):
    (tmp_path / "notes.txt").write_text("mine")
    result = cli("exporter", "--store", str(tmp_path), "--listen", "127.0.0.1:0", timeout=30)
    assert result.returncode == EXIT_BAD_INPUT
    assert "neither empty nor a store" in result.stderr.decode()


# ---------------------------------------------------------------------------------- status --watch
@pytest.mark.slow
def test_status_watch_redraws_until_ctrl_c(store):
    proc = spawn_cli("status", "--store", str(store.root), "--watch")
    try:
        out = Lines(proc)
        seen = out.wait_for(lambda s: sum(line.startswith("--- ") for line in s) >= 3, "three frames")
    finally:
        proc.send_signal(signal.SIGINT)
        assert proc.wait(30) == 0
    text = "".join(seen)
    assert text.count("READY (supervisor pid") >= 2 and "\x1b[" not in text  # a pipe: no clearing
    assert "dispatcher" in text and "append" in text


@pytest.mark.slow
def test_status_watch_json_prints_one_object_per_refresh(store):
    proc = spawn_cli("status", "--store", str(store.root), "--watch", "--json")
    try:
        seen = Lines(proc).wait_for(lambda s: len(s) >= 2, "two JSON lines")
    finally:
        proc.send_signal(signal.SIGINT)
        assert proc.wait(30) == 0
    frames = [json.loads(line) for line in seen[:2]]
    assert all(f["running"] and f["totals"]["appended_msgs"] == sum(SENT.values()) for f in frames)
    retention = frames[-1]["retention"]
    assert retention["bytes_used"]["consumequeue"] == sum(SENT.values()) * CQ_ENTRY_SIZE
    assert all(0 < retention["bytes_used"][part] <= retention["bytes_allocated"][part]
               for part in ("commitlog", "consumequeue", "index"))


# ---------------------------------------------------------------------------------- check, log level
@pytest.mark.slow
def test_check_reports_progress_on_stderr_and_keeps_stdout(tmp_path):
    with checked_store(tmp_path / "store") as running:
        produce(running.root)
    result = cli("check", "--store", str(running.root))
    assert result.returncode == 0 and result.stdout.decode() == "store is consistent\n"
    progress = result.stderr.decode().splitlines()
    assert progress and progress[-1].startswith("  checked ") and progress[-1].endswith(" MiB")
    checked, _, total = progress[-1].split()[1:4]
    assert checked == total  # the last line says the whole log was checked
    as_json = cli("check", "--store", str(running.root), "--json")
    assert as_json.returncode == 0 and as_json.stderr == b""
    assert json.loads(as_json.stdout) == {"findings": [], "pending_records": 0, "pending": []}


@pytest.mark.slow
def test_log_level_reaches_the_supervisor_and_its_children(tmp_path):
    root = tmp_path / "store"
    for level in ("INFO", "WARNING"):
        started = cli("start", "--store", str(root), "--detach", "--log-level", level)
        assert started.returncode == 0, started.stderr.decode()
        assert cli("stop", "--store", str(root)).returncode == 0
        log = (root / "mqstore.log").read_text()
        info = [line for line in log.splitlines() if " INFO " in line]
        if level == "INFO":
            roles = {role for line in info for role in ("supervisor[", "dispatcher[") if role in line}
            assert roles == {"supervisor[", "dispatcher["}, info[:3]
            (root / "mqstore.log").write_text("")
        else:
            assert info == [], info[:3]
    assert_check_clean(root)


def test_every_command_takes_log_level():
    from tools.cli import DELEGATED, build_parser

    subparsers = next(a for a in build_parser()._actions if a.dest == "command")
    for name, parser in subparsers.choices.items():
        if name not in DELEGATED:
            assert any("--log-level" in a.option_strings for a in parser._actions), name
    for name in DELEGATED:
        result = cli(name, "--log-level", "INFO", "--help", timeout=60)
        assert result.returncode == 0 and b"unrecognized" not in result.stderr, (name, result.stderr)


@pytest.mark.slow
def test_tables_and_scrapes_under_load_only_grow_and_end_at_what_was_sent(tmp_path):
    from tests.workers.store_harness import PRODUCER_SCRIPT, spawn_python

    count = 4000
    with checked_store(tmp_path / "store") as running:
        root = str(running.root)
        producer = spawn_python(PRODUCER_SCRIPT, root, "load", str(count), "20", "Load")
        acks_out = Lines(producer)  # drained by a thread: a full pipe would stall the producer
        exporter = spawn_cli("exporter", "--store", root, "--listen", "127.0.0.1:0")
        try:
            [line] = Lines(exporter).wait_for(lambda seen: seen, "the exporter to listen")
            url = line.split()[3]
            seen_max: dict[int, int] = {}
            puts = []
            while producer.poll() is None or len(puts) < 2:
                for row in ok_json("topics", "--store", root):
                    assert row["max_offset"] >= seen_max.get(row["queue_id"], 0), row
                    seen_max[row["queue_id"]] = row["max_offset"]
                with urllib.request.urlopen(url, timeout=30) as response:
                    text = response.read().decode()
                samples = {s.name: s.value for f in text_string_to_metric_families(text)
                           for s in f.samples if not s.labels}
                assert samples["mqstore_up"] == 1
                puts.append(samples["mqstore_put_messages_total"])
            assert producer.wait(60) == 0, producer.stderr.read().decode()
        finally:
            if producer.poll() is None:
                producer.kill()
            exporter.send_signal(signal.SIGTERM)
            assert exporter.wait(30) == 0
        acks = [json.loads(line) for line in acks_out.wait_for(lambda s: len(s) >= count, "every ack")]
        assert puts == sorted(puts) and puts[-1] > 0
        assert len(acks) == count and all(a[1] == "PUT_OK" for a in acks)
        running.wait_caught_up()
        final = {r["queue_id"]: r["messages"] for r in ok_json("topics", "--store", root)}
        per_queue: dict[int, int] = {}
        for ack in acks:
            per_queue[ack[2]] = per_queue.get(ack[2], 0) + 1
        assert final == per_queue


@pytest.mark.slow
def test_put_results_by_status_match_what_a_hostile_client_was_answered(tmp_path):
    with checked_store(tmp_path / "store") as running:
        hostile = subprocess.run(
            [sys.executable, "-m", "tools.torture.hostile", "--store", str(running.root), "--seed", "7",
             "--requests", "60", "--acks", str(tmp_path / "acks.jsonl")],
            cwd=REPO_ROOT, env=child_env(), capture_output=True, timeout=120)
        assert hostile.returncode == 0, hostile.stderr.decode()
        answered = json.loads(hostile.stdout.decode().splitlines()[-1])["counts"]
        assert answered["MESSAGE_ILLEGAL"] > 0 and answered["PUT_OK"] > 0
        samples, _ = scrape(running.root)
        status = ok_json("status", "--store", str(running.root))
    for name in ("PUT_OK", "MESSAGE_ILLEGAL", "DISK_FULL", "UNKNOWN_ERROR"):
        assert value(samples, "mqstore_put_results_total", status=name) == answered.get(name, 0), name
        assert status["put_statuses"][name] == answered.get(name, 0), name


def test_status_watch_of_a_directory_that_is_not_a_store_exits_2_at_once(tmp_path):
    (tmp_path / "notes.txt").write_text("mine")
    result = cli("status", "--store", str(tmp_path), "--watch", timeout=30)
    assert result.returncode == EXIT_BAD_INPUT and result.stdout == b""
    assert "neither empty nor a store" in result.stderr.decode()


@pytest.mark.parametrize("argv", [("bench", "--log-level", "LOUD"), ("spark", "--log-level=LOUD")])
def test_a_delegated_command_refuses_a_bad_log_level(argv):
    result = cli(*argv, timeout=60)
    assert result.returncode == EXIT_BAD_INPUT
    assert result.stderr.decode().splitlines() == [
        "mqstore: error: --log-level 'LOUD' is not one of DEBUG, INFO, WARNING, ERROR, CRITICAL"]


@pytest.mark.slow
@pytest.mark.parametrize("flush", ["sync", "async"])  # answered by the flush, or on append
def test_put_latency_histogram_counts_every_answered_request_scraped_over_http(tmp_path, flush):
    from tests.workers.store_harness import PRODUCER_SCRIPT, read_acks, spawn_python

    per_producer = 100  # one message per send: one request, one answer each
    with checked_store(tmp_path / "store", store={"flush": flush}) as running:
        root = str(running.root)
        producers = [spawn_python(PRODUCER_SCRIPT, root, tag, str(per_producer), "1", "Latency")
                     for tag in ("a", "b")]  # two at once, so one flush answers several requests
        acks = []
        for producer in producers:
            out, err = producer.communicate(timeout=300)
            assert producer.returncode == 0, err.decode()
            acks += read_acks(out)
        samples, _ = scrape(running.root)
        status = ok_json("status", "--store", root)
    assert len(acks) == 2 * per_producer and all(ack[1] == "PUT_OK" for ack in acks)
    name = "mqstore_put_latency_seconds"
    assert value(samples, f"{name}_count") == len(acks) == status["put_latency"]["count"]
    buckets = sorted((float(dict(labels)["le"]), n) for (sample, labels), n in samples.items()
                     if sample == f"{name}_bucket")
    assert len(buckets) == 16 and buckets[-1] == (float("inf"), len(acks))
    assert [n for _, n in buckets] == sorted(n for _, n in buckets)  # cumulative
    assert 0 < value(samples, f"{name}_sum") < len(acks) * 2.0
    latency = status["put_latency"]
    assert 0 < latency["p50_ms"] <= latency["p99_ms"] < 2000  # generous: 2 shared cores
    assert [row["count"] for row in latency["buckets"]] == [n for _, n in buckets[:-1]]


@pytest.mark.slow
def test_check_progress_totals_the_written_bytes_not_the_segment_size(tmp_path):
    from engine.check.fsck import check_summary

    segment_bytes = 64 << 20  # a tiny store in a big, sparse segment
    with checked_store(tmp_path / "store", store={"commitlog_file_size": segment_bytes}) as running:
        produce(running.root)
    calls = []
    summary = check_summary(running.root, progress=lambda done, total: calls.append((done, total)))
    written = summary.end_pos - summary.min_pos
    assert 0 < written < 1 << 20 and summary.findings == ()
    assert calls[-1] == (written, written) and all(total == written for _, total in calls)
    result = cli("check", "--store", str(running.root))
    assert result.returncode == 0, result.stderr.decode()
    mib = f"{written / 2**20:.1f}"
    assert result.stderr.decode().splitlines()[-1] == f"  checked {mib} of {mib} MiB"


SLOW_FSYNC_MS = 300


def slow_fsync_puts(root: Path, count: int, timeout_ms: int) -> tuple[list[str], dict]:
    """`count` puts one by one into a store whose every fsync takes 300 ms more; their answers
    and the store's put latency from `status --json`."""
    from tests.workers.store_harness import PRODUCER_SCRIPT, read_acks, run_python

    with checked_store(root, store={"sync_flush_timeout_ms": timeout_ms},
                       env={"MQSTORE_FAULT_FSYNC_DELAY_MS": str(SLOW_FSYNC_MS)}) as running:
        sent = run_python(PRODUCER_SCRIPT, str(running.root), "slow", str(count), "1", "Slow",
                          timeout=120)
        assert sent.returncode == 0, sent.stderr.decode()
        status = ok_json("status", "--store", str(running.root))
    return [ack[1] for ack in read_acks(sent.stdout)], status["put_latency"]


@pytest.mark.slow
def test_put_latency_runs_from_pickup_to_the_answer_after_the_fsync(tmp_path):
    answers, latency = slow_fsync_puts(tmp_path / "store", 8, timeout_ms=5000)
    assert answers == ["PUT_OK"] * 8 and latency["count"] == 8
    assert next(row["count"] for row in latency["buckets"] if row["le_s"] == 0.2) == 0
    assert latency["sum_s"] >= 8 * SLOW_FSYNC_MS / 1000 and latency["p50_ms"] > 200


@pytest.mark.slow
def test_put_latency_counts_the_answers_given_at_the_flush_deadline(tmp_path):
    timeout_ms = 100  # well before the slowed fsync ends: answered FLUSH_DISK_TIMEOUT then
    answers, latency = slow_fsync_puts(tmp_path / "store", 8, timeout_ms=timeout_ms)
    timeouts = answers.count("FLUSH_DISK_TIMEOUT")
    assert timeouts > 0 and set(answers) <= {"PUT_OK", "FLUSH_DISK_TIMEOUT"}
    assert latency["count"] == len(answers) == 8
    assert latency["sum_s"] >= timeouts * timeout_ms / 1000
