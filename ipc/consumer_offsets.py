"""Committed consumer offsets: <store>/config/consumerOffset.json in RocketMQ's layout.

    {"offsetTable": {"<topic>@<group>": {"<queueId>": <next queue offset>, ...}, ...},
     "commitTimeTable": {"<topic>@<group>": {"<queueId>": <last commit, ms since epoch>, ...}, ...}}

`commitTimeTable` is mqstore's (operators read a group's last commit time from it); RocketMQ's
reader ignores keys it does not know, and a RocketMQ-written file without it reads as "never".
RocketMQ's fastjson writes the queue ids as bare integers ({0:250}), which is not JSON; the
reader accepts both, the writer writes strict JSON. A commit is a read-modify-write under an
flock on `consumerOffset.json.lock`, so consumers in several processes never lose each other's
commits, and the file is replaced atomically with the previous version kept as `.bak` (a torn
or garbled primary is replaced by the backup: logged at WARNING here and in mqstore.log, kept
aside as `.torn-<ms>`, and counted in ipc.offsets_fallbacks for `mqstore status` and the
exporter).
"""

from __future__ import annotations

import logging
import os
import re
import time
from collections.abc import Mapping
from pathlib import Path

from engine.errors import BadInputError, StoreError
from engine.files.filesystem import ensure_dir, write_file_atomically
from engine.files.naming import (
    BACKUP_SUFFIX,
    BROADCAST_OFFSETS_DIR,
    CONFIG_DIR,
    CONSUMER_OFFSET_FILE,
    validate_topic,
)
from engine.topics.table import TopicTableFile
from ipc.deleted_topic_offsets import broadcast_instance_paths
from ipc.offset_table_codec import (
    CommitTimes,
    OffsetTable,
    encode_offset_table,
    parse_offset_document,
    parse_offset_table,
    plan_forget_topic,
)
from ipc.offsets_fallbacks import count_fallback
from ipc.refused_offsets import offsets_lock
from ipc.store_log import append_to_store_log

log = logging.getLogger(__name__)

__all__ = ["CommitTimes", "OffsetTable", "parse_offset_document", "parse_offset_table"]  # re-exported
GROUP_MAX_BYTES = 255
_GROUP_RE = re.compile(r"^[A-Za-z0-9_%|-]+$")
TORN_SUFFIX = ".torn-"  # consumerOffset.json.torn-<ms>: a bad primary the backup replaced


class _Unreadable(Exception):
    """The primary offsets file cannot be used as it is (`reason` says why)."""

    def __init__(self, reason: str):
        self.reason = reason
        super().__init__(reason)


def validate_group(group: object) -> str:
    """A consumer group name: RocketMQ's characters, 1..255 bytes."""
    if not isinstance(group, str) or not group:
        raise BadInputError("group", "must be a non-empty str")
    if len(group.encode()) > GROUP_MAX_BYTES or not _GROUP_RE.match(group):
        raise BadInputError("group", f"{group!r} may only hold letters, digits, '%', '|', '-', '_' "
                            f"(at most {GROUP_MAX_BYTES} bytes)")
    return group


def table_key(topic: str, group: str) -> str:
    return f"{validate_topic(topic)}@{validate_group(group)}"


def broadcast_offsets_path(store_dir: str | os.PathLike, instance_name: str) -> Path:
    """A BROADCASTING instance's own offsets file (same layout): RocketMQ keeps these on the
    client, one file per instance, since every instance reads every message."""
    return Path(store_dir) / CONFIG_DIR / BROADCAST_OFFSETS_DIR / instance_name / CONSUMER_OFFSET_FILE


class ConsumerOffsets:
    """Read and commit the offsets of one store's consumer groups (or of one BROADCASTING
    instance, at `path`)."""

    def __init__(self, store_dir: str | os.PathLike, path: Path | None = None):
        self.root = Path(store_dir)
        self.path = self.root / CONFIG_DIR / CONSUMER_OFFSET_FILE if path is None else path
        self._topics = TopicTableFile(self.root)  # its tombstones judge a commit (_drop_deleted)

    def load(self) -> OffsetTable:
        """The whole table ({} when no file exists); a bad primary is replaced by `.bak`."""
        return self.load_with_times()[0]

    def load_with_times(self) -> tuple[OffsetTable, CommitTimes]:
        """The table and when each queue was last committed ({} for a queue never committed
        by mqstore). A torn, garbled or missing primary beside a good backup is replaced by
        the backup (`_restore_backup`: logged, counted); both unreadable: StoreError."""
        try:
            return self._read_primary()
        except _Unreadable:
            with self._locked():
                return self._read_or_restore()

    def peek_with_times(self) -> tuple[OffsetTable, CommitTimes]:
        """`load_with_times` for read-only tools: a bad primary is read past (the backup's
        table, with a WARNING here), never replaced; the next consumer does that."""
        try:
            return self._read_primary()
        except _Unreadable as bad:
            tables = self._read_backup(bad.reason)
            log.warning("%s; showing %s (one commit older) until a consumer puts it back",
                        bad.reason, self.backup_path.name)
            return tables

    @property
    def backup_path(self) -> Path:
        return self.path.with_name(self.path.name + BACKUP_SUFFIX)

    def _read_primary(self) -> tuple[OffsetTable, CommitTimes]:
        """The primary's tables; ({}, {}) when neither file exists; _Unreadable when it is
        bad, or missing while a backup exists (someone removed it: the backup is older)."""
        try:
            return parse_offset_document(self.path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            if not self.backup_path.exists():
                return {}, {}
            raise _Unreadable(f"{self.path.name} is missing beside its backup") from None
        except (ValueError, UnicodeDecodeError) as exc:
            raise _Unreadable(f"{self.path.name} unreadable: {exc}") from None

    def _read_backup(self, primary_reason: str) -> tuple[OffsetTable, CommitTimes]:
        try:
            return parse_offset_document(self.backup_path.read_text(encoding="utf-8"))
        except (OSError, ValueError, UnicodeDecodeError) as exc:
            raise StoreError(f"consumer offsets unreadable: {primary_reason}; "
                             f"{self.backup_path.name}: {exc}", path=str(self.path),
                             hint="put the file back from a copy, or remove both files (and "
                                  "the .bak) to start every group over") from None

    def _read_or_restore(self) -> tuple[OffsetTable, CommitTimes]:
        """Under the lock: the primary, or the backup put in its place (another consumer may
        have restored it since the read that found it bad)."""
        try:
            return self._read_primary()
        except _Unreadable as bad:
            return self._restore_backup(bad.reason)

    def _restore_backup(self, reason: str) -> tuple[OffsetTable, CommitTimes]:
        """Put the backup (one commit older) in the bad primary's place, keep the bad file as
        `.torn-<ms>`, count the fallback and say so: every group moves back to the backup's
        offsets and reads again what it consumed since, which must never go unexplained."""
        table, times = self._read_backup(reason)
        at_ms = time.time_ns() // 1_000_000
        kept_as = None
        if self.path.exists():
            kept_as = f"{self.path.name}{TORN_SUFFIX}{at_ms}"
            os.replace(self.path, self.path.with_name(kept_as))
        write_file_atomically(self.path, encode_offset_table(table, times))
        count = count_fallback(self.root, at_ms, reason, kept_as)
        written = max((ms for queues in times.values() for ms in queues.values()), default=None)
        message = (f"{reason}: took {self.backup_path.name} (one commit older, last commit at "
                   f"{_clock(written)}) in its place; every group reads again what it consumed "
                   f"since then; the bad file is kept as {kept_as or 'nothing (it was gone)'} "
                   f"(fallback {count} of this store, see `mqstore status`)")
        log.warning("%s", message)
        append_to_store_log(self.root, "consumer", __name__, logging.WARNING, message)
        return table, times

    def get(self, topic: str, group: str, queue_id: int) -> int | None:
        """The committed next offset of one queue, or None when the group never committed it."""
        return self.load().get(table_key(topic, group), {}).get(queue_id)

    def commit(self, topic: str, group: str, queue_id: int, offset: int, *,
               tombstones_read: Mapping[str, int] | None = None) -> None:
        self.commit_many(group, {(topic, queue_id): offset}, tombstones_read=tombstones_read)

    def commit_many(self, group: str, offsets: Mapping[tuple[str, int], int], *,
                    tombstones_read: Mapping[str, int] | None = None) -> None:
        """Persist several (topic, queue_id) -> offset commits in one atomic replace.
        `tombstones_read`: each topic's tombstone (0: none) when its offsets were read; a commit
        of a topic deleted since is dropped with a WARNING (_drop_deleted)."""
        checked = {}
        for (topic, queue_id), offset in offsets.items():
            if not isinstance(queue_id, int) or isinstance(queue_id, bool) or queue_id < 0:
                raise BadInputError("queue_id", f"{queue_id!r} is not a non-negative int")
            if not isinstance(offset, int) or isinstance(offset, bool) or offset < 0:
                raise BadInputError("offset", f"{offset!r} is not a non-negative int")
            checked[(table_key(topic, group), queue_id)] = offset
        ensure_dir(self.path.parent)
        with self._locked():
            if tombstones_read is not None:
                checked = self._drop_deleted(group, checked, tombstones_read)
                if not checked:
                    return
            table, times = self._read_or_restore()
            now_ms = time.time_ns() // 1_000_000
            for (key, queue_id), offset in checked.items():
                table.setdefault(key, {})[queue_id] = offset
                times.setdefault(key, {})[queue_id] = now_ms
            self._replace(table, times)

    def _drop_deleted(self, group: str, checked: dict[tuple[str, int], int],
                      tombstones_read: Mapping[str, int]) -> dict[tuple[str, int], int]:
        """Under the lock: `checked` without the commits of a topic whose tombstone moved since it
        was read. A delete writes its tombstone before it forgets the offsets under this lock, so
        a commit either lands before the forget (and goes with it) or sees the tombstone here:
        an old offset never survives to skip the re-created topic's first messages."""
        tombstones = self._topics.current().tombstones
        kept = {}
        for (key, queue_id), offset in checked.items():
            topic = key.partition("@")[0]
            if tombstones.get(topic, 0) == tombstones_read.get(topic, 0):
                kept[(key, queue_id)] = offset
                continue
            message = (f"group {group}: commit of {topic}/{queue_id} offset {offset} dropped: the topic "
                       "was deleted after this consumer read it (the offset is of its old queue)")
            log.warning("%s", message)
            append_to_store_log(self.root, "consumer", __name__, logging.WARNING, message)
        return kept

    def forget_topic(self, topic: str) -> list[str]:
        """Remove every group's offsets of a deleted topic (one atomic replace per file: the
        groups' file and every BROADCASTING instance's, under the one offsets lock); returns the
        groups that had any. A topic created again starts its queues at 0, which an old offset
        would point past."""
        validate_topic(topic)
        files = [self] + [ConsumerOffsets(self.root, path) for path in broadcast_instance_paths(self.root)]
        groups: set[str] = set()
        with self._locked():  # one lock for the store's every offsets file
            for offsets in files:
                table, times, forgotten = plan_forget_topic(*offsets._read_or_restore(), topic)
                if forgotten:
                    offsets._replace(table, times)
                    groups.update(forgotten)
        return sorted(groups)

    def _replace(self, table: OffsetTable, times: CommitTimes) -> None:
        """Under the lock: the file replaced, the previous version kept as the backup."""
        write_file_atomically(self.path, encode_offset_table(table, times), backup_suffix=BACKUP_SUFFIX)
        backup = self.path.with_name(self.path.name + BACKUP_SUFFIX)
        if backup.exists():  # the backup copy is made with the process umask: owner-only
            os.chmod(backup, 0o600)

    def _locked(self):
        return offsets_lock(self.root)


def _clock(ms: int | None) -> str:
    """An epoch-ms stamp as local date and time, 'unknown' for none."""
    if ms is None:
        return "unknown"
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(ms / 1000)) + f".{ms % 1000:03d}"
