"""How much of the commitlog a child process works through in one step, for the dispatcher and
the index builders alike: at most MAX_STEP_BYTES, so a step ends in time for the next heartbeat.
"""

from __future__ import annotations

from engine.commitlog import CommitLog
from engine.commitlog_scan import BatchScanner
from engine.formats.record import Verify

MAX_STEP_BYTES = 16 * 1024 * 1024  # bounded work per step keeps the heartbeat fresh


def scan_window(commitlog: CommitLog, start_pos: int, limit_pos: int) -> BatchScanner:
    """A batch scanner (many records per step, structure checked) over at most MAX_STEP_BYTES
    from start_pos; the caller rescans to limit_pos if one record or filler is bigger."""
    return commitlog.scan_batches(start_pos, min(limit_pos, start_pos + MAX_STEP_BYTES),
                                  Verify.STRUCTURE)
