"""The cause of a process's death, in the store's log: written when it dies, read back to tell.

A process that dies of a fatal signal (SIGBUS from a write through a mapping on a full disk,
SIGSEGV) runs no Python code, so no logging call can say why: `log_fatal_signals` has
faulthandler write the signal and the Python traceback into mqstore.log. `last_error` reads the
last error a process logged, so the supervisor (a child's exit) and `start --detach` (a
supervisor that died before it was ready) can name the cause, not only "see mqstore.log".
"""

from __future__ import annotations

import faulthandler
import os
import re
from pathlib import Path

from engine.files.naming import LOG_FILE

TAIL_BYTES = 256 * 1024  # how much of the log's end last_error reads
FATAL_PREFIX = "Fatal Python error: "  # how faulthandler starts its report
_ERROR_LINE = re.compile(r"^\S+ \S+ (?:ERROR|CRITICAL)\s+(\S+?)\[(\d+)\] \S+: (.*)$")

_fault_file = None  # the log file faulthandler writes to: it must stay open


def log_fatal_signals(store_dir: str | os.PathLike) -> None:
    """Have a fatal signal write its name and the Python traceback of every thread into the
    store's log (owner-only, appended: the lines of other processes stay whole). No-op when
    the store directory does not exist."""
    global _fault_file
    path = Path(store_dir) / LOG_FILE
    if not path.parent.is_dir():
        return
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    new_file = os.fdopen(fd, "a")
    faulthandler.enable(file=new_file, all_threads=True)
    if _fault_file is not None:
        _fault_file.close()
    _fault_file = new_file


def last_error(store_dir: str | os.PathLike, pid: int | None = None) -> str | None:
    """The last ERROR or CRITICAL line in the store's log as 'role[pid]: message'. With `pid`,
    that process's only; without, a later faulthandler report ('Fatal Python error: ...', which
    names no process) wins. None if there is none."""
    path = Path(store_dir) / LOG_FILE
    try:
        with open(path, "rb") as log_file:
            size = log_file.seek(0, os.SEEK_END)
            log_file.seek(max(0, size - TAIL_BYTES))
            lines = log_file.read().decode(errors="replace").splitlines()
    except OSError:
        return None
    for line in reversed(lines):
        if pid is None and line.startswith(FATAL_PREFIX):
            return line
        match = _ERROR_LINE.match(line)
        if match and (pid is None or int(match.group(2)) == pid):
            return f"{match.group(1)}[{match.group(2)}]: {match.group(3)}"
    return None
