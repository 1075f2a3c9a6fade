"""The supervisor (`mqstore start`): owns the store, the commitlog writer and its children.

Start order (each step only after the previous one succeeded):

1. open the store with engine.store_open.open_store, the sequence MessageStore.open runs too:
   classify the directory (a RocketMQ store or anything else is refused), create a new store's
   layout, check store.json, take the store lock (a second supervisor is refused); then, under
   the lock, start writing the store's log (on_locked: a refused start writes nothing there),
   wait out and remove what a crashed previous supervisor left (children, shared memory);
   recover (logging progress and the report) and create `abort` (present until a clean stop
   removes it); keep the commitlog open for writing and hand the derived files to the children
   (Dispatch.CHILD_PROCESSES);
2. create the shared memory (owner-only) with every position at the recovery cut;
3. start the flush thread, the dispatcher and one index builder per shard, and wait for them
   to boot;
4. write run/supervisor.json, mark the store READY (producers are admitted), say so.

Then the loop: serve producer requests (Appender), watch children (exit, heartbeat) and restart
them within the restart budget, remove what dead consumers left in the waiter table (every
RECLAIM_INTERVAL_S), and handle queued signals. The checkpoint (every
cq_flush_interval_ms, from the durable positions the children publish) and run/supervisor.json
updates are written by the metadata thread (workers.metadata_writer), so a disk stall never
delays the answers and a full disk never stops the store.

Stop (SIGTERM, SIGINT, `mqstore stop`, or a fatal condition): stop admitting, answer what was
accepted after a last flush, let the dispatcher and index builders catch up (bounded wait),
stop them (they flush and publish their durable positions), write the last checkpoint, remove
`abort` only when every structure is durable up to the flushed position, remove the shared
memory and release the lock.
"""

from __future__ import annotations

import logging
import os
import queue
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from engine.config import FlushPolicy, StoreConfig
from engine.errors import DiskFullError, StoreError
from engine.files.open_files import raise_open_file_limit
from engine.files.store_dir import StoreLock, mark_clean_stop
from engine.formats.checkpoint import Checkpoint
from engine.store_open import Dispatch, open_store
from engine.topics.live import LiveTopics, describe
from engine.topics.table import TopicChange, TopicDefaults, TopicOp, TopicTableFile
from ipc.control_block import ProcState, Role, StoreState
from ipc.deleted_topic_offsets import forget_topic_offsets
from ipc.key_ring import REGION_KIND as KEY_RING_KIND
from ipc.refused_offsets import refusal_message, refuse_offsets_past_their_queues
from ipc.run_info import RunInfo, remove_run_info, write_run_info
from ipc.shm import region_name, unlink_stale
from ipc.topic_requests import PRUNE_INTERVAL_S, pending_requests, remove_stale_answers
from workers.appender import Appender
from workers.child_handle import ChildHandle
from workers.delivery_runner import DeliveryRunner
from workers.exit_codes import CliExit, ExitCode, describe_exit
from workers.fatal_log import last_error
from workers.flush_waiters import DeadlineWatch
from workers.group_commit import GroupCommit, fault_fsync_delay_s, fault_fsync_stall_path
from workers.metadata_writer import MetadataWriter
from workers.restart_policy import RestartSettings
from workers.retention_runner import RetentionRunner
from workers.shared_state import SharedState, cleanup_stale

SUPERVISE_INTERVAL_S = 0.1
RECLAIM_INTERVAL_S = 1.0  # how often what dead consumers left in the waiter table is removed
MAX_WAIT_S = 0.05
PROGRESS_INTERVAL_S = 2.0

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class SupervisorSettings:
    """Process-model tunables ([supervisor] table of the TOML config)."""

    restart: RestartSettings = field(default_factory=RestartSettings)
    child_timeout_s: float = 10.0
    boot_timeout_s: float = 60.0
    catch_up_timeout_s: float = 30.0
    child_stop_timeout_s: float = 10.0
    mailbox_slots: int = 64


class StartError(StoreError):
    """The store could not be started (a child could not boot, ...)."""


def _log_progress() -> Callable[[int, int], None]:
    """A recovery progress callback that logs at most every PROGRESS_INTERVAL_S."""
    last = [0.0]

    def progress(done: int, total: int) -> None:
        now = time.monotonic()
        if now - last[0] >= PROGRESS_INTERVAL_S:
            last[0] = now
            log.info("recovery: scanned %d of %d MiB", done >> 20, max(total, 1) >> 20)

    return progress


def _logged_cause(root: Path, pid: int | None) -> str:
    """'; it logged: <its last error line>' for a child that logged an error, else ''."""
    line = last_error(root, pid) if pid is not None else None
    return f"; it logged: {line}" if line else ""


class Supervisor:
    def __init__(self, root: str | Path, config: StoreConfig | None = None,
                 settings: SupervisorSettings | None = None, *,
                 on_locked: Callable[[], None] | None = None,
                 on_ready: Callable[[Supervisor], None] | None = None):
        self.root = Path(root)
        self.config = config or StoreConfig()
        self.settings = settings or SupervisorSettings()
        self.on_locked = on_locked  # first thing once the store's lock is held (its log opens)
        self.on_ready = on_ready
        self.open_lines: list[str] = []  # what opening the store did (OpenedStore.summary_lines)
        self.children: list[ChildHandle] = []
        self.run_info: RunInfo | None = None
        self.exit_code = CliExit.OK
        self.stop_reason: str | None = None
        self._signals: queue.SimpleQueue[int] = queue.SimpleQueue()
        self._lock: StoreLock | None = None
        self._shared: SharedState | None = None
        self._group_commit: GroupCommit | None = None
        self._appender: Appender | None = None
        self._deadlines: DeadlineWatch | None = None
        self._metadata: MetadataWriter | None = None
        self._retention: RetentionRunner | None = None
        self._delivery: DeliveryRunner | None = None
        self._commitlog = None
        self._next_request_prune = 0.0  # monotonic: when stale topic answers are next removed
        self._started_at = time.time()
        self._generation = 0

    # ------------------------------------------------------------------------------- start
    def run(self) -> int:
        """Start, serve until stopped, stop. Returns the CLI exit code."""
        self._install_signal_handlers()
        try:
            self.start()
        except BaseException:
            self._cleanup_after_failed_start()
            raise
        try:
            self.serve()
        except Exception as exc:  # a bug of ours: said in the log, the store stops as FAILED
            log.exception("the supervisor's loop failed")
            self._fail(f"the supervisor's loop failed: {type(exc).__name__}: {exc}")
        finally:
            self.shutdown()
        return self.exit_code

    def start(self) -> None:
        raise_open_file_limit()
        opened = open_store(self.root, self.config, writer="a supervisor",
                            dispatch=Dispatch.CHILD_PROCESSES, progress=_log_progress(),
                            after_lock=self._clear_stale)
        self._lock, self.config = opened.lock, opened.config
        self.open_lines = opened.summary_lines()
        self._commitlog, self._next_offsets = opened.commitlog, opened.next_offsets
        for refused in refuse_offsets_past_their_queues(self.root, self._next_offsets):
            log.warning("%s", refusal_message(refused))  # before any consumer reads from it
        meta, generation = opened.meta, self._generation
        cut = self._commitlog.written_pos
        self._shared = SharedState.create(self.root, shard_count=self.config.index_shards,
                                          flush=self.config.flush, commit_pos=cut,
                                          generation=generation,
                                          mailbox_slots=self.settings.mailbox_slots)
        ctl = self._shared.ctl
        stall_path = fault_fsync_stall_path()
        self._group_commit = GroupCommit(self._commitlog, ctl, self.config,
                                         on_flushed=self._on_flushed,
                                         fault_delay_s=fault_fsync_delay_s(),
                                         fault_stall_path=stall_path)
        topics = LiveTopics(TopicTableFile(self.root), opened.topics,
                            TopicDefaults(self.config.queue_count, self.config.auto_create_topic))
        self._appender = Appender(self._commitlog, self._shared.server, self._group_commit,
                                  self.config, self._next_offsets, root=self.root, topics=topics)
        self._group_commit.on_idle = self._appender.sweep_if_stuck
        self._group_commit.start()
        self._deadlines = DeadlineWatch(self._appender.waiters)
        self._deadlines.start()
        self._retention = RetentionRunner(self.root, self._commitlog, self.config, ctl,
                                          self._group_commit)
        self._retention.publish_start()
        self._delivery = DeliveryRunner(self.root, self._commitlog, self.config, ctl, self._appender,
                                        self._group_commit)
        self._retention.scheduled_pos = self._delivery.waiting_pos
        self._start_children()
        self.run_info = RunInfo(
            supervisor_pid=os.getpid(), generation=generation, store_host=meta.store_host,
            queue_count=self.config.queue_count, max_body_bytes=self.config.max_body_bytes,
            flush=self.config.flush.value, sync_flush_timeout_ms=self.config.sync_flush_timeout_ms,
            index_shards=self.config.index_shards, started_at=self._started_at, ready_at=time.time(),
            delay_level_count=len(self.config.delay_levels_ms),
            timer_max_delay_s=self.config.timer_max_delay_s)
        write_run_info(self.root, self.run_info)
        self._metadata = MetadataWriter(self.root, ctl, self._group_commit,
                                        self.config.cq_flush_interval_ms / 1000.0,
                                        segment_bytes=self._commitlog.segment_bytes,
                                        shard_count=self.config.index_shards,
                                        on_error=self._shared.server.wakeup.post,
                                        fault_stall_path=stall_path)
        self._metadata.start()
        ctl.set_store_state(StoreState.READY)
        log.info("mqstore ready: store %s, pid %d, flush %s, %d index shards, commit_pos %d",
                 self.root, os.getpid(), self.config.flush.value, self.config.index_shards, cut)
        if self._group_commit._fault_delay_s:
            log.warning("fault injection: every flush is delayed by %.0f ms",
                        self._group_commit._fault_delay_s * 1000)
        if stall_path is not None:
            log.warning("fault injection: flushes and checkpoints stall while %s exists", stall_path)
        if self.on_ready is not None:
            self.on_ready(self)

    def _clear_stale(self) -> None:
        """Under the lock: on_locked, then wait out and remove what a crashed previous supervisor
        left."""
        if self.on_locked is not None:
            self.on_locked()
        self._generation = cleanup_stale(self.root) + 1

    def _start_children(self) -> None:
        ctl = self._shared.ctl
        roles = [(Role.DISPATCHER, 0)] + [(Role.INDEX_BUILDER, s)
                                          for s in range(self.config.index_shards)]
        for role, shard in roles:
            self.children.append(ChildHandle(role, shard, self.root, self.config, ctl,
                                             self.settings.restart))
        for child in self.children:
            child.spawn()
        deadline = time.monotonic() + self.settings.boot_timeout_s
        for child in self.children:
            while child.state() is not ProcState.RUNNING:
                code = child.poll()
                if code is not None:
                    raise StartError(f"{child.name} could not boot: {describe_exit(code)}"
                                     f"{_logged_cause(self.root, child.pid)}",
                                     path=str(self.root), hint=f"see {self.root / 'mqstore.log'}")
                if time.monotonic() > deadline:
                    raise StartError(f"{child.name} did not boot within "
                                     f"{self.settings.boot_timeout_s:g} s", path=str(self.root))
                time.sleep(0.01)

    def _cleanup_after_failed_start(self) -> None:
        for child in self.children:
            child.stop(self.settings.child_stop_timeout_s)
        if self._metadata is not None:
            self._metadata.stop()
            self._metadata.close()
        if self._deadlines is not None:
            self._deadlines.stop()
        if self._group_commit is not None:
            self._group_commit.stop()
        self._destroy_shared()
        if self._commitlog is not None:
            self._commitlog.close()
        if self._lock is not None:
            self._lock.release()

    # ------------------------------------------------------------------------------- serve
    def serve(self) -> None:
        """The loop: requests, children, signals; returns when asked to stop."""
        ctl = self._shared.ctl
        appender, server = self._appender, self._shared.server
        next_supervise = next_reclaim = time.monotonic()
        while self.stop_reason is None:
            timeout = MAX_WAIT_S
            deadline = appender.next_deadline()
            if deadline is not None:
                timeout = max(0.0, min(timeout, deadline - time.monotonic()))
            server.wait_for_requests(min(timeout, self._delivery.wait_s(time.monotonic())))
            if appender.sweep() and self.config.flush is FlushPolicy.ASYNC:
                self._wake_dispatcher()
            self._handle_signals()
            if self._group_commit.error is not None:
                self._fail(f"flushing the commitlog failed: {self._group_commit.error}")
            if appender.write_error is not None:
                self._fail(f"writing the commitlog failed: {appender.write_error}")
            if self._metadata.error is not None:
                self._fail(f"flushing {self._metadata.failed_file} failed: {self._metadata.error}")
            now = time.monotonic()
            if self._delivery.run_if_due(now) and self.config.flush is FlushPolicy.ASYNC:
                self._wake_dispatcher()
            if now >= next_supervise:
                ctl.heartbeat(0)
                self._supervise_children(now)
                self._retention.run_if_due(now)
                self._serve_topic_requests()
                next_supervise = now + SUPERVISE_INTERVAL_S
            if now >= next_reclaim:
                self._reclaim_dead_consumers()
                next_reclaim = now + RECLAIM_INTERVAL_S

    def _serve_topic_requests(self) -> None:
        """Apply each `mqstore topic` change waiting in run/topic-requests, or say why not; the
        dispatcher is woken to drop a deleted topic's queues at once."""
        now = time.monotonic()
        if now >= self._next_request_prune:
            remove_stale_answers(self.root)
            self._next_request_prune = now + PRUNE_INTERVAL_S
        for request in pending_requests(self.root):
            try:
                change = TopicChange.from_dict(request.change)
                table = self._appender.change_topic(change)
                answer = {"ok": describe(table, change.topic)}
                if change.op is TopicOp.DELETE:
                    answer["groups_reset"] = self._forget_offsets(change.topic)
            except (StoreError, OSError) as exc:  # refused, or topics.json not written: unchanged
                answer = {"error": str(exc)}
            # an operator's request must never stop the store that holds acknowledged messages:
            # a bug it hits is logged with its traceback and answered, and the loop goes on
            except Exception as exc:
                log.exception("topic request %s failed", request.path.name)
                answer = {"error": f"the supervisor failed to apply it ({type(exc).__name__}: {exc}); "
                                   "see mqstore.log"}
            try:
                request.answer(answer)
            except OSError as exc:  # the command times out and withdraws it
                log.error("topic request %s not answered: %s", request.path.name, exc)
            if "ok" in answer:
                self._wake_dispatcher()

    def _forget_offsets(self, topic: str) -> list[str]:
        """A deleted topic's offsets go as part of the delete, not only in the CLI after the
        answer (which may die first); a file that fails here is the CLI's reset's to retry."""
        try:
            return forget_topic_offsets(self.root, topic)
        except (StoreError, OSError) as exc:
            log.warning("offsets of deleted topic %s not removed: %s", topic, exc)
            return []

    def _reclaim_dead_consumers(self) -> None:
        removed = self._shared.reclaim_dead_consumers()
        if removed:
            log.info("removed the semaphores of %d consumers that died: %s", len(removed),
                     ", ".join(removed))

    def _on_flushed(self) -> None:
        """Called by the flush thread after each flush (or its failure): answer the producers
        the flush made durable, wake the dispatcher (it wakes the index builders after each of
        its blocks). The loop is woken only when it must act: a failed flush, or a stop
        waiting for the last answers."""
        if self._group_commit.error is not None or not self._appender.admitting:
            self._shared.server.wakeup.post()
        else:
            self._appender.answer_flushed()
        if self.config.flush is FlushPolicy.SYNC:
            self._wake_dispatcher()

    def _wake_dispatcher(self) -> None:
        for child in self.children:
            if child.role is Role.DISPATCHER:
                child.wakeup.post()

    def _wake_children(self) -> None:
        for child in self.children:
            child.wakeup.post()

    def _supervise_children(self, now: float) -> None:
        for child in self.children:
            if child.restart_at is not None:
                if now >= child.restart_at:
                    child.spawn()
                continue
            reason = child.is_hung(self.settings.child_timeout_s, self.settings.boot_timeout_s)
            if reason is not None:
                log.error("%s (pid %d) is hung (%s): SIGKILL", child.name, child.pid, reason)
                child.kill(f"hung: {reason}")
            code = child.poll()
            if code is None or child.restart_at is not None:
                continue
            self._handle_exit(child, code, now)
            if self.stop_reason is not None:
                return

    def _handle_exit(self, child: ChildHandle, code: int, now: float) -> None:
        decision = child.policy.on_exit(code, child.ran_for_s(), child.killed_for)
        cause = _logged_cause(self.root, child.pid) if code != ExitCode.OK else ""
        entry = {"at": time.time(), "role": child.role.name.lower(), "shard": child.shard,
                 "pid": child.pid, "what": decision.reason}
        self.run_info = self.run_info.replace(restart_history=[*self.run_info.restart_history, entry])
        self._metadata.post_run_info(self.run_info)
        if decision.restart:
            log.warning("%s (pid %d) %s%s", child.name, child.pid, decision.reason, cause)
            child.restart_at = now + decision.delay_s
        else:
            self._fail(f"{child.name} (pid {child.pid}) {decision.reason}; stopping the store{cause}")

    def _fail(self, reason: str) -> None:
        if self.stop_reason is not None and self.exit_code == CliExit.FAILED:
            return  # the first failure is the reason; the others follow from it
        log.error("%s", reason)
        self.stop_reason = reason
        self.exit_code = CliExit.FAILED

    def request_stop(self, reason: str = "stop requested") -> None:
        if self.stop_reason is None:
            self.stop_reason = reason

    # ------------------------------------------------------------------------------- signals
    def _install_signal_handlers(self) -> None:
        def enqueue(signum, _frame):  # NO LOGGING: only enqueue
            self._signals.put_nowait(signum)

        for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            signal.signal(signum, enqueue)

    def _handle_signals(self) -> None:
        if self._signals.empty():  # once a sweep: a look costs less than a failed get
            return
        while True:
            try:
                signum = self._signals.get_nowait()
            except queue.Empty:
                return
            name = signal.Signals(signum).name
            if signum == signal.SIGHUP:
                log.info("SIGHUP: nothing to reload")
                continue
            log.info("%s: stopping", name)
            self.request_stop(name)

    # ------------------------------------------------------------------------------- checkpoint
    def _final_checkpoint(self) -> Checkpoint | None:
        """The stop's checkpoint, written here (the metadata thread has ended); None if not written."""
        self._metadata.stop()
        try:
            if self._metadata.error is not None:
                return None  # the disk failed; the next start recovers from the last checkpoint
            return self._metadata.write_checkpoint()
        except DiskFullError as exc:
            log.warning("disk full: the last checkpoint was not written (%s)", exc)
        except OSError as exc:
            self._fail(f"flushing the checkpoint failed: {exc}")
        finally:
            self._metadata.close()
        return None

    # ------------------------------------------------------------------------------- stop
    def shutdown(self) -> None:
        """Stop admitting, finish, flush, let children catch up, checkpoint, clean up."""
        reason = self.stop_reason or "stop requested"
        ctl = self._shared.ctl
        ctl.set_store_state(StoreState.STOPPING)
        log.info("stopping (%s)", reason)
        appender = self._appender
        appender.admitting = False
        self._finish_accepted()
        self._group_commit.stop()
        self._deadlines.stop()
        appender.sweep()
        flushed = self._group_commit.published_flushed
        caught_up = self._wait_for_children(flushed)
        clean = caught_up
        for child in self.children:
            if child.running:
                code = child.stop(self.settings.child_stop_timeout_s)
                if code != ExitCode.OK:
                    log.warning("%s %s while stopping", child.name, child.describe(code))
                    clean = False
        appender.sweep()
        self._delivery.maybe_save(time.monotonic(), min_interval_s=0.0)
        self._delivery.close()
        cp = self._final_checkpoint()
        durable = -1 if cp is None else min([cp.cq_durable_pos, *cp.index_durable_pos])
        if clean and durable >= flushed and flushed == self._commitlog.written_pos:
            mark_clean_stop(self.root)
            log.info("stopped cleanly at commit_pos %d", flushed)
        else:
            log.warning("stopped with derived files behind the commitlog (durable %d < %d); the "
                        "next start recovers them", durable, flushed)
        ctl.set_store_state(StoreState.STOPPED if self.exit_code == CliExit.OK else StoreState.FAILED)
        try:
            remove_run_info(self.root)
        except OSError as exc:  # a failed disk (read-only after errors): clients check the pid
            log.warning("could not remove %s: %s", "run/supervisor.json", exc)
        self._destroy_shared()
        self._commitlog.close()
        self._lock.release()
        if self.stop_reason and self.exit_code != CliExit.OK:
            log.error("store stopped: %s", self.stop_reason)

    def _finish_accepted(self) -> None:
        """Answer every request accepted before admission stopped (bounded by the flush timeout)."""
        deadline = time.monotonic() + self.config.sync_flush_timeout_ms / 1000.0 + 1.0
        while time.monotonic() < deadline:
            self._appender.sweep()
            if not self._appender.waiting_count or self._group_commit.error is not None:
                return
            self._shared.server.wait_for_requests(MAX_WAIT_S)

    def _wait_for_children(self, flushed: int) -> bool:
        """Wait until the dispatcher and every builder processed up to `flushed` (bounded)."""
        ctl = self._shared.ctl
        deadline = time.monotonic() + self.settings.catch_up_timeout_s
        for child in self.children:
            if child.restart_at is not None:  # in its restart backoff: it must catch up too
                child.spawn()
        self._wake_children()
        while time.monotonic() < deadline:
            try:
                snap = ctl.snapshot()
            except StoreError:
                return False
            if snap.dispatched_pos >= flushed and min(snap.shard_processed_pos) >= flushed:
                return True
            if not all(child.running for child in self.children):
                log.warning("a child is not running; the derived files stay behind")
                return False
            self._shared.server.wait_for_requests(MAX_WAIT_S)
            self._appender.sweep()
            ctl.heartbeat(0)
        log.warning("children did not catch up within %g s", self.settings.catch_up_timeout_s)
        return False

    def _destroy_shared(self) -> None:
        for child in self.children:
            try:
                child.unlink()
            except Exception:
                log.exception("could not unlink the wakeup of %s", child.name)
            child.close()
        self.children = []
        if self._shared is not None:
            # the dispatcher's key ring: its children remove it when they can, but the supervisor
            # outlives them all, so it makes sure nothing of the store stays in /dev/shm
            unlink_stale(region_name(self.root, KEY_RING_KIND))
            self._shared.destroy()
            self._shared = None
