"""Message lookup for the console: by key, by msgId, by topic + queue + queue offset.

The reads are those of `mqstore query` (tools.read_view.ReadView): the files read-only,
bounded by a running supervisor's published positions, so the console never shows a message a
crash could take back. Bodies go out both as text (when UTF-8) and as hex; the page renders
either with textContent, as the bodies are hostile input.
"""

from __future__ import annotations

from pathlib import Path

from engine.errors import BadInputError
from engine.formats.msg_id import parse_msg_id
from engine.formats.record import Record
from tools.read_view import ReadView

MAX_KEY_MATCHES = 64
HEX_SHOWN_BYTES = 64 * 1024  # a 4 MiB body as hex would be 8 MiB of page text


def message_view(record: Record) -> dict:
    """A record as the page shows it: fields, properties, body as text (or None) and hex."""
    try:
        text = record.body.decode("utf-8")
    except UnicodeDecodeError:
        text = None
    return {"topic": record.topic, "queue_id": record.queue_id, "queue_offset": record.queue_offset,
            "commit_pos": record.commit_pos, "msg_id": record.msg_id,
            "store_ts_ms": record.store_ts_ms, "born_ts_ms": record.born_ts_ms,
            "tags": record.tags, "keys": list(record.keys), "uniq_key": record.uniq_key,
            "properties": dict(record.properties), "body_bytes": len(record.body),
            "body_text": text, "body_hex": record.body[:HEX_SHOWN_BYTES].hex(),
            "body_hex_truncated": len(record.body) > HEX_SHOWN_BYTES}


def _answer(records: list[Record], skipped: list) -> dict:
    return {"messages": [message_view(r) for r in records],
            "skipped": [{"commit_pos": s.commit_pos, "reason": s.reason} for s in skipped]}


def by_key(store_dir: Path, topic: str, key: str, max_count: int = MAX_KEY_MATCHES) -> dict:
    """Messages of `topic` carrying `key` (a KEYS token or UNIQ_KEY), oldest first."""
    if not key:
        raise BadInputError("key", "must not be empty")
    with ReadView(store_dir) as view:
        records, skipped = view.by_key(topic, key, 0, 2**63 - 1, max_count)
    return _answer(records, skipped)


def by_msg_id(store_dir: Path, msg_id: str) -> dict:
    """The message a RocketMQ offset msgId names (its commit position)."""
    _, commit_pos = parse_msg_id(msg_id.strip())
    with ReadView(store_dir) as view:
        return _answer([view.at(commit_pos)], [])


def by_queue_offset(store_dir: Path, topic: str, queue_id: int, queue_offset: int) -> dict:
    """The message at entry `queue_offset` of queue `topic`/`queue_id`."""
    from engine.files.mapped_file import Access
    from engine.queues.consume_queue import ConsumeQueue

    if queue_offset < 0:
        raise BadInputError("queue_offset", f"{queue_offset} must be >= 0")
    with ReadView(store_dir) as view:
        queue = ConsumeQueue.load(view.root, topic, queue_id, view.meta.consume_queue_entries,
                                  Access.READ_ONLY)
        try:
            entry = queue.entry(queue_offset)
            span = (queue.min_offset, queue.max_offset)
        finally:
            queue.close()
        if entry is None:
            raise BadInputError("queue_offset", f"{topic}/{queue_id} holds offsets "
                                f"{span[0]}..{span[1] - 1}, not {queue_offset}"
                                if span[1] > span[0] else f"{topic}/{queue_id} holds no message")
        record = view.at(entry.commit_pos)
    if (record.topic, record.queue_id, record.queue_offset) != (topic, queue_id, queue_offset):
        raise BadInputError("queue_offset", f"the entry of {topic}/{queue_id}@{queue_offset} "
                            f"leads to {record.topic}/{record.queue_id}@{record.queue_offset}")
    return _answer([record], [])
