"""Slot claims: mutual exclusion across processes, and a dead holder's slot frees itself."""

from __future__ import annotations

import multiprocessing
import os
import signal
import stat
import struct
import time

import pytest

from engine.errors import StoreError
from ipc.shm import SharedRegion, issue_shm_token, region_name, unlink_stale_regions
from ipc.slot_claim import claim_slot, is_slot_owner_alive, release_slot, slot_lock_path

SPAWN = multiprocessing.get_context("spawn")
CLAIMER_COUNT = 4
SLOT_COUNT = 2
HOLDS_PER_CLAIMER = 200
CELL = struct.Struct("<q")
COUNTS_OFFSET = 64  # per-claimer [holds, busy] counters after the per-slot holder cells
READY_OFFSET = 256  # per-claimer "started" bytes: a start barrier so the claimers overlap


@pytest.fixture
def store_dir(tmp_path):
    issue_shm_token(tmp_path)  # what a supervisor does before creating its regions
    yield tmp_path
    unlink_stale_regions(tmp_path)


# -- children --------------------------------------------------------------------------------------

def child_claim_repeatedly(name: str, run_dir: str, claimer: int) -> None:
    """Hold slots HOLDS_PER_CLAIMER times; a holder cell that is not ours means two holders."""
    me = claimer + 1
    with SharedRegion.attach(name) as region:
        buf = region.buf
        buf[READY_OFFSET + claimer] = 1
        deadline = time.monotonic() + 60
        while sum(buf[READY_OFFSET:READY_OFFSET + CLAIMER_COUNT]) < CLAIMER_COUNT:
            assert time.monotonic() < deadline, "the other claimers never started"
            os.sched_yield()
        holds = busy = 0
        while holds < HOLDS_PER_CLAIMER:
            try:
                index, fd = claim_slot(run_dir, SLOT_COUNT)
            except StoreError:
                busy += 1
                os.sched_yield()
                continue
            cell = index * CELL.size
            assert CELL.unpack_from(buf, cell)[0] == 0, f"slot {index} already held"
            CELL.pack_into(buf, cell, me)
            for _ in range(3):
                os.sched_yield()
                assert CELL.unpack_from(buf, cell)[0] == me, f"slot {index} taken from us"
            CELL.pack_into(buf, cell, 0)
            release_slot(fd)
            holds += 1
        struct.pack_into("<qq", buf, COUNTS_OFFSET + claimer * 16, holds, busy)
        del buf


def child_hold_slot(run_dir: str, claimed) -> None:
    claim_slot(run_dir, 1)
    claimed.set()
    while True:
        signal.pause()  # hold the lock until killed


# -- tests -----------------------------------------------------------------------------------------

@pytest.mark.slow
def test_claim_two_processes_never_hold_the_same_slot(store_dir):
    name = region_name(store_dir, "claims")
    run_dir = store_dir / "run"
    with SharedRegion.create(name, 4096) as region:
        children = [SPAWN.Process(target=child_claim_repeatedly, args=(name, str(run_dir), c))
                    for c in range(CLAIMER_COUNT)]
        for child in children:
            child.start()
        for child in children:
            child.join(120)
            assert child.exitcode == 0, "a claimer saw its slot held by someone else"
        counts = [struct.unpack_from("<qq", region.buf, COUNTS_OFFSET + c * 16)
                  for c in range(CLAIMER_COUNT)]
        assert all(holds == HOLDS_PER_CLAIMER for holds, _ in counts)
        assert sum(busy for _, busy in counts) > 0, "claimers never contended"
        region.unlink()


def test_claim_killed_holder_slot_is_claimable_again(store_dir):
    run_dir = store_dir / "run"
    claimed = SPAWN.Event()
    child = SPAWN.Process(target=child_hold_slot, args=(str(run_dir), claimed))
    child.start()
    assert claimed.wait(30), "child never claimed"
    assert is_slot_owner_alive(run_dir, 0)
    with pytest.raises(StoreError, match="all 1 slot slots are in use"):
        claim_slot(run_dir, 1)
    assert is_slot_owner_alive(run_dir, 0)  # the probe did not steal or drop it
    os.kill(child.pid, signal.SIGKILL)
    child.join(10)
    assert not is_slot_owner_alive(run_dir, 0)
    index, fd = claim_slot(run_dir, 1)
    assert index == 0
    assert is_slot_owner_alive(run_dir, 0)
    release_slot(fd)
    assert not is_slot_owner_alive(run_dir, 0)


def test_claim_lock_files_are_owner_only_and_missing_slot_has_no_owner(store_dir):
    run_dir = store_dir / "run"
    assert not is_slot_owner_alive(run_dir, 5)
    old_umask = os.umask(0)
    try:
        index, fd = claim_slot(run_dir, 3, prefix="waiter")
    finally:
        os.umask(old_umask)
    path = slot_lock_path(run_dir, index, prefix="waiter")
    assert path.name == f"waiter-{index}.lock"
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert index == os.getpid() % 3  # spread by pid
    assert is_slot_owner_alive(run_dir, index, prefix="waiter")
    assert not is_slot_owner_alive(run_dir, index)  # another family of slots
    release_slot(fd)
