"""The `mqstore` command line end to end (real processes), and its bad-input contract."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys

import pytest

from engine.config import StoreConfig
from engine.files.store_dir import create_store_dir, holder_pid
from tests.conftest import ROCKETMQ_SAMPLES
from tests.helpers import snapshot
from tests.workers.store_harness import (
    SMALL_STORE,
    assert_check_clean,
    cli,
    start_store,
    wait_for,
    write_config,
)
from workers.child_env import REPO_ROOT, child_env


def out(result: subprocess.CompletedProcess) -> str:
    return result.stdout.decode()


def err(result: subprocess.CompletedProcess) -> str:
    return result.stderr.decode()


def assert_one_line_error(result, code: int, words: str) -> None:
    assert result.returncode == code, (result.returncode, err(result))
    text = err(result)
    assert words in text, text
    assert "Traceback" not in text
    assert len([line for line in text.splitlines() if line.startswith("mqstore: error")]) == 1


@pytest.mark.slow
def test_end_to_end_detach_send_consume_query_status_stop(tmp_path):
    store = tmp_path / "store"
    config = write_config(tmp_path / "small.toml")
    started = cli("start", "--store", str(store), "--config", str(config), "--detach")
    assert started.returncode == 0, err(started)
    pid = int(out(started).strip())
    assert holder_pid(store) == pid
    # a new store: nothing was recovered, so no "recovery after clean shutdown" report
    assert err(started) == f"new store {store.resolve()}: created, nothing to recover\n", err(started)
    try:
        sent = cli("send", "--store", str(store), "--topic", "Orders", "--body", "hello world",
                   "--key", "order-1", "--key", "cust-9", "--tags", "TagA", "--json")
        assert sent.returncode == 0, err(sent)
        ack = json.loads(out(sent))
        assert ack["status"] == "PUT_OK" and len(ack["msg_id"]) == 32
        more = cli("send", "--store", str(store), "--topic", "Orders", "--count", "3", "--queue-id", "2",
                   input=b"from stdin")
        assert more.returncode == 0 and out(more).count("PUT_OK") == 3

        consumed = cli("consume", "--store", str(store), "--topic", "Orders", "--json")
        assert consumed.returncode == 0, err(consumed)
        records = [json.loads(line) for line in out(consumed).splitlines()]
        assert sorted(r["body"] for r in records) == ["from stdin"] * 3 + ["hello world"]
        first = next(r for r in records if r["msg_id"] == ack["msg_id"])
        assert first["keys"] == ["order-1", "cust-9"] and first["tags"] == "TagA"
        again = cli("consume", "--store", str(store), "--topic", "Orders", "--json")
        assert out(again) == ""  # the group's offsets were committed
        one = cli("consume", "--store", str(store), "--topic", "Orders", "--queue-id", "2",
                  "--offset", "1", "--max", "1", "--group", "other")
        assert one.returncode == 0 and "Orders/2@1" in out(one)

        for query in (["--topic", "Orders", "--key", "cust-9"], ["--msg-id", ack["msg_id"]],
                      ["--commit-pos", str(ack["commit_pos"])],
                      ["--topic", "Orders", "--key", "order-1", "--begin", str(ack["store_ts_ms"] - 10),
                       "--end", "2100-01-01T00:00:00"]):
            found = cli("query", "--store", str(store), *query, "--json")
            assert found.returncode == 0, (query, err(found))
            assert [json.loads(line)["msg_id"] for line in out(found).splitlines()] == [ack["msg_id"]]
        missing = cli("query", "--store", str(store), "--topic", "Orders", "--key", "order-1",
                      "--end", str(ack["store_ts_ms"] - 5000))
        assert missing.returncode == 1 and out(missing) == ""

        status = cli("status", "--store", str(store), "--json")
        assert status.returncode == 0, err(status)
        data = json.loads(out(status))
        assert data["state"] == "READY" and data["supervisor_pid"] == pid
        assert {p["role"] for p in data["processes"]} == {"supervisor", "dispatcher", "index_builder"}
        assert all(p["rss_bytes"] > 0 for p in data["processes"])
        assert all(0 < p["rss_anon_bytes"] <= p["rss_bytes"] for p in data["processes"])
        assert all(p["cpu_seconds"] > 0 for p in data["processes"])
        assert {"window_bytes_per_flush", "window_msgs_per_flush"} <= data["flush_stats"].keys()
        assert data["positions"]["written"] == data["positions"]["flushed"] > 0
        assert {"lag_bytes", "lag_ms", "rates", "flush_stats", "restart_history"} <= data.keys()
        text = cli("status", "--store", str(store))
        assert "dispatcher" in out(text) and "restart history" in out(text)

        refused = cli("recover", "--store", str(store))
        assert_one_line_error(refused, 4, "already in use")
    finally:
        stopped = cli("stop", "--store", str(store))
    assert stopped.returncode == 0, err(stopped)
    assert "stopped supervisor" in out(stopped)
    assert holder_pid(store) is None
    checked = cli("check", "--store", str(store))
    assert checked.returncode == 0 and "consistent" in out(checked)
    recovered = cli("recover", "--store", str(store), "--json")
    assert recovered.returncode == 0 and json.loads(out(recovered))["shutdown"] == "clean"
    assert_one_line_error(cli("stop", "--store", str(store)), 3, "no supervisor runs")
    assert_one_line_error(cli("send", "--store", str(store), "--topic", "T", "--body", "x"), 3,
                          "no supervisor runs")


@pytest.mark.slow
def test_start_without_arguments_uses_dot_data_and_ctrl_c_stops(tmp_path):
    proc = subprocess.Popen([sys.executable, "-m", "tools.cli", "start"], cwd=tmp_path,
                            env=child_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        line = proc.stdout.readline().decode()
        assert line.startswith("mqstore ready: store data"), line + proc.stderr.read().decode()
        assert (tmp_path / "data" / "store.json").exists()
        assert (tmp_path / "data" / "abort").exists()
        proc.send_signal(signal.SIGINT)  # what Ctrl-C sends
        assert proc.wait(30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
    assert "Traceback" not in proc.stderr.read().decode()
    assert not (tmp_path / "data" / "abort").exists()
    assert (tmp_path / "data" / "mqstore.log").exists()
    assert_check_clean(tmp_path / "data")


@pytest.fixture(scope="module")
def running(tmp_path_factory):
    store = start_store(tmp_path_factory.mktemp("cli") / "store")
    yield store
    assert store.stop() == 0


@pytest.mark.slow
@pytest.mark.parametrize("args,words", [
    (["--topic", "a/b", "--body", "x"], "invalid topic"),
    (["--topic", "..", "--body", "x"], "invalid topic"),
    (["--topic", "T", "--body", "x", "--queue-id", "7"], "outside 0..3"),
    (["--topic", "T", "--body", "x" * 9000], "exceeds the maximum of 8192"),
    (["--topic", "T", "--body", "x", "--property", "novalue"], "NAME=VALUE"),
    (["--topic", "T", "--body", "x", "--count", "0"], "must be >= 1"),
    (["--topic", "T", "--body", "x", "--delay-level", "19"], "level 19 is outside 1..18"),
    (["--topic", "T", "--body", "x", "--property", "DELAY=0"], "level 0 is outside 1..18"),
    (["--topic", "SCHEDULE_TOPIC_XXXX", "--body", "x"], "is a system topic"),
    (["--topic", "%DLQ%g", "--body", "x"], "is a system topic"),
    (["--topic", "T", "--body", "x", "--property", "REAL_TOPIC=U"], "set by the store only"),
    (["--topic", "T", "--body", "x", "--deliver-at", "2099-01-01T00:00:00Z"], "timer_max_delay_s = 259200"),
    (["--topic", "T", "--body", "x", "--deliver-at", "soon"], "neither ms since the epoch nor ISO 8601"),
])
def test_send_bad_input_exits_2(running, args, words):
    assert_one_line_error(cli("send", "--store", str(running.root), *args), 2, words)


@pytest.mark.slow
def test_send_with_a_delay_level_arrives_after_its_delay(running):
    sent = cli("send", "--store", str(running.root), "--topic", "Later", "--body", "soon",
               "--queue-id", "2", "--delay-level", "1", "--json")
    assert sent.returncode == 0, sent.stderr.decode()
    [answer] = [json.loads(line) for line in sent.stdout.decode().splitlines()]
    assert answer["status"] == "PUT_OK" and answer["queue_id"] == 0  # SCHEDULE_TOPIC_XXXX queue 0

    def arrived():
        got = cli("consume", "--store", str(running.root), "--topic", "Later", "--queue-id", "2",
                  "--json", "--no-commit", "--timeout-ms", "200")
        return [json.loads(line) for line in got.stdout.decode().splitlines()]

    [message] = wait_for(arrived, "the delayed message")
    assert message["body"] == "soon"
    assert message["store_ts_ms"] >= answer["store_ts_ms"] + 1000


@pytest.mark.slow
def test_non_utf8_key_and_tag_exit_2(running):
    for flag in ("--key", "--tags"):
        result = subprocess.run([sys.executable.encode(), b"-m", b"tools.cli", b"send", b"--store",
                                 str(running.root).encode(), b"--topic", b"T", b"--body", b"x",
                                 flag.encode(), b"bad\xffvalue"], cwd=REPO_ROOT, env=child_env(),
                                capture_output=True, timeout=60)
        assert_one_line_error(result, 2, "not valid UTF-8")


@pytest.mark.slow
def test_second_start_is_refused_and_writes_nothing_into_the_running_store_log(running):
    log_path = running.root / "mqstore.log"
    before = log_path.read_bytes()
    assert_one_line_error(cli("start", "--store", str(running.root)), 4,
                          f"already in use by pid {running.proc.pid}")
    assert log_path.read_bytes() == before  # the log is the running supervisor's, not the refused one's


def test_start_refuses_a_body_limit_no_segment_holds_and_creates_nothing(tmp_path):
    store = tmp_path / "store"
    config = write_config(tmp_path / "big-body.toml", {"max_body_bytes": 64 * 1024})  # 64 KiB segments
    assert_one_line_error(cli("start", "--store", str(store), "--config", str(config)), 2,
                          "invalid max_body_bytes: 65536 does not fit a commitlog segment of 65536 bytes")
    assert not store.exists()


def test_start_refuses_a_body_limit_past_an_existing_store_segment_and_changes_nothing(tmp_path):
    store = tmp_path / "store"
    create_store_dir(store, StoreConfig(**SMALL_STORE))  # its segment size is frozen: 64 KiB
    before = snapshot(store)
    config = write_config(tmp_path / "big-body.toml", {"max_body_bytes": 1 << 20})
    assert_one_line_error(cli("start", "--store", str(store), "--config", str(config)), 2,
                          "segment of 65536 bytes, whose records carry bodies of at most")
    assert snapshot(store) == before


def test_not_a_store_and_newer_version_exit_2(tmp_path):
    junk = tmp_path / "junk"
    junk.mkdir()
    (junk / "photo.jpg").write_bytes(b"\xff\xd8")
    assert_one_line_error(cli("start", "--store", str(junk)), 2, "neither empty nor a store")
    assert_one_line_error(cli("send", "--store", str(junk), "--topic", "T", "--body", "x"), 2,
                          "neither empty nor a store")
    assert_one_line_error(cli("check", "--store", str(junk)), 2, "")
    assert sorted(p.name for p in junk.iterdir()) == ["photo.jpg"]  # nothing changed on disk
    newer = tmp_path / "newer"
    newer.mkdir()
    meta = {"format_version": 99, "commitlog_file_size": 65536, "consume_queue_entries": 500,
            "index_slot_count": 64, "index_entry_count": 256, "index_shards": 2,
            "checksum": "crc32c", "store_host": "127.0.0.1:10911"}
    (newer / "store.json").write_text(json.dumps(meta))
    assert_one_line_error(cli("start", "--store", str(newer)), 2, "format")
    assert_one_line_error(cli("recover", "--store", str(newer)), 2, "format")
    assert sorted(p.name for p in newer.iterdir()) == ["store.json"]


def test_bad_arguments_exit_2_and_help_documents_exit_codes(tmp_path):
    help_text = cli("--help")
    assert help_text.returncode == 0
    for words in ("exit codes:", "bad arguments or input", "no supervisor runs", "BOOT_FAILED"):
        assert words in out(help_text)
    assert cli("start", "--flush", "sometimes").returncode == 2
    assert cli("nonsense").returncode == 2
    assert_one_line_error(cli("query", "--store", str(tmp_path), "--key", "k"), 2, "")
    bad_toml = tmp_path / "bad.toml"
    bad_toml.write_text("[store]\nno_such_setting = 1\n")
    assert_one_line_error(cli("start", "--store", str(tmp_path / "s"), "--config", str(bad_toml)), 2,
                          "unknown settings")
    assert not (tmp_path / "s").exists()


def test_a_bad_index_flush_interval_is_refused_before_anything_is_created(tmp_path):
    bad_toml = tmp_path / "bad.toml"
    bad_toml.write_text("[store]\nindex_flush_interval_ms = 0\n")
    assert_one_line_error(cli("start", "--store", str(tmp_path / "s"), "--config", str(bad_toml)), 2,
                          "index_flush_interval_ms")
    assert not (tmp_path / "s").exists()


def test_spark_is_imported_lazily():
    code = ("import sys; import tools.cli as c; c.build_parser(); "
            "print(any(m == 'pyspark' or m.startswith('pyspark.') for m in sys.modules))")
    result = subprocess.run([sys.executable, "-c", code], cwd=REPO_ROOT, env=child_env(),
                            capture_output=True, timeout=60)
    assert out(result).strip() == "False", err(result)
    spark = cli("spark", "--help")
    assert "Traceback" not in err(spark)


@pytest.mark.slow
def test_detach_reports_a_refused_start(running):
    refused = cli("start", "--store", str(running.root), "--detach")
    assert_one_line_error(refused, 4, "already in use")
    wait_for(lambda: running.proc.poll() is None, "the running store to be untouched")
    os.kill(running.proc.pid, 0)


@pytest.mark.slow
def test_consume_follow_waits_for_new_messages_and_commits_on_ctrl_c(running):
    store = str(running.root)
    proc = subprocess.Popen([sys.executable, "-m", "tools.cli", "consume", "--store", store, "--topic",
                             "Follow", "--group", "follower", "--follow", "--json"], cwd=REPO_ROOT,
                            env=child_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        for i in range(2):
            sent = cli("send", "--store", store, "--topic", "Follow", "--body", f"live-{i}", "--json")
            assert sent.returncode == 0, err(sent)
            line = proc.stdout.readline().decode()
            assert json.loads(line)["body"] == f"live-{i}"
        proc.send_signal(signal.SIGINT)
        assert proc.wait(30) == 130
    finally:
        if proc.poll() is None:
            proc.kill()
    assert "Traceback" not in proc.stderr.read().decode()
    again = cli("consume", "--store", store, "--topic", "Follow", "--group", "follower")
    assert again.returncode == 0 and out(again) == ""  # both were committed before exiting


@pytest.mark.parametrize("sample", ["store-2019", "store-2021"])
def test_every_command_leaves_a_rocketmq_written_store_byte_for_byte(tmp_path, sample):
    """start (both ways), recover, send, consume, stop, status, query and check on a store RocketMQ
    wrote: no file is written, created or renamed (not even mqstore.log), and a refusal says
    how mqstore can read it."""
    root = tmp_path / sample
    shutil.copytree(ROCKETMQ_SAMPLES / sample, root)
    before = snapshot(root)
    store = ("--store", str(root))
    for args in (("start",), ("start", "--detach"), ("recover",),
                 ("send", "--topic", "T", "--body", "x")):
        result = cli(*args, *store)
        assert_one_line_error(result, 2, "RocketMQ-written store")
        assert "mqstore check" in err(result) and "spark" in err(result), err(result)
    for args in (("consume", "--topic", "TopicTest", "--max", "1"), ("stop",), ("status",),
                 ("query", "--commit-pos", "0"), ("check",)):
        cli(*args, *store)
    assert snapshot(root) == before
