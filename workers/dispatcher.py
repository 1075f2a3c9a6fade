"""The dispatcher process: tails the commitlog and writes the consume queues (RocketMQ reput).

It reads the commitlog through its own read-only mapping, up to the supervisor's published
flushed position under sync flush (a consumer must never see a message a crash can take back)
or the written position under async flush. Each step is one engine.dispatch.span (a small
backlog in plain Python, a larger one with the batch codec, the choice made there): it
writes the consume-queue entries (one ConsumeQueue.put_entries per queue, the rules of
engine.record_rules), publishes `dispatched_pos` after
each batch and wakes long-polling consumers. A small backlog right after a step waits up to
COALESCE_S for more to join it (coalesce_wait_s); while no consumer keeps up, a backlog short of
a step window waits until PACE_INTERVAL_S after the last step began (pace_wait_s), and the
dispatcher sleeps that hold out (HoldWake) instead of waking for every flush it holds.
Every `cq_flush_interval_ms` it msyncs the queues and publishes `cq_durable_pos`, from which the
supervisor's checkpoint is written.

Index keys are handed on (DESIGN §4): for each run the dispatcher computes every key's index hash
and shard once (engine.dispatch.record.shard_key_columns) and publishes each shard's columns as one
block of the key ring (ipc/key_ring.py) tagged with the commitlog range of the run, then posts
the index builders (the supervisor posts only the dispatcher after a flush): at most every
BUILDER_POST_INTERVAL_S, busy or idle (`PostPacer`: an idle dispatcher sleeps only until an
owed post is due), so a builder wakes for several flushes' blocks at a time instead of once
per flush; one message at a time that was ~850 wake-ups a second per builder. It never waits
for a builder: a full ring is overwritten, and a builder scans the commitlog for whatever the
ring does not give it (workers/index_builder.py). Without a ring (the region could not be
made) the builders scan everything, as before.

Restart: ConsumeQueueTable.load + recover_all keeps every valid entry (a killed dispatcher's
page-cache writes survive it), then dispatch resumes from the published cq_durable_pos, or from
below it where recover_all cut a queue at an invalid entry with bytes behind it
(engine.queues.cuts; the bytes are cleared once dispatch is past the old durable position);
re-putting an entry that is already there writes the same bytes again (and the next flush syncs
them: ConsumeQueue._reconcile), so the restart leaves no gap and no duplicate. The published
dispatched_pos is left where the previous dispatcher put it (its entries are still there), so
consumers never see the queues shrink during a restart.
"""

from __future__ import annotations

import enum
import logging
import time
from dataclasses import dataclass

import numpy as np

from engine.config import FlushPolicy
from engine.dispatch.span import SpanDispatch, SpanStep, dispatch_span
from engine.errors import StoreError
from engine.files.mapped_file import Access
from engine.files.open_files import queue_file_budget
from engine.log.commitlog import CommitLog
from engine.queues.cuts import recovered_cuts, redispatch_floor
from engine.queues.table import ConsumeQueueTable
from engine.retention.expiry import expire_queues
from engine.topics.table import TopicFileError, TopicTableFile
from ipc.control_block import DISPATCHER_GROUP, DISPATCHER_GROUP_OFFSET, Role, process_slot_index
from ipc.key_ring import KeyRing, RingWriter
from ipc.wakeup import WaiterTable, Wakeup
from workers.child import ChildProcess, child_main, child_wakeup_name, read_own_group
from workers.child_retention import LineFollower
from workers.step_window import MAX_STEP_BYTES

log = logging.getLogger(__name__)
COALESCE_S = 0.002  # a small backlog within this long of the last step waits for the rest of it
COALESCE_BELOW_BYTES = 32 << 10  # a backlog at least this big is not held for COALESCE_S
# While no consumer keeps up (KEEP_UP_S), the dispatcher steps at most once per PACE_INTERVAL_S:
# a step's fixed cost is shared by every flush of the interval, however cheap the step
# (pace_wait_s). A consumer that keeps up gets every flush at once instead.
# See docs/DECISIONS.md#dispatcher-pacing.
PACE_INTERVAL_S = 0.01
# A consumer that long-polled this recently keeps up, though it may be busy with the last pull
# when a step lands: pacing it would add up to PACE_INTERVAL_S to its end-to-end latency. One
# that has not waited for this long is behind, and bigger steps serve it better.
KEEP_UP_S = 0.1
# index lag may be tens of ms: fewer wake-ups, bigger batches (docs/DECISIONS.md#builder-post-interval)
BUILDER_POST_INTERVAL_S = 0.005
_EMPTY = np.zeros(0, dtype=np.int64)
_NO_KEYS = (_EMPTY, _EMPTY, _EMPTY)


def coalesce_wait_s(backlog_bytes: int, since_last_step_s: float) -> float:
    """How long to wait before dispatching `backlog_bytes` (0: now). A small backlog that comes
    within COALESCE_S of the last step waits for the rest of it (and for more flushes to join
    it), since a step's fixed cost does not shrink with its records; a large one goes at once
    (once it is looked at: see Dispatcher._plan_hold). See docs/DECISIONS.md#dispatcher-pacing."""
    if backlog_bytes >= COALESCE_BELOW_BYTES:
        return 0.0
    return max(COALESCE_S - since_last_step_s, 0.0)


def pace_wait_s(backlog_bytes: int, since_last_step_s: float) -> float:
    """How long a dispatcher no consumer keeps up with holds `backlog_bytes` (0: not at all),
    `since_last_step_s` after the start of the last step: until PACE_INTERVAL_S after it, so
    one step's fixed cost serves every flush of the interval (see
    docs/DECISIONS.md#dispatcher-pacing). A whole step window is not held."""
    if backlog_bytes >= MAX_STEP_BYTES:
        return 0.0
    return max(PACE_INTERVAL_S - since_last_step_s, 0.0)


class HoldWake(enum.Enum):
    """What ends a hold early. A consumer that keeps up is owed a big backlog at once, so each
    flush's post looks again (ON_POST); with none, the dispatcher sleeps the hold out (AT_END):
    under full batched load (~600 flushes a second) the wake-ups that found it still held cost it as much as
    the steps it saved."""
    ON_POST = "on post"
    AT_END = "at end"


@dataclass(frozen=True, slots=True)
class Hold:
    """A backlog held back: until `until_s` (time.monotonic()), and what may end it sooner."""
    until_s: float
    wake: HoldWake


class PostPacer:
    """When to post the index builders: progress makes a post owed; an owed post is due once
    `interval_s` has passed since the last one (busy or idle), so they wake at most that often."""

    def __init__(self, interval_s: float):
        self.interval_s = interval_s
        self.posted_at = float("-inf")
        self.owed = False

    def progress(self) -> None:
        self.owed = True

    def due(self, now: float) -> bool:
        return self.owed and now - self.posted_at >= self.interval_s

    def posted(self, now: float) -> None:
        self.posted_at = now
        self.owed = False

    def wait_s(self, now: float, idle_wait_s: float) -> float:
        """How long an idle dispatcher may sleep: idle_wait_s, or until an owed post is due."""
        if not self.owed:
            return idle_wait_s
        return min(idle_wait_s, max(self.posted_at + self.interval_s - now, 0.0))


class Dispatcher(ChildProcess):
    role = Role.DISPATCHER
    _cut_tails_until: int | None = None  # after a restart that cut queues: clear them once past it

    def boot(self) -> None:
        self.commitlog = CommitLog.open(self.store_dir, self.config.commitlog_file_size,
                                        Access.READ_ONLY)
        self.queues = ConsumeQueueTable.load(self.store_dir, self.config.consume_queue_entries,
                                             Access.READ_WRITE,
                                             queue_file_budget(self.config.max_open_queue_files),
                                             delay_levels_ms=self.config.delay_levels_ms)
        self.queues.recover_all()
        self.topic_file = TopicTableFile(self.store_dir)
        self._topics_seen = None
        self._follow_topics()
        published, durable, _ = read_own_group(self.ctl, DISPATCHER_GROUP_OFFSET, DISPATCHER_GROUP)
        # Re-dispatch from the durable position; entries up to `published` survived the
        # previous dispatcher (page cache), so consumers keep their view: it never goes back.
        self.pos = self.durable_pos = durable
        floor = redispatch_floor(self.queues, self.commitlog, recovered_cuts(self.queues))
        if floor is not None and floor < durable:  # what recover_all cut comes back from the log
            self.pos = floor
        self._cut_tails_until = durable if floor is not None else None
        self.published_pos = published
        self.ctl.reset_dispatcher(published, durable)
        self.waiters = WaiterTable.attach(self.store_dir)
        self.sync_flush = self.ctl.flush_policy is FlushPolicy.SYNC
        self.shard_count = self.ctl.shard_count
        self.ring, self.ring_writers = self._open_ring()
        self.builder_wakeups = self._open_builder_wakeups()
        self.builder_posts = PostPacer(BUILDER_POST_INTERVAL_S)
        self._stepped_at = float("-inf")  # when the last step that was not held began
        self._consumer_waited_at = float("-inf")  # when a consumer was last seen long-polling
        self._held: Hold | None = None  # the backlog's hold (coalesced or paced), if any
        self.blocks_dropped = 0  # blocks too big for the ring (their builders scan instead)
        self.retention = LineFollower(self.ctl, Role.DISPATCHER, 0, self.commitlog,
                                      lambda min_pos: expire_queues(self.queues, min_pos))
        log.info("dispatcher resumes at commit_pos %d (%d consume queues, key ring %s)", self.pos,
                 len(self.queues), "on" if self.ring is not None else "off")

    def _open_ring(self) -> tuple[KeyRing | None, list[RingWriter]]:
        try:
            ring = KeyRing.open_writer(self.store_dir, self.shard_count, self.ctl.generation)
        except (StoreError, OSError) as exc:
            log.warning("no key ring (the index builders scan the commitlog themselves): %s", exc)
            return None, []
        return ring, [ring.writer(shard) for shard in range(self.shard_count)]

    def _open_builder_wakeups(self) -> list[Wakeup]:
        """The index builders' semaphores (the supervisor made them), to post after progress."""
        wakeups = []
        for shard in range(self.shard_count):
            name = child_wakeup_name(self.store_dir, process_slot_index(Role.INDEX_BUILDER, shard))
            try:
                wakeups.append(Wakeup.open(name))
            except StoreError as exc:
                log.warning("cannot post index builder %d (it polls every heartbeat instead): %s",
                            shard, exc)
        return wakeups

    def _limit(self) -> int:
        return self.ctl.flushed_pos if self.sync_flush else self.ctl.written_pos

    def step(self) -> bool:
        limit = self._limit()
        # after the limit is read: a record past a delete's tombstone is appended after the
        # supervisor wrote it, so a limit that covers one comes with the tombstone in view
        self._follow_topics()
        now = time.monotonic()
        if limit <= self.pos:  # an owed builder post is made by the idle wait (_idle_wait_s)
            self._held = self._plan_quiet(now)
            return False
        self._held = None if self._stopping else self._plan_hold(limit - self.pos, now)
        if self._held is not None:
            return False
        self._stepped_at = now
        end_pos, count = self._dispatch_span(self.pos, limit)
        if end_pos > self.pos:
            self.pos = end_pos
            if self._cut_tails_until is not None and self.pos >= self._cut_tails_until:
                self._clear_cut_tails()
            if self.pos > self.published_pos:
                self.ctl.publish_dispatched(self.pos, msg_count=count)
                self.published_pos = self.pos
                if self.waiters.notify_waiters() > 0:
                    self._consumer_waited_at = now
            self.builder_posts.progress()  # posted after dispatched_pos: see index_builder's gap rule
            self._post_builders_if_due()
        return True

    def _follow_topics(self) -> None:
        """Adopt the tombstones of topics.json when it changed (one stat): a deleted topic's
        queues go and its older records are skipped from here on."""
        try:
            table = self.topic_file.current()
        except TopicFileError as exc:  # the supervisor writes it whole: someone edited it
            if self._topics_seen is None:
                raise
            log.warning("%s; keeping the topic table read before", exc)
            return
        if table is self._topics_seen:
            return
        self._topics_seen = table
        for topic, queue_id in self.queues.bury(table.tombstones):
            log.info("removed consume queue %s/%d of a deleted topic", topic, queue_id)

    def _plan_hold(self, backlog_bytes: int, now: float) -> Hold | None:
        """Whether to hold the backlog before a step, until when, and what ends the hold
        sooner: coalescing always, pacing unless consumers keep up (`_consumers_keep_up`): they
        are owed each flush as soon as it lands. Consumers that are behind, or none, get bigger
        steps.

        For a consumer that keeps up each flush's post looks again (ON_POST: a backlog grown
        past COALESCE_BELOW_BYTES goes at once). Without one the hold is slept out (AT_END), so
        a consumer that starts waiting during it waits until it ends, within PACE_INTERVAL_S,
        and so does a backlog that grows meanwhile. The waiter table is the store's, not a
        queue's, so one consumer long-polling an idle topic turns pacing off for all."""
        since_s = now - self._stepped_at
        wait_s = coalesce_wait_s(backlog_bytes, since_s)
        if self._consumers_keep_up(now):
            wake = HoldWake.ON_POST
        else:
            wait_s, wake = max(wait_s, pace_wait_s(backlog_bytes, since_s)), HoldWake.AT_END
        return Hold(now + wait_s, wake) if wait_s > 0 else None

    def _plan_quiet(self, now: float) -> Hold | None:
        """With nothing to dispatch, whether to sleep out the pace interval of the last step
        (AT_END) instead of waking for the flushes of it: while no consumer keeps up they could
        not be dispatched before it ends anyway. None: the idle wait, woken by the next flush."""
        if self._stopping or self._consumers_keep_up(now):
            return None
        wait_s = pace_wait_s(0, now - self._stepped_at)
        return Hold(now + wait_s, HoldWake.AT_END) if wait_s > 0 else None

    def _consumers_keep_up(self, now: float) -> bool:
        """Whether a consumer long-polls now (noted as the last time one did) or did within
        KEEP_UP_S: one that keeps up is often busy with its last pull when the next flush
        lands, and is owed that flush too."""
        if self.waiters.anyone_waiting():
            self._consumer_waited_at = now
        return now - self._consumer_waited_at <= KEEP_UP_S

    def _sleep_until_woken(self, now: float) -> None:
        """The child's idle wait, except that an AT_END hold is slept out: the posts that
        come meanwhile are taken, since the step after it looks at the published position
        anyway. Timed from now, not from `now`: a queue flush may have run since."""
        if self._held is None or self._held.wake is HoldWake.ON_POST:
            super()._sleep_until_woken(now)
            return
        time.sleep(self._idle_wait_s(time.monotonic()))
        self.wakeup.drain()

    def _post_builders_if_due(self) -> None:
        now = time.monotonic()
        if self.builder_posts.due(now):
            self._post_builders(now)

    def _post_builders(self, now: float) -> None:
        for wakeup in self.builder_wakeups:
            wakeup.post()
        self.builder_posts.posted(now)

    def _idle_wait_s(self, now: float) -> float:
        """The child's idle wait, shortened to when an owed builder post or a held backlog is
        due. An owed post that is due is made here: while a full disk is waited out no step
        runs to make it, and a wait of 0 would spin."""
        self._post_builders_if_due()
        wait_s = self.builder_posts.wait_s(now, super()._idle_wait_s(now))
        if self._held is not None and self._disk_full_since is None:
            wait_s = min(wait_s, max(self._held.until_s - now, 0.0))
        return wait_s

    def _dispatch_span(self, start_pos: int, limit: int) -> SpanStep:
        """One step of engine.dispatch.span from start_pos: at most MAX_STEP_BYTES, so the step
        ends in time for the next heartbeat; keys go to the shards' ring writers."""
        where = SpanDispatch(self.commitlog, self.queues, self.shard_count,
                             self._hand_keys if self.ring_writers else None, MAX_STEP_BYTES)
        return dispatch_span(where, start_pos, limit)

    def _hand_keys(self, start_pos: int, end_pos: int, per_shard) -> None:
        """Publish each shard's keys of the records in [start_pos, end_pos) (None: no records)."""
        for shard, writer in enumerate(self.ring_writers):
            keys = per_shard[shard] if per_shard is not None else _NO_KEYS
            if not writer.publish(start_pos, end_pos, *keys):
                self.blocks_dropped += 1

    def flush_step(self) -> None:
        """The periodic flush; before it, the consume-queue files below the retention line go."""
        self.retention.follow()
        self.flush()

    def _clear_cut_tails(self) -> None:
        """Re-dispatch has put back what the restart's recovery cut: the stale bytes past each
        cut queue's end go (a reader must not take them for entries)."""
        for queue in self.queues:
            queue.clear_cut_tail()
        self._cut_tails_until = None

    def flush(self) -> None:
        if self.durable_pos >= self.pos:
            return
        pos = self.pos
        self.queues.flush_all()
        self.durable_pos = pos
        self.ctl.publish_cq_durable(pos)

    def close(self) -> None:
        if self.blocks_dropped:
            log.info("dispatcher: %d key blocks were too big for the ring", self.blocks_dropped)
        if self.builder_posts.owed:  # the builders' last blocks, without their poll interval
            self._post_builders(time.monotonic())
        for wakeup in self.builder_wakeups:
            wakeup.close()
        if self.ring is not None:
            self.ring.remove()
            self.ring.close()
        self.waiters.close()
        self.queues.close()
        self.commitlog.close()


def main(argv: list[str] | None = None) -> None:
    child_main(Dispatcher, argv)


if __name__ == "__main__":
    main()
