"""Damage below the durable line that the operator accepted with `mqstore recover --salvage`:
spans of the commitlog that hold no valid record, kept in place with valid records after them.

They are listed in quarantine/accepted-damage.json (written atomically, 0600). Routine recovery
and the durable-line check pass over an accepted span instead of refusing or cutting there;
`check` lists the span apart from its findings; readers skip the records in it and report them.
A span is the bad region a log walk finds (engine.log.walk_past): [start_pos, end_pos) where the
walk resumed. Damage that is not inside an accepted span is new damage, refused as before.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from enum import Enum
from pathlib import Path

from engine.errors import AcceptedDamageError, CorruptRecordError
from engine.files.filesystem import ensure_dir, write_file_atomically
from engine.files.naming import QUARANTINE_DIR
from engine.formats.record import Record, Verify
from engine.log.commitlog import CommitLog
from engine.log.scan import ScannedRun

ACCEPTED_DAMAGE_FILE = "accepted-damage.json"
_FIELDS = {"start_pos": int, "end_pos": int, "reason": str, "accepted_ms": int, "copy_path": str}


@dataclass(frozen=True)
class AcceptedSpan:
    """Commit positions [start_pos, end_pos) accepted as damaged, why, when, and the copy of
    their bytes in quarantine/."""

    start_pos: int
    end_pos: int
    reason: str
    accepted_ms: int
    copy_path: str


def accepted_damage_path(root: Path) -> Path:
    return Path(root) / QUARANTINE_DIR / ACCEPTED_DAMAGE_FILE


def load_accepted(root: Path) -> list[AcceptedSpan]:
    """The accepted spans in log order ([] when none were accepted); AcceptedDamageError when
    the file is there but not a list of spans."""
    path = accepted_damage_path(root)
    try:
        raw = json.loads(path.read_bytes())
    except FileNotFoundError:
        return []
    except (OSError, ValueError) as exc:
        raise AcceptedDamageError(str(exc), path=str(path)) from None
    if not isinstance(raw, list):
        raise AcceptedDamageError("not a JSON list", path=str(path))
    spans = [_decode_span(item, path) for item in raw]
    return sorted(spans, key=lambda s: s.start_pos)


def save_accepted(root: Path, spans: list[AcceptedSpan]) -> None:
    """Replace the file with `spans` (atomically: a crash leaves the old list or the new)."""
    ensure_dir(Path(root) / QUARANTINE_DIR)
    data = json.dumps([asdict(s) for s in sorted(spans, key=lambda s: s.start_pos)], indent=2)
    write_file_atomically(accepted_damage_path(root), data.encode() + b"\n")


def span_at(spans: list[AcceptedSpan], pos: int) -> AcceptedSpan | None:
    """The accepted span holding commit position `pos`, None if there is none."""
    return next((s for s in spans if s.start_pos <= pos < s.end_pos), None)


def is_accepted(spans: list[AcceptedSpan], start_pos: int, end_pos: int) -> bool:
    """True when [start_pos, end_pos) lies inside one accepted span."""
    span = span_at(spans, start_pos)
    return span is not None and end_pos <= span.end_pos


class ScanUnit(Enum):
    """What a ScanPastAccepted yields: checked runs of records (CommitLog.scan_batches, for
    re-dispatch) or decoded Records one by one (CommitLog.scan, for readers of fields)."""

    RUNS = "runs"
    RECORDS = "records"


class ScanPastAccepted:
    """A scan of the commitlog from `start_pos`, going on after each accepted span (`on_span`
    hears of it) up to `end_pos`; a CorruptRecordError outside every accepted span ends the
    scan as before. The one place the rule "pass over accepted damage, stop at new" is written.
    `pos` is the scanner's: where the next record would start, or the bad record's position."""

    def __init__(self, log: CommitLog, start_pos: int, spans: list[AcceptedSpan],
                 verify: Verify = Verify.MQSTORE,
                 on_span: Callable[[AcceptedSpan], None] | None = None, end_pos: int | None = None,
                 unit: ScanUnit = ScanUnit.RUNS):
        self._spans, self._verify, self._on_span = spans, verify, on_span
        self._end_pos = end_pos
        self._scan = log.scan_batches if unit is ScanUnit.RUNS else log.scan
        self.pos = start_pos

    def __iter__(self) -> Iterator[ScannedRun | Record]:
        while True:
            scanner = self._scan(self.pos, self._end_pos, self._verify)
            try:
                for item in scanner:
                    self.pos = scanner.pos
                    yield item
                self.pos = scanner.pos
                return
            except CorruptRecordError as exc:
                self.pos = exc.pos
                span = span_at(self._spans, exc.pos)
                if span is None:
                    raise
                if self._on_span is not None:
                    self._on_span(span)
                self.pos = span.end_pos


def _decode_span(item: object, path: Path) -> AcceptedSpan:
    if not isinstance(item, dict) or set(item) != set(_FIELDS) or \
            not all(isinstance(item[k], t) for k, t in _FIELDS.items()):
        raise AcceptedDamageError(f"not a span {sorted(_FIELDS)}: {item!r}"[:200], path=str(path))
    span = AcceptedSpan(**item)
    if not 0 <= span.start_pos < span.end_pos:
        raise AcceptedDamageError(f"empty or negative span {span.start_pos}..{span.end_pos}",
                                  path=str(path))
    return span
