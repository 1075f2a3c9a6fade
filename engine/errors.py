"""The one StoreError tree: each subclass says what the caller can do about it.

Every error carries structured fields (path, position, reason) and a `hint` where a
remediation exists; `str()` renders them for humans.
"""

from __future__ import annotations

from engine.status import PutStatus


class StoreError(Exception):
    """Root of every error mqstore raises on purpose."""

    hint: str | None = None

    def __init__(self, message: str, *, path: str | None = None, hint: str | None = None):
        self.message = message
        self.path = str(path) if path is not None else None
        if hint is not None:
            self.hint = hint
        super().__init__(message)

    def __str__(self) -> str:
        text = self.message
        if self.path is not None:
            text = f"{text} [{self.path}]"
        if self.hint:
            text = f"{text} (hint: {self.hint})"
        return text


class BadInputError(StoreError, ValueError):
    """A caller passed something the store refuses (topic, queue id, size, encoding).

    `put_status` is the status a put of that input gets, set where the error is raised, so no
    caller reads it out of the reason's text."""

    def __init__(self, field: str, reason: str, *, path: str | None = None,
                 put_status: PutStatus = PutStatus.MESSAGE_ILLEGAL):
        self.field = field
        self.reason = reason
        self.put_status = put_status
        super().__init__(f"invalid {field}: {reason}", path=path)


class FilterSyntaxError(BadInputError):
    """A subscription's expression does not parse or cannot hold: `position` is the 0-based
    character where it goes wrong in `expression` (the message shows both, with a caret)."""

    def __init__(self, field: str, expression: str, position: int, reason: str):
        self.expression = expression
        self.position = position
        pointer = " " * position + "^"
        super().__init__(field, f"{reason} at position {position}\n  {expression}\n  {pointer}")


class RecordRefusedError(BadInputError):
    """The supervisor's check refused a producer's record. `refusal` (an engine.refusal.Refusal),
    `limit` and `found` travel back in the record's answer row (engine.refusal)."""

    def __init__(self, field: str, reason: str, *, refusal: int, limit: int = 0, found: int = 0,
                 put_status: PutStatus = PutStatus.MESSAGE_ILLEGAL):
        self.refusal = refusal
        self.limit = limit
        self.found = found
        super().__init__(field, reason, put_status=put_status)


class FrozenSettingError(BadInputError):
    """A setting that shapes the store's files asks for another value than store.json froze."""

    def __init__(self, conflicts: list[tuple[str, object, object, str]], *, path: str | None = None):
        self.conflicts = conflicts  # (setting, value in store.json, value asked for, where asked)
        said = "; ".join(f"{name}: the store has {stored}, {source} asks for {asked}"
                         for name, stored, asked, source in conflicts)
        super().__init__("frozen setting", f"{said} (fixed in store.json when the store was "
                         "created; drop the setting or use a new store)", path=path)


class CorruptRecordError(StoreError):
    """Bytes at `pos` are not a valid commitlog record; a recovery scan stops here."""

    def __init__(self, reason: str, *, pos: int, path: str | None = None, size: int = 0):
        self.reason = reason
        self.pos = pos
        self.size = size
        super().__init__(f"corrupt record at commit_pos {pos}: {reason}", path=path)


class StoreCorruptError(StoreError):
    """Data the store already called durable is damaged or missing (below the durable line):
    routine recovery refuses to cut it; the operator chooses (`mqstore recover --rebuild` or
    `--salvage`)."""

    def __init__(self, reason: str, *, commit_pos: int, durable_pos: int | None,
                 path: str | None = None, records_after: int = 0):
        self.reason = reason
        self.commit_pos = commit_pos
        self.durable_pos = durable_pos  # None: the damage is refused wherever the line is
        self.records_after = records_after
        after = f"; {records_after} valid record(s) follow it" if records_after else ""
        below = "" if durable_pos is None else f", below the durable position {durable_pos}"
        super().__init__(
            f"store corrupt at commit_pos {commit_pos}{below}: {reason}{after}; nothing was "
            "changed", path=path,
            hint="put back what is missing or damaged (from a copy) and start again, or run "
                 f"`mqstore recover --rebuild`: it keeps the log before commit_pos {commit_pos}, "
                 "moves everything from there to quarantine/ and rebuilds consume queues and index; "
                 "or `mqstore recover --salvage`: it keeps every valid record in place and accepts "
                 "the damaged bytes (readers skip and report their record)")


class LostHeadError(StoreCorruptError):
    """The commitlog starts above the retention line: segments retention never removed are
    missing. Routine recovery refuses; a rebuild accepts the loss."""

    def __init__(self, reason: str, *, retention_pos: int, log_min_pos: int, path: str | None = None):
        self.reason = reason
        self.commit_pos = retention_pos
        self.durable_pos = None
        self.records_after = 0
        self.log_min_pos = log_min_pos
        StoreError.__init__(
            self, f"store corrupt at commit_pos {retention_pos}: {reason}; nothing was changed",
            path=path,
            hint="put the missing segments back (from a copy) and start again, or accept their "
                 f"loss with `mqstore recover --rebuild`: the store then starts at commit_pos "
                 f"{log_min_pos}, and consume queues and index are rebuilt from what is kept. If an "
                 "mqstore older than the retention line ran retention here, remove the file "
                 "`retention_line` instead: nothing is lost")


class AcceptedDamageError(StoreError):
    """The record of accepted damage (quarantine/accepted-damage.json) cannot be read: without
    it the durable-line check cannot tell accepted damage from new damage."""

    def __init__(self, reason: str, *, path: str):
        self.reason = reason
        super().__init__(f"accepted damage record unreadable: {reason}", path=path,
                         hint="put the file back from a copy, or run `mqstore recover --salvage` "
                              "again to record the damage anew")


class DataLossError(StoreError):
    """Commit positions a reader still had to read are gone (retention deleted their segments)."""

    def __init__(self, lost_from_pos: int, lost_to_pos: int, *, path: str | None = None,
                 hint: str | None = None):
        self.lost_from_pos = lost_from_pos
        self.lost_to_pos = lost_to_pos
        super().__init__(f"commit positions [{lost_from_pos}, {lost_to_pos}) are no longer in the store "
                         "(retention deleted their segments before they were read)", path=path, hint=hint)


class CorruptConsumeQueueError(StoreError):
    """A consume queue is inconsistent (gap, bad entry); rebuild it from the commitlog."""

    def __init__(self, reason: str, *, path: str | None = None, queue_offset: int | None = None):
        self.reason = reason
        self.queue_offset = queue_offset
        super().__init__(f"corrupt consume queue: {reason}", path=path,
                         hint="run `mqstore recover` to rebuild it from the commitlog")


def offset_outside_words(offset: int, queue_end: int) -> str:
    """Where a committed offset lies outside its queue, in the words its refusals use."""
    return "below zero" if offset < 0 else f"past the queue's end {queue_end}"


class CommittedOffsetError(StoreError):
    """A group's committed offset lies outside its queue (past the end, or below zero): taking it
    would skip the queue for good or read nothing; the operator resets it."""

    def __init__(self, *, group: str, topic: str, queue_id: int, offset: int, max_offset: int,
                 path: str):
        self.group = group
        self.topic = topic
        self.queue_id = queue_id
        self.offset = offset
        self.max_offset = max_offset
        where = offset_outside_words(offset, max_offset)
        super().__init__(
            f"group {group!r} committed offset {offset} on {topic}/{queue_id}, {where}; refused "
            "(reading from it would skip or repeat the queue)", path=path,
            hint=f"reset it: `mqstore groups --reset --group {group} --topic {topic} "
                 "--to earliest|latest|TIME|OFFSET` (with the group's consumers stopped)")


class GroupInUseError(StoreError):
    """A consumer group has live consumers: changing its offsets now would be overwritten by
    their next commit."""

    def __init__(self, group: str, pids: list[int], *, path: str | None = None):
        self.group = group
        self.pids = pids
        who = f" (pid {', '.join(map(str, pids))})" if pids else ""
        super().__init__(f"group {group!r} has live consumers{who}; nothing was changed", path=path,
                         hint="stop the group's consumers first: their commits would overwrite "
                              "the reset")


class SubscriptionMismatchError(StoreError):
    """A consumer asked to join its group on a topic with another subscription (filter
    expression or message model) than the group's live members have: the group would split
    the topic's queues between members that select different messages, and lose some."""

    def __init__(self, group: str, topic: str, wanted: str, held: str, pids: list[int], *,
                 path: str | None = None):
        self.group, self.topic, self.wanted, self.held, self.pids = group, topic, wanted, held, pids
        super().__init__(f"group {group!r} on topic {topic!r}: subscription {wanted} refused, its "
                         f"live members (pid {', '.join(map(str, pids))}) subscribe {held}; "
                         f"nothing was joined", path=path,
                         hint="subscribe as the group's members do, or use another group name")


class MemberNameInUseError(StoreError):
    """A consumer asked to join under an instance name a live member of the group already has:
    two members with one name would read and commit the same offsets."""

    def __init__(self, group: str, topic: str, name: str, pid: int, *, path: str | None = None):
        self.group, self.topic, self.name, self.pid = group, topic, name, pid
        super().__init__(f"group {group!r} on topic {topic!r}: member name {name!r} is held by "
                         f"live pid {pid}; nothing was joined", path=path,
                         hint="give each process of the group its own instance_name")


class QueueNotOwnedError(StoreError):
    """A consumer committed a queue its group gave to another live member: only a queue's owner
    commits its offset, else the two would overwrite each other's progress. `owned` is None for
    a consumer that has not joined the group on the topic (the assign API)."""

    def __init__(self, group: str, topic: str, queue_id: int, owned: list[int] | None):
        self.group, self.topic, self.queue_id, self.owned = group, topic, queue_id, owned
        if owned is None:
            super().__init__(f"group {group!r}: queue {topic}/{queue_id} is owned by a live member of "
                             "the group; nothing was committed",
                             hint="read without committing (mqstore consume --no-commit), use "
                                  "another group, or stop the group's members first")
            return
        super().__init__(f"group {group!r}: queue {topic}/{queue_id} is not this member's "
                         f"(it owns {owned or 'none'}); nothing was committed",
                         hint="commit only what `iterate` handed out, or pull and commit "
                              "queues by id from a Consumer that does not iterate the topic")


class CorruptIndexError(StoreError):
    """An index file is inconsistent; rebuild it from the commitlog."""

    def __init__(self, reason: str, *, path: str | None = None):
        self.reason = reason
        super().__init__(f"corrupt index file: {reason}", path=path,
                         hint="run `mqstore recover` to rebuild it from the commitlog")


class CheckpointError(StoreError):
    """The checkpoint file cannot be trusted (bad CRC, bad size, unknown version)."""


class DelayOffsetError(StoreError):
    """config/delayOffset.json (and its .bak) cannot be read as the delivery service's progress."""


class SegmentLayoutError(StoreError):
    """Segment files have a wrong size, a gap in their names, or a foreign file sits among them."""


class NotAStoreError(StoreError):
    """The directory is not an mqstore (nor a RocketMQ) store."""


class StoreMetaMismatchError(NotAStoreError):
    """store.json disagrees with the files on disk (edited by hand after the store was made)."""


class FormatVersionError(StoreError):
    """The store was written by a newer mqstore; refuse to open it."""


class ReadOnlyStoreError(StoreError):
    """A write was attempted on a store opened read-only (e.g. one written by RocketMQ)."""


class StoreLockedError(StoreError):
    """Another supervisor holds the store's lock file."""


class DiskFullError(StoreError):
    """The filesystem has no room for the bytes about to be written (maps to DISK_FULL)."""


class StoreClosedError(StoreError):
    """The handle was closed."""


class SlotsExhaustedError(StoreError):
    """Every slot of a fixed-size table in shared memory is held by a live process."""

    def __init__(self, message: str, *, slot_count: int, path: str | None = None,
                 hint: str | None = None):
        self.slot_count = slot_count
        super().__init__(message, path=path, hint=hint)


class StorePermissionError(StoreError, PermissionError):
    """The store (or its shared memory) belongs to another user."""


class ServiceNotAvailableError(StoreError):
    """No supervisor runs on the store (clients fail fast with this)."""


class PutFailedError(StoreError):
    """A message was not stored as asked: its put answered `status` (a writer fails with it)."""

    def __init__(self, status: str, row_index: int, reason: str | None = None, *, path: str | None = None):
        self.status = status
        self.row_index = row_index
        self.reason = reason
        said = f": {reason}" if reason else ""
        super().__init__(f"row {row_index} was not stored: {status}{said}", path=path)
