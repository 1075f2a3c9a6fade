"""Delayed-delivery rounds (`mqstore torture --fault delayed`): kills while deliveries are due.

One round:

1. start the supervisor on a store whose delay levels are milliseconds (DELAY_LEVELS);
2. a producer process sends a burst of messages with random delay levels (every third with a
   delivery time up to 1.5 s ahead instead), in batches, and writes each acknowledgement
   (commit position, due time) to its ledger;
3. while their delivery times pass, SIGKILL the round's target at a random moment: the
   supervisor and every child at once (`supervisor`), or the dispatcher or an index builder
   (restarted by the supervisor); a killed supervisor is started again (abnormal recovery);
4. wait until every acknowledged delayed message of the run is in its real topic, then stop;
5. verify: each delivered exactly once (by its DELIVERED_FROM), none stored before its
   delivery time, none the ledger does not know, and `check` empty.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from engine.check.fsck import check
from engine.status import GetStatus
from ipc.consumer import Consumer
from ipc.control_block import Role
from tools.store_process import StoreProcess, wait_until, write_store_config
from tools.torture.processes import TortureError
from workers.child_env import REPO_ROOT, child_env

DELAYED_FAULT = "delayed"  # `mqstore torture --fault delayed`
DELAY_LEVELS_MS = (200, 500, 1000)
TARGETS = ("supervisor", "dispatcher", "index")
TOPIC = "Delayed"
QUEUES = 4
DELIVERY_TIMEOUT_S = 60.0
STORE = {"commitlog_file_size": 256 * 1024, "consume_queue_entries": 256, "index_slot_count": 128,
         "index_entry_count": 512, "index_shards": 2, "queue_count": QUEUES, "cq_flush_interval_ms": 100,
         "index_flush_interval_ms": 100, "message_delay_level": " ".join(f"{ms}ms" for ms in DELAY_LEVELS_MS)}

SEND = """
import json, random, sys, time
from engine.message import Message
from ipc.producer import Producer
store, count, seed, ledger = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
levels_ms = [int(ms) for ms in sys.argv[5].split(",")]
rng = random.Random(seed)

def message(i):  # a delay level, or every third a time up to 1.5 s ahead
    body, queue_id = b"%d-%d" % (seed, i), rng.randrange(4)
    if i % 3 == 0:
        return Message("Delayed", body, queue_id=queue_id,
                       deliver_at_ms=time.time_ns() // 1_000_000 + rng.randint(50, 1500))
    return Message("Delayed", body, queue_id=queue_id, delay_level=rng.randint(1, 3))

with Producer(store) as producer, open(ledger, "a") as out:
    sent = 0
    while sent < count:
        batch = [message(sent + i) for i in range(min(rng.randint(1, 16), count - sent))]
        for m, result in zip(batch, producer.send_batch(batch)):
            if result.ok:  # when each is due: a timed one's time, a delayed one's store time + delay
                due = m.deliver_at_ms if m.delay_level is None \\
                    else result.store_ts_ms + levels_ms[m.delay_level - 1]
                out.write(json.dumps([result.commit_pos, due, m.body.decode()]) + "\\n")
        sent += len(batch)
        out.flush()
"""


@dataclass
class DelayedFigures:
    """What a delayed run measured; `failure` says what broke first (None: passed)."""

    seed: int
    rounds: int = 0
    acked: int = 0
    delivered: int = 0
    kills: dict[str, int] = field(default_factory=dict)
    max_lag_ms: int = 0
    failure: str | None = None

    @property
    def passed(self) -> bool:
        return self.failure is None

    def lines(self) -> list[str]:
        kills = ", ".join(f"{target} {n}" for target, n in sorted(self.kills.items())) or "none"
        return [f"delayed delivery: {self.rounds} round(s), seed {self.seed}, kills: {kills}",
                f"  {self.acked} acknowledged delayed messages, {self.delivered} delivered, each once, "
                f"none early; largest lag past the due time {self.max_lag_ms} ms",
                "  PASSED" if self.passed else f"  FAILED: {self.failure}"]


class DelayedRun:
    """A run of delayed-delivery rounds on one new store."""

    def __init__(self, store_dir: Path, work_dir: Path, *, rounds: int, target: str, seed: int,
                 per_round: int = 200):
        if target not in (*TARGETS, "random"):
            raise TortureError(f"--fault delayed takes --target {', '.join(TARGETS)} or random")
        self.root, self.work_dir = Path(store_dir), Path(work_dir)
        self.rounds, self.target, self.per_round = rounds, target, per_round
        self.rng = random.Random(seed)
        self.figures = DelayedFigures(seed)
        self.ledger = self.work_dir / "delayed-ledger.jsonl"
        self.store: StoreProcess | None = None

    def run(self) -> DelayedFigures:
        if self.root.exists() and any(self.root.iterdir()):
            raise TortureError(f"{self.root} is not empty: the torture needs a new store")
        self.work_dir.mkdir(parents=True, exist_ok=True)
        self.ledger.write_text("")
        try:
            self._start()
            for number in range(1, self.rounds + 1):
                self._round(number)
                self.figures.rounds = number
            self._verify()
        except TortureError as exc:
            self.figures.failure = str(exc)
        finally:
            if self.store is not None and self.store.proc.poll() is None:
                self.store.stop()
        if self.figures.passed:
            findings = check(self.root)
            if findings:
                self.figures.failure = "check: " + "; ".join(map(str, findings[:5]))
        return self.figures

    def _start(self) -> None:
        config = write_store_config(self.work_dir / "store.toml", STORE)
        self.store = StoreProcess(self.root, config, self.work_dir / "store.stderr")
        self.store.start()
        self.store.wait_ready()

    def _round(self, number: int) -> None:
        sender = subprocess.run([sys.executable, "-c", SEND, str(self.root), str(self.per_round),
                                 str(self.rng.randrange(2**31)), str(self.ledger),
                                 ",".join(map(str, DELAY_LEVELS_MS))],
                                cwd=REPO_ROOT, env=child_env(), capture_output=True, timeout=120)
        if sender.returncode != 0:
            raise TortureError(f"round {number}: the producer failed: {sender.stderr.decode()[-500:]}")
        time.sleep(self.rng.uniform(0.0, max(DELAY_LEVELS_MS) / 1000.0))  # a random moment of delivery
        target = self.rng.choice(TARGETS) if self.target == "random" else self.target
        self._kill(target)
        self.figures.kills[target] = self.figures.kills.get(target, 0) + 1

    def _kill(self, target: str) -> None:
        store = self.store
        if target == "supervisor":
            children = store.child_pids()
            store.kill()
            for pid in children:
                _kill_quietly(pid)
            wait_until(lambda: all(not _alive(pid) for pid in children), "every store process to die",
                       DELIVERY_TIMEOUT_S, 0.02)
            self._start()
            return
        role = Role.DISPATCHER if target == "dispatcher" else Role.INDEX_BUILDER
        with store.ctl() as ctl:
            victim = self.rng.choice([s.pid for s in ctl.process_slots() if s.role is role and s.pid])
        os.kill(victim, signal.SIGKILL)
        children = 1 + STORE["index_shards"]
        wait_until(lambda: victim not in (pids := store.child_pids()) and len(pids) == children,
                   f"the {target} to be restarted", DELIVERY_TIMEOUT_S, 0.02)

    def _verify(self) -> None:
        acked = {}
        for line in self.ledger.read_text().splitlines():
            commit_pos, due_ms, body = json.loads(line)
            acked[commit_pos] = (due_ms, body)
        self.figures.acked = len(acked)
        deadline = time.monotonic() + DELIVERY_TIMEOUT_S
        while True:
            copies = self._copies()
            if len(copies) >= len(acked) or time.monotonic() > deadline:
                break
            time.sleep(0.05)
        seen: set[int] = set()
        for message in copies:
            # a timed message whose time had passed when it was sent is stored in its topic at once
            origin = int(message.properties.get("DELIVERED_FROM", message.commit_pos))
            if origin not in acked:
                raise TortureError(f"a copy at {message.commit_pos} from {origin}, which no producer sent")
            if origin in seen:
                raise TortureError(f"the message from {origin} ({acked[origin][1]}) was delivered twice")
            due_ms, body = acked[origin]
            if message.store_ts_ms < due_ms or message.body.decode() != body:
                raise TortureError(f"{body}: delivered {due_ms - message.store_ts_ms} ms early or altered")
            seen.add(origin)
            self.figures.max_lag_ms = max(self.figures.max_lag_ms, message.store_ts_ms - due_ms)
        self.figures.delivered = len(seen)
        if len(seen) != len(acked):
            raise TortureError(f"{len(acked) - len(seen)} acknowledged delayed message(s) were not "
                               f"delivered within {DELIVERY_TIMEOUT_S:g} s")

    def _copies(self) -> list:
        out = []
        with Consumer(self.root, "torture-delayed") as consumer:
            for queue_id in range(QUEUES):
                offset = 0
                while True:
                    result = consumer.pull(TOPIC, queue_id, offset, 1000)
                    if result.status is not GetStatus.FOUND:
                        break
                    out += result.messages
                    offset = result.next_offset
        return out


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except FileNotFoundError:
        return False


def _kill_quietly(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
