"""What `engine.check.fsck` reports: `Finding` values of a `FindingKind`, collected with a cap per file.

A finding is a value, not an error: whether it fails anything is the caller's decision.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path

MAX_FINDINGS_PER_FILE = 20  # then one "... and N more" finding of the same kind


class FindingKind(StrEnum):
    """What is wrong; a str, so a finding's fields serialise as they are (`mqstore check --json`)."""

    LAYOUT = "layout"  # a file of the wrong size, a foreign file, a gap in names
    CORRUPT_RECORD = "corrupt_record"  # an invalid record with valid data after it
    TORN_TAIL = "torn_tail"  # invalid bytes after the last valid record
    CQ_ENTRY_MISMATCH = "cq_entry_mismatch"  # an entry that does not point at its record
    CQ_GAP = "cq_gap"  # unwritten entries inside [min_offset, max_offset)
    CQ_DUPLICATE = "cq_duplicate"  # two entries with the same commit_pos
    CQ_MISSING_ENTRY = "cq_missing_entry"  # a consumable record without its entry
    CQ_PAST_END = "cq_past_end"  # an entry pointing past the end of valid data
    INDEX_FILE_CORRUPT = "index_file_corrupt"  # bad size or header, slot heads or chains
    INDEX_ENTRY_UNRESOLVED = "index_entry_unresolved"  # an entry that resolves to no record key
    INDEX_ENTRY_TIME = "index_entry_time"  # an entry whose time disagrees with its record's store time
    INDEX_KEY_MISSING = "index_key_missing"  # a record key that the index does not find
    CHECKPOINT_UNREADABLE = "checkpoint_unreadable"
    CHECKPOINT_INCONSISTENT = "checkpoint_inconsistent"  # a position past the data or mid-record
    ACCEPTED_DAMAGE = "accepted_damage"  # inside a span a salvage accepted: noted, not a finding


@dataclass(frozen=True)
class Finding:
    """One problem found: what, in which file, and the commit position (or None)."""

    kind: FindingKind
    path: str
    detail: str
    pos: int | None = None

    def __str__(self) -> str:
        where = f" at {self.pos}" if self.pos is not None else ""
        return f"{self.kind.value}{where}: {self.detail} [{self.path}]"


class FindingList:
    """Collects findings, at most `cap` per (kind, path), then one "... and N more" summary
    (`close_group`), so a badly damaged file does not bury the rest of the report."""

    def __init__(self, cap: int = MAX_FINDINGS_PER_FILE):
        self.cap = cap
        self.items: list[Finding] = []
        self._counts: dict[tuple[FindingKind, str], int] = defaultdict(int)

    def add(self, kind: FindingKind, path: Path | str, detail: str, pos: int | None = None) -> None:
        key = (kind, str(path))
        self._counts[key] += 1
        if self._counts[key] <= self.cap:
            self.items.append(Finding(kind, str(path), detail, None if pos is None else int(pos)))

    def count_more(self, kind: FindingKind, path: Path | str, count: int) -> None:
        """Count `count` findings past the cap without building them (a file wrong throughout)."""
        self._counts[(kind, str(path))] += count

    def close_group(self, kind: FindingKind, path: Path | str) -> None:
        extra = self._counts.get((kind, str(path)), 0) - self.cap
        if extra > 0:
            self.items.append(Finding(kind, str(path), f"... and {extra} more"))


def findings_to_json(findings: list[Finding]) -> list[dict]:
    """Plain dicts for `mqstore check --json`."""
    return [{"kind": f.kind.value, "path": f.path, "detail": f.detail, "pos": f.pos} for f in findings]
