"""Store settings: defaults follow RocketMQ; every size is a setting so tests can use small files."""

from __future__ import annotations

import dataclasses
import tomllib
import typing
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path

from engine.delivery.levels import DEFAULT_DELAY_LEVELS, parse_delay_levels
from engine.errors import BadInputError
from engine.formats.crc32c_property import CRC32C_PROP_SIZE
from engine.formats.record.layout import FILLER_SIZE, RECORD_FIXED_SIZE
from engine.topics.system import TIMER_MAX_DELAY_LIMIT_S

MiB = 1024 * 1024
GiB = 1024 * MiB


class FlushPolicy(StrEnum):
    """SYNC: acknowledge after fdatasync (group commit). ASYNC: acknowledge on append."""

    SYNC = "sync"
    ASYNC = "async"


@dataclass(frozen=True)
class StoreConfig:
    """All tunables of one store. Layout sizes are frozen into store.json at creation."""

    commitlog_file_size: int = GiB
    consume_queue_entries: int = 300_000
    index_slot_count: int = 5_000_000
    index_entry_count: int = 20_000_000
    index_shards: int = 2
    queue_count: int = 8
    flush: FlushPolicy = FlushPolicy.SYNC
    max_body_bytes: int = 4 * MiB
    sync_flush_timeout_ms: int = 5000
    async_flush_interval_ms: int = 500
    async_flush_least_pages: int = 4
    async_flush_thorough_interval_ms: int = 10_000
    cq_flush_interval_ms: int = 1000
    index_flush_interval_ms: int = 10_000  # a builder starts a paced sync of its index files
    store_host: str = "127.0.0.1:10911"
    file_reserved_hours: float = 72.0
    delete_when_hour: int = 4
    disk_warn_ratio: float = 0.75
    disk_clean_force_ratio: float = 0.85
    disk_full_ratio: float = 0.90
    # consume-queue files a process keeps mapped (2 fds each when written); the least recently
    # used beyond are synced and closed, and reopened when used (engine.files.open_files)
    max_open_queue_files: int = 4096
    clean_resource_interval_ms: int = 10_000  # retention pass of a running store (cleanResourceInterval)
    # an unconfigured topic is created with queue_count queues by its first put (RocketMQ
    # autoCreateTopicEnable); off, a put to it is refused until `mqstore topic create`
    auto_create_topic: bool = True
    # the delay of each level (RocketMQ's messageDelayLevel), recorded in store.json at creation
    message_delay_level: str = DEFAULT_DELAY_LEVELS
    timer_max_delay_s: int = 3 * 24 * 3600  # how far ahead deliver_at_ms may be (timerMaxDelaySec)

    def __post_init__(self) -> None:
        if isinstance(self.flush, str) and not isinstance(self.flush, FlushPolicy):
            object.__setattr__(self, "flush", parse_flush_policy(self.flush))
        _require(self.commitlog_file_size >= 4096, "commitlog_file_size", "must be >= 4096")
        _require(self.consume_queue_entries >= 2, "consume_queue_entries", "must be >= 2")
        _require(self.index_slot_count >= 1, "index_slot_count", "must be >= 1")
        _require(self.index_entry_count >= 2, "index_entry_count", "must be >= 2")
        _require(1 <= self.index_shards <= 64, "index_shards", "must be in 1..64")
        _require(1 <= self.queue_count <= 1024, "queue_count", "must be in 1..1024")
        _require(self.max_body_bytes >= 1, "max_body_bytes", "must be >= 1")
        _require(self.index_flush_interval_ms >= 1, "index_flush_interval_ms", "must be >= 1")
        _require(self.max_open_queue_files >= 1, "max_open_queue_files", "must be >= 1")
        _require(self.clean_resource_interval_ms >= 1, "clean_resource_interval_ms", "must be >= 1")
        _require(0 <= self.delete_when_hour <= 23, "delete_when_hour", "must be in 0..23")
        parse_delay_levels(self.message_delay_level)
        _require(1 <= self.timer_max_delay_s <= TIMER_MAX_DELAY_LIMIT_S, "timer_max_delay_s",
                 f"must be in 1..{TIMER_MAX_DELAY_LIMIT_S} (7 days)")
        _require(0 < self.disk_warn_ratio <= self.disk_clean_force_ratio <= self.disk_full_ratio
                 <= 1.0, "disk ratios", "need 0 < warn <= clean_force <= full <= 1")

    @property
    def store_ip_port(self) -> tuple[str, int]:
        host, _, port = self.store_host.rpartition(":")
        return host, int(port)

    @property
    def delay_levels_ms(self) -> tuple[int, ...]:
        """Each delay level's delay in ms (level N is item N - 1)."""
        return parse_delay_levels(self.message_delay_level)

    def replace(self, **changes) -> StoreConfig:
        return dataclasses.replace(self, **changes)


def max_body_room_bytes(segment_bytes: int) -> int:
    """The largest body any record can carry in a segment of `segment_bytes`: less the filler a
    roll may need, the fixed fields, a one-byte topic and the __CRC32C property."""
    return segment_bytes - FILLER_SIZE - RECORD_FIXED_SIZE - 1 - CRC32C_PROP_SIZE


def refuse_unfit_body_limit(config: StoreConfig) -> None:
    """BadInputError when a body of max_body_bytes could never fit one commitlog segment: the
    store would accept a limit its own writer refuses (at start; in-process test stores with
    tiny segments keep the default limit)."""
    room_bytes = max_body_room_bytes(config.commitlog_file_size)
    if config.max_body_bytes > room_bytes:
        raise BadInputError("max_body_bytes", f"{config.max_body_bytes} does not fit a commitlog segment "
                            f"of {config.commitlog_file_size} bytes, whose records carry bodies of at "
                            f"most {room_bytes} bytes; lower max_body_bytes (commitlog_file_size is "
                            "fixed when a store is created)")


def _require(ok: bool, field: str, reason: str) -> None:
    if not ok:
        raise BadInputError(field, reason)


def parse_flush_policy(text: str) -> FlushPolicy:
    try:
        return FlushPolicy(text.lower())
    except ValueError:
        raise BadInputError("flush", f"{text!r} is not one of sync, async") from None


def read_config_tables(path: str | Path) -> dict:
    """The parsed TOML file; BadInputError when it is missing or not TOML."""
    path = Path(path)
    try:
        return tomllib.loads(path.read_text())
    except FileNotFoundError:
        raise BadInputError("config", "file not found", path=str(path)) from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise BadInputError("config", f"not valid TOML: {exc}", path=str(path)) from None


def store_table(path: str | Path) -> dict:
    """The StoreConfig settings of a TOML file (its [store] table, or its top level)."""
    return store_part(read_config_tables(path))


def store_part(tables: dict) -> dict:
    """The StoreConfig settings of parsed TOML tables: [store], or the top level."""
    if "store" in tables:
        return tables["store"]
    return {k: v for k, v in tables.items() if k != "supervisor"}


def check_setting_types(table: dict, types: dict[str, type], where: str, path: str | Path) -> None:
    """Refuse an unknown key or a value of the wrong type, naming the key, the value and what
    it must be (an int is accepted for a float; a bool is not a number)."""
    unknown = sorted(set(table) - set(types))
    if unknown:
        raise BadInputError("config", f"{where}: unknown settings {unknown}; valid ones are "
                            f"{', '.join(sorted(types))}", path=str(path))
    for name, value in table.items():
        expected = types[name]
        accepted = (int, float) if expected is float else (expected,)
        if isinstance(value, bool) != (expected is bool) or not isinstance(value, accepted):
            raise BadInputError("config", f"{where} {name} = {value!r} is a "
                                f"{type(value).__name__}, expected {_type_word(expected)}",
                                path=str(path))


def _type_word(expected: type) -> str:
    if issubclass(expected, StrEnum):
        return "one of " + ", ".join(repr(m.value) for m in expected)
    return {int: "an integer", float: "a number", str: "a string", bool: "true or false"}.get(
        expected, expected.__name__)


def store_setting_types() -> dict[str, type]:
    """StoreConfig field name -> the TOML value type it takes (flush is a string)."""
    hints = typing.get_type_hints(StoreConfig)
    return {f.name: (str if hints[f.name] is FlushPolicy else hints[f.name])
            for f in dataclasses.fields(StoreConfig)}


def load_config_file(path: str | Path, base: StoreConfig | None = None) -> StoreConfig:
    """Read a TOML file of StoreConfig fields (top level or a [store] table)."""
    return config_from_tables(read_config_tables(path), path, base)


def config_from_tables(tables: dict, path: str | Path, base: StoreConfig | None = None) -> StoreConfig:
    """StoreConfig from the parsed TOML of `path` (types checked first), for a caller that
    also reads its other tables."""
    data = store_part(tables)
    check_setting_types(data, store_setting_types(), "[store]", path)
    return dataclasses.replace(base or StoreConfig(), **data)
