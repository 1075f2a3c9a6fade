"""Dispatch of a few records in plain Python: the dispatcher's small steps.

A step of a few dozen records spends ~0.5 ms in the fixed cost of the batch codec and of the
per-queue numpy of engine.dispatch.record, however few records it has. Here the same rules run record by
record with struct: the structure checks of engine.formats.record.structure, the properties rule
of properties.decode_properties, the rules of engine.record_rules, one ConsumeQueue.put_entries per
queue, and one matrix product for every key's hash (key_batch.padded_key_hashes). `decode_few`
takes plain records only (magic v1 or v2, IPv4 hosts, ASCII topic and properties) and stops at
the first other piece (a filler, an IPv6 host, non-ASCII text, damage): the caller hands the rest
to the batch codec, which has every rule, so both paths write the same bytes
(tests/workers/test_dispatch_few.py).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field
from functools import lru_cache

import crc32c

from engine.errors import CorruptRecordError
from engine.formats.index_file import KEY_SEPARATOR
from engine.formats.java_hash import tags_code
from engine.formats.key_batch import padded_key_hashes
from engine.formats.properties import KEYS_SEPARATOR, PROP_KEYS, PROP_TAGS, PROP_UNIQ_KEY, SEP_KV, SEP_PROP
from engine.formats.record.layout import (
    BODY_OFFSET,
    FIELD_INDEX,
    HOSTS_V6,
    PROPERTIES_LENGTH_SIZE,
    V4_HEADER_FMT,
    V4_HEADER_SIZE,
)
from engine.formats.record.structure import check_head, check_position, locate_parts
from engine.queues.table import ConsumeQueueTable
from engine.record_rules import enters_consume_queue, is_unindexed_rollback, scheduled_tag_column
from engine.topics.system import SCHEDULE_TOPIC

_HEADER = struct.Struct(V4_HEADER_FMT)
_F_TOTAL, _F_MAGIC, _F_QUEUE_ID, _F_QUEUE_OFFSET, _F_COMMIT, _F_SYS_FLAG, _F_STORE_TS, _F_BODY_LEN = (
    FIELD_INDEX[name] for name in ("total_size", "magic", "queue_id", "queue_offset", "commit_pos",
                                   "sys_flag", "store_ts_ms", "body_length"))
_TAGS_B, _KEYS_B, _UNIQ_B = PROP_TAGS.encode(), PROP_KEYS.encode(), PROP_UNIQ_KEY.encode()
_KEY_SEP_B, _TOKEN_SEP_B = KEY_SEPARATOR.encode(), KEYS_SEPARATOR.encode()


@dataclass(slots=True)
class FewRecords:
    """What dispatch needs of a few records, one list entry per record (DispatchColumns' fields
    as lists); `index_keys[i]` are record i's `topic#key` strings as bytes, UNIQ_KEY first.
    `end_pos` is where the next record starts (the start when none was taken)."""

    end_pos: int
    commit_pos: list[int] = field(default_factory=list)
    total_size: list[int] = field(default_factory=list)
    queue_id: list[int] = field(default_factory=list)
    queue_offset: list[int] = field(default_factory=list)
    sys_flag: list[int] = field(default_factory=list)
    store_ts_ms: list[int] = field(default_factory=list)
    tags_code: list[int] = field(default_factory=list)
    topic: list[bytes] = field(default_factory=list)
    index_keys: list[list[bytes]] = field(default_factory=list)

    @property
    def count(self) -> int:
        return len(self.commit_pos)


def decode_few(buf, pos: int, end: int, base_pos: int) -> FewRecords:
    """The plain records of buf[pos:end] (buf[0] at commit position base_pos), from pos up to
    the first piece that is not one or would cross `end`."""
    out = FewRecords(base_pos + pos)
    while end - pos >= V4_HEADER_SIZE:
        fields = _HEADER.unpack_from(buf, pos)
        total_size, magic = fields[_F_TOTAL], fields[_F_MAGIC]
        commit_pos = base_pos + pos
        if total_size > end - pos or fields[_F_SYS_FLAG] & HOSTS_V6:
            break
        try:
            check_head(total_size, magic, end - pos, commit_pos)
            check_position(fields[_F_COMMIT], commit_pos, total_size)
            _, topic_pos, props_pos = locate_parts(buf, pos, total_size, magic, pos + BODY_OFFSET,
                                                   fields[_F_BODY_LEN], commit_pos)
        except CorruptRecordError:  # a filler or damage: the batch codec's to handle
            break
        topic = bytes(buf[topic_pos:props_pos - PROPERTIES_LENGTH_SIZE])
        props = bytes(buf[props_pos:pos + total_size])
        if not (topic.isascii() and props.isascii()):
            break
        tags, keys = _properties(props, topic + _KEY_SEP_B)
        out.commit_pos.append(commit_pos)
        out.total_size.append(total_size)
        out.queue_id.append(fields[_F_QUEUE_ID])
        out.queue_offset.append(fields[_F_QUEUE_OFFSET])
        out.sys_flag.append(fields[_F_SYS_FLAG])
        out.store_ts_ms.append(fields[_F_STORE_TS])
        out.tags_code.append(tags)
        out.topic.append(topic)
        out.index_keys.append(keys)
        pos += total_size
        out.end_pos = base_pos + pos
    return out


def _properties(props: bytes, key_prefix: bytes) -> tuple[int, list[bytes]]:
    """(tags code, index keys) of ASCII properties by decode_properties' rule: pairs split on
    0x02, a pair kept when its first 0x01 lies strictly inside it, a later duplicate wins."""
    tags = keys = uniq = None
    for pair in props.split(SEP_PROP):
        at = pair.find(SEP_KV)
        if 0 < at < len(pair) - 1:
            name = pair[:at]
            if name == _UNIQ_B:
                uniq = pair[at + 1:]
            elif name == _KEYS_B:
                keys = pair[at + 1:]
            elif name == _TAGS_B:
                tags = pair[at + 1:]
    index_keys = [key_prefix + uniq] if uniq else []
    if keys:
        index_keys += [key_prefix + token for token in keys.split(_TOKEN_SEP_B) if token]
    return (_tags_code_of(tags) if tags else 0), index_keys


@lru_cache(maxsize=4096)
def _tags_code_of(raw: bytes) -> int:
    return tags_code(raw.decode("ascii"))


@lru_cache(maxsize=4096)
def _topic_name(raw: bytes) -> str:
    return raw.decode("ascii")


def few_to_consume_queues(table: ConsumeQueueTable, few: FewRecords) -> int:
    """dispatch_columns_to_consume_queues for FewRecords: one put_entries per queue, queues in order
    of first appearance; returns the entries written."""
    groups: dict[tuple[bytes, int], list[int]] = {}
    for row, (topic, queue_id, queue_offset, sys_flag) in enumerate(
            zip(few.topic, few.queue_id, few.queue_offset, few.sys_flag, strict=True)):
        if enters_consume_queue(sys_flag, queue_offset):
            groups.setdefault((topic, queue_id), []).append(row)
    written = 0
    for (topic, queue_id), rows in groups.items():
        name = _topic_name(topic)
        floor = table.tombstone_of(name)  # a deleted topic's records enter no queue
        if floor:
            rows = [i for i in rows if few.commit_pos[i] >= floor]
            if not rows:
                continue
        queue = table.get_or_create(name, queue_id)
        tags = [few.tags_code[i] for i in rows] if name != SCHEDULE_TOPIC else \
            scheduled_tag_column([few.store_ts_ms[i] for i in rows], queue_id, table.delay_levels_ms).tolist()
        written += queue.put_entries([few.queue_offset[i] for i in rows], [few.commit_pos[i] for i in rows],
                                     [few.total_size[i] for i in rows], tags)
    return written


def few_key_columns(few: FewRecords, shard_count: int) -> list[tuple[list[int], list[int], list[int]]]:
    """shard_key_columns for FewRecords: per shard (key hashes, commit positions, store times) of
    every key dispatch_to_shard indexes (none of a rollback), in record order, UNIQ_KEY first."""
    keys: list[bytes] = []
    rows: list[int] = []
    for row, index_keys in enumerate(few.index_keys):
        if index_keys and not is_unindexed_rollback(few.sys_flag[row], few.queue_offset[row]):
            keys += index_keys
            rows += [row] * len(index_keys)
    hashes = padded_key_hashes(keys)
    out: list[tuple[list[int], list[int], list[int]]] = [([], [], []) for _ in range(shard_count)]
    for key, key_hash, row in zip(keys, hashes, rows, strict=True):
        key_hashes, positions, times = out[crc32c.crc32c(key) % shard_count]
        key_hashes.append(key_hash)
        positions.append(few.commit_pos[row])
        times.append(few.store_ts_ms[row])
    return out
