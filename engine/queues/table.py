"""The consume-queue table: every consume queue of a store, by (topic, queue id).

Queues live under <root>/consumequeue/<topic>/<queueId>/; each is an
`engine.queues.consume_queue.ConsumeQueue`. The table loads them all, loads a queue whose directory
appeared since (a reader sees the dispatcher's new queues), and runs recovery's and flush's
per-queue steps over all of them. Its queues share one OpenFileBudget: however many queues
there are, at most `max_open_files` of their files stay mapped (engine.files.open_files).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator, Mapping
from enum import Enum
from pathlib import Path

from engine.delivery.levels import DEFAULT_DELAY_LEVELS_MS
from engine.errors import BadInputError, SegmentLayoutError
from engine.files.filesystem import move_aside, remove_file, remove_tree, write_new_file
from engine.files.mapped_file import Access
from engine.files.naming import (
    CONSUMEQUEUE_DIR,
    QUARANTINE_DIR,
    REBUILD_SUFFIX,
    consume_queue_dir,
    is_topic_name,
    validate_topic,
)
from engine.files.open_files import OpenFileBudget, queue_file_budget
from engine.queues.consume_queue import ConsumeQueue, check_queue_id

log = logging.getLogger(__name__)


class OnUnreadable(Enum):
    """What loading the table does with a queue whose files break the layout rules, or that a
    recovery began to rebuild (its `<queueId>.rebuild` marker)."""

    RAISE = "raise"  # a reader: the SegmentLayoutError; a queue being rebuilt loads as it is
    SKIP = "skip"  # a read-only look before a writer opens: left out, named in `skipped`
    SET_ASIDE = "set_aside"  # recovery: marked, moved to quarantine/, started empty, rebuilt


class ConsumeQueueTable:
    """Every consume queue of a store, by (topic, queue_id)."""

    def __init__(self, root: Path, entries_per_file: int, access: Access,
                 max_open_files: int | None = None, *,
                 delay_levels_ms: tuple[int, ...] = DEFAULT_DELAY_LEVELS_MS):
        """`max_open_files`: the bound on mapped files (default: queue_file_budget());
        `delay_levels_ms`: the store's delay levels, which SCHEDULE_TOPIC_XXXX entries' tag
        field is computed with (engine.record_rules.SCHEDULED_TAG_FIELD)."""
        self.root = Path(root)
        self.delay_levels_ms = delay_levels_ms
        self.entries_per_file = entries_per_file
        self.access = access
        self.budget = OpenFileBudget(queue_file_budget() if max_open_files is None else max_open_files)
        self.foreign: list[Path] = []  # what load skipped: not a topic or not a queue id
        self.skipped: list[tuple[str, int]] = []  # unreadable or being rebuilt, left out (SKIP)
        self.set_aside: list[tuple[str, int]] = []  # started empty, to be rebuilt (SET_ASIDE)
        self._queues: dict[tuple[str, int], ConsumeQueue] = {}
        # deleted topics (engine.topics.table): their records below the position enter no queue
        self.tombstones: dict[str, int] = {}

    @classmethod
    def load(cls, root: Path, entries_per_file: int, access: Access, max_open_files: int | None = None,
             on_unreadable: OnUnreadable = OnUnreadable.RAISE, *,
             delay_levels_ms: tuple[int, ...] = DEFAULT_DELAY_LEVELS_MS) -> ConsumeQueueTable:
        """Load every queue under <root>/consumequeue; foreign entries are listed in `foreign`;
        a queue whose files break the layout rules, or that a recovery began to rebuild, is
        handled by `on_unreadable`."""
        if on_unreadable is OnUnreadable.SET_ASIDE and access is not Access.READ_WRITE:
            raise BadInputError("on_unreadable", "only a writer sets unreadable queues aside")
        table = cls(root, entries_per_file, access, max_open_files, delay_levels_ms=delay_levels_ms)
        base = table.root / CONSUMEQUEUE_DIR
        if not base.is_dir():
            return table
        for topic_dir in sorted(base.iterdir()):
            if not (topic_dir.is_dir() and is_topic_name(topic_dir.name)):
                table.foreign.append(topic_dir)
                continue
            table._load_topic(topic_dir, on_unreadable)
        return table

    def _load_topic(self, topic_dir: Path, on_unreadable: OnUnreadable) -> None:
        topic, rebuilding = topic_dir.name, _rebuild_markers(topic_dir)
        for queue_dir in sorted(topic_dir.iterdir()):
            name = queue_dir.name
            if marked_queue_id(queue_dir) is not None:
                continue
            if not (queue_dir.is_dir() and name.isdigit() and str(int(name)) == name):
                self.foreign.append(queue_dir)  # RocketMQ skips non-numeric queue dirs
                continue
            queue_id = int(name)
            if queue_id in rebuilding and on_unreadable is not OnUnreadable.RAISE:
                continue  # below, with the markers whose directory is gone
            try:
                self._load(topic, queue_id)
            except SegmentLayoutError as exc:
                if on_unreadable is OnUnreadable.RAISE:
                    raise
                rebuilding.add(queue_id)
                log.warning("consume queue %s/%d is unreadable (%s)", topic, queue_id, exc)
        if on_unreadable is OnUnreadable.RAISE:
            return
        for queue_id in sorted(rebuilding):
            if on_unreadable is OnUnreadable.SET_ASIDE:
                self._set_aside(topic, queue_id)
            else:
                self.skipped.append((topic, queue_id))

    def _set_aside(self, topic: str, queue_id: int) -> None:
        """Mark the queue as being rebuilt, move what is left of it to quarantine/ and start it
        empty; recovery re-dispatches it from the log's start and `finish_rebuilds` drops the
        mark. A crash before that finds the mark and begins again (the queue is derived data)."""
        directory = consume_queue_dir(self.root, topic, queue_id)
        marker = _marker_of(directory)
        if marked_queue_id(marker) is None:
            write_new_file(marker, (REBUILD_MARKER_BYTES,))
        if directory.exists():
            moved = move_aside(directory, self.root / QUARANTINE_DIR,
                               f"consumequeue-{topic}-{queue_id}.{int(time.time() * 1000)}")
            log.warning("consume queue %s/%d moved to %s; rebuilt from the commitlog", topic, queue_id,
                        moved)
        self._load(topic, queue_id)
        self.set_aside.append((topic, queue_id))

    def finish_rebuilds(self) -> None:
        """Once recovery's checkpoint is written every queue is whole again: the rebuild markers
        go (those a salvage or rebuild found too, which rebuild every queue)."""
        base = self.root / CONSUMEQUEUE_DIR
        for marker in base.glob("*/*" + REBUILD_SUFFIX) if base.is_dir() else ():
            if marked_queue_id(marker) is not None:
                remove_file(marker)
        self.set_aside.clear()

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

    def tombstone_of(self, topic: str) -> int:
        """The commit position below which `topic`'s records are deleted (0: none)."""
        return self.tombstones.get(topic, 0) if self.tombstones else 0

    def bury(self, tombstones: Mapping[str, int]) -> list[tuple[str, int]]:
        """Adopt the topic table's tombstones and drop every queue of a deleted topic that
        begins below its tombstone (a queue created again begins above it); returns those
        dropped. The writer of the queues calls it; a reader only adopts (`tombstones`)."""
        self.tombstones = dict(tombstones)
        base = self.root / CONSUMEQUEUE_DIR
        dropped = []
        for topic, floor in self.tombstones.items():
            topic_dir = base / topic
            queue_ids = {qid for (name, qid) in self._queues if name == topic}
            if topic_dir.is_dir():
                queue_ids |= {int(d.name) for d in topic_dir.iterdir() if d.name.isdigit()}
            for queue_id in sorted(queue_ids):
                queue = self.get(topic, queue_id)
                first = queue.entry(queue.min_offset) if queue is not None else None
                if first is None or first.commit_pos < floor:
                    self.drop(topic, queue_id)
                    dropped.append((topic, queue_id))
            if topic_dir.is_dir() and not any(topic_dir.iterdir()):
                topic_dir.rmdir()
        return dropped

    def adopt_tombstones(self, tombstones: Mapping[str, int]) -> None:
        """A reader's `bury`: adopt the topic table's tombstones and forget (close; the files are
        the writer's) its queues of every topic whose tombstone moved, so the next `get` loads
        what is on disk now: a deleted topic's old queue cached here must not be read again."""
        moved = {topic for topic, pos in tombstones.items() if pos != self.tombstones.get(topic)}
        self.tombstones = dict(tombstones)
        for key in [key for key in self._queues if key[0] in moved]:
            self._queues.pop(key).close()

    def get_live(self, topic: str, queue_id: int) -> ConsumeQueue | None:
        """`get` for a reader, None (and forgotten) for a queue that begins below its topic's
        tombstone: the writer has not removed a deleted topic's old queue yet."""
        queue = self.get(topic, queue_id)
        floor = self.tombstone_of(topic)
        if queue is None or not floor:
            return queue
        queue.refresh()
        first = queue.entry(queue.min_offset)
        if first is not None and first.commit_pos >= floor:
            return queue
        self._queues.pop((topic, queue_id)).close()
        return None

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

    def close(self) -> None:
        for queue in self._queues.values():
            queue.close()
        self._queues.clear()


REBUILD_MARKER_BYTES = b"mqstore: this consume queue is being rebuilt from the commitlog\n"


def _marker_of(queue_dir: Path) -> Path:
    return queue_dir.with_name(queue_dir.name + REBUILD_SUFFIX)


def marked_queue_id(path: Path) -> int | None:
    """The queue id a `<queueId>.rebuild` marker names; None for anything else (a user's file
    of that name without the marker's bytes is foreign, never taken for a marker)."""
    name = path.name[:-len(REBUILD_SUFFIX)] if path.name.endswith(REBUILD_SUFFIX) else ""
    if not (name.isdigit() and str(int(name)) == name and path.is_file()
            and path.stat().st_size == len(REBUILD_MARKER_BYTES)):
        return None
    return int(name) if path.read_bytes() == REBUILD_MARKER_BYTES else None


def _rebuild_markers(topic_dir: Path) -> set[int]:
    """The queue ids of the rebuild markers in a topic's directory."""
    ids = {marked_queue_id(path) for path in topic_dir.glob("*" + REBUILD_SUFFIX)}
    ids.discard(None)
    return ids
