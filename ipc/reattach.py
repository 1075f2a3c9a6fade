"""Clients that outlive their supervisor: watching it, and waiting for the next one.

A Producer or Consumer attaches to the supervisor that runs when it is created. When that
supervisor exits (a clean `stop`, a crash, `kill -9`) and another one is started on the store,
the client reattaches by itself: the next call waits up to `reattach_timeout_s` (default
DEFAULT_REATTACH_TIMEOUT_S) for a READY supervisor, polling every ATTACH_POLL_S, and then
raises or answers SERVICE_NOT_AVAILABLE naming the bound. 0 means one look and no wait.

`SupervisorWatch` tells whether the attached supervisor is still alive through a pidfd (about
2 us, immune to pid reuse), cheap enough to look at before every request a producer publishes:
a request published to a supervisor already gone would otherwise get an unknown outcome when it
was certainly never stored.
"""

from __future__ import annotations

import os
import select
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from engine.errors import BadInputError, ServiceNotAvailableError
from ipc.control_block import pid_alive

DEFAULT_REATTACH_TIMEOUT_S = 30.0
MAX_REATTACH_TIMEOUT_S = 24 * 3600.0
ATTACH_POLL_S = 0.05

T = TypeVar("T")


def validate_reattach_timeout(value: object) -> float:
    """`reattach_timeout_s` as a float in 0..MAX_REATTACH_TIMEOUT_S (BadInputError otherwise)."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not (
            0 <= value <= MAX_REATTACH_TIMEOUT_S):
        raise BadInputError("reattach_timeout_s", f"{value!r} is not a number of seconds in "
                            f"0..{MAX_REATTACH_TIMEOUT_S:g}")
    return float(value)


def wait_for_supervisor(root: Path, attach: Callable[[], T], timeout_s: float) -> T:
    """`attach()` once a supervisor serves the store again; ServiceNotAvailableError when none
    did within `timeout_s` (the last reason why not, and the bound, in the message)."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            return attach()
        except ServiceNotAvailableError as exc:
            reason = exc.message
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise ServiceNotAvailableError(
                f"no supervisor served the store again within reattach_timeout_s = {timeout_s:g} s "
                f"({reason})", path=str(root),
                hint="start it with `mqstore start`, or give the client a longer reattach_timeout_s")
        time.sleep(min(ATTACH_POLL_S, remaining))  # no semaphore exists to wait on before it starts


class SupervisorWatch:
    """Whether one supervisor process (by pid, seen at attach) is still alive."""

    def __init__(self, pid: int):
        self.pid = pid
        self._poll: select.poll | None = None
        self._fd = -1
        try:
            self._fd = os.pidfd_open(pid)
        except ProcessLookupError:
            self._gone = True
            return
        except (OSError, AttributeError):  # no pidfd on this kernel: fall back to /proc
            self._gone = not pid_alive(pid)
            return
        self._gone = False
        self._poll = select.poll()
        self._poll.register(self._fd, select.POLLIN)

    def alive(self) -> bool:
        """False once the process has exited (a zombie counts as exited)."""
        if self._gone:
            return False
        if self._poll is not None:
            self._gone = bool(self._poll.poll(0))
        else:
            self._gone = not pid_alive(self.pid)
        return not self._gone

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
        self._poll = None
        self._gone = True
