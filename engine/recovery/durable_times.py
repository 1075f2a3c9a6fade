"""RocketMQ's three checkpoint timestamps, taken from what is durable (reference §5.1):

    physicMsgTimestamp   store time of the last record below the commitlog's flushed position
    logicsMsgTimestamp   store time of the last record below the consume queues' durable position
    indexMsgTimestamp    end timestamp (store time of the last entry) of the newest full index
                         file, the lowest over the shards; 0 while a shard has none

RocketMQ's abnormal recovery starts at the last segment whose first record is at most
min(physic, logics) - 3 s old, and drops index files that end after indexMsgTimestamp, so each
must be a time that the files at the checkpoint's positions hold; the wall clock of the
checkpoint is later than all of them. A full index file is one followed by another in its shard
(ShardIndex._roll syncs it before it creates the next). 0 is RocketMQ's own value before
anything is durable. mqstore's recovery reads only the positions.
"""

from __future__ import annotations

import logging
from pathlib import Path

from engine.errors import CorruptIndexError, CorruptRecordError
from engine.files.naming import index_shard_dir, is_index_file_name
from engine.formats.checkpoint import Checkpoint
from engine.formats.index_file import INDEX_HEADER_SIZE, decode_index_header
from engine.log.commitlog import CommitLog
from engine.log.last_record import record_ending_at

log = logging.getLogger(__name__)



def store_ts_before(commitlog: CommitLog, end_pos: int) -> int:
    """The store time of the record that ends at `end_pos` (a durable position: a record end,
    or a segment base after a filler), found backwards and read with every check
    (engine.log.last_record); 0 when no record is below it, or none that reads ends there (warned:
    0 makes RocketMQ scan from its first segment)."""
    if end_pos <= commitlog.min_pos:
        return 0
    try:
        record = record_ending_at(commitlog, end_pos)
    except CorruptRecordError as exc:
        log.warning("no record ending at the durable position %d reads: %s", end_pos, exc)
        return 0
    if record is None:
        log.warning("no record ends at the durable position %d", end_pos)
        return 0
    return record.store_ts_ms


class CheckpointTimes:
    """Checkpoints stamped with the store times of what their positions hold, read through one
    commitlog view (used by one thread)."""

    def __init__(self, commitlog: CommitLog, root: Path, shard_count: int):
        self._commitlog = commitlog
        self._root = Path(root)
        self._shard_count = shard_count

    def checkpoint(self, commitlog_flushed_pos: int, cq_durable_pos: int,
                   index_durable_pos: tuple[int, ...]) -> Checkpoint:
        """The checkpoint of these durable positions (confirmPhyOffset: the flushed position)."""
        physic_ts_ms = store_ts_before(self._commitlog, commitlog_flushed_pos)
        logics_ts_ms = (physic_ts_ms if cq_durable_pos == commitlog_flushed_pos  # dispatch caught up
                        else store_ts_before(self._commitlog, cq_durable_pos))
        return Checkpoint(physic_msg_ts_ms=physic_ts_ms, logics_msg_ts_ms=logics_ts_ms,
                          index_msg_ts_ms=sealed_index_ts_ms(self._root, self._shard_count),
                          confirm_commit_pos=commitlog_flushed_pos,
                          commitlog_flushed_pos=commitlog_flushed_pos, cq_durable_pos=cq_durable_pos,
                          index_durable_pos=tuple(index_durable_pos))


def sealed_index_ts_ms(root: Path, shard_count: int) -> int:
    """indexMsgTimestamp: the lowest, over the shards, end timestamp of the newest full index
    file of the shard (the next to last); 0 when a shard has no full file (or it went meanwhile)."""
    lowest = None
    for shard in range(shard_count):
        directory = index_shard_dir(root, shard)
        try:
            names = sorted(n for n in (p.name for p in directory.iterdir()) if is_index_file_name(n))
            if len(names) < 2:
                return 0
            with open(directory / names[-2], "rb") as fh:
                header = decode_index_header(fh.read(INDEX_HEADER_SIZE))
        except (FileNotFoundError, CorruptIndexError):
            return 0
        lowest = header.end_ts_ms if lowest is None else min(lowest, header.end_ts_ms)
    return lowest or 0
