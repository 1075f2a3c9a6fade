"""Real runs of `python -m tools.bench`: a store started for the run, Redis when installed,
and the disk probe. These start processes, so they take seconds, not milliseconds."""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys

import psutil
import pytest

from engine.status import PutStatus
from ipc.producer import Producer
from tests.workers.store_harness import assert_check_clean, start_store
from tools.bench import disk, report
from workers.child_env import REPO_ROOT, child_env

SHORT_RUN = ("--producers", "1", "--consumers", "1", "--seconds", "2", "--warmup", "0.5",
             "--interval", "1", "--batch", "4", "--keys")


def bench(*args: str, timeout: float = 120.0) -> subprocess.CompletedProcess:
    env = child_env()
    return subprocess.run([sys.executable, "-m", "tools.bench", *args], cwd=REPO_ROOT, env=env,
                          capture_output=True, text=True, timeout=timeout)


def _redis_available() -> bool:
    try:
        import redis  # noqa: F401
    except ImportError:
        return False
    return shutil.which("redis-server") is not None


def _assert_complete(doc: dict, name: str, interval_ends_s: list[float]) -> dict:
    run = doc["runs"][name]
    summary = run["summary"]
    assert summary["sent_total"] == summary["received_total"] > 0
    assert summary["errors"] == {}
    assert summary["pub_latency"]["count"] > 0 and summary["e2e_latency"]["count"] > 0
    assert [i["t_s"] for i in run["intervals"]] == interval_ends_s
    return run


@pytest.mark.slow
def test_two_second_run_against_a_started_store(tmp_path):
    result = bench("--start", "--workdir", str(tmp_path), *SHORT_RUN, "--json", str(tmp_path / "r.json"),
                   "--plot", str(tmp_path / "r.png"))
    assert result.returncode == 0, result.stdout + result.stderr
    doc = json.loads((tmp_path / "r.json").read_text())
    assert report.check_document(doc) == []
    run = _assert_complete(doc, "mqstore", [1.0, 2.0])
    assert run["store"]["flush"]["flush_count"] > 0
    assert run["store"]["samples"], "status was sampled during the run"
    lines = [line for line in result.stdout.splitlines() if line.startswith("mqstore [")]
    assert len(lines) == 2 and all("| load " in line for line in lines)
    assert "(equal: yes)" in result.stdout
    assert 0 < (tmp_path / "r.png").stat().st_size < 200_000
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r.json", "r.png"]  # store removed


@pytest.mark.slow
def test_fixed_rate_run_with_spread_producers_holds_the_rate(tmp_path):
    result = bench("--start", "--workdir", str(tmp_path), "--producers", "2", "--consumers", "1",
                   "--seconds", "2", "--warmup", "0.5", "--interval", "1", "--batch", "8",
                   "--rate", "800", "--schedule", "spread", "--json", str(tmp_path / "r.json"))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "mqstore: 2 producer(s), 1 consumer(s), 800 msg/s offered (spread schedule)" in result.stdout
    doc = json.loads((tmp_path / "r.json").read_text())
    assert report.check_document(doc) == []
    assert doc["config"]["schedule"] == "spread" and doc["config"]["rate_msgs_per_s"] == 800
    run = _assert_complete(doc, "mqstore", [1.0, 2.0])  # nothing NOT_SENT, everything received
    # 2 producers x 400 msg/s for 2.5 s, batch j of producer 1 due half a gap after producer 0's;
    # a rate a loaded 2-core machine holds with sync flush (the test is of the schedule, not speed)
    assert run["summary"]["sent_total"] == 2 * 400 * 2.5
    assert 720 <= run["summary"]["pub_msgs_per_s"] <= 880


@pytest.mark.slow
def test_reading_a_stored_backlog_counts_it_and_says_when_it_ran_out(tmp_path):
    running = start_store(tmp_path / "store")
    try:
        with Producer(running.root) as producer:
            for topic, batches in (("bench-0", 8), ("other", 1)):
                for _ in range(batches):
                    result = producer.send_columns(topic, [bytes(40)] * 500,
                                                   queue_ids=[i % 4 for i in range(500)])
                    assert result.status_counts() == {PutStatus.PUT_OK: 500}
        running.wait_caught_up()
        # no warm-up, 16 per pull: reading 4,000 messages takes the consumers some ms of the run
        result = bench("--store", str(running.root), "--producers", "0", "--consumers", "2",
                       "--consume-from", "start", "--seconds", "2", "--warmup", "0", "--interval", "1",
                       "--pull-count", "16", "--json", str(tmp_path / "r.json"))
        assert result.returncode == 0, result.stdout + result.stderr
    finally:
        assert running.stop() == 0
    summary = json.loads((tmp_path / "r.json").read_text())["runs"]["mqstore"]["summary"]
    assert summary["backlog_at_start_msgs"] == summary["received_total"] == summary["cons_msgs"] == 4_000
    caught_up_s = summary["caught_up_s"]
    assert 0 < caught_up_s < 2  # consumers start with the measurement, and ran out within it
    assert summary["cons_msgs_per_s_until_caught_up"] == pytest.approx(4_000 / caught_up_s, rel=1e-3)
    assert summary["cons_msgs_per_s"] == 2_000  # over the whole 2 s: the lower bound
    lines = [line for line in result.stdout.splitlines() if line.startswith("mqstore [")]
    assert [line.split("| backlog ")[1].split(" ")[0] for line in lines] == ["0", "0"]
    assert (f"  backlog   4000 at start; read to its end {caught_up_s:g} s into the measurement, at "
            in result.stdout)
    assert_check_clean(running.root)


@pytest.mark.slow
def test_peer_redis_runs_side_by_side_or_says_how_to_install(tmp_path):
    args = ("--start", "--workdir", str(tmp_path), *SHORT_RUN, "--seconds", "1", "--peer", "redis",
            "--json", str(tmp_path / "r.json"))
    result = bench(*args)
    if not _redis_available():
        assert result.returncode != 0
        assert "apt-get install redis-server" in result.stderr
        assert "pip install 'mqstore[redis]'" in result.stderr
        return
    assert result.returncode == 0, result.stdout + result.stderr
    doc = json.loads((tmp_path / "r.json").read_text())
    assert report.check_document(doc) == []
    _assert_complete(doc, "mqstore", [1.0])
    _assert_complete(doc, "redis", [1.0])
    assert doc["ratios"]["redis"]["pub_msgs_per_s"] > 0
    assert "mqstore vs redis (appendfsync always), same run:" in result.stdout
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r.json"]  # redis dir removed too


def test_missing_redis_server_prints_the_install_hint_before_starting_anything(tmp_path):
    result = bench("--start", "--workdir", str(tmp_path), "--peer", "redis",
                   "--redis-server", str(tmp_path / "no-such-redis-server"), timeout=60)
    assert result.returncode != 0, result.stdout + result.stderr
    assert "no-such-redis-server' is not on PATH" in result.stderr
    assert "apt-get install redis-server" in result.stderr
    assert "pip install 'mqstore[redis]'" in result.stderr
    assert list(tmp_path.iterdir()) == []


@pytest.mark.slow
def test_sigterm_stops_the_run_and_cleans_up_its_store_and_workers(tmp_path):
    env = child_env()
    proc = subprocess.Popen([sys.executable, "-m", "tools.bench", "--start", "--workdir", str(tmp_path),
                             "--producers", "1", "--consumers", "1", "--seconds", "120", "--warmup", "0"],
                            cwd=REPO_ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True)
    try:
        lines = []
        for line in proc.stdout:  # the store is up, then the workers are told to go
            lines.append(line)
            if line.startswith("mqstore: 1 producer(s)"):
                break
        started = next(line for line in lines if "supervisor pid" in line)
        supervisor_pid = int(started.split("supervisor pid ")[1].split(",")[0])
        proc.send_signal(signal.SIGTERM)
        rest = proc.communicate(timeout=60)[0]
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, "".join(lines) + rest
    assert _gone(supervisor_pid)
    assert list(tmp_path.iterdir()) == []  # the run's store directory is removed
    left = [p.info["cmdline"] for p in psutil.process_iter(["cmdline"])
            if any(str(tmp_path) in part for part in p.info["cmdline"] or ())]
    assert left == []  # no worker or store process of this run is left


def _gone(pid: int) -> bool:
    """No such process, or only its zombie (a detached supervisor is reaped by whoever adopted it)."""
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def test_bench_without_a_store_says_what_to_give():
    result = bench("--producers", "1", timeout=60)
    assert result.returncode == 2
    assert "give --store DIR (a running store) or --start" in result.stderr


def test_disk_probe_writes_and_cleans_up(tmp_path):
    point = disk.probe_writers(tmp_path, writers=2, write_bytes=512, seconds=0.2)
    assert point["writes"] > 0 and point["writes_per_s"] > 0 and point["fdatasync_p50_ms"] > 0
    assert list(tmp_path.iterdir()) == []
