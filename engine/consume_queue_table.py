"""The consume-queue table: every consume queue of a store, by (topic, queue id).

Queues live under <root>/consumequeue/<topic>/<queueId>/; each is an
`engine.consume_queue.ConsumeQueue`. The table loads them all, loads a queue whose directory
appeared since (a reader sees the dispatcher's new queues), and runs recovery's and flush's
per-queue steps over all of them. Its queues share one OpenFileBudget: however many queues
there are, at most `max_open_files` of their files stay mapped (engine.open_files).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from enum import Enum
from pathlib import Path

from engine.consume_queue import ConsumeQueue, check_queue_id
from engine.errors import BadInputError, SegmentLayoutError
from engine.filesystem import move_aside, remove_tree
from engine.mapped_file import Access
from engine.naming import CONSUMEQUEUE_DIR, QUARANTINE_DIR, consume_queue_dir, is_topic_name, validate_topic
from engine.open_files import OpenFileBudget, queue_file_budget

log = logging.getLogger(__name__)


class OnUnreadable(Enum):
    """What loading the table does with a queue whose files break the layout rules."""

    RAISE = "raise"  # a reader: the SegmentLayoutError
    SKIP = "skip"  # a read-only look before a writer opens: left out, named in `unreadable`
    SET_ASIDE = "set_aside"  # a writer: moved to quarantine/, started empty, rebuilt from the log


class ConsumeQueueTable:
    """Every consume queue of a store, by (topic, queue_id)."""

    def __init__(self, root: Path, entries_per_file: int, access: Access,
                 max_open_files: int | None = None):
        """`max_open_files`: the bound on mapped files (default: queue_file_budget())."""
        self.root = Path(root)
        self.entries_per_file = entries_per_file
        self.access = access
        self.budget = OpenFileBudget(queue_file_budget() if max_open_files is None else max_open_files)
        self.foreign: list[Path] = []  # what load skipped: not a topic or not a queue id
        self.unreadable: list[tuple[str, int]] = []  # queues load skipped or set aside
        self._queues: dict[tuple[str, int], ConsumeQueue] = {}

    @classmethod
    def load(cls, root: Path, entries_per_file: int, access: Access, max_open_files: int | None = None,
             on_unreadable: OnUnreadable | None = None) -> ConsumeQueueTable:
        """Load every queue under <root>/consumequeue; foreign entries are listed in `foreign`.

        A queue whose files break the layout rules (a short or missing file) is handled by
        `on_unreadable`; by default a writer sets it aside (a queue is derived data) and a
        reader gets the SegmentLayoutError."""
        if on_unreadable is None:
            on_unreadable = OnUnreadable.SET_ASIDE if access is Access.READ_WRITE else OnUnreadable.RAISE
        if on_unreadable is OnUnreadable.SET_ASIDE and access is not Access.READ_WRITE:
            raise BadInputError("on_unreadable", "only a writer sets unreadable queues aside")
        table = cls(root, entries_per_file, access, max_open_files)
        base = table.root / CONSUMEQUEUE_DIR
        if not base.is_dir():
            return table
        for topic_dir in sorted(base.iterdir()):
            if not (topic_dir.is_dir() and is_topic_name(topic_dir.name)):
                table.foreign.append(topic_dir)
                continue
            for queue_dir in sorted(topic_dir.iterdir()):
                name = queue_dir.name
                if not (queue_dir.is_dir() and name.isdigit() and str(int(name)) == name):
                    table.foreign.append(queue_dir)  # RocketMQ skips non-numeric queue dirs
                    continue
                try:
                    table._load(topic_dir.name, int(name))
                except SegmentLayoutError as exc:
                    if on_unreadable is OnUnreadable.RAISE:
                        raise
                    if on_unreadable is OnUnreadable.SET_ASIDE:
                        table._set_aside(topic_dir.name, int(name), exc)
                    table.unreadable.append((topic_dir.name, int(name)))
        return table

    def _set_aside(self, topic: str, queue_id: int, problem: SegmentLayoutError) -> None:
        """Quarantine an unreadable queue and start it empty, re-dispatched from the log's start
        (its cut_floor_pos 0): a queue is derived data."""
        moved = move_aside(consume_queue_dir(self.root, topic, queue_id), self.root / QUARANTINE_DIR,
                           f"consumequeue-{topic}-{queue_id}.{int(time.time() * 1000)}")
        log.warning("consume queue %s/%d is unreadable (%s): moved to %s, rebuilt from the commitlog",
                    topic, queue_id, problem, moved)
        self._load(topic, queue_id).cut_floor_pos = 0

    def _load(self, topic: str, queue_id: int) -> ConsumeQueue:
        queue = ConsumeQueue.load(self.root, topic, queue_id, self.entries_per_file, self.access,
                                  self.budget)
        self._queues[(topic, queue_id)] = queue
        return queue

    def get(self, topic: str, queue_id: int) -> ConsumeQueue | None:
        """The queue, loading it if its directory appeared since; None if it does not exist."""
        queue = self._queues.get((topic, queue_id))
        if queue is None:
            validate_topic(topic)
            check_queue_id(queue_id)
            if consume_queue_dir(self.root, topic, queue_id).is_dir():
                queue = self._load(topic, queue_id)
        return queue

    def get_or_create(self, topic: str, queue_id: int) -> ConsumeQueue:
        """The queue, created empty (its first file comes with the first put) if missing."""
        return self.get(topic, queue_id) or self._load(topic, queue_id)

    def drop(self, topic: str, queue_id: int) -> None:
        """Forget a queue and delete its files (recovery then rebuilds it from the commitlog)."""
        validate_topic(topic)
        check_queue_id(queue_id)
        queue = self._queues.pop((topic, queue_id), None)
        if queue is not None:
            queue.close()
        remove_tree(consume_queue_dir(self.root, topic, queue_id))

    def __iter__(self) -> Iterator[ConsumeQueue]:
        return iter(list(self._queues.values()))

    def __len__(self) -> int:
        return len(self._queues)

    def max_commit_end(self) -> int:
        """Where dispatch has got to: the largest end of a last entry over all queues."""
        return max((q.max_commit_end for q in self._queues.values()), default=0)

    def truncate_all_from(self, cut_pos: int) -> int:
        """Recovery's cut, after re-dispatch: drop the unconfirmed entries re-dispatch did not
        reach (ConsumeQueue.drop_unconfirmed), then the entries of every queue that point at or
        past `cut_pos`, then the bytes left behind a cut queue's end (clear_cut_tail); returns
        how many entries were dropped."""
        dropped = sum(q.drop_unconfirmed() for q in self._queues.values())
        truncated = sum(q.truncate_from_commit_pos(cut_pos) for q in self._queues.values()
                        if q.max_commit_end > cut_pos)
        for queue in self._queues.values():
            queue.clear_cut_tail()
        return dropped + truncated

    def flush_all(self) -> None:
        for queue in self._queues.values():
            queue.flush()

    def recover_all(self, durable_pos: int | None = None) -> int:
        """Recover every queue (ConsumeQueue.recover; `durable_pos`: the consume queues' durable
        commit position, None to trust every valid entry); returns max_commit_end() afterwards."""
        for queue in self._queues.values():
            queue.recover(durable_pos)
        return self.max_commit_end()

    def cut_floor_pos(self) -> int | None:
        """After recover_all: the lowest commit position re-dispatch must start from to put back
        the entries recovery cut (ConsumeQueue.cut_floor_pos); None when it cut none."""
        return min((queue.cut_floor_pos for queue in self._queues.values()
                    if queue.cut_floor_pos is not None), default=None)

    def close(self) -> None:
        for queue in self._queues.values():
            queue.close()
        self._queues.clear()

