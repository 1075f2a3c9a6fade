"""The live members of a consumer group on one topic, as files whose flocks the kernel holds.

    config/groups/<group>/<topic>/members/<member>.json   one per member; flock'd LOCK_EX by it
    config/groups/<group>/<topic>/members/.join           flock'd LOCK_EX while one member joins

A member file says who the member is (pid, since, subscription, the queues it owns now) and
its mtime is the member's last sweep. It is live exactly while its flock is held: the kernel
drops the lock when the member closes it, exits or is SIGKILLed, so a dead member is seen at
the next look, not after a heartbeat timeout; a member that is SIGSTOPped or hung keeps its
lock (and its queues), and shows as stalled by its /proc state or its old sweep time. A member
that looks reaps the files of dead ones; read-only tools only pass them over.

Joining is serialized by `.join`: the joiner compares its subscription (message model and
filter expression, an opaque canonical string) with every live member's and is refused on a
difference (SubscriptionMismatchError), or when its name is a live member's.
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import stat
import time
import weakref
from dataclasses import asdict, dataclass
from enum import Enum
from pathlib import Path

from engine.errors import MemberNameInUseError, StorePermissionError, SubscriptionMismatchError
from engine.files.filesystem import ensure_dir
from ipc.group_members import group_lock_path

log = logging.getLogger(__name__)

MEMBERS_DIR = "members"
QUEUES_DIR = "queues"
MEMBER_SUFFIX = ".json"
JOIN_LOCK = ".join"
TMP_SUFFIX = ".tmp"  # `.<member>.tmp`: a joiner's file before its rename into place
STALLED_AFTER_MS = 5000  # a member that has not swept its queues for this long is stalled
_PROC_STOPPED_STATES = ("T", "t")  # SIGSTOPped, or stopped under a debugger


class MessageModel(Enum):
    """RocketMQ's message models: CLUSTERING shares a group's queues among its members (each
    message to one member); BROADCASTING gives every member every message."""

    CLUSTERING = "CLUSTERING"
    BROADCASTING = "BROADCASTING"


def topic_dir(store_dir: str | os.PathLike, group: str, topic: str) -> Path:
    """The group's directory for one topic, beside its `<group>.lock` (same name rule)."""
    return group_lock_path(store_dir, group).with_suffix("") / topic


@dataclass(frozen=True, slots=True)
class MemberRecord:
    """What a member file says, and when the member last swept its queues."""

    member: str
    pid: int
    since_ms: int
    group: str  # as given: the directory name is shortened for a name too long for the filesystem
    topic: str
    model: str
    expression: str
    queue_ids: tuple[int, ...]
    swept_ms: int

    @property
    def subscription(self) -> str:
        return f"{self.model} {self.expression!r}"

    def state(self, now_ms: int) -> str:
        """'stalled' when the process is stopped or has not swept for STALLED_AFTER_MS, else 'live'."""
        if _proc_state(self.pid) in _PROC_STOPPED_STATES or now_ms - self.swept_ms > STALLED_AFTER_MS:
            return "stalled"
        return "live"

    def as_dict(self) -> dict:
        return asdict(self)


def live_members(store_dir: str | os.PathLike, group: str, topic: str) -> list[MemberRecord]:
    """The group's live members on `topic`, sorted by name; files of dead ones are left alone."""
    return live_members_in(topic_dir(store_dir, group, topic))


def live_members_in(directory: Path) -> list[MemberRecord]:
    """The live members of one group's topic directory (`topic_dir`), sorted by name."""
    return _scan(directory / MEMBERS_DIR)[0]


def reap_dead_members(directory: Path) -> list[MemberRecord]:
    """The live members in a members directory; the files of dead ones are removed."""
    live, dead = _scan(directory)
    for path in dead:
        try:
            path.unlink()
        except FileNotFoundError:
            pass  # another member reaped it first
        except OSError as exc:  # one stuck file must not stop the group: it is only passed over
            _warn_once(path, f"cannot remove it: {exc.strerror}")
    return live


def member_topics(group_directory: Path) -> list[str]:
    """The topics a group's directory holds member directories for (live members or not), sorted."""
    try:
        return sorted(entry.name for entry in group_directory.iterdir() if (entry / MEMBERS_DIR).is_dir())
    except FileNotFoundError:
        return []


def _scan(directory: Path) -> tuple[list[MemberRecord], list[Path]]:
    """(live members sorted by name, files of dead members); a file whose flock can be taken
    has no live holder. Anything else under a member's name (a directory, a FIFO, a symlink, a
    file this process cannot open) is passed over: one bad entry must not stop every member."""
    live, dead = [], []
    try:
        names = sorted(name for name in os.listdir(directory) if name.endswith(MEMBER_SUFFIX))
    except FileNotFoundError:
        return [], []
    for name in names:
        path = directory / name
        try:
            record = _look_at_member(path, dead)
        except OSError as exc:
            _warn_once(path, exc.strerror)
            continue
        if record is not None:
            live.append(record)
    return live, dead


def _look_at_member(path: Path, dead: list[Path]) -> MemberRecord | None:
    """A live member's record; None, with a dead member's file added to `dead`, otherwise.
    Opened O_NONBLOCK|O_NOFOLLOW (a FIFO would block the open, a symlink leads elsewhere) and
    only a regular file is locked: a directory flocks too, and would be taken for a dead member."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW)
    except FileNotFoundError:
        return None  # reaped, or a member that left, since the listing
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            _warn_once(path, "not a regular file")
            return None
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return _read_member(fd)
        dead.append(path)
        return None
    finally:
        os.close(fd)


def _warn_once(path: Path, reason: str) -> None:
    """Say once per process that an entry is passed over: scans run ten times a second."""
    if str(path) not in _WARNED_PATHS:
        _WARNED_PATHS.add(str(path))
        log.warning("passing over %s in a group's members: %s", path, reason)


def _remove_stale_tmp(directory: Path) -> None:
    """Remove the `.<member>.tmp` files joiners killed mid-join left; called under `.join`, so
    none of them is a join in progress."""
    for name in os.listdir(directory):
        if name.startswith(".") and name.endswith(TMP_SUFFIX):
            try:
                (directory / name).unlink()
            except OSError:
                pass  # gone already, or not ours to remove: it is only clutter


def _read_member(fd: int) -> MemberRecord | None:
    """A live member file's record, read again should it change under the read; None when it
    stays unreadable (a member that died while it was being created)."""
    for _ in range(3):
        record = _decode_member(os.pread(fd, 1 << 16, 0), os.fstat(fd).st_mtime_ns)
        if record is not None:
            return record
    return None


def _decode_member(data: bytes, mtime_ns: int) -> MemberRecord | None:
    try:
        fields = json.loads(data)
        return MemberRecord(fields["member"], fields["pid"], fields["since_ms"], fields["group"],
                            fields["topic"], fields["model"], fields["expression"],
                            tuple(fields["queue_ids"]), mtime_ns // 1_000_000)
    except (ValueError, KeyError, TypeError):
        return None


class RosterSeat:
    """One member's file, flock'd until `leave`, until collected, or (in a forked child) at
    fork: a child must not keep its parent's membership alive after the parent is gone."""

    def __init__(self, directory: Path, record: MemberRecord, fd: int):
        self.directory = directory
        self.record = record
        self._fd = fd
        self._swept_s = time.monotonic()
        self._finalizer = weakref.finalize(self, os.close, fd)
        _SEATS.add(self)

    @property
    def path(self) -> Path:
        return self.directory / (self.record.member + MEMBER_SUFFIX)

    def publish_queues(self, queue_ids: list[int]) -> None:
        """Rewrite the file with the queues this member owns now (for `mqstore groups`)."""
        self.record = MemberRecord(**{**self.record.as_dict(), "queue_ids": tuple(queue_ids)})
        _write_record(self._fd, self.record)

    def mark_swept(self) -> None:
        """Set the file's mtime to now, at most once a second: the member is not stalled."""
        now = time.monotonic()
        if now - self._swept_s >= 1.0:
            os.utime(self._fd)
            self._swept_s = now

    def leave(self) -> None:
        """Remove the file, then let its lock go (idempotent)."""
        if self._finalizer.alive:
            try:
                self.path.unlink()
            except FileNotFoundError:
                pass
        self._drop()

    def _drop(self) -> None:
        self._finalizer()
        _SEATS.discard(self)


def join_roster(store_dir: str | os.PathLike, group: str, topic: str, member: str,
                model: MessageModel, expression: str) -> RosterSeat:
    """Join the group on `topic` as `member`: refused when a live member subscribes otherwise
    or has that name; the new file is locked before it is visible, so it is never seen dead."""
    directory = topic_dir(store_dir, group, topic) / MEMBERS_DIR
    try:
        ensure_dir(directory)
        join_fd = os.open(directory / JOIN_LOCK, os.O_RDWR | os.O_CREAT, 0o600)
    except PermissionError as exc:
        raise StorePermissionError(f"cannot join group {group!r} on {topic!r}: {exc.strerror}",
                                   path=str(directory),
                                   hint="a member writes its file under config/groups/; to read "
                                        "without joining, name the queues (iterate(queue_ids=...), "
                                        "pull)") from None
    try:
        fcntl.flock(join_fd, fcntl.LOCK_EX)  # held for the milliseconds of one join
        live = reap_dead_members(directory)
        _remove_stale_tmp(directory)
        record = MemberRecord(member, os.getpid(), time.time_ns() // 1_000_000, group, topic,
                              model.value, expression, (), 0)
        _refuse_mismatch(group, record, live, directory)
        tmp = directory / f".{member}{TMP_SUFFIX}"
        fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            _write_record(fd, record)
            os.rename(tmp, directory / (member + MEMBER_SUFFIX))
        except BaseException:
            os.close(fd)
            raise
        return RosterSeat(directory, record, fd)
    finally:
        os.close(join_fd)


def _refuse_mismatch(group: str, record: MemberRecord, live: list[MemberRecord], directory: Path) -> None:
    for other in live:
        if other.member == record.member:
            raise MemberNameInUseError(group, record.topic, record.member, other.pid, path=str(directory))
    differing = [other for other in live if other.subscription != record.subscription]
    if differing:
        raise SubscriptionMismatchError(group, record.topic, record.subscription, differing[0].subscription,
                                        sorted({other.pid for other in differing}), path=str(directory))


def _write_record(fd: int, record: MemberRecord) -> None:
    fields = record.as_dict()
    del fields["swept_ms"]  # the file's mtime says it
    fields["queue_ids"] = list(record.queue_ids)
    data = (json.dumps(fields) + "\n").encode()
    # one write over the old text, padded with blanks (JSON allows them): never an empty file
    size = os.fstat(fd).st_size
    os.pwrite(fd, data + b" " * max(size - len(data), 0), 0)


def _proc_state(pid: int) -> str | None:
    """The state letter of /proc/<pid>/stat (R, S, T, ...); None when it cannot be read."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            return stat.read().rsplit(b")", 1)[1].split()[0].decode()
    except (OSError, IndexError):
        return None


def _drop_inherited_seats() -> None:
    """In a forked child, close the inherited member files: the parent keeps its locks."""
    for seat in list(_SEATS):
        seat._drop()


_SEATS: weakref.WeakSet[RosterSeat] = weakref.WeakSet()
_WARNED_PATHS: set[str] = set()  # bad entries already said (_warn_once)
os.register_at_fork(after_in_child=_drop_inherited_seats)
