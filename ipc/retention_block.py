"""The retention area of the control block (layout version 2, DESIGN §4 "Retention").

The supervisor publishes the retention line (the commitlog's new minimum position) and what its
passes removed; each child publishes how far it has dropped its own files below the line;
`mqstore clean` bumps the request word and waits for the supervisor's `manual_done` to reach
it. One writer per group, as in the rest of the control block; the request word is one aligned
8-byte store, so two `clean` commands at once may share one pass (each waits for its value).
"""

from __future__ import annotations

import struct
import threading
from dataclasses import dataclass

from engine.retention.expiry import RetentionReason
from ipc import seqlock
from ipc.control_block import GROUP_SIZE, RETENTION_AREA_OFFSET, ControlBlock, Role

LINE_GROUP = struct.Struct("<7q")
CLEAN_GROUP = struct.Struct("<2q")
REQUEST_WORD = struct.Struct("<q")

LINE_OFFSET = RETENTION_AREA_OFFSET
REQUEST_OFFSET = LINE_OFFSET + GROUP_SIZE
DISPATCHER_CLEAN_OFFSET = REQUEST_OFFSET + GROUP_SIZE
SHARD_CLEAN_OFFSET = DISPATCHER_CLEAN_OFFSET + GROUP_SIZE
REASONS = list(RetentionReason)  # a reason travels as its index

assert seqlock.seqlock_size(LINE_GROUP) <= GROUP_SIZE


@dataclass(frozen=True)
class RetentionLine:
    """The supervisor's group: the line, running totals, and the last pass."""

    min_commit_pos: int
    passes: int = 0
    segments_removed: int = 0
    bytes_removed: int = 0
    last_pass_ms: int = 0
    manual_done: int = 0
    last_reason: RetentionReason = RetentionReason.NONE


@dataclass(frozen=True)
class ChildClean:
    """A child's group: the line its files are cleaned to, and the files it removed in total."""

    clean_pos: int
    files_removed: int


class RetentionBlock:
    """Typed access to the retention area of an attached (or created) control block."""

    def __init__(self, ctl: ControlBlock):
        self._buf = ctl.region.buf
        self.shard_count = ctl.shard_count
        self._write_lock = threading.Lock()

    # -- the supervisor's line -------------------------------------------------------------------
    def line(self) -> RetentionLine:
        values = seqlock.read_consistent(self._buf, LINE_OFFSET, LINE_GROUP)
        return RetentionLine(*values[:6], REASONS[values[6]])

    def publish_line(self, line: RetentionLine) -> None:
        """The supervisor's only write: the whole group (the line never moves down)."""
        with self._write_lock:
            old = seqlock.read_unlocked(self._buf, LINE_OFFSET, LINE_GROUP)
            if line.min_commit_pos < old[0]:
                raise ValueError(f"min_commit_pos may only grow: {line.min_commit_pos} < {old[0]}")
            seqlock.write_locked(self._buf, LINE_OFFSET, LINE_GROUP, (
                line.min_commit_pos, line.passes, line.segments_removed, line.bytes_removed,
                line.last_pass_ms, line.manual_done, REASONS.index(line.last_reason)))

    # -- the request of `mqstore clean` ----------------------------------------------------------
    def manual_requested(self) -> int:
        return REQUEST_WORD.unpack_from(self._buf, REQUEST_OFFSET)[0]

    def request_manual(self) -> int:
        """Ask the supervisor for a manual pass; returns the value `manual_done` must reach."""
        wanted = self.manual_requested() + 1
        seqlock.store_word(self._buf, REQUEST_OFFSET, wanted, "q")
        return wanted

    # -- the children ----------------------------------------------------------------------------
    def _clean_offset(self, role: Role, shard: int) -> int:
        if role is Role.DISPATCHER:
            return DISPATCHER_CLEAN_OFFSET
        if role is Role.INDEX_BUILDER and 0 <= shard < self.shard_count:
            return SHARD_CLEAN_OFFSET + shard * GROUP_SIZE
        raise ValueError(f"no clean group for {role.name} shard {shard}")

    def child_clean(self, role: Role, shard: int = 0) -> ChildClean:
        return ChildClean(*seqlock.read_consistent(self._buf, self._clean_offset(role, shard),
                                                   CLEAN_GROUP))

    def own_clean(self, role: Role, shard: int = 0) -> ChildClean:
        """The child's own group without the sequence check (its previous life may have died
        mid-write; the next write repairs it)."""
        return ChildClean(*seqlock.read_unlocked(self._buf, self._clean_offset(role, shard),
                                                 CLEAN_GROUP))

    def publish_clean(self, role: Role, shard: int, clean: ChildClean) -> None:
        with self._write_lock:
            seqlock.write_locked(self._buf, self._clean_offset(role, shard), CLEAN_GROUP,
                                 (clean.clean_pos, clean.files_removed))

    def cleans(self) -> dict[str, ChildClean]:
        """Every child's group by part: 'consumequeue' and 'index/<shard>'."""
        out = {"consumequeue": self.child_clean(Role.DISPATCHER)}
        for shard in range(self.shard_count):
            out[f"index/{shard}"] = self.child_clean(Role.INDEX_BUILDER, shard)
        return out
