"""The topic table: `config/topics.json` in RocketMQ's layout, its rules, and its tombstones.

    {"dataVersion": {"counter": 3, "timestamp": 1551626364371},
     "topicConfigTable": {"<topic>": {"topicName": "<topic>", "readQueueNums": 4,
                                      "writeQueueNums": 4, "perm": 6, "order": false,
                                      "topicFilterType": "SINGLE_TAG", "topicSysFlag": 0}, ...},
     "mqstoreTombstones": {"<topic>": <commit_pos>, ...}}

RocketMQ's TopicConfigManager writes the first two keys (fastjson: bare integer keys are read
too); `mqstoreTombstones` is mqstore's and RocketMQ's reader ignores it. A tombstone says a
topic was deleted when the log ended at `commit_pos`: its records below it never enter a consume
queue again (dispatch, recovery's re-dispatch and `check` all skip them), so a re-dispatch after
a crash does not bring the topic back; a topic created again starts fresh queues above it.

Only the store lock's holder writes the file (the supervisor, or an offline `MessageStore`),
atomically with the previous version kept as `.bak`. A bad file refuses the start, naming what
is wrong: falling back to the backup in silence could drop a tombstone and revive a topic.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from enum import Enum
from pathlib import Path

from engine.errors import BadInputError, StoreError
from engine.files.filesystem import ensure_dir, write_file_atomically
from engine.files.naming import BACKUP_SUFFIX, TOPICS_FILE, config_path, validate_topic
from engine.formats.fastjson import quote_bare_integer_keys
from engine.formats.store_meta import MAX_QUEUE_COUNT
from engine.refusal import Refusal, refused
from engine.topics.system import is_system_topic

PERM_READ = 4  # RocketMQ PermName
PERM_WRITE = 2
PERM_INHERIT = 1
PERM_READ_WRITE = PERM_READ | PERM_WRITE
_PERM_WORDS = {"rw": PERM_READ_WRITE, "r": PERM_READ, "w": PERM_WRITE}
FILTER_TYPES = ("SINGLE_TAG", "MULTI_TAG")
TOMBSTONES_KEY = "mqstoreTombstones"
# names RocketMQ keeps for the broker's own topics (TopicValidator) beside the store's own
# (engine.topics.system): an operator may not create one
RESERVED_TOPICS = frozenset({"TBW102"})
RESERVED_TOPIC_PREFIXES = ("RMQ_SYS_",)


class TopicFileError(StoreError):
    """topics.json cannot be read as a topic table; nothing was changed."""


def parse_perm(text: str) -> int:
    """`rw`, `r` or `w` as RocketMQ's perm bits."""
    try:
        return _PERM_WORDS[text]
    except KeyError:
        raise BadInputError("perm", f"{text!r} is not one of rw, r, w") from None


def is_reserved_topic(topic: str) -> bool:
    """Whether `topic` is a name the store keeps for its own topics (delays, retries, dead
    letters, RocketMQ's system topics): `mqstore topic create` refuses it."""
    return is_system_topic(topic) or topic in RESERVED_TOPICS or topic.startswith(RESERVED_TOPIC_PREFIXES)


def perm_text(perm: int) -> str:
    """RocketMQ's perm bits as `rw`, `r`, `w` or `-` (the inherit bit is not shown)."""
    return ("r" if perm & PERM_READ else "") + ("w" if perm & PERM_WRITE else "") or "-"


@dataclass(frozen=True, slots=True)
class TopicConfig:
    """RocketMQ's TopicConfig: queue counts, permission, and the fields mqstore keeps as read."""

    topic: str
    read_queue_count: int
    write_queue_count: int
    perm: int = PERM_READ_WRITE
    filter_type: str = "SINGLE_TAG"
    sys_flag: int = 0
    order: bool = False

    @property
    def writable(self) -> bool:
        return bool(self.perm & PERM_WRITE)

    @property
    def readable(self) -> bool:
        return bool(self.perm & PERM_READ)

    @property
    def consumed_queue_count(self) -> int:
        """How many queues consumers read: every queue a send may reach (RocketMQ reads only
        readQueueNums, so with fewer read than write queues messages go unread; mqstore never)."""
        return max(self.read_queue_count, self.write_queue_count)


@dataclass(frozen=True, slots=True)
class TopicDefaults:
    """What a topic gets when its first message arrives unconfigured (autoCreateTopicEnable)."""

    queue_count: int
    auto_create: bool = True

    def config_for(self, topic: str) -> TopicConfig:
        return TopicConfig(topic, self.queue_count, self.queue_count)


@dataclass(frozen=True, slots=True)
class TopicTable:
    """The configured topics, the tombstones of deleted ones, and RocketMQ's data version.
    `system`: the store's own topics, whose queue counts come from the store, not the file."""

    topics: Mapping[str, TopicConfig] = field(default_factory=dict)
    tombstones: Mapping[str, int] = field(default_factory=dict)
    version_counter: int = 0
    version_ms: int = 0
    system: frozenset[str] = frozenset()

    def put_route(self, topic: str, queue_id: int, defaults: TopicDefaults) -> TopicConfig:
        """The rule for a put to (topic, queue_id), for the supervisor's check and the in-process
        store alike: the topic's config (a new default one for an unconfigured topic when
        auto-create is on); RecordRefusedError, a MESSAGE_ILLEGAL, when the put is refused."""
        config = self.topics.get(topic)
        if config is None:
            if not defaults.auto_create:
                raise refused(Refusal.TOPIC_UNKNOWN)
            config = defaults.config_for(topic)
        if not config.writable:
            raise refused(Refusal.TOPIC_NOT_WRITABLE, found=config.perm)
        if not 0 <= queue_id < config.write_queue_count:
            raise refused(Refusal.WRITE_QUEUE, limit=config.write_queue_count, found=queue_id)
        return config

    def write_queue_count(self, topic: str, defaults: TopicDefaults) -> int:
        """How many queues a producer spreads `topic` over (the default for a new topic)."""
        config = self.topics.get(topic)
        return defaults.queue_count if config is None else config.write_queue_count

    def read_queue_count(self, topic: str, defaults: TopicDefaults) -> int:
        """How many queues a consumer reads of `topic` (TopicConfig.consumed_queue_count)."""
        config = self.topics.get(topic)
        return defaults.queue_count if config is None else config.consumed_queue_count

    def tombstone_of(self, topic: str) -> int:
        """The commit position below which `topic`'s records are deleted (0: none)."""
        return self.tombstones.get(topic, 0)

    def with_topic(self, config: TopicConfig) -> TopicTable:
        """This table with `config` added or replaced, its data version bumped."""
        return self._bumped(topics={**self.topics, config.topic: config})

    def without_topic(self, topic: str, commit_pos: int) -> TopicTable:
        """This table with `topic` deleted at `commit_pos` (its tombstone moves up to it)."""
        topics = {name: config for name, config in self.topics.items() if name != topic}
        tombstones = {**self.tombstones, topic: max(commit_pos, self.tombstone_of(topic))}
        return self._bumped(topics=topics, tombstones=tombstones)

    def with_tombstones_within(self, end_pos: int) -> TopicTable:
        """This table with every tombstone above `end_pos` lowered to it (self when none is): a
        tombstone past the recovered end of the log would hide the records written after it."""
        if all(pos <= end_pos for pos in self.tombstones.values()):
            return self
        return self._bumped(tombstones={name: min(pos, end_pos) for name, pos in self.tombstones.items()})

    def with_system_topics(self, queue_counts: Mapping[str, int]) -> TopicTable:
        """This table holding the store's own topics with the store's queue counts (a file's
        entry for one is replaced: the store decides how many queues it has)."""
        if not queue_counts:
            return self
        topics = dict(self.topics)
        for topic, count in queue_counts.items():
            topics[topic] = TopicConfig(validate_topic(topic), count, count)
        return replace(self, topics=topics, system=self.system | frozenset(queue_counts))

    def _bumped(self, **changes) -> TopicTable:
        now_ms = max(time.time_ns() // 1_000_000, self.version_ms)
        return replace(self, version_counter=self.version_counter + 1, version_ms=now_ms, **changes)


# ---------------------------------------------------------------- the operator's changes


class TopicOp(Enum):
    CREATE = "create"
    UPDATE = "update"
    DELETE = "delete"


@dataclass(frozen=True, slots=True)
class TopicChange:
    """One `mqstore topic create|update|delete`: the queue count and perm unless a delete (an
    update keeps what it leaves None; a create's perm defaults to rw)."""

    op: TopicOp
    topic: str
    queue_count: int | None = None
    perm: int | None = None

    def as_dict(self) -> dict:
        return {"op": self.op.value, "topic": self.topic, "queues": self.queue_count, "perm": self.perm}

    @classmethod
    def from_dict(cls, data: Mapping) -> TopicChange:
        try:
            op = TopicOp(data["op"])
            perm = data.get("perm")
            if perm is not None and type(perm) is not int:  # 6.9 is no perm, not 6
                raise ValueError(f"perm {perm!r} is not an integer")
            return cls(op, validate_topic(data["topic"]), data.get("queues"), perm)
        except (KeyError, TypeError, ValueError) as exc:
            raise BadInputError("topic change", f"{dict(data)!r} is not one: {exc}") from None


def plan_topic_change(table: TopicTable, change: TopicChange, *, used_queue_count: int,
                      end_pos: int) -> TopicTable:
    """The table after `change`, or BadInputError saying why it cannot apply. `used_queue_count`:
    one past the highest queue id of the topic holding entries; `end_pos`: where the log ends
    now (a delete's tombstone)."""
    topic = validate_topic(change.topic)
    current = table.topics.get(topic)
    if topic in table.system:
        raise BadInputError("topic", f"{topic} is the store's own topic; its queues follow the "
                            "store's settings")
    if change.op is TopicOp.DELETE:
        if current is None:
            raise BadInputError("topic", f"no topic {topic} to delete")
        return table.without_topic(topic, end_pos)
    if change.op is TopicOp.CREATE and is_reserved_topic(topic):
        raise BadInputError("topic", f"{topic} is a name the store keeps for its own topics "
                            "(SCHEDULE_TOPIC_XXXX, TBW102, RMQ_SYS_*, %RETRY%*, %DLQ%*)")
    if change.op is TopicOp.CREATE and current is not None:
        raise BadInputError("topic", f"{topic} exists ({current.write_queue_count} queues); "
                            "use `mqstore topic update`")
    if change.op is TopicOp.UPDATE and current is None:
        raise BadInputError("topic", f"no topic {topic}; use `mqstore topic create`")
    count = change.queue_count if change.queue_count is not None or current is None \
        else current.write_queue_count
    if type(count) is not int or not 1 <= count <= MAX_QUEUE_COUNT:
        raise BadInputError("queues", f"{count!r} is not a queue count in 1..{MAX_QUEUE_COUNT}")
    perm = change.perm if change.perm is not None else current.perm if current else PERM_READ_WRITE
    kept = current is not None and perm == current.perm  # e.g. RocketMQ's 7 (rw, inherit) as read
    if perm not in (PERM_READ, PERM_WRITE, PERM_READ_WRITE) and not kept:
        raise BadInputError("perm", f"{perm} is not r (4), w (2) or rw (6)")
    # RocketMQ lets the counts shrink and leaves the messages of the queues past them unread by
    # rebalancing consumers; mqstore refuses instead of hiding stored messages
    if count < used_queue_count:
        raise BadInputError("queues", f"{topic} holds messages in queue {used_queue_count - 1}; "
                            f"{count} queues would hide them from consumers (RocketMQ allows it "
                            "and they go unread); delete the topic instead, or keep "
                            f"{used_queue_count} or more")
    base = current or TopicConfig(topic, count, count)
    return table.with_topic(replace(base, read_queue_count=count, write_queue_count=count, perm=perm))


# ---------------------------------------------------------------- codec


def encode_topic_table(table: TopicTable) -> bytes:
    """topics.json's bytes: RocketMQ's keys (fields sorted as fastjson writes them), tombstones."""
    body = {
        "dataVersion": {"counter": table.version_counter, "timestamp": table.version_ms},
        "topicConfigTable": {name: {"order": c.order, "perm": c.perm, "readQueueNums": c.read_queue_count,
                                    "topicFilterType": c.filter_type, "topicName": c.topic,
                                    "topicSysFlag": c.sys_flag, "writeQueueNums": c.write_queue_count}
                             for name, c in sorted(table.topics.items()) if name not in table.system},
        TOMBSTONES_KEY: dict(sorted(table.tombstones.items())),
    }
    return (json.dumps(body, indent=2) + "\n").encode("utf-8")


def decode_topic_table(text: str) -> TopicTable:
    """The table of topics.json's text; ValueError naming the entry and field that is wrong."""
    data = json.loads(quote_bare_integer_keys(text))
    if not isinstance(data, dict):
        raise ValueError("the top level is not an object")
    version = data.get("dataVersion", {})
    if not isinstance(version, dict):
        raise ValueError("dataVersion is not an object")
    raw_topics = data.get("topicConfigTable", {})
    if not isinstance(raw_topics, dict):
        raise ValueError("topicConfigTable is not an object")
    topics = {name: _decode_config(name, entry) for name, entry in raw_topics.items()}
    raw_tombs = data.get(TOMBSTONES_KEY, {})
    if not isinstance(raw_tombs, dict):
        raise ValueError(f"{TOMBSTONES_KEY} is not an object")
    tombstones = {}
    for name, pos in raw_tombs.items():
        _valid_name(name, TOMBSTONES_KEY)
        tombstones[name] = _int_field(f"{TOMBSTONES_KEY}.{name}", pos, 0, 2**63 - 1)
    return TopicTable(topics, tombstones,
                      _int_field("dataVersion.counter", version.get("counter", 0), 0, 2**63 - 1),
                      _int_field("dataVersion.timestamp", version.get("timestamp", 0), 0, 2**63 - 1))


def _decode_config(name: str, entry: object) -> TopicConfig:
    """One topicConfigTable entry; unknown fields (RocketMQ 5's attributes) are ignored."""
    _valid_name(name, "topicConfigTable")
    where = f"topicConfigTable.{name}"
    if not isinstance(entry, dict):
        raise ValueError(f"{where} is not an object")
    if entry.get("topicName", name) != name:
        raise ValueError(f"{where}.topicName is {entry['topicName']!r}, not its key")
    for required in ("readQueueNums", "writeQueueNums", "perm"):
        if required not in entry:
            raise ValueError(f"{where} has no {required}")
    filter_type = entry.get("topicFilterType", "SINGLE_TAG")
    if filter_type not in FILTER_TYPES:
        raise ValueError(f"{where}.topicFilterType {filter_type!r} is not one of {', '.join(FILTER_TYPES)}")
    order = entry.get("order", False)
    if type(order) is not bool:
        raise ValueError(f"{where}.order is {json.dumps(order)}, not true or false")
    return TopicConfig(name, _int_field(f"{where}.readQueueNums", entry["readQueueNums"], 0, MAX_QUEUE_COUNT),
                       _int_field(f"{where}.writeQueueNums", entry["writeQueueNums"], 0, MAX_QUEUE_COUNT),
                       _int_field(f"{where}.perm", entry["perm"], 0, 7), filter_type,
                       _int_field(f"{where}.topicSysFlag", entry.get("topicSysFlag", 0), 0, 2**31 - 1),
                       order)


def _valid_name(name: str, where: str) -> None:
    try:
        validate_topic(name)
    except BadInputError as exc:
        raise ValueError(f"{where}: {name!r}: {exc.reason}") from None


def _int_field(where: str, value: object, low: int, high: int) -> int:
    if type(value) is not int or not low <= value <= high:
        raise ValueError(f"{where} is {json.dumps(value)}, not an integer in {low}..{high}")
    return value


# ---------------------------------------------------------------- the file


class TopicTableFile:
    """config/topics.json of one store: `load` and `write` for the lock holder, `current` for
    readers in other processes (re-read when the file was replaced)."""

    def __init__(self, root: str | os.PathLike):
        self.root = Path(root)
        self.path = config_path(self.root, TOPICS_FILE)
        self._seen: tuple[int, int, int] | None = None
        self._table = TopicTable()

    def load(self) -> TopicTable:
        """The table on disk (an empty one when there is no file); TopicFileError when bad."""
        try:
            stat = os.stat(self.path)
            text = self.path.read_text(encoding="utf-8")
        except FileNotFoundError:
            self._seen, self._table = None, TopicTable()
            return self._table
        except (OSError, UnicodeDecodeError) as exc:
            raise TopicFileError(f"{TOPICS_FILE} unreadable: {exc}", path=str(self.path)) from None
        try:
            table = decode_topic_table(text)
        except ValueError as exc:
            raise TopicFileError(f"{TOPICS_FILE} is not a topic table: {exc}", path=str(self.path),
                                 hint=f"fix the file, or put {TOPICS_FILE}{BACKUP_SUFFIX} (the "
                                      "previous version) in its place") from None
        self._seen, self._table = _identity(stat), table
        return table

    @property
    def table(self) -> TopicTable:
        """The table as last read (or written) here, without looking at the file."""
        return self._table

    def current(self) -> TopicTable:
        """The table as last read, read again when the file was replaced since (one stat)."""
        try:
            seen = _identity(os.stat(self.path))
        except FileNotFoundError:
            seen = None
        if seen != self._seen:
            return self.load()
        return self._table

    def write(self, table: TopicTable) -> None:
        """Replace the file with `table` (tmp, fsync, rename; the old one kept as `.bak`)."""
        ensure_dir(self.path.parent)
        write_file_atomically(self.path, encode_topic_table(table), backup_suffix=BACKUP_SUFFIX)
        self._seen, self._table = _identity(os.stat(self.path)), table


def _identity(stat: os.stat_result) -> tuple[int, int, int]:
    return stat.st_ino, stat.st_mtime_ns, stat.st_size
