"""The shared memory a supervisor creates for its store, and the cleanup of a crashed one's.

Created in this order after recovery (all owner-only, mode 0o600): the control block (state
STARTING, every position at the recovery cut), the consumers' waiter table, the producer
mailbox with its semaphores. Children's wakeup semaphores come with their ChildHandles.

A supervisor that died (SIGKILL, power cut) leaves its regions and semaphores in /dev/shm and
maybe children that have not yet noticed. The next supervisor holds the store lock, which
proves they are stale: it waits for the old children to exit (they check their parent every
100 ms; SIGKILL after a grace period), then unlinks every region and semaphore of the store.
"""

from __future__ import annotations

import logging
import os
import signal
import time
from dataclasses import dataclass
from pathlib import Path

import psutil

from engine.config import FlushPolicy
from ipc.control_block import (
    ControlBlock,
    Positions,
    ProcState,
    Role,
    flush_code_for,
    pid_alive,
    process_slot_index,
    remove_stale,
)
from ipc.mailbox import MailboxServer
from ipc.run_info import run_dir
from ipc.shm import forget_shm_token, issue_shm_token, unlink_stale_regions
from ipc.wakeup import WaiterTable, unlink_all

OLD_CHILD_GRACE_S = 3.0

log = logging.getLogger(__name__)


def cleanup_stale(store_dir: Path) -> int:
    """Remove what a dead supervisor left behind; returns its generation (0 if none)."""
    old_children = _old_children(store_dir)
    _wait_for_exit(old_children)
    generation = remove_stale(store_dir) or 0
    regions = unlink_stale_regions(store_dir)
    sems = unlink_all(store_dir)
    forget_shm_token(store_dir)
    if generation or regions or sems:
        log.info("removed shared memory of a previous supervisor (generation %d): %d regions, "
                 "%d semaphores", generation, len(regions) + (1 if generation else 0), len(sems))
    return generation


def _old_children(store_dir: Path) -> list[int]:
    try:
        ctl = ControlBlock.attach(store_dir)
    except Exception:
        return []
    try:
        return [slot.pid for slot in ctl.process_slots()
                if slot.role is not Role.SUPERVISOR and slot.state is not ProcState.EXITED
                and slot.pid != os.getpid() and pid_alive(slot.pid) and _is_our_child(slot.pid)]
    finally:
        ctl.close()


def _is_our_child(pid: int) -> bool:
    try:
        cmdline = " ".join(psutil.Process(pid).cmdline())
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return False
    return "workers.dispatcher" in cmdline or "workers.index_builder" in cmdline


def _wait_for_exit(pids: list[int]) -> None:
    deadline = time.monotonic() + OLD_CHILD_GRACE_S
    while pids and time.monotonic() < deadline:
        pids = [pid for pid in pids if pid_alive(pid)]
        time.sleep(0.05)
    for pid in pids:
        log.warning("child %d of a previous supervisor is still running: SIGKILL", pid)
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    deadline = time.monotonic() + OLD_CHILD_GRACE_S
    while any(pid_alive(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.02)


@dataclass
class SharedState:
    """The supervisor's regions: control block, waiter table, mailbox (+ their semaphores)."""

    ctl: ControlBlock
    waiters: WaiterTable
    server: MailboxServer
    store_dir: Path

    @classmethod
    def create(cls, store_dir: Path, *, shard_count: int, flush: FlushPolicy, commit_pos: int,
               generation: int, mailbox_slots: int) -> SharedState:
        issue_shm_token(store_dir)  # fresh names each start: nobody can create them first
        ctl = ControlBlock.create(store_dir, shard_count, flush_code_for(flush),
                                  generation=generation)
        created: list = [ctl]
        try:
            ctl.reset_positions(Positions.uniform(commit_pos, shard_count))
            index = process_slot_index(Role.SUPERVISOR)
            ctl.claim_process_slot(index, Role.SUPERVISOR, 0, os.getpid())
            ctl.set_process_state(index, ProcState.RUNNING)
            waiters = WaiterTable.create(store_dir)
            created.append(waiters)
            server = MailboxServer.create(store_dir, slot_count=mailbox_slots)
        except BaseException:
            for thing in reversed(created):
                thing.unlink()
                thing.close()
            unlink_all(store_dir)
            raise
        return cls(ctl, waiters, server, Path(store_dir))

    def reclaim_dead_consumers(self) -> list[str]:
        """Remove the waiter entries and semaphores of consumers that died (SIGKILL, SIGTERM)."""
        return self.waiters.reclaim_dead(run_dir(self.store_dir))

    def destroy(self) -> None:
        """Unlink and unmap everything, then forget the names (the supervisor's last act). The
        token's namespace ends here: every semaphore under it goes, consumers' too (a live one
        keeps its open handle; a dead one's would otherwise stay in /dev/shm for good)."""
        for thing in (self.server, self.waiters, self.ctl):
            try:
                thing.unlink()
            except Exception:
                log.exception("could not unlink %r", thing)
            thing.close()
        try:
            left = unlink_all(self.store_dir)
        except Exception:
            log.exception("could not remove the store's semaphores")
        else:
            if left:
                log.info("removed %d consumer semaphores at stop", len(left))
        try:
            forget_shm_token(self.store_dir)
        except OSError as exc:  # a failed disk: the next start or `recover` removes it
            log.warning("could not remove the shared-memory token: %s", exc)
