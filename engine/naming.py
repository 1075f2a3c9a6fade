"""Where every file of a store lives, and how names map to positions (RocketMQ's layout)."""

from __future__ import annotations

import re
import time
from pathlib import Path

from engine.errors import BadInputError

NAME_DIGITS = 20
TOPIC_MAX_BYTES = 127
_TOPIC_RE = re.compile(r"^[A-Za-z0-9_%|-]+$")  # RocketMQ's allowed topic characters

COMMITLOG_DIR = "commitlog"
CONSUMEQUEUE_DIR = "consumequeue"
INDEX_DIR = "index"
CONFIG_DIR = "config"
QUARANTINE_DIR = "quarantine"
CHECKPOINT_FILE = "checkpoint"
ABORT_FILE = "abort"
LOCK_FILE = "lock"
STORE_META_FILE = "store.json"
TOPICS_FILE = "topics.json"
CONSUMER_OFFSET_FILE = "consumerOffset.json"
BACKUP_SUFFIX = ".bak"
TEMP_SUFFIX = ".tmp"
LOG_FILE = "mqstore.log"


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


def index_file_name(now_ms: int | None = None) -> str:
    """Index files are named by local wall-clock creation time, yyyyMMddHHmmssSSS."""
    now_ms = int(time.time() * 1000) if now_ms is None else now_ms
    secs, millis = divmod(now_ms, 1000)
    return time.strftime("%Y%m%d%H%M%S", time.localtime(secs)) + f"{millis:03d}"


def quarantine_name(cut_pos: int, now_ms: int) -> str:
    """Side file for a torn tail cut at `cut_pos` (ZODB's .trN idea)."""
    return f"{offset_to_name(cut_pos)}.{now_ms}.torn"
