"""Reading and atomically replacing the checkpoint file (never patched in place).

Reading falls back from `checkpoint` to `checkpoint.bak`, then to None: recovery then scans
the whole commitlog. A RocketMQ-written checkpoint (no mqstore part) is read for its
RocketMQ fields only. A write that meets a full disk raises DiskFullError and leaves the
previous checkpoint in place (and no temp file behind).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from pathlib import Path

from engine.errors import CheckpointError, DiskFullError
from engine.files.filesystem import DISK_FULL_ERRNOS, remove_file, write_file_atomically
from engine.files.naming import BACKUP_SUFFIX, CHECKPOINT_FILE, TEMP_SUFFIX
from engine.formats.checkpoint import Checkpoint, decode_checkpoint, encode_checkpoint


class CheckpointSource(Enum):
    """Where recovery's checkpoint came from."""

    PRIMARY = "checkpoint"
    BACKUP = "checkpoint.bak"
    NONE = "none (full scan)"


@dataclass(frozen=True)
class LoadedCheckpoint:
    checkpoint: Checkpoint | None
    source: CheckpointSource
    problems: tuple[str, ...] = ()


def checkpoint_path(root: Path) -> Path:
    return Path(root) / CHECKPOINT_FILE


def load_checkpoint(root: Path) -> LoadedCheckpoint:
    """The newest trustworthy checkpoint, with what was wrong with the ones skipped."""
    problems = []
    primary = checkpoint_path(root)
    for path, source in ((primary, CheckpointSource.PRIMARY),
                         (primary.with_name(primary.name + BACKUP_SUFFIX), CheckpointSource.BACKUP)):
        try:
            raw = path.read_bytes()
        except FileNotFoundError:
            problems.append(f"{path.name}: missing")
            continue
        try:
            return LoadedCheckpoint(decode_checkpoint(raw), source, tuple(problems))
        except CheckpointError as exc:
            problems.append(f"{path.name}: {exc.message}")
    return LoadedCheckpoint(None, CheckpointSource.NONE, tuple(problems))


def write_checkpoint(root: Path, checkpoint: Checkpoint) -> None:
    """Replace the checkpoint atomically, keeping the previous one as `.bak`.

    DiskFullError when the disk has no room (the previous checkpoint stays); any other OSError
    (EIO from the fsync) propagates."""
    path = checkpoint_path(root)
    try:
        write_file_atomically(path, encode_checkpoint(checkpoint), backup_suffix=BACKUP_SUFFIX)
    except OSError as exc:
        if exc.errno not in DISK_FULL_ERRNOS:
            raise
        _remove_temp_files(path)
        raise DiskFullError(f"no space left to write the checkpoint: {exc.strerror}",
                            path=str(path)) from exc


def _remove_temp_files(path: Path) -> None:
    """Best effort: the half-written temp files of a failed replace take space and mean nothing."""
    backup = path.with_name(path.name + BACKUP_SUFFIX)
    for tmp in (path.with_name(path.name + TEMP_SUFFIX), backup.with_name(backup.name + TEMP_SUFFIX)):
        try:
            remove_file(tmp)
        except OSError:
            pass
