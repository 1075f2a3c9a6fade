"""The offsets fault (`mqstore torture --target supervisor --fault offsets`): consumer groups
commit between kills; while the store is down consumerOffset.json is torn (cut short or
overwritten with garbage) and every segment's mtime is set to 1970.

Before each kill, `mqstore consume` processes (real ones) read a random number of messages per
group and commit, twice, so the `.bak` is one commit older than the primary. After the restart:

- the first consumer of a group falls back to the backup: the WARNING must be on its stderr and
  in mqstore.log, and the fallback record (ipc.offsets_fallbacks) must have counted it;
- no group's offset moves without a logged reason: each offset read after the restart is at
  least the backup's, and a queue whose backup offset is below the primary's (its messages are
  read again) counts as moved back, which that WARNING explains;
- nothing acknowledged is lost (the ledger check at the end of the round): retention must judge
  a segment by its records' store times, not by a 1970 mtime. The round's store config makes
  retention's time trigger hold (delete_when_hour = this hour, a pass every 500 ms).
"""

from __future__ import annotations

import os
import random
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from engine.files.naming import COMMITLOG_DIR, CONSUMEQUEUE_DIR, LOG_FILE
from ipc.consumer_offsets import ConsumerOffsets, OffsetTable, parse_offset_table
from ipc.control_block import ControlBlock
from ipc.offsets_fallbacks import read_fallbacks
from ipc.retention_block import RetentionBlock
from tools.store_process import wait_until
from tools.torture.load import TOPICS
from workers.child_env import REPO_ROOT, child_env

GROUPS = {f"torture-{topic}": topic for topic in TOPICS[:2]}  # group -> the topic it reads
CONSUME_MAX = (5, 60)  # messages one consumer run reads per group
CONSUME_TIMEOUT_S = 120.0
FALLBACK_WORDS = "consumerOffset.json unreadable"
DAMAGES = ("offsets", "mtimes")
EPOCH_1970_S = 0
RETENTION_PASS_TIMEOUT_S = 30.0


def retention_overrides() -> dict:
    """Store settings that make retention's time trigger hold for the run (local hour now)."""
    return {"delete_when_hour": time.localtime().tm_hour, "clean_resource_interval_ms": 500}


@dataclass
class OffsetFigures:
    """What the offsets fault did and saw over a run."""

    consumer_runs: int = 0
    damaged_files: int = 0
    fallbacks: int = 0
    queues_moved_back: int = 0
    segments_backdated: int = 0
    problems: list[str] = field(default_factory=list)


class OffsetDamage:
    """Consumer runs and damages of the offsets fault over one store."""

    def __init__(self, root: Path, rng: random.Random, damages: tuple[str, ...] = DAMAGES):
        unknown = set(damages) - set(DAMAGES)
        if unknown:
            raise ValueError(f"unknown damages {sorted(unknown)}")
        self.root = root
        self.rng = rng
        self.damages = damages
        self.offsets = ConsumerOffsets(root)
        self.figures = OffsetFigures()
        self._floor: OffsetTable = {}  # no offset may end below these after the restart
        self._torn = False  # the offsets file was torn: the restart must fall back, loudly

    def consume_twice(self) -> None:
        """Each group reads and commits twice: the primary and the backup differ."""
        for _ in range(2):
            for group, topic in GROUPS.items():
                self._consume(group, topic, self.rng.randint(*CONSUME_MAX))

    def damage_while_down(self) -> str:
        """Tear the offsets file and backdate the segments (the store is down); what was done."""
        done = []
        self._floor = self.offsets.peek_with_times()[0]  # what the groups committed before the kill
        self._torn = False
        if "offsets" in self.damages and self.offsets.backup_path.exists():
            backup = parse_offset_table(self.offsets.backup_path.read_text())
            self.figures.queues_moved_back += sum(
                1 for key, queues in self._floor.items() for q, offset in queues.items()
                if backup.get(key, {}).get(q, 0) < offset)
            self._floor, self._torn = backup, True
            done.append(self._tear())
        if "mtimes" in self.damages:
            count = backdate_segments(self.root)
            self.figures.segments_backdated += count
            done.append(f"{count} segment mtimes set to 1970")
        return "; ".join(done)

    def check_after_restart(self) -> list[str]:
        """Consume once per group on the restarted store; the problems found (module doc)."""
        if "mtimes" in self.damages:
            wait_for_retention_pass(self.root)  # the 1970 mtimes meet a retention pass this round
        fallbacks_before = read_fallbacks(self.root).count
        logged_before = len(_log_lines(self.root))
        stderr = "".join(self._consume(group, topic, 1) for group, topic in GROUPS.items())
        problems = []
        if self._torn:
            problems += self._fallback_problems(stderr, _log_lines(self.root)[logged_before:],
                                                fallbacks_before)
        elif FALLBACK_WORDS in stderr:
            problems.append("a consumer fell back although the offsets file was not damaged")
        after = self.offsets.peek_with_times()[0]
        for key, queues in self._floor.items():
            for queue_id, offset in queues.items():
                now = after.get(key, {}).get(queue_id, 0)
                if now < offset:
                    problems.append(f"{key} queue {queue_id} moved back to {now}, below the "
                                    f"{'backup' if self._torn else 'committed'} {offset}, with no "
                                    "logged reason")
        self.figures.problems += problems
        return problems

    def _fallback_problems(self, stderr: str, logged: list[str], fallbacks_before: int) -> list[str]:
        """The restart's fallback must be on the consumer's stderr, in mqstore.log, and counted."""
        problems = []
        if FALLBACK_WORDS not in stderr:
            problems.append("a consumer fell back to the backup without a WARNING on its stderr")
        if not any(FALLBACK_WORDS in line and " WARNING " in line for line in logged):
            problems.append("a consumer fell back to the backup without a WARNING in mqstore.log")
        count = read_fallbacks(self.root).count
        if count != fallbacks_before + 1:
            problems.append(f"the fallback record went from {fallbacks_before} to {count}, not +1")
        self.figures.fallbacks += count - fallbacks_before
        return problems

    def _tear(self) -> str:
        data = self.offsets.path.read_bytes()
        if self.rng.random() < 0.5:
            cut = self.rng.randrange(len(data) - 1)  # the closing brace goes: never valid JSON
            self.offsets.path.write_bytes(data[:cut])
            how = f"cut at byte {cut} of {len(data)}"
        else:
            self.offsets.path.write_bytes(self.rng.randbytes(self.rng.randint(1, len(data))))
            how = "overwritten with garbage"
        self.figures.damaged_files += 1
        return f"consumerOffset.json {how}"

    def _consume(self, group: str, topic: str, count: int) -> str:
        """One `mqstore consume` process; its stderr (the problem is recorded on failure)."""
        result = subprocess.run(
            [sys.executable, "-m", "tools.cli", "consume", "--store", str(self.root), "--topic", topic,
             "--group", group, "--max", str(count), "--timeout-ms", "0", "--json"],
            cwd=REPO_ROOT, env=child_env(), capture_output=True, text=True, timeout=CONSUME_TIMEOUT_S)
        self.figures.consumer_runs += 1
        if result.returncode != 0:
            self.figures.problems.append(f"`mqstore consume --group {group}` exited "
                                         f"{result.returncode}: {result.stderr[-1500:]}")
        return result.stderr


def backdate_segments(root: Path) -> int:
    """Set the mtime of every commitlog and consume-queue segment to 1970; how many."""
    paths = [p for p in (root / COMMITLOG_DIR).iterdir() if p.is_file()]
    paths += [p for p in (root / CONSUMEQUEUE_DIR).glob("*/*/*") if p.is_file()]
    for path in paths:
        os.utime(path, (EPOCH_1970_S, EPOCH_1970_S))
    return len(paths)


def wait_for_retention_pass(root: Path) -> None:
    """Wait until the running supervisor has run a retention pass since it started."""
    with ControlBlock.attach(root) as ctl:
        block = RetentionBlock(ctl)
        wait_until(lambda: block.line().passes >= 1, "a retention pass after the restart",
                   RETENTION_PASS_TIMEOUT_S)


def _log_lines(root: Path) -> list[str]:
    try:
        return (root / LOG_FILE).read_text(errors="replace").splitlines()
    except FileNotFoundError:
        return []
