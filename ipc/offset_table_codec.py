"""The text of consumerOffset.json decoded (ipc.consumer_offsets documents the layout): pure,
raising ValueError on anything but the documented shape. A primitive, so the supervisor can read
the committed offsets at start (ipc.refused_offsets) without acting as a client."""

from __future__ import annotations

import json

from engine.formats.fastjson import quote_bare_integer_keys

OffsetTable = dict[str, dict[int, int]]
CommitTimes = dict[str, dict[int, int]]  # same keys as OffsetTable; values are ms since epoch


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
