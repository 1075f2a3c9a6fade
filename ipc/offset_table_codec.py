"""The text of consumerOffset.json encoded and decoded (ipc.consumer_offsets documents the
layout): pure, raising ValueError on anything but the documented shape. A primitive, so the
supervisor can read the committed offsets at start (ipc.refused_offsets) and forget a deleted
topic's (ipc.deleted_topic_offsets) without acting as a client."""

from __future__ import annotations

import json
from collections.abc import Mapping

from engine.formats.fastjson import quote_bare_integer_keys

OffsetTable = dict[str, dict[int, int]]
CommitTimes = dict[str, dict[int, int]]  # same keys as OffsetTable; values are ms since epoch


def encode_offset_table(table: Mapping[str, Mapping[int, int]],
                        commit_times: Mapping[str, Mapping[int, int]] | None = None) -> bytes:
    """Strict JSON, keys sorted, queue ids as strings (what RocketMQ's reader also accepts)."""
    def body(rows: Mapping[str, Mapping[int, int]]) -> dict:
        return {key: {str(qid): int(v) for qid, v in sorted(queues.items())}
                for key, queues in sorted(rows.items())}

    document = {"offsetTable": body(table)}
    if commit_times:
        document["commitTimeTable"] = body(commit_times)
    return (json.dumps(document, indent=2) + "\n").encode()


def plan_forget_topic(table: OffsetTable, times: CommitTimes, topic: str
                      ) -> tuple[OffsetTable, CommitTimes, list[str]]:
    """The tables without any group's offsets of `topic` (a deleted topic), and those groups."""
    gone = [key for key in table if key.partition("@")[0] == topic]
    kept_table = {key: queues for key, queues in table.items() if key not in gone}
    kept_times = {key: queues for key, queues in times.items() if key.partition("@")[0] != topic}
    return kept_table, kept_times, sorted(key.partition("@")[2] for key in gone)


def parse_offset_table(text: str) -> OffsetTable:
    """Decode the file's text leniently (bare integer keys allowed); raise ValueError if garbled."""
    return parse_offset_document(text)[0]


def parse_offset_document(text: str) -> tuple[OffsetTable, CommitTimes]:
    """The offsets and the commit times of the file's text; raise ValueError if garbled."""
    data = json.loads(quote_bare_integer_keys(text))
    if not isinstance(data, dict):
        raise ValueError("top level is not an object")
    return _int_table(data, "offsetTable"), _int_table(data, "commitTimeTable")


def _int_table(data: dict, name: str) -> dict[str, dict[int, int]]:
    raw = data.get(name, {})
    if not isinstance(raw, dict):
        raise ValueError(f"{name} is not an object")
    table: dict[str, dict[int, int]] = {}
    for key, queues in raw.items():
        if not isinstance(queues, dict):
            raise ValueError(f"{name} entry {key!r} is not an object")
        table[key] = {int(qid): _int_value(name, key, value) for qid, value in queues.items()}
    return table


def _int_value(name: str, key: str, value: object) -> int:
    """A stored offset or time: a JSON integer only. null, true or 7.9 would crash or move the
    offset in silence; ValueError lets the reader fall back to the backup instead."""
    if type(value) is not int:
        raise ValueError(f"{name} entry {key!r} holds {json.dumps(value)}, not an integer")
    return value
