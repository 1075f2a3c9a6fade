"""`mqstore groups --reset`: move a group's committed offsets on one topic (Kafka's
`--reset-offsets`), the operator's answer to an offset outside its queue.

    mqstore groups --reset --group G --topic T --to earliest|latest|TIME|OFFSET

`earliest` is each queue's min offset (what retention kept), `latest` its max offset (skip all
that is there), TIME the first message stored at or after it (ISO 8601, local time unless it has
a zone, or `@<ms since the epoch>`), OFFSET one queue offset for every queue of the topic,
refused unless it lies in each queue's [min, max]. Every queue the group committed for the topic
is reset, one whose files are gone too (its span is [0, 0]), in the groups' file and in each
BROADCASTING instance's own (config/broadcastOffsets/<instance>/); the group must have committed before
and the topic must have queues or committed ones; the reset is refused while the group has live consumers
(ipc.group_members: their next commit would overwrite it) and holds the group alone while it
writes. It writes the offsets file as a commit does (one atomic replace, previous kept as
`.bak`), clears the refusals of the queues it reset (ipc.refused_offsets) and logs each move in
mqstore.log: no offset moves without a logged reason. Bad input
changes nothing.
"""

from __future__ import annotations

import logging
import os
from dataclasses import asdict, dataclass, replace
from datetime import datetime
from pathlib import Path

from engine.errors import BadInputError
from engine.files.naming import CONFIG_DIR, validate_topic
from ipc.consumer_offsets import ConsumerOffsets, table_key, validate_group
from ipc.deleted_topic_offsets import broadcast_instance_paths
from ipc.group_members import group_held_alone
from ipc.refused_offsets import clear_refused
from ipc.store_log import append_to_store_log
from tools.inventory import QueueSpan, require_store, topic_spans

log = logging.getLogger(__name__)
EARLIEST = "earliest"
LATEST = "latest"
EPOCH_MS_MARK = "@"


@dataclass(frozen=True)
class OffsetMove:
    """One queue's committed offset before the reset (None: never committed) and after."""

    queue_id: int
    before: int | None
    after: int
    instance: str | None = None  # a BROADCASTING instance's own offsets; None: the group's

    def as_dict(self) -> dict:
        return asdict(self)


def parse_reset_target(text: str) -> str | int | datetime:
    """`earliest`, `latest`, an OFFSET (int >= 0), or a TIME (an aware or naive datetime;
    `@<ms>` is epoch milliseconds)."""
    if text in (EARLIEST, LATEST):
        return text
    if text.isdigit():
        return int(text)
    if text.startswith(EPOCH_MS_MARK) and text[1:].isdigit():
        return datetime.fromtimestamp(int(text[1:]) / 1000).astimezone()
    try:
        return datetime.fromisoformat(text)
    except ValueError:
        raise BadInputError("--to", f"{text!r} is none of earliest, latest, an offset (digits), an "
                            "ISO 8601 time or @<ms since the epoch>") from None


def reset_offsets(store_dir: str | Path, group: str, topic: str, to_text: str) -> list[OffsetMove]:
    """Reset `group`'s offsets on every queue of `topic` to `to_text` (module doc); the moves."""
    root = Path(store_dir)
    validate_group(group)
    validate_topic(topic)
    target = parse_reset_target(to_text)
    require_store(root)
    files = _offsets_files(root, group)
    for offsets in files:
        _moves(root, offsets.peek_with_times()[0], group, topic, target)  # refuse before any write
    moves: list[OffsetMove] = []
    with group_held_alone(root, group):
        for offsets in files:
            instance = None if offsets.path.parent.name == CONFIG_DIR else offsets.path.parent.name
            file_moves = [replace(move, instance=instance)
                          for move in _moves(root, offsets.load(), group, topic, target)]
            offsets.commit_many(group, {(topic, move.queue_id): move.after for move in file_moves})
            moves.extend(file_moves)
        clear_refused(root, group, topic, sorted({move.queue_id for move in moves}))
    said = ", ".join(f"{m.instance + '/' if m.instance else ''}{m.queue_id}: "
                     f"{'-' if m.before is None else m.before} -> {m.after}" for m in moves)
    message = (f"offsets of group {group} on {topic} reset to {to_text} by `mqstore groups "
               f"--reset` (pid {os.getpid()}): {said}")
    log.info("%s", message)
    append_to_store_log(root, "cli", __name__, logging.WARNING, message)
    return moves


def _offsets_files(root: Path, group: str) -> list[ConsumerOffsets]:
    """The offsets files `group` committed in: the groups' file and, for a BROADCASTING group,
    each instance's own; BadInputError when it committed in none."""
    files = [ConsumerOffsets(root)] + [ConsumerOffsets(root, path) for path in broadcast_instance_paths(root)]
    committed = [offsets for offsets in files
                 if any(key.endswith("@" + group) for key in offsets.peek_with_times()[0])]
    if not committed:
        raise BadInputError("group", f"{group!r} has committed no offset in this store", path=str(root))
    return committed


def _moves(root: Path, table: dict, group: str, topic: str,
           target: str | int | datetime) -> list[OffsetMove]:
    """Each queue's move; BadInputError for an unknown group or topic, or an OFFSET outside."""
    if not any(key.endswith("@" + group) for key in table):
        raise BadInputError("group", f"{group!r} has committed no offset in this store", path=str(root))
    ts_ms = int(target.timestamp() * 1000) if isinstance(target, datetime) else None
    spans = topic_spans(root, topic, ts_ms)
    before = table.get(table_key(topic, group), {})
    for queue_id in before.keys() - spans.keys():  # committed, its files gone (a rebuild dropped it)
        spans[queue_id] = QueueSpan(0, 0, 0)
    if not spans:
        raise BadInputError("topic", f"{topic!r} has no queue in this store", path=str(root))
    return [OffsetMove(queue_id, before.get(queue_id), _new_offset(topic, queue_id, span, target))
            for queue_id, span in sorted(spans.items())]


def _new_offset(topic: str, queue_id: int, span: QueueSpan, target: str | int | datetime) -> int:
    if target == EARLIEST:
        return span.min_offset
    if target == LATEST:
        return span.max_offset
    if isinstance(target, datetime):
        return span.at_time_offset
    if not span.min_offset <= target <= span.max_offset:
        hint = f" (for a time in ms since the epoch write @{target})" if target >= 10**11 else ""
        raise BadInputError("--to", f"offset {target} is outside {topic}/{queue_id}, which holds "
                            f"[{span.min_offset}, {span.max_offset}]{hint}; nothing was changed")
    return target
