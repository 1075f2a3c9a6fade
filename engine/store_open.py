"""Opening a store for writing: the one sequence `MessageStore.open` and the supervisor share.

1. classify the directory: a RocketMQ store is refused (every byte kept), a new one is laid out;
2. read store.json, refuse one that disagrees with the files (hand-edited), and let its frozen
   layout sizes win over the settings;
3. take the store lock (a second writer is refused), then run the caller's step for what a
   crashed previous owner left (the supervisor's stale children and shared memory);
4. open the parts (a routine recovery first refuses damage below the durable line on read-only
   views, and sets aside the index shards it must rebuild; a rebuild or salvage first pads short
   segments) and recover them: abort file and checkpoint, truncation, re-dispatch;
5. create `abort` (present until a clean stop removes it);
6. hand the derived files over: the in-process store keeps them open and dispatches itself, the
   supervisor closes them for its dispatcher and index-builder processes (`Dispatch`).

A failure at any step after the lock closes what was opened and releases the lock.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from enum import Enum
from pathlib import Path

from engine.config import StoreConfig
from engine.errors import CorruptIndexError
from engine.files.filesystem import move_aside
from engine.files.mapped_file import Access
from engine.files.naming import QUARANTINE_DIR, index_shard_dir
from engine.files.open_files import queue_file_budget
from engine.files.store_dir import (
    StoreKind,
    StoreLock,
    config_for_store,
    create_store_dir,
    inspect_store_dir,
    is_fresh_store,
    mark_running,
    read_meta,
    refuse_foreign_store,
)
from engine.formats.store_meta import StoreMeta
from engine.frozen_settings import refuse_inconsistent_meta
from engine.index.shard import ShardIndex
from engine.log.commitlog import CommitLog
from engine.queues.table import ConsumeQueueTable, OnUnreadable
from engine.recovery.durable_line import pad_short_segments, refuse_short_segments
from engine.recovery.recover import (
    RecoveryMode,
    RecoveryReport,
    StoreParts,
    detect_shutdown,
    recover,
    refuse_damage_before_opening,
)
from engine.topics.system import system_topic_counts
from engine.topics.table import TopicConfig, TopicTable, TopicTableFile

log = logging.getLogger(__name__)


class Dispatch(Enum):
    """Who builds the consume queues and the index from the log once the store is open."""

    IN_PROCESS = "in-process"  # MessageStore: keeps queues and shards open, dispatches on put
    CHILD_PROCESSES = "child-processes"  # the supervisor: its children open them themselves


@dataclass
class OpenedStore:
    """A store open for writing, recovered, marked running, and locked by this process."""

    root: Path
    config: StoreConfig  # the settings with store.json's frozen layout applied
    meta: StoreMeta
    lock: StoreLock
    report: RecoveryReport
    new_store: bool  # laid out by this open: nothing was recovered
    commitlog: CommitLog
    next_offsets: dict[tuple[str, int], int]  # (topic, queue_id) -> the next queue offset
    topics: TopicTable  # config/topics.json with the store's own topics and its queues' topics
    parts: StoreParts | None  # every part, open; None under Dispatch.CHILD_PROCESSES

    def summary_lines(self) -> list[str]:
        """What the open did, as the log says it: a new store has nothing to recover, so the
        report of its empty scan would only mislead."""
        return [new_store_line(self.root)] if self.new_store else self.report.summary_lines()


def new_store_line(root: Path) -> str:
    return f"new store {root}: created, nothing to recover"


def open_store(root: str | Path, config: StoreConfig, *, writer: str, dispatch: Dispatch,
               recovery: RecoveryMode = RecoveryMode.ROUTINE,
               progress: Callable[[int, int], None] | None = None,
               after_lock: Callable[[], None] | None = None) -> OpenedStore:
    """Run the open sequence of the module doc. `writer` names the opener in the refusal of a
    foreign store ("<writer> would write it"); `after_lock` runs once the lock is held."""
    root = Path(root)
    kind = inspect_store_dir(root)
    if kind is StoreKind.ROCKETMQ:
        refuse_foreign_store(root, f"{writer} would write it")
    meta = create_store_dir(root, config) if kind is StoreKind.NEW else read_meta(root)
    if kind is StoreKind.MQSTORE:
        refuse_inconsistent_meta(root, meta)  # a hand-edited store.json is not trusted
    new_store = is_fresh_store(root)
    store_config = config_for_store(meta, config)
    if store_config.index_shards != config.index_shards:
        log.warning("store.json fixes index_shards at %d (asked for %d)",
                    store_config.index_shards, config.index_shards)
    lock = StoreLock.acquire(root)
    try:
        if after_lock is not None:
            after_lock()
        topic_file = TopicTableFile(root)
        # a bad topics.json refuses the open before anything changes
        table = topic_file.load().with_system_topics(system_topic_counts(len(store_config.delay_levels_ms)))
        parts, report = _recover(root, store_config, recovery, progress, new_store, table.tombstones)
        table = _keep_tombstones_within(topic_file, table, parts)
        table = _adopt_queue_topics(topic_file, table, parts.queues, store_config.queue_count)
        mark_running(root)
    except BaseException:
        lock.release()
        raise
    next_offsets = {(q.topic, q.queue_id): q.max_offset for q in parts.queues}
    if dispatch is Dispatch.CHILD_PROCESSES:
        _close_derived(parts)
    return OpenedStore(root, store_config, meta, lock, report, new_store, parts.commitlog,
                       next_offsets, table, parts if dispatch is Dispatch.IN_PROCESS else None)


def _keep_tombstones_within(topic_file: TopicTableFile, table: TopicTable, parts: StoreParts) -> TopicTable:
    """The table with no tombstone above the recovered end of the log, written when one was
    (before any put): a lost unflushed tail (a store from before tombstones were flushed, or a
    torn tail) must not leave a tombstone that hides the records written after it."""
    end_pos = parts.commitlog.written_pos
    lowered = table.with_tombstones_within(end_pos)
    if lowered is not table:
        topic_file.write(lowered)
        parts.queues.bury(lowered.tombstones)
        log.warning("lowered the tombstone(s) of %s to the recovered end of the log %d",
                    ", ".join(sorted(name for name, pos in table.tombstones.items() if pos > end_pos)),
                    end_pos)
    return lowered


def _adopt_queue_topics(topic_file: TopicTableFile, table: TopicTable, queues: ConsumeQueueTable,
                        default_queue_count: int) -> TopicTable:
    """The table with every topic that has queues but no config (a store from before
    topics.json, or a first put whose topics.json write a crash cut off) configured with the
    default queue count, or more to cover its highest queue; written when that added any."""
    used: dict[str, int] = {}
    for queue in queues:
        if queue.topic not in table.topics:
            used[queue.topic] = max(used.get(queue.topic, 0), queue.queue_id + 1)
    for topic, count in sorted(used.items()):
        table = table.with_topic(TopicConfig(topic, max(count, default_queue_count),
                                             max(count, default_queue_count)))
    if used:
        topic_file.write(table)
        log.info("configured %d topic(s) found in the consume queues: %s", len(used), ", ".join(sorted(used)))
    return table


def _recover(root: Path, config: StoreConfig, mode: RecoveryMode,
             progress: Callable[[int, int], None] | None,
             new_store: bool, tombstones: Mapping[str, int]) -> tuple[StoreParts, RecoveryReport]:
    """Open the parts and recover them, logging what was found; closes them if recovery fails."""
    shutdown = detect_shutdown(root)
    if new_store:
        log.info("%s", new_store_line(root))
    else:
        log.info("recovering store %s after a %s shutdown", root, shutdown.value)
    parts = open_for_recovery(root, config, mode)
    try:
        # a deleted topic's queues go before re-dispatch, which skips its records below the
        # tombstone: a topic created again gets its entries in fresh queues, never the old ones
        for topic, queue_id in parts.queues.bury(tombstones):
            log.info("removed consume queue %s/%d of a deleted topic", topic, queue_id)
        report = recover(parts, shutdown, mode=mode, progress=progress)
    except BaseException:
        close_parts(parts)
        raise
    for line in [] if new_store else report.summary_lines():
        log.info("%s", line)
    return parts, report


def open_for_recovery(root: Path, config: StoreConfig, mode: RecoveryMode) -> StoreParts:
    """The writable parts `recover` works on, opened only once the mode allows writing: a routine
    recovery first refuses damage below the durable line on a read-only view, then sets aside
    the index shards whose files cannot vouch for a trim; a rebuild or a salvage first pads
    short segments with zeros (each logged at WARNING)."""
    if mode is not RecoveryMode.ROUTINE:
        for path, size_bytes in pad_short_segments(root, config.commitlog_file_size):
            log.warning("extended short segment %s from %d bytes with zeros", path, size_bytes)
        # a salvage reads each queue's old tail (hidden_tails): an unreadable one is refused
        unreadable = OnUnreadable.RAISE if mode is RecoveryMode.SALVAGE else OnUnreadable.SET_ASIDE
        return open_parts(root, config, Access.READ_WRITE, unreadable)
    unsound = refuse_damage_before_opening(root, config)
    parts = open_parts(root, config, Access.READ_WRITE, OnUnreadable.SET_ASIDE)
    try:
        _set_aside_unsound_shards(parts, config, unsound)
    except BaseException:
        close_parts(parts)
        raise
    return parts


def open_parts(root: Path, config: StoreConfig, access: Access,
               unreadable_queues: OnUnreadable = OnUnreadable.RAISE) -> StoreParts:
    """Open the commitlog, consume queues and index shards of a store; a consume queue whose
    files break the layout is handled by `unreadable_queues` (recovery sets it aside).

    A writer that finds an index shard it cannot read moves the shard aside to quarantine/
    and starts it empty; recovery then rebuilds it from the commitlog (the index is derived).
    A writer refuses a short commitlog segment (StoreCorruptError; a rebuild pads it first).
    """
    if access is Access.READ_WRITE:
        refuse_short_segments(root, config.commitlog_file_size)
    commitlog = CommitLog.open(root, config.commitlog_file_size, access)
    queues = ConsumeQueueTable.load(root, config.consume_queue_entries, access,
                                    queue_file_budget(config.max_open_queue_files), unreadable_queues,
                                    delay_levels_ms=config.delay_levels_ms)
    shards, damaged = [], []
    for n in range(config.index_shards):
        try:
            shards.append(open_shard(root, config, n, access))
        except CorruptIndexError:
            if access is not Access.READ_WRITE:
                raise
            quarantine_shard(root, n)
            shards.append(open_shard(root, config, n, access))
            damaged.append(n)
    return StoreParts(Path(root), commitlog, queues, shards, damaged)


def _set_aside_unsound_shards(parts: StoreParts, config: StoreConfig, unsound: dict[int, str]) -> None:
    """Routine recovery trims each index shard and trusts what it keeps: a shard whose files
    cannot vouch for that (`unsound`, engine.index.health) is moved aside and rebuilt as an
    unreadable one is."""
    for n, problem in unsound.items():
        if n in parts.damaged_shards:
            continue
        log.warning("index shard %d is rebuilt from the commitlog: %s", n, problem)
        if parts.shards[n].files:
            parts.shards[n].close()
            quarantine_shard(parts.root, n)
            parts.shards[n] = open_shard(parts.root, config, n, Access.READ_WRITE)
        parts.damaged_shards.append(n)
    parts.damaged_shards.sort()


def open_shard(root: Path, config: StoreConfig, shard: int, access: Access) -> ShardIndex:
    return ShardIndex.load(root, shard, config.index_slot_count, config.index_entry_count, access)


def quarantine_shard(root: Path, shard: int) -> Path:
    """Move an unreadable index shard's directory aside (kept for inspection, never deleted)."""
    return move_aside(index_shard_dir(root, shard), Path(root) / QUARANTINE_DIR,
                      f"index-{shard}.{int(time.time() * 1000)}")


def close_parts(parts: StoreParts) -> None:
    parts.commitlog.close()
    _close_derived(parts)


def _close_derived(parts: StoreParts) -> None:
    """Close the consume queues and index shards (the commitlog stays open)."""
    parts.queues.close()
    for shard in parts.shards:
        shard.close()
