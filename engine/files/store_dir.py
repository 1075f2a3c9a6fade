"""A store directory's identity and lifecycle markers: store.json, the lock, the abort file.

A directory is one of: new (absent or empty), an mqstore store (store.json), a
RocketMQ-written store (RocketMQ's layout, no store.json: read-only), or not a store.
"""

from __future__ import annotations

import fcntl
import os
from enum import Enum
from pathlib import Path
from typing import NoReturn

from engine.config import StoreConfig
from engine.errors import NotAStoreError, ReadOnlyStoreError, StoreLockedError, StorePermissionError
from engine.files.filesystem import ensure_dir, remove_file, write_file_atomically
from engine.files.naming import (
    ABORT_FILE,
    CHECKPOINT_FILE,
    COMMITLOG_DIR,
    CONFIG_DIR,
    CONSUMEQUEUE_DIR,
    INDEX_DIR,
    LOCK_FILE,
    STORE_META_FILE,
)
from engine.files.owners import permission_hint
from engine.formats.store_meta import StoreMeta, decode_store_meta, encode_store_meta, from_config

FOREIGN_STORE_HINT = ("mqstore reads it without writing a byte: `mqstore check --store DIR`, "
                      "`mqstore spark export|stats --store DIR`, or spark.read.format(\"mqstore\")")


def refuse_foreign_store(root: Path, action: str) -> NoReturn:
    """The one refusal of a write to a RocketMQ-written store, raised before anything is written."""
    raise ReadOnlyStoreError(f"this is a RocketMQ-written store; {action}", path=str(root),
                             hint=FOREIGN_STORE_HINT)


class StoreKind(Enum):
    NEW = "new"
    MQSTORE = "mqstore"
    ROCKETMQ = "rocketmq"


def inspect_store_dir(root: Path) -> StoreKind:
    """Classify `root` without changing anything; raise NotAStoreError for anything else."""
    root = Path(root)
    try:
        if not root.exists():
            return StoreKind.NEW
        if not root.is_dir():
            raise NotAStoreError("not a directory", path=str(root))
        if not os.access(root, os.R_OK | os.X_OK):
            raise PermissionError
        names = {p.name for p in root.iterdir()}
    except PermissionError:
        raise StorePermissionError("no permission to read the store directory", path=str(root),
                                   hint=permission_hint(root)) from None
    if STORE_META_FILE in names:
        return StoreKind.MQSTORE
    if COMMITLOG_DIR in names and (root / COMMITLOG_DIR).is_dir():
        return StoreKind.ROCKETMQ
    if not names:
        return StoreKind.NEW
    raise NotAStoreError("directory is neither empty nor a store (no store.json, no commitlog/)",
                         path=str(root), hint="point --store at an empty or existing store directory")


def require_writable(root: Path) -> None:
    """Refuse, before anything is written, a store directory this process may not write."""
    if not os.access(root, os.W_OK | os.X_OK):
        raise StorePermissionError("cannot write the store directory", path=str(root),
                                   hint=permission_hint(root))


def read_meta(root: Path) -> StoreMeta:
    path = Path(root) / STORE_META_FILE
    try:
        raw = path.read_bytes()
    except PermissionError:
        raise StorePermissionError("no permission to read store.json", path=str(path),
                                   hint=permission_hint(path)) from None
    return decode_store_meta(raw, path=str(path))


def create_store_dir(root: Path, config: StoreConfig) -> StoreMeta:
    """Lay out a new store: directories first, store.json last (its presence marks a store)."""
    root = ensure_dir(Path(root))
    for name in (COMMITLOG_DIR, CONSUMEQUEUE_DIR, INDEX_DIR, CONFIG_DIR):
        ensure_dir(root / name)
    meta = from_config(config)
    write_file_atomically(root / STORE_META_FILE, encode_store_meta(meta))
    return meta


def is_fresh_store(root: Path) -> bool:
    """True for a store just laid out: no commitlog segment, no checkpoint, no abort file yet."""
    root = Path(root)
    commitlog = root / COMMITLOG_DIR
    return not ((commitlog.is_dir() and any(commitlog.iterdir()))
                or (root / CHECKPOINT_FILE).exists() or (root / ABORT_FILE).exists())


def config_for_store(meta: StoreMeta, config: StoreConfig) -> StoreConfig:
    """The runtime config with the layout sizes frozen in store.json (they win over settings)."""
    queue_count = config.queue_count if meta.queue_count is None else meta.queue_count
    levels = config.message_delay_level if meta.message_delay_level is None else meta.message_delay_level
    return config.replace(message_delay_level=levels, commitlog_file_size=meta.commitlog_file_size,
                          consume_queue_entries=meta.consume_queue_entries,
                          index_slot_count=meta.index_slot_count,
                          index_entry_count=meta.index_entry_count,
                          index_shards=meta.index_shards, queue_count=queue_count)


class StoreLock:
    """The exclusive flock on `<root>/lock` held by the one writer of a store."""

    def __init__(self, root: Path, fd: int):
        self.root = Path(root)
        self._fd = fd

    @classmethod
    def acquire(cls, root: Path) -> StoreLock:
        path = Path(root) / LOCK_FILE
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
        except PermissionError:
            raise StorePermissionError("no permission to take the store's lock", path=str(path),
                                       hint=permission_hint(path)) from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "another process"
            os.close(fd)
            raise StoreLockedError(f"store is already in use by pid {holder}", path=str(root),
                                   hint="stop it first (`mqstore stop`)") from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        return cls(root, fd)

    def release(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


def holder_pid(root: Path) -> int | None:
    """The pid written by the current lock holder, or None when nobody holds the lock."""
    path = Path(root) / LOCK_FILE
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            text = os.pread(fd, 32, 0).decode(errors="replace").strip()
            return int(text) if text.isdigit() else None
        fcntl.flock(fd, fcntl.LOCK_UN)
        return None
    finally:
        os.close(fd)


def mark_running(root: Path) -> None:
    """Create `abort` (with our pid): present until a clean stop removes it."""
    write_file_atomically(Path(root) / ABORT_FILE, f"{os.getpid()}\n".encode())


def mark_clean_stop(root: Path) -> None:
    remove_file(Path(root) / ABORT_FILE)
