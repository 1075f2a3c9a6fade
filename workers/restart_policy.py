"""When to restart a child that died: exponential backoff with jitter inside a restart budget.

Synthesised from gunicorn (jittered respawn, boot-error codes halt), supervisord (BACKOFF,
startsecs) and Erlang/OTP (at most MaxR restarts in MaxT seconds, then escalate):

* a child that exits with a code of the no-restart set (exit_codes.NO_RESTART) is not restarted;
* otherwise the n-th consecutive restart waits base * 2**(n-1) seconds (capped), times a random
  factor in [1 - jitter, 1 + jitter], so children that die together do not restart in lockstep;
* a child that ran for `healthy_after_s` resets the backoff (it booted fine, then crashed);
* more than `budget` restarts inside `window_s` means something is wrong for good: give up,
  and the supervisor stops the store cleanly instead of flapping.

Pure logic: the clock and the random source are injected, so the tests need no sleeping.
"""

from __future__ import annotations

import random
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import NamedTuple

from workers.exit_codes import describe_exit, should_restart


@dataclass(frozen=True)
class RestartSettings:
    """Tunables of the restart policy (TOML table [supervisor] of `mqstore start --config`)."""

    budget: int = 5
    window_s: float = 30.0
    base_delay_s: float = 0.1
    max_delay_s: float = 5.0
    jitter: float = 0.25
    healthy_after_s: float = 10.0


class Decision(NamedTuple):
    """What to do about one child exit."""

    restart: bool
    delay_s: float
    reason: str


class RestartPolicy:
    """The restart bookkeeping of one child (one role, one shard)."""

    def __init__(self, settings: RestartSettings | None = None, *,
                 clock: Callable[[], float] = time.monotonic,
                 rng: Callable[[], float] = random.random):
        self.settings = settings or RestartSettings()
        self._clock = clock
        self._rng = rng
        self._restarts: deque[float] = deque()
        self._consecutive = 0
        self.history: list[tuple[float, str]] = []  # (wall time, what happened) for `status`

    @property
    def restart_count(self) -> int:
        return len(self.history)

    def on_exit(self, returncode: int, ran_for_s: float, killed_for: str | None = None) -> Decision:
        """Decide about a child that exited with `returncode` after running `ran_for_s`
        (`killed_for`: why the supervisor killed it, if it did)."""
        what = describe_exit(returncode, killed_for)
        if not should_restart(returncode):
            return Decision(False, 0.0, f"{what}: not restarting")
        now = self._clock()
        window = self.settings.window_s
        while self._restarts and now - self._restarts[0] > window:
            self._restarts.popleft()
        if len(self._restarts) >= self.settings.budget:
            return Decision(False, 0.0, f"{what}: restart budget of {self.settings.budget} "
                                        f"restarts in {window:g} s exceeded")
        if ran_for_s >= self.settings.healthy_after_s:
            self._consecutive = 0
        self._consecutive += 1
        delay = self.backoff_delay(self._consecutive)
        self._restarts.append(now)
        self.history.append((time.time(), what))
        return Decision(True, delay, f"{what}: restarting in {delay:.2f} s "
                                     f"({len(self._restarts)}/{self.settings.budget} in {window:g} s)")

    def backoff_delay(self, attempt: int) -> float:
        """Seconds to wait before restart number `attempt` (1-based) of a run of failures."""
        s = self.settings
        delay = min(s.max_delay_s, s.base_delay_s * 2 ** max(attempt - 1, 0))
        factor = 1.0 + s.jitter * (2.0 * self._rng() - 1.0)
        return max(0.0, delay * factor)
