"""`engine.check.fsck`, what routine recovery will re-dispatch: findings that are its work, not damage.

A crash (SIGKILL) leaves records the dispatcher and index builders had not reached yet: their
consume-queue entries and index keys are missing until the next start re-dispatches them. A
missing entry or key is *pending*, not a finding, when routine recovery surely puts it back:

- its record lies at or past the durable position the checkpoint records for that structure
  (cq_durable_pos for the consume queues, index_durable_pos[shard] for a shard): recovery trims
  each structure to that position and scans from the lowest of them, re-dispatching every
  record it walks (engine.recovery.recover);
- and before the first invalid record, where recovery cuts; damage below the checkpoint's
  flushed position makes a routine start refuse (engine.recovery.durable_line), so then nothing is
  pending.

Anything else stays a finding. The checkpoint is read as recovery reads it (engine.recovery.checkpoint,
`.bak` fallback); without one nothing is known to be pending.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from engine.check.commitlog import LogScan
from engine.check.findings import MAX_FINDINGS_PER_FILE, Finding, FindingKind, FindingList
from engine.recovery.checkpoint import load_checkpoint


class PendingWork:
    """The re-dispatch line of one store and the missing entries and keys found past it."""

    def __init__(self, cq_from_pos: int | None, shard_from_pos: tuple[int, ...], end_pos: int):
        self.cq_from_pos = cq_from_pos  # None: nothing is pending
        self.shard_from_pos = shard_from_pos
        self.end_pos = end_pos
        self.found = FindingList(MAX_FINDINGS_PER_FILE)
        self._record_positions: set[int] = set()

    @classmethod
    def nothing(cls) -> PendingWork:
        """No line: every missing entry and key is a finding."""
        return cls(None, (), 0)

    @classmethod
    def read(cls, root: Path, scan: LogScan, shard_count: int) -> PendingWork:
        """The line from the checkpoint recovery would load and the first invalid record."""
        cp = load_checkpoint(root).checkpoint
        if cp is None or len(cp.index_durable_pos) != shard_count:
            return cls.nothing()
        first_bad = min(scan.bad_starts, default=scan.data_end)
        if first_bad < cp.commitlog_flushed_pos:
            return cls.nothing()  # a routine start refuses: it re-dispatches nothing
        return cls(max(cp.cq_durable_pos, scan.min_pos), tuple(cp.index_durable_pos), first_bad)

    def cq_covers(self, positions: np.ndarray) -> np.ndarray:
        """Which of these records' consume-queue entries recovery puts back."""
        if self.cq_from_pos is None:
            return np.zeros(len(positions), dtype=bool)
        return (positions >= self.cq_from_pos) & (positions < self.end_pos)

    def shard_covers(self, shard: int, pos: int) -> bool:
        """Whether recovery indexes the keys of the record at `pos` into `shard` again."""
        if self.cq_from_pos is None:
            return False
        return self.shard_from_pos[shard] <= pos < self.end_pos

    def add(self, kind: FindingKind, path: Path | str, detail: str,
            positions: np.ndarray | list[int]) -> None:
        """Note a pending finding about the records at `positions` (its pos: the first)."""
        positions = [int(p) for p in positions]
        self._record_positions.update(positions)
        self.found.add(kind, path, detail, positions[0] if positions else None)

    def close_group(self, kind: FindingKind, path: Path | str) -> None:
        self.found.close_group(kind, path)

    @property
    def record_count(self) -> int:
        """How many distinct records lack an entry or a key that recovery puts back."""
        return len(self._record_positions)

    @property
    def findings(self) -> tuple[Finding, ...]:
        return tuple(self.found.items)
