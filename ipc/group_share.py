"""One consumer's share of its group's queues on one topic: the rebalance.

Every member computes the same allocation on its own (RocketMQ's average allocation,
ipc.queue_allocation) over the group's live CLUSTERING members on the topic (ipc.group_roster,
liveness from flocks) and the topic's queues, then hands over by the queue locks
(ipc.queue_locks): it commits and lets go of the queues it no longer gets, and takes those it
gets as their old owners let go (or die). A rebalance runs at most every REBALANCE_INTERVAL_S,
from the member's own sweep over its queues, so members joining or leaving, a death and a
change of the queue count are all seen within that interval plus one sweep. A BROADCASTING
member is on the roster (seen by `mqstore groups`, its subscription checked) and reads every
queue.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Collection

from ipc.group_roster import MessageModel, RosterSeat, join_roster, reap_dead_members
from ipc.queue_allocation import allocate_averagely
from ipc.queue_locks import QueueLocks

REBALANCE_INTERVAL_S = 0.1  # a dead member's queues move within this plus one sweep


class GroupShare:
    """The queues this member owns on one topic, rebalanced as the group changes."""

    def __init__(self, store_dir: str | os.PathLike, group: str, topic: str, member: str,
                 model: MessageModel, expression: str):
        self.model = model
        self.seat: RosterSeat = join_roster(store_dir, group, topic, member, model, expression)
        try:
            self.locks = QueueLocks(store_dir, group, topic) if model is MessageModel.CLUSTERING else None
        except BaseException:
            self.seat.leave()
            raise
        self.owned: list[int] = []
        self.wanted: list[int] = []  # what the allocation gives this member; owned once handed over
        self._rebalanced_s = -REBALANCE_INTERVAL_S

    @property
    def member(self) -> str:
        return self.seat.record.member

    def maybe_rebalance(self, queue_count: int, commit: Callable[[list[int]], None],
                        busy: Collection[int] = ()) -> list[int]:
        """The queues owned now, rebalanced when REBALANCE_INTERVAL_S passed since the last
        time; `commit(queue_ids)` writes what was handed out of queues about to be let go, and
        a queue in `busy` (a batch of it is being handed out) is kept until it is not."""
        self.seat.mark_swept()
        if time.monotonic() - self._rebalanced_s >= REBALANCE_INTERVAL_S:
            self.rebalance(queue_count, commit, busy)
        return self.owned

    def rebalance(self, queue_count: int, commit: Callable[[list[int]], None],
                  busy: Collection[int] = ()) -> list[int]:
        """Let go of the queues no longer this member's and not `busy` (after `commit`), take
        those that are and whose old owner let go; the queues owned now."""
        self._rebalanced_s = time.monotonic()
        if self.locks is None:  # BROADCASTING: every queue, no one to share with
            self.wanted = owned = list(range(queue_count))
        else:
            self.wanted = self._allocation(queue_count)
            owned = self._hand_over(self.wanted, commit, busy)
        if owned != list(self.seat.record.queue_ids):
            self.seat.publish_queues(owned)
        self.owned = owned
        return owned

    def _hand_over(self, wanted: list[int], commit: Callable[[list[int]], None],
                   busy: Collection[int]) -> list[int]:
        """Commit and let go of the queues held but neither wanted nor busy, take the wanted
        ones that are free; the queues held now."""
        unwanted = [queue_id for queue_id in self.locks.held if queue_id not in wanted]
        let_go = [queue_id for queue_id in unwanted if queue_id not in busy]
        if len(let_go) < len(unwanted):
            # a batch read before the hand-over is still being handed out: its queue goes once
            # the batch is marked, else the next owner would read it again from the old commit
            self._rebalanced_s = -REBALANCE_INTERVAL_S  # so look again at the next sweep
        if let_go:
            commit(let_go)
            for queue_id in let_go:
                self.locks.release(queue_id)
        for queue_id in wanted:
            self.locks.try_take(queue_id)
        return self.locks.held

    def _allocation(self, queue_count: int) -> list[int]:
        live = reap_dead_members(self.seat.directory)
        members = {record.member for record in live if record.model == MessageModel.CLUSTERING.value}
        members.add(self.member)
        return allocate_averagely(self.member, sorted(members), range(queue_count))

    def leave(self, commit: Callable[[list[int]], None]) -> None:
        """Commit what was handed out, let every queue go, then leave the roster."""
        if self.locks is not None:
            if self.locks.held:
                commit(self.locks.held)
            self.locks.close()
        self.seat.leave()
