"""Named POSIX shared-memory regions: create (owner), attach (everyone else), unlink (owner only).

A region is a file under /dev/shm, mapped MAP_SHARED. Names carry a random token the supervisor
draws at each start and records in <store>/run/shm-token (0600, in the 0700 store directory), so
every process of the store's user finds the same regions, two stores never collide, and another
local user can neither predict a name nor create it first to block the store:

    /mqstore-<16 hex of the token>-<kind>      e.g. kind = ctl, mbox, wait

No token file means no supervisor created anything: clients get ServiceNotAvailableError.

Lifetime is explicit (style-anchors G): the process that created a region is the only one
that may unlink it; the creator's pid is recorded at create and checked at unlink, so a forked
child that inherited the object cannot tear the region down. Attaching never registers the
region with any tracker (posix_ipc has none), so a process that attaches and exits leaves the
region alone.
"""

from __future__ import annotations

import mmap
import os
import re
import secrets
import stat
from pathlib import Path

import posix_ipc

from engine.errors import BadInputError, ServiceNotAvailableError, StoreError, StorePermissionError
from engine.files.filesystem import ensure_dir, remove_file, write_file_atomically
from engine.files.owners import describe_uid

SHM_DIR = Path("/dev/shm")
REGION_MODE = 0o600
NAME_PREFIX = "mqstore-"
TOKEN_BYTES = 8  # 16 hex: names keep the length they had when they were a path hash
TOKEN_FILE = "run/shm-token"
_TOKEN_RE = re.compile(r"^[0-9a-f]{16}$")
_KIND_RE = re.compile(r"^[a-z0-9][a-z0-9-]{0,63}$")
_START_HINT = "start the store with `mqstore start`"


def token_path(store_dir: str | os.PathLike) -> Path:
    return Path(store_dir) / TOKEN_FILE


def issue_shm_token(store_dir: str | os.PathLike) -> str:
    """Draw a new token for this supervisor's names and record it (before creating any region)."""
    token = secrets.token_hex(TOKEN_BYTES)
    path = token_path(store_dir)
    ensure_dir(path.parent)
    write_file_atomically(path, f"{token}\n".encode())
    return token


def forget_shm_token(store_dir: str | os.PathLike) -> None:
    """Remove the token file once every region and semaphore it names is gone."""
    path = token_path(store_dir)
    if path.exists():
        remove_file(path)


def read_shm_token(store_dir: str | os.PathLike) -> str:
    """The current token; ServiceNotAvailableError when no supervisor has created shared memory."""
    path = token_path(store_dir)
    try:
        text = path.read_text().strip()
    except FileNotFoundError:
        raise ServiceNotAvailableError("no supervisor runs on this store", path=str(store_dir),
                                       hint=_START_HINT) from None
    except PermissionError:
        raise StorePermissionError(f"no permission to read {TOKEN_FILE}", path=str(path),
                                   hint="run as the user that started the store") from None
    if not _TOKEN_RE.match(text):
        raise ServiceNotAvailableError(f"{TOKEN_FILE} holds {text[:40]!r}, not a token",
                                       path=str(path), hint=_START_HINT)
    return text


def store_prefix(store_dir: str | os.PathLike) -> str:
    """The '/mqstore-<token>-' prefix every region and semaphore name of this store starts with."""
    return f"/{NAME_PREFIX}{read_shm_token(store_dir)}-"


def region_name(store_dir: str | os.PathLike, kind: str) -> str:
    """Stable POSIX name of one region (or semaphore) of the store at `store_dir`."""
    if not _KIND_RE.match(kind):
        raise BadInputError("kind", f"{kind!r} must be 1-64 chars of [a-z0-9-]")
    return store_prefix(store_dir) + kind


def region_path(name: str) -> Path:
    """The file under /dev/shm that holds the region named `name`."""
    return SHM_DIR / name.lstrip("/")


def unlink_stale(name: str) -> bool:
    """Remove a leftover region named `name`; True if one existed. The caller proves it is stale."""
    try:
        posix_ipc.unlink_shared_memory(name)
    except posix_ipc.ExistentialError:
        return False
    return True


def unlink_stale_regions(store_dir: str | os.PathLike) -> list[str]:
    """Remove every region of the store (not its semaphores); returns the names removed."""
    if not token_path(store_dir).exists():
        return []  # no token, no regions: nothing of this store can be in /dev/shm
    prefix = store_prefix(store_dir)[1:]
    removed = []
    for entry in sorted(os.listdir(SHM_DIR)):
        if entry.startswith(prefix) and unlink_stale("/" + entry):
            removed.append("/" + entry)
    return removed


class SharedRegion:
    """One mapped shared-memory region; `buf` is a writable memoryview over all of it."""

    def __init__(self, name: str, mapping: mmap.mmap, size_bytes: int, owner_pid: int | None):
        self.name = name
        self.size_bytes = size_bytes
        self.owner_pid = owner_pid
        self._mmap: mmap.mmap | None = mapping
        self.buf: memoryview | None = memoryview(mapping)

    @classmethod
    def create(cls, name: str, size_bytes: int) -> SharedRegion:
        """Create a zero-filled region (mode 0o600); fails if one of that name exists."""
        if size_bytes <= 0:
            raise BadInputError("size_bytes", f"must be > 0, got {size_bytes}")
        try:
            shm = posix_ipc.SharedMemory(name, posix_ipc.O_CREX, mode=REGION_MODE, size=size_bytes)
        except posix_ipc.ExistentialError:
            raise name_taken_error(f"shared memory region {name}", region_path(name),
                                   "a crashed supervisor left it; unlink_stale() it after "
                                   "taking the store lock") from None
        except posix_ipc.PermissionsError as exc:
            raise StorePermissionError(f"cannot create shared memory region {name}: {exc}") from None
        try:
            mapping = mmap.mmap(shm.fd, size_bytes)
        finally:
            shm.close_fd()
        return cls(name, mapping, size_bytes, os.getpid())

    @classmethod
    def attach(cls, name: str) -> SharedRegion:
        """Map an existing region read-write; checks ownership before mapping anything."""
        try:
            shm = posix_ipc.SharedMemory(name)
        except posix_ipc.ExistentialError:
            raise ServiceNotAvailableError(f"shared memory region {name} does not exist",
                                           hint=_START_HINT) from None
        except posix_ipc.PermissionsError:
            raise _permission_error(name, _uid_of(region_path(name))) from None
        try:
            info = os.fstat(shm.fd)
            if info.st_uid != os.geteuid():
                raise _permission_error(name, info.st_uid)
            if info.st_size == 0:
                raise ServiceNotAvailableError(f"shared memory region {name} is still being "
                                               "created", hint="retry in a moment")
            mapping = mmap.mmap(shm.fd, info.st_size)
        finally:
            shm.close_fd()
        return cls(name, mapping, info.st_size, None)

    @property
    def is_owner(self) -> bool:
        return self.owner_pid == os.getpid()

    def close(self) -> None:
        """Unmap. If numpy arrays or slices still view the region, the unmap waits for them."""
        if self.buf is None:
            return
        buf, mapping = self.buf, self._mmap
        self.buf = None
        self._mmap = None
        try:
            buf.release()
            mapping.close()
        except BufferError:
            pass  # live views keep the mapping alive; it is unmapped when the last one goes

    def unlink(self) -> None:
        """Remove the name from /dev/shm. Only the creating process may do this."""
        if not self.is_owner:
            raise StoreError(f"process {os.getpid()} may not unlink shared memory region "
                             f"{self.name}: it was created by pid {self.owner_pid}",
                             hint="only the supervisor that created a region unlinks it")
        unlink_stale(self.name)

    def __enter__(self) -> SharedRegion:
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"SharedRegion({self.name!r}, size_bytes={self.size_bytes}, owner={self.owner_pid})"


def name_taken_error(what: str, path: Path, own_hint: str) -> StoreError:
    """The error for a name that exists at create, naming who holds it (a squatter or us)."""
    uid = _uid_of(path)
    if uid is None or uid == os.geteuid():
        return StoreError(f"{what} already exists", path=str(path), hint=own_hint)
    return StorePermissionError(
        f"{what} already exists and belongs to {describe_uid(uid)}, not to this process's "
        f"{describe_uid(os.geteuid())}: another user created it first", path=str(path),
        hint=f"ask that user (or root) to remove {path}; the next start draws a new name")


def _uid_of(path: Path) -> int | None:
    try:
        return os.stat(path).st_uid
    except OSError:
        return None


def _permission_error(name: str, owner_uid: int | None) -> StorePermissionError:
    mode = ""
    try:
        mode = f", mode {stat.filemode(os.stat(region_path(name)).st_mode)}"
    except OSError:
        pass
    return StorePermissionError(
        f"shared memory region {name} belongs to uid {owner_uid}{mode}; this process runs as "
        f"uid {os.geteuid()}", path=str(region_path(name)),
        hint="run the client as the user that started the store")
