"""Logging for the `mqstore` processes: stderr plus a rotating file in the store directory.

The supervisor owns rotation (RotatingFileHandler on <store>/mqstore.log). Its children append
to the same file through a WatchedFileHandler (workers.child), which reopens the file after the
supervisor rotated it; each line carries the process role and pid, and O_APPEND keeps lines whole.

A supervisor writes the store's log only once it holds the store's lock: until then the log
may be another supervisor's (a second `start` is refused at the lock), so `hold_records` keeps
its lines in memory and `open_store_log` writes them to the file once the store is its own.
"""

from __future__ import annotations

import logging
import logging.handlers
import sys
from pathlib import Path

from engine.files.naming import LOG_FILE
from workers.log_level import env_log_level

LOG_FORMAT = "%(asctime)s %(levelname)-7s %(role)s[%(process)d] %(name)s: %(message)s"
STDERR_FORMAT = "%(asctime)s %(levelname)-7s %(role)s[%(process)d] %(message)s"
MAX_LOG_BYTES = 10 * 1024 * 1024
BACKUP_COUNT = 5


class _RoleFilter(logging.Filter):
    def __init__(self, role: str):
        super().__init__()
        self.role = role

    def filter(self, record: logging.LogRecord) -> bool:
        record.role = self.role
        return True


def setup_logging(role: str, *, level: int = logging.INFO, to_stderr: bool = True) -> None:
    """Route the root logger to stderr (a supervisor adds the store's log with open_store_log).

    `level` applies unless the environment names one (MQSTORE_LOG_LEVEL, set by `--log-level`).
    """
    root = logging.getLogger()
    for handler in list(root.handlers):
        root.removeHandler(handler)
        handler.close()
    root.setLevel(env_log_level(level))
    if to_stderr:
        stream = logging.StreamHandler(sys.stderr)
        stream.setFormatter(logging.Formatter(STDERR_FORMAT, "%H:%M:%S"))
        stream.addFilter(_RoleFilter(role))
        root.addHandler(stream)


def hold_records(role: str) -> logging.handlers.MemoryHandler:
    """Keep every log record from now on in memory (beside stderr), for `open_store_log`."""
    held = logging.handlers.MemoryHandler(capacity=1 << 30, flushLevel=logging.CRITICAL + 1)
    held.addFilter(_RoleFilter(role))
    logging.getLogger().addHandler(held)
    return held


def open_store_log(role: str, store_dir: str | Path, held: logging.handlers.MemoryHandler) -> None:
    """Start writing the store's log, the held records first. The supervisor's handler rotates
    the file; its children reopen it after a rotation (workers.child)."""
    path = Path(store_dir) / LOG_FILE
    handler = logging.handlers.RotatingFileHandler(path, maxBytes=MAX_LOG_BYTES, backupCount=BACKUP_COUNT)
    handler.setFormatter(logging.Formatter(LOG_FORMAT))
    handler.addFilter(_RoleFilter(role))
    try:
        path.chmod(0o600)
    except OSError:
        pass
    root = logging.getLogger()
    root.removeHandler(held)
    held.setTarget(handler)
    held.close()  # flushes the held records into the file
    root.addHandler(handler)
