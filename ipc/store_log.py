"""A client's line in the store's log: a WARNING that must reach `<store>/mqstore.log`.

A consumer runs in the user's process, whose logging is the user's; an event the operator must
find after the fact (a torn offsets file replaced by its backup, an offset reset by `mqstore
groups --reset`) is also appended to the store's own log, in the layout of tools.logging_setup
(the console's event view parses it). One O_APPEND write per line keeps it whole beside the
supervisor's lines.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

from engine.files.naming import LOG_FILE

# the layout of tools.logging_setup.LOG_FORMAT, which ipc cannot import (a lower layer)
_FORMATTER = logging.Formatter("%(asctime)s %(levelname)-7s %(role)s[%(process)d] %(name)s: %(message)s")


def append_to_store_log(store_dir: str | os.PathLike, role: str, logger_name: str, level: int,
                        message: str) -> None:
    """Append one formatted line to mqstore.log as `role[pid]` (created owner-only if absent);
    an unwritable log is left alone: the caller has logged the message in its own process."""
    record = logging.LogRecord(logger_name, level, __file__, 0, message, None, None)
    record.role = role
    line = (_FORMATTER.format(record).replace("\n", " ") + "\n").encode()
    try:
        fd = os.open(Path(store_dir) / LOG_FILE, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    except OSError:
        return
    try:
        os.write(fd, line)
    except OSError:
        pass
    finally:
        os.close(fd)
