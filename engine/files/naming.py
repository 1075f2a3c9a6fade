"""Where every file of a store lives, and how names map to positions (RocketMQ's layout)."""

from __future__ import annotations

import itertools
import os
import re
import time
from collections.abc import Sequence
from pathlib import Path
from typing import NamedTuple

from engine.errors import BadInputError, SegmentLayoutError

NAME_DIGITS = 20
TOPIC_MAX_BYTES = 127
_TOPIC_RE = re.compile(r"^[A-Za-z0-9_%|-]+$")  # RocketMQ's allowed topic characters

COMMITLOG_DIR = "commitlog"
CONSUMEQUEUE_DIR = "consumequeue"
INDEX_DIR = "index"
CONFIG_DIR = "config"
QUARANTINE_DIR = "quarantine"
CHECKPOINT_FILE = "checkpoint"
RETENTION_LINE_FILE = "retention_line"
ABORT_FILE = "abort"
LOCK_FILE = "lock"
STORE_META_FILE = "store.json"
CONSUMER_OFFSET_FILE = "consumerOffset.json"
BROADCAST_OFFSETS_DIR = "broadcastOffsets"  # config/broadcastOffsets/<instance>/consumerOffset.json
TOPICS_FILE = "topics.json"  # RocketMQ's topic configs (engine.topics.table)
BACKUP_SUFFIX = ".bak"
TEMP_SUFFIX = ".tmp"
REBUILD_SUFFIX = ".rebuild"  # consumequeue/<topic>/<queueId>.rebuild: that queue is being rebuilt
LOG_FILE = "mqstore.log"
ROCKETMQ_SEGMENT_BYTES = 1 << 30  # RocketMQ's default commitlog segment size


def offset_to_name(pos: int) -> str:
    """A segment's file name: its first position, 20 zero-padded digits."""
    return f"{pos:0{NAME_DIGITS}d}"


def name_to_offset(name: str) -> int:
    """Inverse of offset_to_name; raises ValueError for a foreign name."""
    if len(name) != NAME_DIGITS or not name.isdigit():
        raise ValueError(f"not a segment name: {name!r}")
    return int(name)


def is_segment_name(name: str) -> bool:
    return len(name) == NAME_DIGITS and name.isdigit()


# ---------------------------------------------------------------- segment listing


class SegmentFile(NamedTuple):
    """One segment file of a directory: the position of its first byte, and its path."""

    base_pos: int
    path: Path


def segment_files(directory: Path) -> list[SegmentFile]:
    """The segment files of `directory` (20-digit names) by base position; other names are
    not listed, and a missing directory lists none."""
    directory = Path(directory)
    if not directory.is_dir():
        return []
    names = sorted(n for n in os.listdir(directory) if is_segment_name(n))
    return [SegmentFile(name_to_offset(n), directory / n) for n in names]


def check_segment_bases(files: Sequence[SegmentFile], segment_bytes: int) -> None:
    """Every base a multiple of `segment_bytes` and each one `segment_bytes` after the one
    before (no gap): else SegmentLayoutError at the first file that breaks the rule."""
    for file in files:
        if file.base_pos % segment_bytes:
            raise SegmentLayoutError(f"segment name is not a multiple of the segment size {segment_bytes}",
                                     path=str(file.path))
    for prev, file in itertools.pairwise(files):
        if file.base_pos != prev.base_pos + segment_bytes:
            expected = offset_to_name(prev.base_pos + segment_bytes)
            raise SegmentLayoutError(f"gap in segments: expected {expected}", path=str(file.path))


def check_segment_sizes(files: Sequence[SegmentFile], segment_bytes: int) -> None:
    """Every file exactly `segment_bytes` long: else SegmentLayoutError."""
    for file in files:
        size_bytes = os.stat(file.path).st_size
        if size_bytes != segment_bytes:
            raise SegmentLayoutError(f"segment is {size_bytes} bytes, not {segment_bytes}",
                                     path=str(file.path))


def infer_segment_bytes(files: Sequence[SegmentFile]) -> int:
    """The segment size of a store that records none (RocketMQ's): the size its segment files
    share (RocketMQ's default without files); SegmentLayoutError when they differ or are zero."""
    sizes = {os.stat(file.path).st_size for file in files}
    if len(sizes) > 1 or 0 in sizes:
        raise SegmentLayoutError(f"segment files of sizes {sorted(sizes)}: they must share one, "
                                 "not zero", path=str(files[0].path.parent))
    return sizes.pop() if sizes else ROCKETMQ_SEGMENT_BYTES


def validate_topic(topic: object) -> str:
    """Return the topic if usable as a directory name and a RocketMQ topic, else raise."""
    if not isinstance(topic, str):
        raise BadInputError("topic", f"must be a str, not {type(topic).__name__}")
    if not topic:
        raise BadInputError("topic", "must not be empty")
    try:
        encoded = topic.encode("utf-8")
    except UnicodeEncodeError:
        raise BadInputError("topic", "is not valid UTF-8 text") from None
    if len(encoded) > TOPIC_MAX_BYTES:
        raise BadInputError("topic", f"longer than {TOPIC_MAX_BYTES} bytes")
    if topic in (".", "..") or "/" in topic or not _TOPIC_RE.match(topic):
        raise BadInputError("topic", f"{topic!r} may only hold letters, digits, '%', '|', '-', '_'")
    return topic


def is_topic_name(name: str) -> bool:
    """Whether `name` (e.g. a directory's) is a valid topic."""
    try:
        validate_topic(name)
    except BadInputError:
        return False
    return True


def commitlog_dir(root: Path) -> Path:
    return Path(root) / COMMITLOG_DIR


def consume_queue_dir(root: Path, topic: str, queue_id: int) -> Path:
    return Path(root) / CONSUMEQUEUE_DIR / topic / str(queue_id)


def index_shard_dir(root: Path, shard: int) -> Path:
    return Path(root) / INDEX_DIR / str(shard)


def config_path(root: Path, name: str) -> Path:
    return Path(root) / CONFIG_DIR / name


INDEX_NAME_DIGITS = 17  # yyyyMMddHHmmssSSS


def is_index_file_name(name: str) -> bool:
    """Whether a name in a shard's directory is an index file's (17 digits, index_file_name)."""
    return len(name) == INDEX_NAME_DIGITS and name.isdigit()


def index_file_name(now_ms: int | None = None) -> str:
    """Index files are named by local wall-clock creation time, yyyyMMddHHmmssSSS."""
    now_ms = int(time.time() * 1000) if now_ms is None else now_ms
    secs, millis = divmod(now_ms, 1000)
    return time.strftime("%Y%m%d%H%M%S", time.localtime(secs)) + f"{millis:03d}"


def quarantine_name(cut_pos: int, now_ms: int) -> str:
    """Side file for a torn tail cut at `cut_pos` (ZODB's .trN idea)."""
    return f"{offset_to_name(cut_pos)}.{now_ms}.torn"


def damaged_copy_name(start_pos: int, now_ms: int) -> str:
    """Side file for the bytes of a damaged span a salvage accepted, starting at `start_pos`."""
    return f"{offset_to_name(start_pos)}.{now_ms}.damaged"
