"""The dispatcher's pacing, on given times (binary fractions, so the arithmetic is exact): it
posts the index builders at most once per interval, busy or idle, and never leaves progress
unposted (PostPacer); it holds a small backlog for COALESCE_S after a step; and while no consumer
keeps up it holds any backlog short of a step window until PACE_INTERVAL_S after the last step
began (pace_wait_s) and sleeps that hold out (HoldWake); `step` and the idle wait themselves
are driven through below, over a real commitlog, control block, waiter table and semaphore."""

from __future__ import annotations

import os

import pytest

from ipc.control_block import ControlBlock, FlushCode
from ipc.shm import issue_shm_token
from ipc.wakeup import ConsumerWaiter, WaiterTable, Wakeup
from tests.workers.test_dispatch_few import SHARDS, close_dispatcher, dispatcher_over, write_log
from workers.child import HEARTBEAT_INTERVAL_S
from workers.dispatcher import (
    COALESCE_BELOW_BYTES,
    COALESCE_S,
    KEEP_UP_S,
    PACE_INTERVAL_S,
    Dispatcher,
    Hold,
    HoldWake,
    PostPacer,
    coalesce_wait_s,
    pace_wait_s,
)
from workers.step_window import MAX_STEP_BYTES

INTERVAL_S = 2.0 ** -8  # ~3.9 ms
TICK_S = 2.0 ** -10  # ~1 ms: a dispatcher step per flush, one message at a time


def test_nothing_is_due_without_progress():
    pacer = PostPacer(INTERVAL_S)
    assert not pacer.due(100.0)
    assert pacer.wait_s(100.0, HEARTBEAT_INTERVAL_S) == HEARTBEAT_INTERVAL_S


def test_the_first_progress_is_posted_at_once():
    pacer = PostPacer(INTERVAL_S)
    pacer.progress()
    assert pacer.due(100.0)


def test_progress_within_the_interval_is_posted_when_it_ends_and_the_idle_wait_ends_then():
    pacer = PostPacer(INTERVAL_S)
    pacer.progress()
    pacer.posted(100.0)
    pacer.progress()  # the next step, one tick later
    assert not pacer.due(100.0 + TICK_S)
    assert pacer.wait_s(100.0 + TICK_S, HEARTBEAT_INTERVAL_S) == INTERVAL_S - TICK_S
    assert pacer.due(100.0 + INTERVAL_S)
    pacer.posted(100.0 + INTERVAL_S)
    assert not pacer.owed
    assert pacer.wait_s(100.0 + INTERVAL_S + TICK_S, HEARTBEAT_INTERVAL_S) == HEARTBEAT_INTERVAL_S


def test_an_overdue_post_does_not_sleep():
    pacer = PostPacer(INTERVAL_S)
    pacer.posted(100.0)
    pacer.progress()
    assert pacer.wait_s(100.5, HEARTBEAT_INTERVAL_S) == 0.0


def test_steady_progress_is_posted_once_per_interval_not_once_per_step():
    pacer = PostPacer(INTERVAL_S)
    posts = 0
    steps = 1024  # one second of a step per tick
    for step in range(steps):
        now = 100.0 + step * TICK_S
        pacer.progress()
        if pacer.due(now):
            pacer.posted(now)
            posts += 1
    assert posts == steps * TICK_S / INTERVAL_S  # 256, not 1024
    assert pacer.owed and pacer.due(100.0 + steps * TICK_S)  # the last steps are posted next


# ------------------------------------------------------------------ dispatch coalescing


def test_a_large_backlog_is_dispatched_at_once():
    assert coalesce_wait_s(COALESCE_BELOW_BYTES, 0.0) == 0.0
    assert coalesce_wait_s(16 << 20, 0.0) == 0.0


def test_a_small_backlog_right_after_a_step_waits_for_the_rest_of_the_coalesce_time():
    assert coalesce_wait_s(900, 0.0) == COALESCE_S
    assert coalesce_wait_s(900, COALESCE_S / 4) == COALESCE_S * 3 / 4


def test_a_small_backlog_long_after_the_last_step_is_dispatched_at_once():
    assert coalesce_wait_s(900, COALESCE_S) == 0.0
    assert coalesce_wait_s(1, 60.0) == 0.0


# ------------------------------------------------------------------ pacing a busy dispatcher

STEP_S = 2.0 ** -10  # ~1 ms, a step of a few hundred records
LARGE_BACKLOG_BYTES = 64 << 10  # one flush at bar 1: not held by coalescing


def test_after_a_step_the_next_waits_until_the_pace_interval_after_its_start():
    assert coalesce_wait_s(LARGE_BACKLOG_BYTES, 0.0) == 0.0  # without pacing it would go at once
    assert pace_wait_s(LARGE_BACKLOG_BYTES, STEP_S) == pytest.approx(PACE_INTERVAL_S - STEP_S)
    assert pace_wait_s(LARGE_BACKLOG_BYTES, PACE_INTERVAL_S) == 0.0


def test_a_cheap_step_is_paced_as_long_as_a_dear_one():
    """One message per flush makes steps of a few records: duty-based pacing let them come
    every ~2 ms, one step's fixed cost for every two or three messages."""
    cheap_step_s = 2.0 ** -14  # ~61 us
    assert pace_wait_s(900, cheap_step_s) == pytest.approx(PACE_INTERVAL_S - cheap_step_s)


def test_pacing_never_holds_a_whole_window():
    assert pace_wait_s(MAX_STEP_BYTES, 0.0) == 0.0
    assert pace_wait_s(LARGE_BACKLOG_BYTES, 60.0) == 0.0


@pytest.fixture
def paced_dispatcher(tmp_path):
    """A Dispatcher with only the state _plan_hold reads, a step of STEP_S just ended, and a real
    waiter table."""
    issue_shm_token(tmp_path)
    table = WaiterTable.create(tmp_path, entry_count=2)
    dispatcher = Dispatcher.__new__(Dispatcher)
    dispatcher.waiters = table
    dispatcher._stepped_at = 100.0
    dispatcher._consumer_waited_at = float("-inf")
    yield dispatcher
    table.close()
    table.unlink()


def test_with_no_consumer_waiting_a_busy_dispatcher_is_paced(paced_dispatcher):
    hold = paced_dispatcher._plan_hold(LARGE_BACKLOG_BYTES, 100.0 + STEP_S)
    assert hold.until_s == pytest.approx(100.0 + PACE_INTERVAL_S)
    assert hold.wake is HoldWake.AT_END  # nobody is owed it sooner: slept out


def test_a_consumer_waiting_now_or_within_keep_up_s_gets_the_backlog_at_once(paced_dispatcher):
    paced_dispatcher.waiters.waiting[1] = 1  # as ConsumerWaiter.wait raises it before sleeping
    assert paced_dispatcher._plan_hold(LARGE_BACKLOG_BYTES, 100.0 + STEP_S) is None
    paced_dispatcher.waiters.waiting[1] = 0  # posted, and busy with its pull since
    assert paced_dispatcher._plan_hold(LARGE_BACKLOG_BYTES, 100.0 + STEP_S) is None
    # coalescing stays, and the next flush's post looks again
    assert paced_dispatcher._plan_hold(900, 100.0 + STEP_S) == Hold(100.0 + COALESCE_S, HoldWake.ON_POST)
    # busy for longer than KEEP_UP_S: behind, so paced again
    later = 100.0 + STEP_S + KEEP_UP_S + TICK_S
    paced_dispatcher._stepped_at = later - STEP_S
    assert paced_dispatcher._plan_hold(LARGE_BACKLOG_BYTES, later).wake is HoldWake.AT_END


class FakeClock:
    """time.monotonic for the dispatcher module: moves only when the test moves it, and by
    STEP_S during each dispatch (the step's duration, which pacing measures)."""

    def __init__(self, now: float):
        self.now = now
        self.slept: list[float] = []

    def monotonic(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds


@pytest.fixture
def stepping(tmp_path, monkeypatch):
    """A Dispatcher over a real log of ~150 KiB (requests of 3 records, each `ends` entry the
    log's end after one), a real control block and waiter table, with the state boot() sets,
    stepped on a FakeClock; each dispatch takes STEP_S."""
    ends = write_log(tmp_path, 120)
    dispatcher = dispatcher_over(tmp_path, "pace")
    issue_shm_token(tmp_path)
    dispatcher.ctl = ControlBlock.create(tmp_path, SHARDS, FlushCode.SYNC)
    dispatcher.waiters = WaiterTable.create(tmp_path, entry_count=2)
    dispatcher.sync_flush, dispatcher.published_pos, dispatcher._stopping = True, 0, False
    dispatcher.builder_wakeups, dispatcher.builder_posts = [], PostPacer(INTERVAL_S)
    dispatcher._stepped_at = float("-inf")
    dispatcher._consumer_waited_at, dispatcher._held = float("-inf"), None
    dispatcher._disk_full_since = None
    dispatcher.wakeup = Wakeup.create(f"/mqstore-test-{os.getpid()}-stepping")
    clock = FakeClock(100.0)
    monkeypatch.setattr("workers.dispatcher.time", clock)
    dispatch_span = dispatcher._dispatch_span

    def timed_dispatch_span(start_pos: int, limit: int):
        clock.now += STEP_S
        return dispatch_span(start_pos, limit)

    monkeypatch.setattr(dispatcher, "_dispatch_span", timed_dispatch_span)
    yield dispatcher, clock, [end for end in ends if end >= LARGE_BACKLOG_BYTES]
    dispatcher.wakeup.close()
    dispatcher.wakeup.unlink()
    dispatcher.waiters.close()
    dispatcher.waiters.unlink()
    dispatcher.ctl.close()
    dispatcher.ctl.unlink()
    close_dispatcher(dispatcher)


def flushed_to(dispatcher, pos: int) -> None:
    dispatcher.ctl.publish_written(pos)
    dispatcher.ctl.publish_flushed(pos)


def test_step_holds_the_next_backlog_until_the_pace_interval_and_then_dispatches_it(stepping):
    dispatcher, clock, ends = stepping
    flushed_to(dispatcher, ends[0])
    assert dispatcher.step() and dispatcher.pos == ends[0]  # nothing before it: at once
    flushed_to(dispatcher, ends[-1])  # ~90 KiB more: coalescing alone would not hold it
    assert not dispatcher.step()
    hold_end = 100.0 + PACE_INTERVAL_S
    assert dispatcher._held.until_s == pytest.approx(hold_end)
    assert dispatcher._idle_wait_s(clock.now) == pytest.approx(hold_end - clock.now)  # sleeps to it
    clock.now = hold_end
    assert dispatcher.step() and dispatcher.pos == ends[-1]
    assert dispatcher.ctl.dispatched_pos == ends[-1]


def test_step_does_not_hold_a_backlog_for_a_consumer_that_waited_within_keep_up_s(stepping, tmp_path):
    """A consumer busy with its last pull when the next flush lands still keeps up: pacing that
    flush was the end-to-end tail at half the maximum rate. One busy for KEEP_UP_S is behind."""
    dispatcher, clock, ends = stepping
    mid = len(ends) // 2
    with ConsumerWaiter.register(dispatcher.waiters, tmp_path / "run") as waiter:
        flushed_to(dispatcher, ends[0])
        dispatcher.waiters.waiting[waiter.index] = 1  # as ConsumerWaiter.wait sets it to sleep
        assert dispatcher.step()
        assert waiter.wakeup.pending_posts == 1 and not dispatcher.waiters.anyone_waiting()
        flushed_to(dispatcher, ends[mid])
        assert dispatcher.step() and dispatcher.pos == ends[mid]  # busy with its pull: not held
        flushed_to(dispatcher, ends[mid + 1])  # busy still: coalesced only, not paced
        assert not dispatcher.step() and dispatcher._held.wake is HoldWake.ON_POST
        clock.now += KEEP_UP_S  # busy all this time: behind (this step is past the interval)
        assert dispatcher.step() and dispatcher.pos == ends[mid + 1]
        flushed_to(dispatcher, ends[-1])
        assert not dispatcher.step() and dispatcher._held.wake is HoldWake.AT_END  # paced
        dispatcher.waiters.waiting[waiter.index] = 1
        assert dispatcher.step() and dispatcher.pos == ends[-1]  # it waits now: at once


def test_a_consumer_that_starts_waiting_during_a_step_keeps_up(stepping, tmp_path, monkeypatch):
    """Not waiting when the step was planned, posted by the step's notify: the next flush is
    owed to it at once, not paced."""
    dispatcher, _, ends = stepping
    mid = len(ends) // 2
    timed = dispatcher._dispatch_span
    with ConsumerWaiter.register(dispatcher.waiters, tmp_path / "run") as waiter:
        def waits_meanwhile(start_pos: int, limit: int):
            dispatcher.waiters.waiting[waiter.index] = 1  # its long-poll begins during the step
            return timed(start_pos, limit)

        monkeypatch.setattr(dispatcher, "_dispatch_span", waits_meanwhile)
        flushed_to(dispatcher, ends[0])
        assert dispatcher.step() and waiter.wakeup.pending_posts == 1  # the step posted it
        monkeypatch.setattr(dispatcher, "_dispatch_span", timed)
        flushed_to(dispatcher, ends[mid])
        assert dispatcher.step() and dispatcher.pos == ends[mid]  # not paced


def test_a_hold_nobody_waits_for_is_slept_out_and_takes_the_posts_made_meanwhile(stepping):
    dispatcher, clock, ends = stepping
    flushed_to(dispatcher, ends[0])
    assert dispatcher.step()
    flushed_to(dispatcher, ends[-1])
    assert not dispatcher.step() and dispatcher._held.wake is HoldWake.AT_END
    hold_end, began = dispatcher._held.until_s, clock.now
    for _ in range(3):  # the posts of the flushes the hold covers
        dispatcher.wakeup.post()
    dispatcher._sleep_until_woken(clock.now)
    assert clock.slept == [pytest.approx(hold_end - began)]  # one sleep, to the hold's end
    assert dispatcher.wakeup.pending_posts == 0  # they wake it no more
    assert dispatcher.step() and dispatcher.pos == ends[-1]


def test_a_hold_a_consumer_waits_for_ends_at_the_next_post(stepping, tmp_path):
    dispatcher, clock, ends = stepping
    with ConsumerWaiter.register(dispatcher.waiters, tmp_path / "run") as waiter:
        dispatcher.waiters.waiting[waiter.index] = 1
        flushed_to(dispatcher, ends[0])
        assert dispatcher.step()
        flushed_to(dispatcher, ends[1])  # one small request: coalesced
        assert not dispatcher.step() and dispatcher._held.wake is HoldWake.ON_POST
        dispatcher.wakeup.post()  # the next flush
        dispatcher._sleep_until_woken(clock.now)
        assert clock.slept == [] and dispatcher.wakeup.pending_posts == 0  # woken by it


def test_a_slept_out_hold_ends_sooner_for_an_owed_builder_post(stepping):
    dispatcher, clock, ends = stepping
    post_interval_s = INTERVAL_S / 2  # a post comes due within the hold that follows
    dispatcher.builder_posts = PostPacer(post_interval_s)
    flushed_to(dispatcher, ends[0])
    assert dispatcher.step()  # the first progress is posted at once
    dispatcher.builder_posts.progress()
    post_due = dispatcher.builder_posts.posted_at + post_interval_s
    flushed_to(dispatcher, ends[-1])
    assert not dispatcher.step() and dispatcher._held.until_s > post_due
    dispatcher._sleep_until_woken(clock.now)
    assert clock.now == pytest.approx(post_due)  # woke for the post, the hold not over yet
    dispatcher._sleep_until_woken(clock.now)  # makes the post, then sleeps the rest
    assert not dispatcher.builder_posts.owed
    assert clock.now == pytest.approx(dispatcher._held.until_s)


def test_a_stopping_dispatcher_holds_nothing(stepping):
    dispatcher, _, ends = stepping
    flushed_to(dispatcher, ends[0])
    assert dispatcher.step()
    dispatcher._stopping = True
    flushed_to(dispatcher, ends[-1])
    assert dispatcher.step() and dispatcher.pos == ends[-1]


# ------------------------------------------------------- the dispatcher's idle wait itself


def test_while_a_full_disk_is_waited_out_an_owed_post_is_made_not_spun_on(tmp_path):
    """No step runs during a disk-full wait, so the idle wait must post owed progress itself and
    then sleep: a wait of 0 there would spin at 100 % CPU until space returns."""
    name = f"/mqstore-test-{os.getpid()}-pacing"
    builder = Wakeup.create(name)
    try:
        dispatcher = Dispatcher.__new__(Dispatcher)  # only the state _idle_wait_s reads
        dispatcher.builder_wakeups = [builder]
        dispatcher.builder_posts = PostPacer(INTERVAL_S)
        dispatcher._held = None
        dispatcher._disk_full_since, dispatcher._retry_at = 100.0, 100.5  # retry in 0.5 s
        dispatcher.builder_posts.posted(100.0)
        dispatcher.builder_posts.progress()  # the step before the disk filled
        wait_s = dispatcher._idle_wait_s(100.0 + INTERVAL_S)
        assert builder.pending_posts == 1 and not dispatcher.builder_posts.owed
        assert wait_s == HEARTBEAT_INTERVAL_S  # min(heartbeat, time to the retry): sleeps
        dispatcher._held = Hold(99.0, HoldWake.AT_END)  # a stale hold does not make it spin either
        assert dispatcher._idle_wait_s(100.0 + INTERVAL_S) == HEARTBEAT_INTERVAL_S
    finally:
        builder.close()
        builder.unlink()


def test_with_nothing_to_dispatch_after_a_step_the_rest_of_the_interval_is_slept_out(stepping):
    """The flushes of a pace interval could not be dispatched before it ends: waking for each
    (one message per flush) only to hold it cost a wake-up per flush."""
    dispatcher, clock, ends = stepping
    flushed_to(dispatcher, ends[0])
    assert dispatcher.step()
    stepped_at = clock.now - STEP_S
    assert not dispatcher.step()  # nothing new yet
    assert dispatcher._held == Hold(stepped_at + PACE_INTERVAL_S, HoldWake.AT_END)
    dispatcher.wakeup.post()  # a flush meanwhile does not end the sleep
    dispatcher._sleep_until_woken(clock.now)
    assert clock.now == pytest.approx(stepped_at + PACE_INTERVAL_S)
    assert dispatcher.wakeup.pending_posts == 0
    assert not dispatcher.step() and dispatcher._held is None  # the interval is over: idle wait


def test_with_nothing_to_dispatch_a_consumer_that_keeps_up_leaves_the_dispatcher_on_posts(stepping,
                                                                                        tmp_path):
    dispatcher, clock, ends = stepping
    with ConsumerWaiter.register(dispatcher.waiters, tmp_path / "run") as waiter:
        dispatcher.waiters.waiting[waiter.index] = 1
        flushed_to(dispatcher, ends[0])
        assert dispatcher.step()  # posted it, which cleared the flag
        assert not dispatcher.step() and dispatcher._held is None  # the next flush's post wakes it
        clock.now += KEEP_UP_S  # busy since: behind
        flushed_to(dispatcher, ends[-1])
        assert dispatcher.step()  # nobody to post
        assert not dispatcher.step() and dispatcher._held.wake is HoldWake.AT_END
        dispatcher.waiters.waiting[waiter.index] = 1  # it waits again
        assert not dispatcher.step() and dispatcher._held is None
