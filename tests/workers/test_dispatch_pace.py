"""The dispatcher's pace on a real store: with no consumer waiting, send-and-wait (one message
per flush) is dispatched at most once per PACE_INTERVAL_S, not once per flush, and the last
flush of a burst is still dispatched and indexed with nothing after it to post anyone."""

from __future__ import annotations

import time

import pytest

from tests.workers.store_harness import PRODUCER_SCRIPT, checked_store, read_acks, spawn_python
from workers.dispatcher import PACE_INTERVAL_S

pytestmark = pytest.mark.slow
BURST_MESSAGES = 300


def watch_dispatched(store, producer) -> list[float]:
    """The times dispatched_pos was seen to move while `producer` ran (a lower bound on the
    dispatcher's steps: a poller may miss some, never invent one)."""
    moves = []
    with store.ctl() as ctl:
        last = ctl.dispatched_pos
        while producer.poll() is None:
            pos = ctl.dispatched_pos
            if pos != last:
                moves.append(time.monotonic())
                last = pos
            time.sleep(0.0002)
    return moves


def test_send_and_wait_with_no_consumer_is_dispatched_once_per_pace_interval(tmp_path):
    with checked_store(tmp_path / "store") as store:
        producer = spawn_python(PRODUCER_SCRIPT, str(store.root), "p", str(BURST_MESSAGES), "1", "T1")
        moves = watch_dispatched(store, producer)
        out, err = producer.communicate(timeout=120)
        assert producer.returncode == 0, err.decode()
        assert {ack[1] for ack in read_acks(out)} == {"PUT_OK"}
        store.wait_caught_up()  # the burst's last flush too, though nothing posted after it
        flushes = store.positions().flush_count
        assert len(moves) >= 2
        span_s = moves[-1] - moves[0]
        # steps begin at least PACE_INTERVAL_S apart, so the moves seen are fewer than
        # span / interval + 2 (the first one may be seen late); one more for a step the busy
        # machine stretched (a move is seen when a step ends, not when it begins)
        assert len(moves) <= span_s / PACE_INTERVAL_S + 3, (len(moves), span_s, flushes)
        assert flushes > 2 * len(moves)  # the point: many flushes a step
