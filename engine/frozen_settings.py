"""Settings that shape a store's files, frozen in store.json when the store is created.

Segment and index sizes, the index shard count, the queue count and the delay levels (a
scheduled record's queue is its level) decide where every byte and
every key lives; a store restarted with other values would hide queues or look keys up in the
wrong shard. So a later start or recover that asks for another value is refused with both values
named, before anything is written, and a store.json edited to disagree with the files on disk
is refused rather than trusted.
"""

from __future__ import annotations

from pathlib import Path

from engine.delivery.levels import DEFAULT_DELAY_LEVELS, parse_delay_levels
from engine.errors import FrozenSettingError, StoreMetaMismatchError
from engine.files.naming import CONSUMEQUEUE_DIR, INDEX_DIR, TOPICS_FILE, is_topic_name
from engine.formats.store_meta import StoreMeta
from engine.recovery.checkpoint import load_checkpoint
from engine.topics.system import is_system_topic, queue_count_of
from engine.topics.table import TopicTableFile

FROZEN_SETTINGS = ("commitlog_file_size", "consume_queue_entries", "index_slot_count",
                   "index_entry_count", "index_shards", "queue_count", "message_delay_level")
_RESTORE_HINT = "put store.json back as it was when the store was created"


def refuse_changed_settings(meta: StoreMeta, asked: dict[str, tuple[object, str]],
                            root: Path) -> None:
    """Raise FrozenSettingError when a setting the caller gave explicitly (name -> (value,
    where it was given)) differs from what store.json froze. Settings not given are fine."""
    conflicts = []
    for name in FROZEN_SETTINGS:
        if name not in asked:
            continue
        stored = getattr(meta, name)
        value, source = asked[name]
        if stored is not None and value != stored:
            conflicts.append((name, stored, value, source))
    if conflicts:
        raise FrozenSettingError(conflicts, path=str(root))


def refuse_inconsistent_meta(root: Path, meta: StoreMeta) -> None:
    """Raise StoreMetaMismatchError when store.json's shard or queue count disagrees with the
    index shard directories, the checkpoint's shard count or the consume-queue directories."""
    root = Path(root)
    shard_dirs = _numbered_dirs(root / INDEX_DIR)
    extra = [n for n in shard_dirs if n >= meta.index_shards and any((root / INDEX_DIR / str(n)).iterdir())]
    if extra:
        raise StoreMetaMismatchError(
            f"store.json says index_shards = {meta.index_shards}, but {INDEX_DIR}/{extra[0]}/ holds "
            f"index files of shard {extra[0]}", path=str(root / "store.json"), hint=_RESTORE_HINT)
    checkpoint = load_checkpoint(root).checkpoint
    recorded = len(checkpoint.index_durable_pos) if checkpoint is not None else 0
    if recorded and recorded != meta.index_shards:
        raise StoreMetaMismatchError(
            f"store.json says index_shards = {meta.index_shards}, but the checkpoint records "
            f"{recorded} index shards", path=str(root / "store.json"), hint=_RESTORE_HINT)
    if meta.queue_count is not None:
        levels = DEFAULT_DELAY_LEVELS if meta.message_delay_level is None else meta.message_delay_level
        _refuse_hidden_queues(root, meta.queue_count, len(parse_delay_levels(levels)))


def _refuse_hidden_queues(root: Path, queue_count: int, delay_level_count: int) -> None:
    """A queue past its topic's count would be hidden from consumers: the store's own topics
    have theirs (engine.topics.system), a configured topic its read queues (config/topics.json),
    any other topic store.json's queue_count."""
    top = root / CONSUMEQUEUE_DIR
    topics = sorted(p for p in top.iterdir() if is_topic_name(p.name)) if top.is_dir() else []
    configured = TopicTableFile(root).load().topics if topics else {}
    for topic_dir in topics:
        config = configured.get(topic_dir.name)
        if is_system_topic(topic_dir.name) or config is None:
            limit = queue_count_of(topic_dir.name, queue_count, delay_level_count)
        else:
            limit = max(config.read_queue_count, config.write_queue_count)
        beyond = [n for n in _numbered_dirs(topic_dir) if n >= limit]
        if beyond and (config is None or is_system_topic(topic_dir.name)):
            raise StoreMetaMismatchError(
                f"store.json says queue_count = {queue_count}, but topic {topic_dir.name} has "
                f"queue {beyond[0]}", path=str(root / "store.json"), hint=_RESTORE_HINT)
        if beyond:
            raise StoreMetaMismatchError(
                f"{TOPICS_FILE} gives topic {topic_dir.name} {limit} read queues, but it has queue "
                f"{beyond[0]}", path=str(TopicTableFile(root).path),
                hint=f"put {TOPICS_FILE} back as it was (or its .bak)")


def _numbered_dirs(directory: Path) -> list[int]:
    if not directory.is_dir():
        return []
    return sorted(int(p.name) for p in directory.iterdir() if p.name.isdigit() and p.is_dir())
