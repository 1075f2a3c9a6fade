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
from engine.files.naming import BACKUP_SUFFIX, CONFIG_DIR, CONSUMER_OFFSET_FILE, validate_topic
from ipc.offset_table_codec import encode_offset_table, parse_offset_document, plan_forget_topic
from ipc.refused_offsets import offsets_lock


def forget_topic_offsets(store_dir: str | os.PathLike, topic: str) -> list[str]:
    """Remove every group's offsets of `topic` (one atomic replace, the previous file kept as
    `.bak`); the groups that had any. StoreError when the file cannot be read as offsets."""
    validate_topic(topic)
    path = Path(store_dir) / CONFIG_DIR / CONSUMER_OFFSET_FILE
    with offsets_lock(store_dir):
        try:
            table, times = parse_offset_document(path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            return []
        except (ValueError, UnicodeDecodeError) as exc:
            raise StoreError(f"{path.name} unreadable: {exc}", path=str(path)) from None
        kept_table, kept_times, groups = plan_forget_topic(table, times, topic)
        if groups:
            write_file_atomically(path, encode_offset_table(kept_table, kept_times),
                                  backup_suffix=BACKUP_SUFFIX)
            os.chmod(path.with_name(path.name + BACKUP_SUFFIX), 0o600)  # as the consumers keep it
    return groups
