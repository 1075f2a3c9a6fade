"""Kill rounds: run a load, SIGKILL a target at a random moment, restart it, verify.

One round:

1. start the supervisor (`mqstore start`) on the store and wait until it is READY;
2. start the load producers (tools.torture.load), each with its own fsynced ledger;
3. for each kill of the round: wait for a random number of new acknowledgements, wait a random
   0-30 ms more (so kills land in every phase: mid-append, mid-flush, mid-checkpoint), then
   SIGKILL the target and restart what is needed:
   - supervisor: its children exit by themselves, the producers see SERVICE_NOT_AVAILABLE and
     exit; `mqstore start` again (abnormal recovery), new producers. With `fault=power-loss` the
     whole store is first frozen (SIGSTOP, waited for), its durable positions read from the
     control block, then everything is killed and tools.torture.faults drops what the page
     cache had not written back before the restart; every `damage_every`th power loss also
     flips a byte below the durable line (tools.torture.durable_damage): the start must refuse
     it and the operator's `mqstore recover --rebuild` cut there before the restart (every
     second such damage that a valid record follows: `mqstore recover --salvage` instead);
   - dispatcher / index (a random shard): the supervisor restarts it; we wait for the new pid
     to run;
   - producer: one producer process dies mid-request; a new one takes its place;
4. wait for new acknowledgements after the last restart (the store accepts writes again);
5. stop the producers (SIGTERM: each finishes its batch), stop the supervisor (SIGTERM, exit 0);
6. verify (tools.torture.verify): check(root) is empty and the ledger agrees with the store.

Recovery time is measured from the kill to the store serving again: READY after a supervisor
restart, the replacement child RUNNING, or the replacement producer's first acknowledgement.
The engine's own recovery time (the RecoveryReport's duration, from the supervisor's log) is
kept apart. All randomness comes from one seed, printed with the figures.
"""

from __future__ import annotations

import os
import random
import re
import shutil
import signal
import time
import traceback
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from engine.errors import StoreError
from engine.files.naming import ABORT_FILE
from ipc import seqlock
from ipc.control_block import (
    DISPATCHER_GROUP,
    DISPATCHER_GROUP_OFFSET,
    GROUP_SIZE,
    SHARD_GROUP,
    SHARD_GROUPS_OFFSET,
    SUPERVISOR_GROUP,
    SUPERVISOR_GROUP_OFFSET,
    Role,
)
from tools.store_process import StoreProcess, StoreProcessError, is_stopped, wait_until, write_store_config
from tools.torture.durable_damage import (
    damage_below_line,
    expect_refused_start,
    rebuild_and_compare,
    salvage_and_compare,
)
from tools.torture.faults import DurablePositions, Tear, simulate_power_loss
from tools.torture.figures import Figures, RoundRecord
from tools.torture.hostile import acks_path, attack, verify_hostile_acks
from tools.torture.ledger import LedgerReader
from tools.torture.offset_damage import DAMAGES, OffsetDamage, retention_overrides
from tools.torture.processes import ProducerFleet, TortureError
from tools.torture.verify import (
    AcceptedDamage,
    OperatorCut,
    PowerLoss,
    VerifyState,
    store_config,
    verify_store,
)

KILL_TARGETS = ("supervisor", "dispatcher", "index", "producer")  # what `random` picks from
TARGETS = (*KILL_TARGETS, "hostile")
FAULTS = ("kill", "power-loss", "offsets")
ACK_TIMEOUT_S = 120.0
HOSTILE_REQUESTS = 300  # per hostile round: enough random flips to reach every header field's check
KILL_JITTER_S = 0.03
# the RecoveryReport line the supervisor logs: "... from commit_pos X to CUT in MS ms"
_ENGINE_RECOVERY_RE = re.compile(r"bytes from commit_pos \d+ to (\d+) in (\d+) ms")

# Small files so that segment rolls, fillers, consume-queue and index file rolls and
# multi-file recovery happen in every few rounds; checkpoints every 100 ms.
TORTURE_STORE = {
    "commitlog_file_size": 256 * 1024,
    "consume_queue_entries": 256,
    "index_slot_count": 128,
    "index_entry_count": 512,
    "index_shards": 2,
    "queue_count": 4,
    "cq_flush_interval_ms": 100,
    "index_flush_interval_ms": 100,
    "max_body_bytes": 8192,
    "async_flush_interval_ms": 100,
    "async_flush_thorough_interval_ms": 1000,
}


@dataclass
class TortureSettings:
    store_dir: Path
    rounds: int = 20
    target: str = "random"
    flush: str = "sync"
    fault: str = "kill"
    tear: Tear = Tear.PAGE
    seed: int | None = None
    producers: int = 2
    kills_per_round: int = 1
    damage_every: int = 2  # every Nth power loss also damages a record below the durable line
    acks_before_kill: tuple[int, int] = (20, 300)
    acks_after_restart: int = 20
    rounds_per_store: int = 0  # 0: one store for the whole run
    max_batch: int = 8
    max_body_bytes: int = 6000
    work_dir: Path | None = None
    offset_damages: tuple[str, ...] = DAMAGES  # the offsets fault: what it damages between kills
    store_overrides: dict = field(default_factory=dict)
    supervisor_overrides: dict = field(default_factory=dict)
    progress: Callable[[str], None] | None = None


class TortureRun:
    """One torture run: `run()` returns the Figures (their `failure` says what broke first)."""

    def __init__(self, settings: TortureSettings):
        self.settings = s = settings
        if s.target not in (*TARGETS, "random"):
            raise ValueError(f"unknown target {s.target!r}")
        if s.fault not in FAULTS:
            raise ValueError(f"unknown fault {s.fault!r}")
        self.seed = s.seed if s.seed is not None else random.SystemRandom().randrange(2**32)
        self.rng = random.Random(self.seed)
        self.root = Path(s.store_dir)
        self.work_dir = Path(s.work_dir or self.root.with_name(self.root.name + ".torture"))
        self.figures = Figures(seed=self.seed, flush=s.flush, fault=s.fault, target=s.target)
        self._tag_seq = 0
        self._power_loss_count = 0
        self._damages = 0  # damages below the durable line so far: every second one is salvaged
        self._acked_in_old_stores = self._timed_out_in_old_stores = 0
        self._statuses_in_old_stores: Counter[str] = Counter()
        self._round_tags: list[str] = []
        self.store: StoreProcess | None = None
        self.fleet: ProducerFleet | None = None
        self.offset_damage: OffsetDamage | None = None

    # ------------------------------------------------------------------------------ run
    def run(self) -> Figures:
        if self.root.exists() and any(self.root.iterdir()):
            raise TortureError(f"{self.root} is not empty: the torture needs a new store "
                               "(it never touches existing data)")
        started = time.monotonic()
        self._clear_work_dir()
        self._new_store(first=True)
        try:
            for number in range(1, self.settings.rounds + 1):
                if self._needs_new_store(number):
                    self._new_store()
                record = self._run_round(number)
                self.figures.add_round(record)
                self._say(self._round_line(record))
                if record.problems:
                    self.figures.failure = f"round {number}: " + "; ".join(record.problems)
                    break
        except StoreProcessError as exc:  # a TortureError or a store process's timeout
            self.figures.failure = str(exc)
        except Exception as exc:  # any other error ends the run as a failure, traceback kept
            self.figures.failure = "".join(traceback.format_exception(exc)[-6:])
        finally:
            self._kill_everything()
            self.figures.duration_s = time.monotonic() - started
        return self.figures

    def _clear_work_dir(self) -> None:
        """Ledgers of an earlier run describe another store: start the work directory afresh."""
        if not self.work_dir.exists():
            return
        ours = {"ledgers", "logs", "store.toml"}
        foreign = sorted(p.name for p in self.work_dir.iterdir() if p.name not in ours)
        if foreign:
            raise TortureError(f"{self.work_dir} holds files the torture did not make: {foreign}")
        shutil.rmtree(self.work_dir)

    def _needs_new_store(self, number: int) -> bool:
        per = self.settings.rounds_per_store
        return bool(per) and number > 1 and (number - 1) % per == 0

    def _new_store(self, *, first: bool = False) -> None:
        """A fresh store and ledger (the previous one was verified at the end of its last round)."""
        if not first:
            self._acked_in_old_stores, self._timed_out_in_old_stores = \
                self.figures.acked, self.figures.timed_out
            self._statuses_in_old_stores = self.figures.producer_statuses.copy()
            self.figures.stores += 1
            shutil.rmtree(self.root)
            shutil.rmtree(self.work_dir)
        for sub in ("ledgers", "logs"):
            (self.work_dir / sub).mkdir(parents=True, exist_ok=True)
        self.state = VerifyState()
        self.ledger = LedgerReader(self.work_dir / "ledgers")
        offsets_fault = self.settings.fault == "offsets"
        config = write_store_config(
            self.work_dir / "store.toml",
            {**TORTURE_STORE, "flush": self.settings.flush,
             **(retention_overrides() if offsets_fault else {}), **self.settings.store_overrides},
            self.settings.supervisor_overrides)
        previous = self.offset_damage
        self.offset_damage = (OffsetDamage(self.root, self.rng, self.settings.offset_damages)
                              if offsets_fault else None)
        if previous is not None and self.offset_damage is not None:
            self.offset_damage.figures = previous.figures  # totals over every store of the run
        self.store = StoreProcess(self.root, config, self.work_dir / "logs" / "supervisor.log")
        self.fleet = ProducerFleet(self.root, self.work_dir / "ledgers", self.work_dir / "logs",
                                   max_batch=self.settings.max_batch,
                                   max_body_bytes=self.settings.max_body_bytes)

    # ------------------------------------------------------------------------------ a round
    def _run_round(self, number: int) -> RoundRecord:
        s = self.settings
        target = self.rng.choice(KILL_TARGETS) if s.target == "random" else s.target
        fault = {"supervisor": s.fault, "hostile": "requests"}.get(target, "kill")
        record = RoundRecord(number, target, fault)
        started = time.monotonic()
        self.store.start()
        self._round_tags = []
        for _ in range(s.producers):  # they boot while the store does, and attach once it is ready
            self._spawn_producer(number)
        self.store.wait_ready()
        for _ in range(s.kills_per_round):
            self._wait_new_acks(self.rng.randint(*s.acks_before_kill))
            time.sleep(self.rng.uniform(0.0, KILL_JITTER_S))  # a random moment, not a wait
            self._kill(target, record, number)
        self._wait_new_acks(s.acks_after_restart)
        self._count_unprovoked_restarts(record)
        self.fleet.stop_all()
        self._stop_store(record)
        self._verify(record)
        record.duration_s = round(time.monotonic() - started, 2)
        return record

    def _spawn_producer(self, number: int) -> str:
        self._tag_seq += 1
        tag = f"r{number:04d}p{self._tag_seq:05d}"
        self.fleet.spawn(tag, self.rng.randrange(2**31))
        self._round_tags.append(tag)
        return tag

    def _wait_new_acks(self, count: int) -> None:
        baseline = self.ledger.count_lines(self._round_tags)

        def enough():
            if not self.fleet.tags or not self.store.running:
                raise TortureError(f"the load stopped (producers {self.fleet.tags}, supervisor "
                                   f"running {self.store.running}):\n{self.store.log_text()[-3000:]}")
            return self.ledger.count_lines(self._round_tags) >= baseline + count

        wait_until(enough, f"{count} more acknowledgements", ACK_TIMEOUT_S)

    # ------------------------------------------------------------------------------ kills
    def _kill(self, target: str, record: RoundRecord, number: int) -> None:
        if target == "supervisor":
            self._kill_supervisor(record, number)
        elif target == "dispatcher":
            self._kill_child(Role.DISPATCHER, 0, record)
        elif target == "index":
            shards = store_config(self.root).index_shards
            self._kill_child(Role.INDEX_BUILDER, self.rng.randrange(shards), record)
        elif target == "hostile":
            self._attack(record)
        else:
            self._kill_producer(record, number)
        record.kills += 1

    def _kill_supervisor(self, record: RoundRecord, number: int) -> None:
        s = self.settings
        offsets = self.offset_damage if record.fault == "offsets" else None
        if offsets is not None:
            offsets.consume_twice()
        children = self.store.child_pids()
        durable = self._freeze(children) if record.fault == "power-loss" else None
        self.store.kill()
        for pid in children if durable is not None else ():
            _kill_quietly(pid)
        self.store.wait_orphans_gone(children)
        self.fleet.wait_all_exited()
        if durable is not None:
            loss = simulate_power_loss(self.root, durable, store_config(self.root), self.rng, s.tear)
            self.state.power_losses.append(PowerLoss(time.time_ns() // 1_000_000,
                                                     durable.commitlog_flushed_pos))
            record.power_loss = loss.summary()
            self._power_loss_count += 1
            if s.damage_every and self._power_loss_count % s.damage_every == 0:
                self._damage_below_line(record)
        if offsets is not None:
            record.damage = "; ".join(filter(None, (record.damage, offsets.damage_while_down())))
        began = time.monotonic()
        self.store.start()
        for _ in range(self.settings.producers):
            self._spawn_producer(number)
        self.store.wait_ready()
        record.recovery_ms.append((time.monotonic() - began) * 1000)
        self.figures.restarts["supervisor"] += 1
        match = _ENGINE_RECOVERY_RE.search(self.store.log_text())
        if match:
            record.engine_recovery_ms.append(float(match.group(2)))
        # forget what the log held past the recovery cut (unknown: rescan it all)
        self.state.log.invalidate_from(int(match.group(1)) if match else 0)
        if offsets is not None:
            record.problems += offsets.check_after_restart()

    def _damage_below_line(self, record: RoundRecord) -> None:
        """Flip a byte below the durable line: start must refuse; the operator's rebuild cut there
        and quarantine the rest byte for byte, or (every second damage a valid record follows)
        the operator's salvage keep everything else in place (tools.torture.durable_damage)."""
        damage = damage_below_line(self.root, store_config(self.root), self.rng)
        if damage is None:
            return
        commit_pos = damage.commit_pos
        expect_refused_start(self.store, commit_pos)
        self._damages += 1
        if damage.followed and self._damages % 2 == 0:
            self._salvage(record, commit_pos)
            return
        cut_pos, quarantined = rebuild_and_compare(self.store, commit_pos)
        self.state.operator_cuts.append(OperatorCut(time.time_ns() // 1_000_000, cut_pos))
        self.state.log.invalidate_from(cut_pos)
        self.figures.rebuilds += 1
        record.power_loss += (f"; damage at {commit_pos} below the durable line: start refused, "
                              f"rebuild cut at {cut_pos} and quarantined {quarantined} bytes")

    def _salvage(self, record: RoundRecord, commit_pos: int) -> None:
        cut_pos, spans = salvage_and_compare(self.store, commit_pos)
        at_ms = time.time_ns() // 1_000_000
        for start, end in spans:
            self.state.salvages.append(AcceptedDamage(at_ms, start, end))
            self.state.log.forget_span(start, end)
        self.state.log.invalidate_from(cut_pos)
        self.figures.salvages += 1
        record.power_loss += (f"; damage at {commit_pos} below the durable line: start refused, "
                              f"salvage accepted {spans}, cut at {cut_pos}")

    def _freeze(self, children: list[int]) -> DurablePositions:
        """SIGSTOP the supervisor and its children; the durable positions at that instant."""
        pids = [self.store.pid, *children]
        for pid in pids:
            os.kill(pid, signal.SIGSTOP)
        wait_until(lambda: all(is_stopped(p) for p in pids), "the store to freeze", 30.0)
        with self.store.ctl() as ctl:
            return frozen_positions(ctl)

    def _kill_child(self, role: Role, shard: int, record: RoundRecord) -> None:
        pid = self.store.child_pid(role, shard)
        os.kill(pid, signal.SIGKILL)
        began = time.monotonic()
        self.store.wait_child_replaced(role, pid, shard)
        record.recovery_ms.append((time.monotonic() - began) * 1000)
        self.figures.restarts[role.name.lower()] += 1

    def _kill_producer(self, record: RoundRecord, number: int) -> None:
        victim = self.rng.choice(self.fleet.tags)
        self.fleet.kill(victim)
        began = time.monotonic()
        tag = self._spawn_producer(number)
        wait_until(lambda: self.ledger.count_lines([tag]) > 0, "the new producer's first ack",
                   ACK_TIMEOUT_S)
        record.recovery_ms.append((time.monotonic() - began) * 1000)
        self.figures.restarts["producer"] += 1

    def _attack(self, record: RoundRecord) -> None:
        """A hostile client's requests beside the ledger producers: the store must answer every
        one and keep every process it had (no stop, no child restart)."""
        children = self.store.child_pids()
        counts, problems = attack(self.root, self.work_dir / "logs", self.rng.randrange(2**31),
                                  HOSTILE_REQUESTS)
        self.figures.hostile_statuses.update(counts)
        record.problems += problems
        if not self.store.running or self.store.child_pids() != children:
            record.problems.append("the store stopped or lost a process under hostile requests:\n"
                                   f"{self.store.log_text()[-3000:]}")

    def _count_unprovoked_restarts(self, record: RoundRecord) -> None:
        """Child restarts the supervisor made that we did not cause (a child crashed)."""
        with self.store.ctl() as ctl:
            restarts = sum(slot.restarts for slot in ctl.process_slots()
                           if slot.role is not Role.SUPERVISOR)
        provoked = record.kills if record.target in ("dispatcher", "index") else 0
        if restarts > provoked:
            self.figures.restarts["unprovoked child"] += restarts - provoked

    # ------------------------------------------------------------------------------ end of round
    def _stop_store(self, record: RoundRecord) -> None:
        code = self.store.stop()
        if code != 0:
            record.problems.append(f"the supervisor stopped with exit code {code}:\n"
                                   f"{self.store.log_text()[-3000:]}")
        if (self.root / ABORT_FILE).exists():
            self.figures.unclean_stops += 1

    def _verify(self, record: RoundRecord) -> None:
        report = verify_store(self.root, self.ledger.read_all(), self.state)
        f = self.figures
        f.acked = self._acked_in_old_stores + report.acknowledged
        f.timed_out = self._timed_out_in_old_stores + report.timed_out
        f.lost = len(report.lost)
        f.lost_unflushed += len(report.lost_unflushed)
        f.lost_to_rebuild += len(report.lost_to_rebuild)
        f.lost_to_salvage += len(report.lost_to_salvage)
        f.duplicated = len(report.duplicated)
        f.mismatched = len(report.mismatched)
        f.index_missing = len(report.index_missing)
        f.check_findings = len(report.findings)
        f.producer_statuses = self._statuses_in_old_stores + self.fleet.counts
        if self.offset_damage is not None:
            self._add_offset_figures()
        record.acked_total = report.acknowledged
        record.lost, record.lost_unflushed = len(report.lost), len(report.lost_unflushed)
        record.duplicated = len(report.duplicated)
        record.problems += report.problems
        record.problems += verify_hostile_acks(self.root, acks_path(self.work_dir / "logs"))

    def _add_offset_figures(self) -> None:
        """The offsets fault's totals so far (its figures object lives as long as the run)."""
        o, f = self.offset_damage.figures, self.figures
        f.offset_damages, f.offset_fallbacks = o.damaged_files, o.fallbacks
        f.offsets_moved_back, f.segments_backdated = o.queues_moved_back, o.segments_backdated
        f.consumer_runs = o.consumer_runs
        if o.problems:
            f.failure = f.failure or "offsets: " + "; ".join(o.problems[:3])

    def _round_line(self, r: RoundRecord) -> str:
        rec = ", ".join(f"{ms:.0f}" for ms in r.recovery_ms) or "-"
        loss = f", power loss: {r.power_loss}" if r.power_loss else ""
        loss += f", damage: {r.damage}" if r.damage else ""
        return (f"round {r.number}/{self.settings.rounds} {r.target} ({r.fault}): kills {r.kills}, "
                f"recovery {rec} ms, acked {r.acked_total}, lost {r.lost}, dup {r.duplicated}, "
                f"lost unflushed {r.lost_unflushed}{loss} [{r.duration_s:.1f} s]")

    def _say(self, line: str) -> None:
        if self.settings.progress is not None:
            self.settings.progress(line)

    def _kill_everything(self) -> None:
        """On the way out (normally everything is already stopped): leave no process behind."""
        if self.fleet is not None:
            for tag in self.fleet.tags:
                try:
                    self.fleet.kill(tag)
                except TortureError:
                    pass  # it had failed on its own: the run's failure already says so
        if self.store is not None and self.store.running:
            try:
                children = self.store.child_pids()
            except Exception:  # the shared memory is gone: nothing to look up
                children = []
            self.store.kill()
            for pid in children:
                _kill_quietly(pid)
            self.store.wait_orphans_gone(children)


def frozen_positions(ctl) -> DurablePositions:
    """The durable positions of a frozen store. A writer stopped in the middle of publishing
    leaves its seqlock group odd, so a consistent read would wait forever; then each aligned
    8-byte field is read as it is: old or new, and each is published only after its sync."""
    try:
        return DurablePositions.from_positions(ctl.snapshot())
    except StoreError:
        buf = ctl.region.buf
        flushed = seqlock.read_unlocked(buf, SUPERVISOR_GROUP_OFFSET, SUPERVISOR_GROUP)[1]
        cq_durable = seqlock.read_unlocked(buf, DISPATCHER_GROUP_OFFSET, DISPATCHER_GROUP)[1]
        shards = tuple(seqlock.read_unlocked(buf, SHARD_GROUPS_OFFSET + n * GROUP_SIZE,
                                             SHARD_GROUP)[1] for n in range(ctl.shard_count))
        return DurablePositions(flushed, cq_durable, shards)


def _kill_quietly(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
