"""The retention line on disk: where retention has removed the commitlog up to, so that a log
that starts above it is known to have lost segments (engine.formats.retention_line).

Retention moves the line up before it removes segments (`raise_retention_line`); every
recovery that succeeds sets it to where the log starts (`settle_retention_line`), in routine
recovery only after `refuse_lost_head` found the log starting at or below it. Both rewrite the
file in place, so neither needs a new block on a full disk. A store from
before the line (no file) or with an unreadable one cannot vouch for its head: it is not
refused, and its line is written at the next recovery.
"""

from __future__ import annotations

import logging
from pathlib import Path

from engine.errors import CheckpointError, LostHeadError
from engine.files.filesystem import DISK_FULL_ERRNOS, overwrite_in_place, write_file_atomically
from engine.files.naming import RETENTION_LINE_FILE, commitlog_dir
from engine.formats.retention_line import decode_retention_line, encode_retention_line

log = logging.getLogger(__name__)


def read_retention_line(root: Path) -> int | None:
    """The line's position; None when the store has no line file (CheckpointError when bad)."""
    try:
        data = (Path(root) / RETENTION_LINE_FILE).read_bytes()
    except FileNotFoundError:
        return None
    return decode_retention_line(data)


def raise_retention_line(root: Path, min_pos: int) -> None:
    """Before retention removes the segments below `min_pos`: the line moves up to it, durably."""
    _write_line(root, min_pos)


def settle_retention_line(root: Path, log_min_pos: int) -> None:
    """After a recovery: the line is where the log now starts (written only when it differs)."""
    try:
        current = read_retention_line(root)
    except CheckpointError:
        current = None
    if current != log_min_pos:
        _write_line(root, log_min_pos)


def _write_line(root: Path, min_pos: int) -> None:
    """The line at `min_pos`, durable on return. The file is rewritten in place (16 bytes in one
    sector; a torn one fails its CRC and vouches for nothing), so retention works on a full
    disk; a missing or odd-sized one is replaced, and when a full disk refuses that the store
    goes on without a line, which refuses nothing (warned)."""
    path = Path(root) / RETENTION_LINE_FILE
    data = encode_retention_line(min_pos)
    if overwrite_in_place(path, data):
        return
    try:
        write_file_atomically(path, data)
    except OSError as exc:
        if exc.errno not in DISK_FULL_ERRNOS:
            raise
        log.warning("%s: no room to write the retention line (%s); a lost first segment will not be "
                    "told from retention until it is written", path, exc)


def lost_head_reason(root: Path, log_min_pos: int) -> str | None:
    """Why the log's start is not one retention made (segments missing before it), or None."""
    lost = _lost_head(root, log_min_pos)
    return None if lost is None else lost[0]


def refuse_lost_head(root: Path, log_min_pos: int) -> None:
    """LostHeadError (nothing changed) when segments retention never removed are missing."""
    lost = _lost_head(root, log_min_pos)
    if lost is not None:
        reason, line = lost
        raise LostHeadError(reason, retention_pos=line, log_min_pos=log_min_pos,
                            path=str(commitlog_dir(root)))


def _lost_head(root: Path, log_min_pos: int) -> tuple[str, int] | None:
    """(why, the line) when the log starts above the line; None when it does not or when the line
    cannot vouch (missing, or unreadable: warned)."""
    try:
        line = read_retention_line(root)
    except CheckpointError as exc:
        log.warning("%s: cannot tell whether the commitlog lost its first segments (%s)",
                    Path(root) / RETENTION_LINE_FILE, exc)
        return None
    if line is None or log_min_pos <= line:
        return None
    return (f"the commitlog starts at {log_min_pos}, but retention removed only the segments "
            f"below {line}: the segments between are missing"), line
