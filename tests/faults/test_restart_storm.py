"""Restart storms: a child that crashes in a loop exhausts the restart budget and the store stops
with a clear message; a child that cannot boot is not restarted at all. Under load, with the
ledger: whatever was acknowledged before the storm is intact after the next start.

Crash loops are made two ways: by SIGKILLing the child each time it comes back, and for real,
by making the index builder's own work fail -- its shard directory is made immutable
(`chattr +i`, which binds root too), so the builder crashes each time it rolls to a new index
file, however often it is restarted.

`make test` runs the crash loop for real (the budget, then the ledger after the next start);
the SIGKILL loop and the child that cannot boot run in `make soak`, as their rules without the
load are tests/workers/test_supervisor.py's (test_restart_budget_exceeded_stops_the_store,
test_child_that_cannot_boot_is_not_restarted_and_its_cause_is_in_the_log).
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess

import pytest

from engine.files.naming import INDEX_DIR
from ipc.control_block import Role
from tools.store_process import StoreProcess, wait_until, write_store_config
from tools.torture.ledger import LedgerReader
from tools.torture.processes import ProducerFleet
from tools.torture.rounds import TORTURE_STORE
from tools.torture.verify import VerifyState, verify_store

pytestmark = pytest.mark.slow
BUDGET = {"restart_budget": 3, "restart_window_s": 120.0, "restart_base_delay_s": 0.01,
          "restart_max_delay_s": 0.05}


class Storm:
    """A store under load whose supervisor we expect to give up."""

    def __init__(self, tmp_path, store: dict | None = None):
        self.tmp_path = tmp_path
        self.root = tmp_path / "store"
        (tmp_path / "ledgers").mkdir()
        config = write_store_config(tmp_path / "store.toml", {**TORTURE_STORE, **(store or {})},
                                    BUDGET)
        self.store = StoreProcess(self.root, config, tmp_path / "supervisor.log")
        self.fleet = ProducerFleet(self.root, tmp_path / "ledgers", tmp_path, max_batch=8,
                                   max_body_bytes=2000)
        self.ledger = LedgerReader(tmp_path / "ledgers")
        self.tags = 0

    def start(self) -> None:
        self.store.start()
        for _ in range(2):
            self.tags += 1
            self.fleet.spawn(f"p{self.tags}", self.tags)
        self.store.wait_ready()

    def wait_acks(self, more: int) -> None:
        target = self.ledger.count_lines(self.fleet.tags) + more
        wait_until(lambda: self.ledger.count_lines(self.fleet.tags) >= target or not self.store.running,
                   f"{more} more acknowledgements", 60)

    def wait_gave_up(self) -> tuple[int, str]:
        code = self.store.proc.wait(120)
        self.fleet.wait_all_exited(60)  # SERVICE_NOT_AVAILABLE: they exit by themselves
        return code, self.store.log_text()

    def restart_and_verify(self) -> None:
        """The next start recovers; writes work; the stopped store agrees with the ledger."""
        self.start()
        self.wait_acks(20)
        self.fleet.stop_all()
        assert self.store.stop() == 0, self.store.log_text()[-3000:]
        report = verify_store(self.root, self.ledger.read_all(), VerifyState())
        assert not report.problems, report.problems
        assert report.acknowledged > 0

    def cleanup(self) -> None:
        for tag in self.fleet.tags:
            self.fleet.kill(tag)
        if self.store.running:
            self.store.kill()


@pytest.fixture
def storm(tmp_path):
    storm = Storm(tmp_path)
    yield storm
    storm.cleanup()


@pytest.mark.soak
@pytest.mark.parametrize("role, shard", [(Role.DISPATCHER, 0)], ids=["dispatcher"])
def test_killed_in_a_loop_hits_the_restart_budget_and_stops_cleanly(storm, role, shard):
    storm.start()
    storm.wait_acks(30)
    kills = 0
    while storm.store.running:
        pid = storm.store.child_pid(role, shard)
        os.kill(pid, signal.SIGKILL)
        kills += 1
        if kills <= BUDGET["restart_budget"]:
            storm.store.wait_child_replaced(role, pid, shard)
            storm.wait_acks(5)  # producers are not interrupted by a child's restart
        else:
            break
    code, log = storm.wait_gave_up()
    name = "dispatcher" if role is Role.DISPATCHER else f"index builder {shard}"
    assert code == 1 and kills == BUDGET["restart_budget"] + 1
    assert (f"{name} (pid " in log and "restart budget of 3 restarts in 120 s exceeded; "
            "stopping the store" in log), log[-3000:]
    assert log.count(f"{name} started") == BUDGET["restart_budget"] + 1  # then no more
    storm.restart_and_verify()


def test_child_that_crashes_by_itself_in_a_loop_stops_the_store(tmp_path):
    if shutil.which("chattr") is None:
        pytest.skip("no chattr")
    storm = Storm(tmp_path, store={"index_entry_count": 64})  # rolls every ~63 keys
    shard_dir = storm.root / INDEX_DIR / "0"
    try:
        storm.start()
        storm.wait_acks(10)
        # the builder makes its directory with its first keys, which may come after 10 acks
        wait_until(lambda: any(shard_dir.glob("*")), "index builder 0's first index file", 60)
        locked = subprocess.run(["chattr", "+i", str(shard_dir)], capture_output=True, text=True)
        if locked.returncode != 0:
            pytest.skip(f"chattr +i unsupported here: {locked.stderr.strip()}")
        code, log = storm.wait_gave_up()
        assert code == 1, log[-3000:]
        assert "index builder 0" in log and "exited with 1 (CRASHED)" in log, log[-3000:]
        assert "restart budget of 3 restarts in 120 s exceeded; stopping the store" in log
        assert log.count("index builder 0 started") == BUDGET["restart_budget"] + 1
    finally:
        subprocess.run(["chattr", "-i", str(shard_dir)], capture_output=True)
        storm.cleanup()
    storm.restart_and_verify()
    storm.cleanup()


@pytest.mark.soak
def test_child_that_cannot_boot_is_not_restarted(storm):
    storm.start()
    storm.wait_acks(30)
    foreign = storm.root / INDEX_DIR / "1" / "not-an-index-file"
    # the builder makes its directory with its first keys, up to a dispatcher pace interval
    # and a builder post interval behind the acknowledgements
    wait_until(foreign.parent.is_dir, "index builder 1's directory", 60)
    foreign.write_bytes(b"junk")  # ShardIndex.load refuses a foreign file: BOOT_FAILED
    os.kill(storm.store.child_pid(Role.INDEX_BUILDER, 1), signal.SIGKILL)
    code, log = storm.wait_gave_up()
    assert code == 1
    assert "index builder 1" in log and "BOOT_FAILED" in log and "not restarting" in log, log[-3000:]
    assert log.count("index builder 1 started") == 2  # the first start and one failed boot
    foreign.unlink()
    storm.restart_and_verify()
