"""store.json: the format version and the layout sizes frozen when a store is created.

    {
      "checksum": "crc32c",              record checksum kind (the __CRC32C property)
      "commitlog_file_size": 1073741824, bytes per commitlog segment
      "consume_queue_entries": 300000,   entries per consume-queue file
      "format_version": 1,               a newer version than FORMAT_VERSION is refused
      "index_entry_count": 20000000,     entries per index file
      "index_shards": 2,                 index shard count (1..64)
      "index_slot_count": 5000000,       hash slots per index file
      "message_delay_level": "1s 5s ..", each delay level's delay (optional: absent in older stores)
      "queue_count": 8,                  queues per topic (optional: absent in older stores)
      "store_host": "127.0.0.1:10911"    STOREHOST written into records
    }

JSON with sorted keys, 2-space indent and a trailing newline, so diffs and `cat` read well.
Unknown keys are ignored (forward compatibility within a version); missing ones are an error,
except queue_count and message_delay_level, which stores created before they were recorded
lack (then they are not frozen).
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from typing import TYPE_CHECKING

from engine.errors import FormatVersionError, NotAStoreError

if TYPE_CHECKING:
    from engine.config import StoreConfig

FORMAT_VERSION = 1
CHECKSUM_CRC32C = "crc32c"
MAX_INDEX_SHARDS = 64
_INT_FIELDS = ("format_version", "commitlog_file_size", "consume_queue_entries", "index_slot_count",
               "index_entry_count", "index_shards", "queue_count")
_OPTIONAL_FIELDS = ("queue_count", "message_delay_level")
MAX_QUEUE_COUNT = 1024


@dataclass(frozen=True, slots=True)
class StoreMeta:
    """What store.json records; the layout sizes win over later settings."""

    format_version: int
    commitlog_file_size: int
    consume_queue_entries: int
    index_slot_count: int
    index_entry_count: int
    index_shards: int
    checksum: str = CHECKSUM_CRC32C
    store_host: str = "127.0.0.1:10911"
    queue_count: int | None = None
    message_delay_level: str | None = None


def from_config(config: StoreConfig) -> StoreMeta:
    """The store.json of a store created now with `config`."""
    return StoreMeta(format_version=FORMAT_VERSION, commitlog_file_size=config.commitlog_file_size,
                     consume_queue_entries=config.consume_queue_entries,
                     index_slot_count=config.index_slot_count, index_entry_count=config.index_entry_count,
                     index_shards=config.index_shards, checksum=CHECKSUM_CRC32C,
                     store_host=config.store_host, queue_count=config.queue_count,
                     message_delay_level=config.message_delay_level)


def encode_store_meta(meta: StoreMeta) -> bytes:
    """store.json bytes: sorted keys, indented, trailing newline (an unrecorded queue_count is left out)."""
    data = {k: v for k, v in dataclasses.asdict(meta).items()
            if not (k in _OPTIONAL_FIELDS and v is None)}
    return (json.dumps(data, sort_keys=True, indent=2) + "\n").encode("utf-8")


def decode_store_meta(raw: bytes | str, *, path: str | None = None) -> StoreMeta:
    """Parse store.json; FormatVersionError if newer than this code, NotAStoreError if malformed."""
    try:
        data = json.loads(raw)
    except (ValueError, TypeError) as exc:
        raise NotAStoreError(f"store.json is not valid JSON: {exc}", path=path) from None
    if not isinstance(data, dict):
        raise NotAStoreError("store.json is not a JSON object", path=path)
    missing = sorted(f.name for f in dataclasses.fields(StoreMeta)
                     if f.name not in data and f.name not in _OPTIONAL_FIELDS)
    if missing:
        raise NotAStoreError(f"store.json lacks {missing}", path=path)
    for name in _INT_FIELDS:
        if name not in data:
            continue
        value = data[name]
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise NotAStoreError(f"store.json {name} = {value!r} is not a positive integer", path=path)
    if data["format_version"] > FORMAT_VERSION:
        raise FormatVersionError(f"store format version {data['format_version']} is newer than "
                                 f"{FORMAT_VERSION}", path=path, hint="open it with a newer mqstore")
    _check_str_fields(data, path)
    if data["index_shards"] > MAX_INDEX_SHARDS:
        raise NotAStoreError(f"store.json index_shards {data['index_shards']} > {MAX_INDEX_SHARDS}",
                             path=path)
    if data.get("queue_count", 1) > MAX_QUEUE_COUNT:
        raise NotAStoreError(f"store.json queue_count {data['queue_count']} > {MAX_QUEUE_COUNT}",
                             path=path)
    return StoreMeta(**{f.name: data[f.name] for f in dataclasses.fields(StoreMeta) if f.name in data})


def _check_str_fields(data: dict, path: str | None) -> None:
    levels = data.get("message_delay_level", "1s")
    if not isinstance(levels, str) or not levels.split():
        raise NotAStoreError(f"store.json message_delay_level {levels!r} is not a delay level table",
                             path=path)
    if data["checksum"] != CHECKSUM_CRC32C:
        raise NotAStoreError(f"store.json checksum {data['checksum']!r} is not {CHECKSUM_CRC32C!r}",
                             path=path)
    host = data["store_host"]
    ip, sep, port = host.rpartition(":") if isinstance(host, str) else ("", "", "")
    if not (ip and sep and port.isdigit()):
        raise NotAStoreError(f"store.json store_host {host!r} is not 'ip:port'", path=path)
