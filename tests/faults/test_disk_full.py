"""A full disk: producers get DISK_FULL, nothing written is damaged, writes resume with space.

The store runs on a small filesystem the test mounts (a tmpfs; a loop-mounted ext4 image if
tmpfs cannot be mounted; skipped with both reasons if neither can) and the disk is filled for
real with a ballast file. The ledgers live on the ordinary disk. Two paths are exercised: the
supervisor's disk-usage check (DISK_FULL above disk_full_ratio) and the last bytes of the disk
(ENOSPC while writing, which must be DISK_FULL too, never SIGBUS).
"""

from __future__ import annotations

import os
import signal

import pytest

from engine.check.fsck import check
from engine.config import StoreConfig
from engine.formats.index_file import index_key, slot_pos
from engine.formats.java_hash import index_key_hash
from engine.status import PutStatus
from engine.store import MessageStore
from ipc.control_block import pid_alive
from ipc.producer import Producer
from tests.workers.store_harness import cli
from tools.store_process import StoreProcess, is_stopped, wait_until, write_store_config
from tools.torture.filesystems import (
    FilesystemUnavailable,
    MiB,
    fill,
    small_loop_ext4,
    small_tmpfs,
    unfill,
    unmount,
)
from tools.torture.ledger import LedgerReader
from tools.torture.processes import ProducerFleet
from tools.torture.rounds import TORTURE_STORE
from tools.torture.verify import VerifyState, verify_store

pytestmark = pytest.mark.slow
FS_BYTES = 24 * MiB


@pytest.fixture
def small_disk(tmp_path):
    mount_point = tmp_path / "disk"
    try:
        small_tmpfs(mount_point, FS_BYTES)
    except FilesystemUnavailable as tmpfs_error:
        try:
            small_loop_ext4(tmp_path / "disk.img", mount_point, FS_BYTES)
        except FilesystemUnavailable as loop_error:
            pytest.skip(f"no small filesystem: tmpfs: {tmpfs_error}; loop ext4: {loop_error}")
    yield mount_point
    unmount(mount_point)


class Rig:
    """A store on the small disk, two load producers, ledgers on the real disk."""

    def __init__(self, disk, work, supervisor: dict | None = None, **store):
        work.mkdir()
        (work / "ledgers").mkdir()
        self.disk = disk
        self.root = disk / "store"
        config = write_store_config(work / "store.toml", {**TORTURE_STORE, **store}, supervisor)
        self.store = StoreProcess(self.root, config, work / "supervisor.log")
        self.fleet = ProducerFleet(self.root, work / "ledgers", work, max_batch=8, max_body_bytes=2000)
        self.ledger = LedgerReader(work / "ledgers")

    def start(self, producers: int = 2) -> None:
        self.store.start()
        for n in range(producers):
            self.fleet.spawn(f"p{n}", 1000 + n)
        self.store.wait_ready()

    def acks(self) -> int:
        return self.ledger.count_lines(self.fleet.tags)

    def wait_acks(self, more: int) -> None:
        target = self.acks() + more
        wait_until(lambda: self.acks() >= target, f"{more} more acknowledgements", 60)

    def finish(self) -> None:
        """Stop everything; the stopped store must be consistent and agree with the ledger."""
        self.fleet.stop_all()
        assert self.store.stop() == 0, self.store.log_text()[-3000:]
        report = verify_store(self.root, self.ledger.read_all(), VerifyState())
        assert not report.problems, report.problems
        assert report.acknowledged > 0

    def kill_all(self) -> None:
        for tag in self.fleet.tags:
            self.fleet.kill(tag)
        if self.store.running:
            self.store.kill()


def probe(producer: Producer, size: int = 100) -> PutStatus:
    return producer.send("Probe", b"p" * size, keys=("probe",)).status


def fill_until_refused(rig: Rig, producer: Producer, disk) -> int:
    """Fill the disk to 93% used (above disk_full_ratio, 90%, with room for the up to 1 s until
    the supervisor's next usage check) until 20 probes in a row are refused and nothing is
    written meanwhile; the acknowledgements by then. Retention's forced clean (at 85%) may free
    a segment or two, after which writes rightly resume: then fill again."""
    for _ in range(5):
        unfill(disk)
        fill(disk, leave_bytes=FS_BYTES * 7 // 100)
        seen: list[PutStatus] = []
        try:
            wait_until(lambda seen=seen: seen.append(probe(producer)) or seen[-1] is PutStatus.DISK_FULL,
                       "DISK_FULL", 30)
        except AssertionError:
            raise AssertionError(f"probes {seen[-5:]}: {rig.store.log_text()[-2000:]}") from None
        # the sweep that found the disk full may have appended a fleet request before the
        # probe and publishes it after answering; a second probe is served by a later sweep
        if probe(producer) is not PutStatus.DISK_FULL:
            continue
        with rig.store.ctl() as ctl:
            written, acks = ctl.written_pos, rig.acks()
            if all(probe(producer) is PutStatus.DISK_FULL for _ in range(20)):
                assert ctl.written_pos == written  # nothing is written while the disk is full
                return acks
    raise AssertionError(f"the store kept taking writes on a full disk: {rig.store.log_text()[-2000:]}")


def test_disk_usage_above_the_limit_gives_disk_full_and_writes_resume(tmp_path, small_disk):
    rig = Rig(small_disk, tmp_path / "work")
    try:
        rig.start()
        rig.wait_acks(50)
        with Producer(rig.root) as producer:
            acks = fill_until_refused(rig, producer, small_disk)
            assert rig.acks() - acks <= 2 * 8  # at most a batch in flight per producer
            unfill(small_disk)
            wait_until(lambda: probe(producer) is PutStatus.PUT_OK, "writes to resume", 30)
        rig.wait_acks(50)
        rig.finish()
        assert rig.fleet.counts["DISK_FULL"] > 0, rig.fleet.counts
    finally:
        rig.kill_all()


def test_last_bytes_of_the_disk_give_disk_full_not_a_crash(tmp_path, small_disk):
    rig = Rig(small_disk, tmp_path / "work", {"catch_up_timeout_s": 5.0}, disk_warn_ratio=1.0,
              disk_clean_force_ratio=1.0, disk_full_ratio=1.0)  # full = 0 bytes free
    try:
        rig.start(producers=0)
        with Producer(rig.root) as producer:
            statuses = _race_the_disk_check(rig, producer)  # the commitlog meets ENOSPC
            assert rig.store.running, (f"the supervisor died (exit code {rig.store.proc.returncode}"
                                       f"):\n{rig.store.log_text()[-2000:]}")
            assert PutStatus.DISK_FULL in statuses and statuses <= {PutStatus.PUT_OK,
                                                                     PutStatus.DISK_FULL}
            unfill(small_disk)
            _children_meet_a_full_disk(rig, producer)  # a consume queue's first page
            unfill(small_disk)
            wait_until(lambda: probe(producer) is PutStatus.PUT_OK, "writes to resume", 30)
        assert rig.store.stop() == 0
        log = rig.store.log_text()
        assert "SIGBUS" not in log and "stopped cleanly" in log, log[-3000:]
        assert verify_store(rig.root, [], VerifyState()).findings == []
    finally:
        rig.kill_all()


def _race_the_disk_check(rig: Rig, producer: Producer, attempts: int = 8) -> set:
    """Fill the disk right after the supervisor's once-a-second usage check passed, then write
    more than the last free page, until the append itself met ENOSPC (not the usage check)."""
    statuses: set = set()
    for _ in range(attempts):
        if probe(producer) is PutStatus.PUT_OK:  # the usage check ran: a fresh 1 s window
            fill(rig.disk, leave_bytes=0)
            results = producer.send_batch_async([_big_message(i) for i in range(64)]).result(60)
            statuses |= {r.status for r in results}
            if "disk full while appending" in rig.store.log_text() or not rig.store.running:
                break
        unfill(rig.disk)
    return statuses


def _children_meet_a_full_disk(rig: Rig, producer: Producer) -> None:
    """Records the dispatcher has yet to index into a new consume-queue file, then no space."""
    children = [p for p in rig.store.child_pids() if pid_alive(p)]
    for pid in children:
        os.kill(pid, signal.SIGSTOP)
    try:
        wait_until(lambda: all(is_stopped(p) for p in children), "the children to stop", 10)
        assert producer.send("Fresh", b"f" * 100, keys=("fresh",)).ok  # appended and flushed
        fill(rig.disk, leave_bytes=0)
    finally:
        for pid in children:
            os.kill(pid, signal.SIGCONT)
    with rig.store.ctl() as ctl:
        written = ctl.written_pos
        try:
            wait_until(lambda: ctl.dispatched_pos >= written or "SIGBUS" in rig.store.log_text()
                       or "dispatcher: disk full, waiting for space" in rig.store.log_text()
                       or not rig.store.running,
                       "the dispatcher to index the new record, wait for space, or die", 15)
        except AssertionError as exc:
            raise AssertionError(f"{exc}: {rig.store.log_text()[-2500:]}") from None


def _big_message(i: int):
    from engine.message import Message

    return Message("Big", bytes([i % 251]) * 3000, keys=(f"big-{i}",))


@pytest.fixture
def full_tmpfs_store(tmp_path):
    """A stopped store with one key on a small tmpfs, then filled: a read fault on a hole of its
    files would allocate a page, which the full tmpfs turns into a SIGBUS."""
    mount_point = tmp_path / "tmpfs"
    try:
        small_tmpfs(mount_point, 8 * MiB)
    except FilesystemUnavailable as exc:
        pytest.skip(f"no tmpfs (a read fault allocates only there): {exc}")
    root = mount_point / "store"
    config = StoreConfig(commitlog_file_size=256 << 10, queue_count=1, index_slot_count=100_000,
                         index_entry_count=1000, index_shards=1)
    with MessageStore.open(root, config) as store:
        assert store.put("Orders", b"hello", keys=["order-1"]).status is PutStatus.PUT_OK
    fill(mount_point, leave_bytes=0)
    yield root, config
    unmount(mount_point)


def test_query_of_absent_keys_on_a_full_tmpfs_reads_slot_holes_without_dying(full_tmpfs_store):
    root, config = full_tmpfs_store
    absent = [f"absent-{i}" for i in range(8)]
    page_of = {key: slot_pos(index_key_hash(index_key("Orders", key)) % config.index_slot_count) // 4096
               for key in ["order-1", *absent]}
    assert any(page_of[key] != page_of["order-1"] for key in absent)  # some land on a never-written page
    for key in absent:
        missing = cli("query", "--store", str(root), "--topic", "Orders", "--key", key)
        assert missing.returncode == 1 and missing.stdout == b"", (key, missing.returncode, missing.stderr)
    found = cli("query", "--store", str(root), "--topic", "Orders", "--key", "order-1", "--json")
    assert found.returncode == 0 and b"order-1" in found.stdout, found.stderr
    assert check(root) == []
