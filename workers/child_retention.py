"""A child's side of retention (DESIGN §4): each structure expires with the process that writes it.

The dispatcher drops its consume-queue files, and each index builder its index files, that lie
wholly below the retention line the supervisor publishes (workers/retention_runner.py), then
publishes the line it has cleaned to. Its read-only commitlog view forgets the deleted segments
at the same time: a deleted file's blocks are freed only once no process maps it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from engine.log.commitlog import CommitLog
from ipc.control_block import ControlBlock, Role
from ipc.retention_block import ChildClean, RetentionBlock
from workers.child_handle import child_name

log = logging.getLogger(__name__)


class LineFollower:
    """Follows the retention line for one child; `expire(min_commit_pos)` removes its files
    below the line and returns how many."""

    def __init__(self, ctl: ControlBlock, role: Role, shard: int, commitlog: CommitLog,
                 expire: Callable[[int], int]):
        self.block = RetentionBlock(ctl)
        self.role = role
        self.shard = shard
        self._commitlog = commitlog
        self._expire = expire
        self.clean = self.block.own_clean(role, shard)  # totals survive a restart of the child

    def follow(self) -> int:
        """Clean up to the line if it moved; files removed."""
        line = self.block.line().min_commit_pos
        if line <= self.clean.clean_pos:
            return 0
        self._commitlog.refresh()
        removed = self._expire(line)
        self.clean = ChildClean(line, self.clean.files_removed + removed)
        self.block.publish_clean(self.role, self.shard, self.clean)
        if removed:
            log.info("%s: removed %d file(s) below the retention line %d", child_name(self.role, self.shard),
                     removed, line)
        return removed
