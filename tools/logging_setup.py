"""Logging for the `mqstore` processes: stderr plus a rotating file in the store directory.

The supervisor owns rotation (RotatingFileHandler on <store>/mqstore.log). Its children append
to the same file through a WatchedFileHandler, which reopens the file after the supervisor
rotated it; each line carries the process role and pid, and O_APPEND keeps lines whole.
"""

from __future__ import annotations

import logging
import logging.handlers
import sys
from pathlib import Path

from engine.naming import LOG_FILE
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


def setup_logging(role: str, store_dir: str | Path | None = None, *, level: int = logging.INFO,
                  rotate: bool = False, to_stderr: bool = True) -> None:
    """Route the root logger to stderr and, when the store directory exists, to its log file.

    `level` applies unless the environment names one (MQSTORE_LOG_LEVEL, set by `--log-level`).
    `rotate` is for the supervisor only: children must not rotate a file others write.
    """
    root = logging.getLogger()
    for handler in list(root.handlers):
        root.removeHandler(handler)
        handler.close()
    root.setLevel(env_log_level(level))
    role_filter = _RoleFilter(role)
    if to_stderr:
        stream = logging.StreamHandler(sys.stderr)
        stream.setFormatter(logging.Formatter(STDERR_FORMAT, "%H:%M:%S"))
        stream.addFilter(role_filter)
        root.addHandler(stream)
    if store_dir is not None and Path(store_dir).is_dir():
        path = Path(store_dir) / LOG_FILE
        if rotate:
            handler = logging.handlers.RotatingFileHandler(path, maxBytes=MAX_LOG_BYTES,
                                                           backupCount=BACKUP_COUNT)
        else:
            handler = logging.handlers.WatchedFileHandler(path)
        handler.setFormatter(logging.Formatter(LOG_FORMAT))
        handler.addFilter(role_filter)
        root.addHandler(handler)
        try:
            path.chmod(0o600)
        except OSError:
            pass
