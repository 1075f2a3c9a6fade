"""tools.bench.probes.ack_floor runs end to end, closed loop and at a fixed rate, and leaves nothing over."""

from __future__ import annotations

import os

import pytest

from tools.bench.probes import ack_floor


def own_semaphores() -> set[str]:
    prefix = "sem." + ack_floor.NAME_PREFIX[1:]
    return {name for name in os.listdir("/dev/shm") if name.startswith(prefix)}


@pytest.mark.slow
def test_closed_loop_acknowledges_batches_and_cleans_up(tmp_path):
    out = ack_floor.main(["--producers", "2", "--batch", "4", "--seconds", "0.5", "--runs", "1",
                                "--crc", "--dir", str(tmp_path)])
    assert out["acks_per_s"] > 0
    assert out["msgs_per_s"] == pytest.approx(4 * out["acks_per_s"])
    assert out["msgs_per_sync"] >= 1  # an fdatasync never answers nothing
    assert 0 < out["latency_p50_ms"] <= out["latency_p99_ms"] <= out["latency_max_ms"]
    assert out["server_cpu_us_per_msg"] > 0 and out["producers_cpu_us_per_msg"] > 0
    assert own_semaphores() == set()
    assert list(tmp_path.iterdir()) == []  # the synced file is removed


@pytest.mark.slow
def test_fixed_rate_sends_on_schedule(tmp_path):
    # 2 producers x batches of 4 at 400 msg/s: each producer's batch due every 20 ms, 50 in 1 s
    out = ack_floor.main(["--producers", "2", "--batch", "4", "--seconds", "1", "--runs", "1",
                                "--rate", "400", "--dir", str(tmp_path)])
    assert out["msgs_per_s"] == pytest.approx(400)
    assert out["acks_per_s"] == pytest.approx(100)
    assert out["syncs_per_s"] <= out["acks_per_s"]


@pytest.mark.slow
def test_work_a_round_costs_the_server_that_much_cpu_a_sync(tmp_path):
    out = ack_floor.main(["--producers", "2", "--batch", "4", "--seconds", "0.5", "--runs", "1",
                          "--work-us", "400", "--dir", str(tmp_path)])
    server_cpu_us_per_sync = out["server_cpu_us_per_msg"] * out["msgs_per_sync"]
    assert server_cpu_us_per_sync >= 0.9 * 400  # the busy wait runs once a round, on the CPU
    assert own_semaphores() == set()


@pytest.mark.slow
def test_server_threads_answer_every_request_once_and_clean_up(tmp_path):
    out = ack_floor.main(["--producers", "3", "--batch", "2", "--seconds", "0.5", "--runs", "1",
                          "--server-threads", "2", "--work-us", "50", "--dir", str(tmp_path)])
    assert out["acks_per_s"] > 0
    assert out["server_answers_per_s"] == out["acks_per_s"]  # a request taken twice is answered twice
    assert out["idlest_thread_syncs_per_s"] > 0  # both threads served
    assert out["syncs_per_s"] <= out["acks_per_s"]  # no thread syncs a round it took nothing in
    assert own_semaphores() == set()
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("args, message", [
    (["--producers", "0"], "--producers must be at least 1"),
    (["--seconds", "0"], "--seconds must be > 0"),
    (["--server-threads", "0"], "--server-threads must be at least 1"),
    (["--work-us", "-1"], "--work-us >= 0"),
    (["--dir", "/nonexistent/mqstore-ack-floor"], "no such directory"),
])
def test_bad_arguments_are_refused_before_anything_runs(args, message, capsys):
    with pytest.raises(SystemExit) as stopped:
        ack_floor.main(args)
    assert stopped.value.code == 2
    assert message in capsys.readouterr().err
    assert own_semaphores() == set()
