"""A store's layout as the Spark code sees it: format, segment size and segments, durable end.

Read from the directory with plain file reads and the pure codecs (store.json, checkpoint);
nothing is mapped, so this is safe on a live store and on executors.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from pathlib import Path

from engine.delivery.levels import DEFAULT_DELAY_LEVELS_MS, parse_delay_levels
from engine.errors import NotAStoreError
from engine.files.naming import (
    STORE_META_FILE,
    check_segment_bases,
    check_segment_sizes,
    commitlog_dir,
    infer_segment_bytes,
    segment_files,
)
from engine.formats.record import Verify
from engine.formats.store_meta import decode_store_meta
from engine.recovery.checkpoint import load_checkpoint


class StoreFormat(Enum):
    MQSTORE = "mqstore"  # store.json present: every record must carry its CRC32C
    ROCKETMQ = "rocketmq"  # written by RocketMQ: BODYCRC (and a CRC32C only where present)


@dataclass(frozen=True)
class Segment:
    path: str
    base_pos: int


@dataclass(frozen=True)
class StoreLayout:
    """What a reader needs to know about a store, read from its directory (no mmaps)."""

    root: str
    format: StoreFormat
    segment_bytes: int
    segments: tuple[Segment, ...]
    consume_queue_entries: int = 0
    index_slot_count: int = 0
    index_entry_count: int = 0
    index_shards: int = 0
    delay_levels_ms: tuple[int, ...] = DEFAULT_DELAY_LEVELS_MS  # the tag field of scheduled entries

    @property
    def full_verify(self) -> Verify:
        return Verify.MQSTORE if self.format is StoreFormat.MQSTORE else Verify.ROCKETMQ

    @property
    def min_pos(self) -> int:
        return self.segments[0].base_pos if self.segments else 0


# ------------------------------------------------------------------------ store layout


def read_layout(root: str | Path, store_format: StoreFormat | None = None) -> StoreLayout:
    """Classify the store and list its segments; sizes from store.json, else from the files."""
    root = Path(root)
    directory = commitlog_dir(root)
    if not directory.is_dir():
        raise NotAStoreError("no commitlog/ directory here", path=str(root))
    files = segment_files(directory)
    meta_path = root / STORE_META_FILE
    if store_format is None:
        store_format = StoreFormat.MQSTORE if meta_path.exists() else StoreFormat.ROCKETMQ
    sizes: dict = {}
    if meta_path.exists():
        meta = decode_store_meta(meta_path.read_bytes(), path=str(meta_path))
        segment_bytes = meta.commitlog_file_size
        sizes = dict(consume_queue_entries=meta.consume_queue_entries,
                     index_slot_count=meta.index_slot_count,
                     index_entry_count=meta.index_entry_count, index_shards=meta.index_shards)
        if meta.message_delay_level is not None:
            sizes["delay_levels_ms"] = parse_delay_levels(meta.message_delay_level)
    else:
        segment_bytes = infer_segment_bytes(files)
    check_segment_bases(files, segment_bytes)
    check_segment_sizes(files, segment_bytes)
    segments = tuple(Segment(str(file.path), file.base_pos) for file in files)
    return StoreLayout(str(root), store_format, segment_bytes, segments, **sizes)


def read_durable_pos(root: str | Path) -> int | None:
    """min(commitlog flushed, consume queues durable) from the checkpoint (or its .bak);
    None without an mqstore checkpoint."""
    cp = load_checkpoint(Path(root)).checkpoint
    return None if cp is None else min(cp.commitlog_flushed_pos, cp.cq_durable_pos)
