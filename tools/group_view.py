"""The members of the store's consumer groups as `mqstore groups` shows them: per member its
pid, since when, state (live, or stalled: stopped or not sweeping), the queues it owns and the
messages waiting on them. Read-only: dead members' files are passed over, not removed."""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from pathlib import Path

from engine.files.naming import CONFIG_DIR
from ipc.consumer_offsets import ConsumerOffsets, broadcast_offsets_path, table_key
from ipc.group_members import GROUPS_DIR
from ipc.group_roster import MessageModel, live_members_in, member_topics
from tools.inventory import QueueSpan, require_store, topic_spans


@dataclass(frozen=True)
class MemberRow:
    """One live member of a group on one topic."""

    group: str
    topic: str
    member: str
    pid: int
    since_ms: int
    state: str
    model: str
    expression: str
    queue_ids: tuple[int, ...]
    lag_messages: int  # on its queues: from the committed offset (else the min) to the end

    def as_dict(self) -> dict:
        fields = asdict(self)
        fields["queue_ids"] = list(self.queue_ids)
        return fields


def member_table(store_dir: str | Path) -> list[MemberRow]:
    """Every live member of every group on this store, by group, topic and member name."""
    root = Path(store_dir)
    require_store(root)
    group_offsets = ConsumerOffsets(root).peek_with_times()[0]
    now_ms = time.time_ns() // 1_000_000
    rows = []  # by group directory, topic and member name
    for directory in _group_dirs(root):
        for topic in member_topics(directory):
            members = live_members_in(directory / topic)
            spans = topic_spans(root, topic) if members else {}
            for record in members:
                offsets = group_offsets if record.model == MessageModel.CLUSTERING.value else (
                    ConsumerOffsets(root, broadcast_offsets_path(root, record.member)).peek_with_times()[0])
                lag = _lag(spans, offsets.get(table_key(topic, record.group), {}), record.queue_ids)
                rows.append(MemberRow(record.group, topic, record.member, record.pid, record.since_ms,
                                      record.state(now_ms), record.model, record.expression,
                                      record.queue_ids, lag))
    return rows


def _lag(spans: dict[int, QueueSpan], committed: dict[int, int], queue_ids: tuple[int, ...]) -> int:
    """Messages from the committed offset (the min offset when none) to the end of each queue."""
    lag = 0
    for queue_id in queue_ids:
        span = spans.get(queue_id)
        if span is not None:
            start = max(committed.get(queue_id, span.min_offset), span.min_offset)
            lag += max(span.max_offset - start, 0)
    return lag


def _group_dirs(root: Path) -> list[Path]:
    """The groups' directories of member files (`config/groups/<group>/`), sorted."""
    directory = root / CONFIG_DIR / GROUPS_DIR
    try:
        return sorted(entry for entry in directory.iterdir() if entry.is_dir())
    except FileNotFoundError:
        return []
