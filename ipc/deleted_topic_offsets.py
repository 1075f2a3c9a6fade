"""Every group's offsets of a deleted topic removed from config/consumerOffset.json, by the
supervisor as part of applying the delete (a primitive: it acts as no client).

Step order: the delete's tombstone is in topics.json first, then this runs under the offsets
lock, so a consumer's commit either lands before it (and is removed here) or sees the tombstone
under the same lock and is dropped (ipc.consumer_offsets): no old offset survives to skip the
re-created topic's first messages. A primary that cannot be read is left to the consumers'
restore from the backup (ipc.consumer_offsets), which the CLI's own reset then runs.
"""

from __future__ import annotations

import os
from pathlib import Path

from engine.errors import StoreError
from engine.files.filesystem import write_file_atomically
from engine.files.naming import (
    BACKUP_SUFFIX,
    BROADCAST_OFFSETS_DIR,
    CONFIG_DIR,
    CONSUMER_OFFSET_FILE,
    validate_topic,
)
from ipc.offset_table_codec import encode_offset_table, parse_offset_document, plan_forget_topic
from ipc.refused_offsets import offsets_lock


def forget_topic_offsets(store_dir: str | os.PathLike, topic: str) -> list[str]:
    """Remove every group's offsets of `topic` (one atomic replace per file, the previous kept
    as `.bak`): the groups' file and every BROADCASTING instance's, under the one offsets lock;
    the groups that had any. StoreError when a file cannot be read as offsets."""
    validate_topic(topic)
    config = Path(store_dir) / CONFIG_DIR
    groups: set[str] = set()
    with offsets_lock(store_dir):
        # an instance's offsets survive otherwise, and a re-created topic is read from them
        for path in [config / CONSUMER_OFFSET_FILE, *broadcast_instance_paths(store_dir)]:
            groups.update(_forget_in(path, topic))
    return sorted(groups)


def broadcast_instance_paths(store_dir: str | os.PathLike) -> list[Path]:
    """The offsets files of the store's BROADCASTING instances (those that committed), sorted."""
    directory = Path(store_dir) / CONFIG_DIR / BROADCAST_OFFSETS_DIR
    try:
        names = sorted(os.listdir(directory))
    except FileNotFoundError:
        return []
    paths = [directory / name / CONSUMER_OFFSET_FILE for name in names]
    return [path for path in paths if path.exists() or path.with_name(path.name + BACKUP_SUFFIX).exists()]


def _forget_in(path: Path, topic: str) -> list[str]:
    """Under the offsets lock: `topic`'s offsets removed from one file; the groups that had any."""
    try:
        table, times = parse_offset_document(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return []
    except (ValueError, UnicodeDecodeError) as exc:
        raise StoreError(f"{path.name} unreadable: {exc}", path=str(path)) from None
    kept_table, kept_times, groups = plan_forget_topic(table, times, topic)
    if groups:
        write_file_atomically(path, encode_offset_table(kept_table, kept_times), backup_suffix=BACKUP_SUFFIX)
        os.chmod(path.with_name(path.name + BACKUP_SUFFIX), 0o600)  # as the consumers keep it
    return groups
