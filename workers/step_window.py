"""How much of the commitlog a child process works through in one step, for the dispatcher and
the index builders alike: at most MAX_STEP_BYTES, so a step ends in time for the next heartbeat.
"""

from __future__ import annotations

MAX_STEP_BYTES = 16 * 1024 * 1024  # bounded work per step keeps the heartbeat fresh

