"""The dispatcher's pacing: it posts the index builders at most once per interval, busy or idle, never
leaves progress unposted: PostPacer's rules, on given times (binary fractions, so the
arithmetic is exact)."""

from __future__ import annotations

import os

from ipc.wakeup import Wakeup
from workers.child import HEARTBEAT_INTERVAL_S
from workers.dispatcher import COALESCE_BELOW_BYTES, COALESCE_S, Dispatcher, PostPacer, coalesce_wait_s

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
        dispatcher._coalesce_until = None
        dispatcher._disk_full_since, dispatcher._retry_at = 100.0, 100.5  # retry in 0.5 s
        dispatcher.builder_posts.posted(100.0)
        dispatcher.builder_posts.progress()  # the step before the disk filled
        wait_s = dispatcher._idle_wait_s(100.0 + INTERVAL_S)
        assert builder.pending_posts == 1 and not dispatcher.builder_posts.owed
        assert wait_s == HEARTBEAT_INTERVAL_S  # min(heartbeat, time to the retry): sleeps
        dispatcher._coalesce_until = 99.0  # a stale coalesce deadline does not make it spin either
        assert dispatcher._idle_wait_s(100.0 + INTERVAL_S) == HEARTBEAT_INTERVAL_S
    finally:
        builder.close()
        builder.unlink()
