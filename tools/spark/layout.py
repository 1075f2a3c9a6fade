"""A store's layout as the Spark code sees it: format, segment size and segments, durable end.

Read from the directory with plain file reads and the pure codecs (store.json, checkpoint);
nothing is mapped, so this is safe on a live store and on executors.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Sequence
from dataclasses import dataclass
from enum import Enum
from pathlib import Path

from engine.checkpoint import load_checkpoint
from engine.errors import NotAStoreError, SegmentLayoutError
from engine.formats.record import Verify
from engine.formats.store_meta import decode_store_meta
from engine.naming import STORE_META_FILE, commitlog_dir, is_segment_name, name_to_offset


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
    names = sorted(n for n in os.listdir(directory) if is_segment_name(n))
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
    else:
        segment_bytes = _inferred_segment_bytes(directory, names)
    segments = tuple(Segment(str(directory / n), name_to_offset(n)) for n in names)
    _check_segments(segments, segment_bytes)
    return StoreLayout(str(root), store_format, segment_bytes, segments, **sizes)


def _inferred_segment_bytes(directory: Path, names: list[str]) -> int:
    """A RocketMQ store records no segment size: every segment file has it."""
    sizes = {os.stat(directory / n).st_size for n in names}
    if len(sizes) > 1:
        raise SegmentLayoutError(f"segments of different sizes {sorted(sizes)}", path=str(directory))
    return sizes.pop() if sizes else 1 << 30


def _check_segments(segments: Sequence[Segment], segment_bytes: int) -> None:
    for prev, seg in itertools.pairwise(segments):
        if seg.base_pos != prev.base_pos + segment_bytes:
            raise SegmentLayoutError(f"gap in segments after {prev.base_pos}", path=seg.path)
    for seg in segments:
        if seg.base_pos % segment_bytes or os.stat(seg.path).st_size != segment_bytes:
            raise SegmentLayoutError(f"segment is not {segment_bytes} bytes at a multiple of it",
                                     path=seg.path)


def read_durable_pos(root: str | Path) -> int | None:
    """min(commitlog flushed, consume queues durable) from the checkpoint (or its .bak);
    None without an mqstore checkpoint."""
    cp = load_checkpoint(Path(root)).checkpoint
    return None if cp is None else min(cp.commitlog_flushed_pos, cp.cq_durable_pos)
