"""Exit codes: the contract between the supervisor and its children, and of the `mqstore` CLI.

A child's exit code tells the supervisor what to do next (gunicorn's WORKER_BOOT_ERROR idea):

    code  name            meaning                                          supervisor does
    0     OK              stopped on request (SIGTERM) after a final flush  nothing (expected)
    1     CRASHED         an unexpected exception while running             restart (budgeted)
    2     USAGE           bad command line (argparse)                       stop the store
    3     BOOT_FAILED     could not open, attach or recover its files       stop the store
    4     STORE_CORRUPT   its files disagree with the commitlog for good    stop the store
    5     ORPHANED        the supervisor went away; exited by itself       nothing (we are gone)
    <0    -signal         killed by a signal (SIGKILL: perhaps out of memory) restart (budgeted)

The codes in NO_RESTART mean "restarting will not help": the supervisor stops the store cleanly
with a message naming the child instead of looping. The CLI's own codes are in CliExit.
"""

from __future__ import annotations

import signal
from enum import IntEnum


class ExitCode(IntEnum):
    """How a child process (dispatcher, index builder) ended."""

    OK = 0
    CRASHED = 1
    USAGE = 2
    BOOT_FAILED = 3
    STORE_CORRUPT = 4
    ORPHANED = 5


NO_RESTART = frozenset({ExitCode.USAGE, ExitCode.BOOT_FAILED, ExitCode.STORE_CORRUPT})


class CliExit(IntEnum):
    """Exit status of `mqstore <command>` (listed in `mqstore --help`)."""

    OK = 0
    FAILED = 1  # the command ran and failed (store error, check findings, send not stored)
    BAD_INPUT = 2  # bad arguments or input: nothing was changed
    NOT_RUNNING = 3  # no supervisor runs on the store (send, consume, stop, status)
    LOCKED = 4  # another supervisor holds the store (start, recover)
    PERMISSION = 5  # the store belongs to another user
    INTERRUPTED = 130  # Ctrl-C in a client command


def should_restart(returncode: int) -> bool:
    """True when a child that exited with `returncode` is worth restarting."""
    if returncode < 0:
        return True
    if returncode in (ExitCode.OK, ExitCode.ORPHANED):
        return False
    try:
        return ExitCode(returncode) not in NO_RESTART
    except ValueError:
        return True  # an unknown code is a crash


def describe_exit(returncode: int) -> str:
    """Human words for a child's return code, e.g. 'killed by SIGKILL (perhaps out of memory)'."""
    if returncode < 0:
        try:
            name = signal.Signals(-returncode).name
        except ValueError:
            name = f"signal {-returncode}"
        extra = " (perhaps out of memory)" if returncode == -signal.SIGKILL else ""
        return f"killed by {name}{extra}"
    try:
        return f"exited with {returncode} ({ExitCode(returncode).name})"
    except ValueError:
        return f"exited with {returncode}"


def cli_epilog() -> str:
    """The exit-code table printed at the end of `mqstore --help`."""
    lines = ["exit codes:"]
    words = {
        CliExit.OK: "success",
        CliExit.FAILED: "the command ran and failed (store error, check findings, put not stored, "
                        "a corrupt record skipped by consume or query)",
        CliExit.BAD_INPUT: "bad arguments or input; nothing was changed",
        CliExit.NOT_RUNNING: "no supervisor runs on the store",
        CliExit.LOCKED: "another supervisor holds the store",
        CliExit.PERMISSION: "the store belongs to another user",
        CliExit.INTERRUPTED: "interrupted (Ctrl-C)",
    }
    lines += [f"  {int(code):>3}  {text}" for code, text in words.items()]
    lines.append("child processes (dispatcher, index builders) exit with: "
                 + ", ".join(f"{int(c)} {c.name}" for c in ExitCode)
                 + "; the supervisor does not restart " + ", ".join(sorted(c.name for c in NO_RESTART)))
    return "\n".join(lines)
