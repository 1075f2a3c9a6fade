"""The topic table of the store's writer: the put rule with auto-create, and operator changes.

The supervisor's record check and the in-process MessageStore route every put through
`LiveTopics.route` (engine.topics.table.TopicTable.put_route, plus the creation of an
unconfigured topic), and apply `mqstore topic create|update|delete` through `apply`. Each
change is written to config/topics.json before it takes effect, so a crash never leaves a
record of a topic, or a queue offset restarted by a delete, that the file does not explain.
"""

from __future__ import annotations

import errno
import logging
from collections.abc import Callable, Mapping

from engine.errors import RecordRefusedError
from engine.refusal import Refusal, refused
from engine.status import PutStatus
from engine.topics.table import (
    TopicChange,
    TopicConfig,
    TopicDefaults,
    TopicOp,
    TopicTable,
    TopicTableFile,
    plan_topic_change,
)

log = logging.getLogger(__name__)


class LiveTopics:
    """The lock holder's topic table (one thread at a time: the caller serializes puts)."""

    def __init__(self, topic_file: TopicTableFile, table: TopicTable, defaults: TopicDefaults):
        self.file = topic_file
        self.table = table
        self.defaults = defaults

    def route(self, topic: str, queue_id: int) -> TopicConfig:
        """TopicTable.put_route, creating (and writing) an unconfigured topic it accepts."""
        config = self.table.put_route(topic, queue_id, self.defaults)
        if topic not in self.table.topics:
            try:
                self._write(self.table.with_topic(config))
            except OSError as exc:
                raise _not_written(topic, exc) from exc
            log.info("topic %s created by its first message (%d queues)", topic, config.write_queue_count)
        return config

    def apply(self, change: TopicChange, next_offsets: dict[tuple[str, int], int],
              flush_log: Callable[[], int]) -> TopicTable:
        """Apply an operator's change (BadInputError, nothing changed, when it cannot); a delete
        tombstones the topic at the end of the log and forgets its queue offsets in
        `next_offsets`, so a topic created again starts its queues at 0. `flush_log`: makes the
        whole log durable and returns its end (it raises when the flush fails)."""
        used = used_queue_count(next_offsets, change.topic)
        # a tombstone is a durable position: above an unflushed tail, a power loss would bring the
        # log back below it and the re-created topic's new records would sit under it, never read
        end_pos = flush_log() if change.op is TopicOp.DELETE else 0
        table = plan_topic_change(self.table, change, used_queue_count=used, end_pos=end_pos)
        self._write(table)
        if change.op is TopicOp.DELETE:
            for key in [key for key in next_offsets if key[0] == change.topic]:
                del next_offsets[key]
        log.info("topic %s: %s (%s)", change.topic, change.op.value, describe(table, change.topic))
        return table

    def _write(self, table: TopicTable) -> None:
        self.file.write(table)
        self.table = table


def _not_written(topic: str, exc: OSError) -> RecordRefusedError:
    """A new topic's record refused because topics.json could not be written: the store's fault,
    not the record's (nothing was appended, so nothing is lost; the producer may retry)."""
    full = exc.errno in (errno.ENOSPC, errno.EDQUOT)
    log.error("topic %s not created: %s", topic, exc)
    return refused(Refusal.TOPIC_NOT_WRITTEN, found=exc.errno or 0,
                   put_status=PutStatus.DISK_FULL if full else PutStatus.SERVICE_NOT_AVAILABLE,
                   detail=f"creating it failed: config/topics.json was not written ({exc}); "
                          "nothing was stored")


def used_queue_count(next_offsets: Mapping[tuple[str, int], int], topic: str) -> int:
    """One past the highest queue id of `topic` that ever held a message (0: none)."""
    return max((queue_id + 1 for (name, queue_id), offset in next_offsets.items()
                if name == topic and offset > 0), default=0)


def describe(table: TopicTable, topic: str) -> str:
    config = table.topics.get(topic)
    if config is None:
        return f"deleted below commit_pos {table.tombstone_of(topic)}"
    return f"{config.write_queue_count} write and {config.read_queue_count} read queues, perm {config.perm}"
