"""Whether routine recovery may trim an index shard to its durable position, or must rebuild it
from the commitlog (DESIGN §5.4). A trim keeps what lies below the durable position and trusts
it; a shard whose files cannot vouch for that is rebuilt instead, as an unreadable one is
(`engine.store_open` moves what is left of it to quarantine/):

* files missing: the log between its first record and the shard's first entry (its durable
  position when the shard holds none) holds a key of the shard. Retention deletes a shard's
  files oldest first, only those wholly below the log's first record and never the last, and a
  trim keeps the oldest, so only damage (the shard's directory, every file or the oldest ones
  deleted) leaves such a key out. The look stops at the first key of the shard: on sound files
  it reads the few records before it (every message carries a UNIQ_KEY);
* the slot table: the newest file's slot heads in use are not the number its header counts (a
  page of heads zeroed), looked at only where the trim would leave that file as it is.

Not seen here: a missing file in the middle or at the end of a shard, a damaged entry or chain
link, and older files' slot tables; `mqstore check` finds them and a rebuild repairs them.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np

from engine.dispatch.record import key_hashes_and_shards
from engine.errors import CorruptRecordError
from engine.formats.record import Verify
from engine.index.shard import ShardIndex
from engine.log.commitlog import CommitLog
from engine.record_rules import unindexed_rollback_mask
from engine.recovery.accepted_damage import AcceptedSpan, ScanPastAccepted, load_accepted
from engine.recovery.checkpoint import load_checkpoint


def unsound_shards(root: Path, log: CommitLog, shards: Sequence[ShardIndex | None]) -> dict[int, str]:
    """Shard number -> why routine recovery must rebuild it, among `shards` (None: not loaded).
    None without a checkpoint: recovery then rebuilds every shard anyway."""
    checkpoint = load_checkpoint(root).checkpoint
    if checkpoint is None:
        return {}
    accepted = load_accepted(root)
    known = checkpoint.index_durable_pos
    problems = {}
    for shard_no, shard in enumerate(shards):
        durable_pos = known[shard_no] if shard_no < len(known) else 0
        problem = None if shard is None else shard_problem(shard, len(shards), durable_pos, log, accepted)
        if problem is not None:
            problems[shard_no] = problem
    return problems


def shard_problem(shard: ShardIndex, shard_count: int, durable_pos: int, log: CommitLog,
                  accepted: list[AcceptedSpan]) -> str | None:
    """Why `shard` must be rebuilt rather than trimmed to durable_pos (see the module doc), or None."""
    oldest = next((f for f in shard.files if f.index_count > 1), None)
    indexed_from = durable_pos if oldest is None else min(oldest.begin_commit_pos, durable_pos)
    key_pos = first_key_pos(log, shard.shard, shard_count, log.min_pos, indexed_from, accepted)
    if key_pos is not None:
        return (f"the record at {key_pos} has a key of the shard, which holds no entry below "
                f"{indexed_from}: index files are missing")
    if shard.files:
        problem = shard.files[-1].slot_heads_problem(durable_pos)
        if problem is not None:
            return f"slot table of {shard.files[-1].path.name}: {problem}"
    return None


def first_key_pos(log: CommitLog, shard_no: int, shard_count: int, start_pos: int, end_pos: int,
                  accepted: list[AcceptedSpan]) -> int | None:
    """The first record in [start_pos, end_pos) with a key the shard indexes (None if none, or if
    damage ends the look: the durable line's checks are what judge damage)."""
    if start_pos >= end_pos:
        return None
    try:
        for run in ScanPastAccepted(log, start_pos, accepted, Verify.STRUCTURE, end_pos=end_pos):
            cols = run.columns()
            rows = cols.key_rows
            _, shards = key_hashes_and_shards(cols, shard_count)
            positions = cols.commit_pos[rows]
            mine = np.flatnonzero((shards == shard_no) & (positions < end_pos)
                                  & ~unindexed_rollback_mask(cols.sys_flag[rows], cols.queue_offset[rows]))
            if len(mine):
                return int(positions[mine[0]])
    except CorruptRecordError:
        return None
    return None
