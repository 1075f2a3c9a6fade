"""Delayed delivery in the running store: messages sent with a delay level (and with DELAY set by
the client) from a producer process reach their real topic exactly once and never before their
time, across a SIGKILL of the supervisor and every child taken while deliveries are under way."""

from __future__ import annotations

import os
import signal
import time

import pytest

from ipc.consumer import Consumer
from tests.workers.store_harness import (
    assert_check_clean,
    read_acks,
    run_python,
    start_store,
    wait_for,
)

LEVELS_MS = (300, 4000)  # the kill comes once level 1 is delivering, long before level 2 is due
STORE = {"message_delay_level": " ".join(f"{ms}ms" for ms in LEVELS_MS)}
COUNT = 60  # even i: delay_level=1, odd i: DELAY=2 set as a property by the client

SEND = """
import json, sys
from engine.message import Message
from ipc.producer import Producer
with Producer(sys.argv[1]) as producer:
    for i in range(int(sys.argv[2])):
        if i % 2:
            r = producer.send("Orders", b"m-%d" % i, queue_id=i % 4, properties={"DELAY": "2"})
        else:
            r = producer.send("Orders", b"m-%d" % i, queue_id=i % 4, delay_level=1)
        print(json.dumps([i, r.status.name, r.commit_pos, r.store_ts_ms]), flush=True)
"""


def _delivered(root) -> list:
    with Consumer(root, "check") as consumer:
        out = []
        for queue_id in range(4):
            result = consumer.pull("Orders", queue_id, 0, 1000)
            out += result.messages
        return out


def _gone(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] in ("Z", "X")
    except FileNotFoundError:
        return True


@pytest.mark.slow
def test_delayed_messages_across_a_sigkill_of_every_store_process_arrive_once_never_early(tmp_path):
    root = tmp_path / "store"
    running = start_store(root, store=STORE)
    sent = run_python(SEND, str(root), str(COUNT))
    assert sent.returncode == 0, sent.stderr.decode()
    acks = {commit_pos: (i, store_ts_ms + LEVELS_MS[i % 2])
            for i, status, commit_pos, store_ts_ms in read_acks(sent.stdout) if status == "PUT_OK"}
    assert len(acks) == COUNT
    wait_for(lambda: len(_delivered(root)) >= COUNT // 4, "the first deliveries")
    children = running.child_pids()
    delivered_before = len(_delivered(root))
    running.kill()
    for pid in children:
        if not _gone(pid):
            os.kill(pid, signal.SIGKILL)
    wait_for(lambda: all(_gone(pid) for pid in children), "every store process to die")
    assert delivered_before < COUNT, "the kill came after every delivery: nothing was tested"

    running = start_store(root, store=STORE)
    try:
        wait_for(lambda: len(_delivered(root)) >= COUNT, "every delayed message to arrive")
        delivered = _delivered(root)
    finally:
        assert running.stop() == 0
    origins = [int(m.properties["DELIVERED_FROM"]) for m in delivered]
    assert sorted(origins) == sorted(acks)  # each exactly once
    for message, origin in zip(delivered, origins, strict=True):
        i, due_ms = acks[origin]
        assert message.body == b"m-%d" % i and message.queue_id == i % 4
        assert message.store_ts_ms >= due_ms, f"m-{i} delivered {due_ms - message.store_ts_ms} ms early"
        assert "DELAY" not in message.properties
    assert_check_clean(root)


TIMED = """
import json, sys, time
from ipc.producer import Producer
with Producer(sys.argv[1]) as producer:
    now_ms = time.time_ns() // 1_000_000
    for name, ahead_ms in (("early", 300), ("across", 2500), ("past", -1000)):
        r = producer.send("Timed", name.encode(), queue_id=1, deliver_at_ms=now_ms + ahead_ms)
        print(json.dumps([name, r.status.name, r.queue_id, now_ms + ahead_ms]), flush=True)
"""


@pytest.mark.slow
def test_a_timed_message_across_a_restart_arrives_once_at_its_time(tmp_path):
    root = tmp_path / "store"
    running = start_store(root)
    sent = run_python(TIMED, str(root))
    assert sent.returncode == 0, sent.stderr.decode()
    due = {name: at for name, status, _, at in read_acks(sent.stdout) if status == "PUT_OK"}
    assert set(due) == {"early", "across", "past"}

    def timed() -> dict:
        with Consumer(root, "check") as consumer:
            return {m.body.decode(): m for m in consumer.pull("Timed", 1, 0, 100).messages}

    wait_for(lambda: "early" in timed(), "the early message")
    assert running.stop() == 0  # "across" is still waiting
    wait_for(lambda: time.time() * 1000 > due["across"], "its time to pass while the store is down")
    running = start_store(root)
    try:
        wait_for(lambda: "across" in timed(), "the message timed across the restart")
        arrived = timed()
        with Consumer(root, "check") as consumer:
            assert len(consumer.pull("Timed", 1, 0, 100).messages) == 3  # each once
    finally:
        assert running.stop() == 0
    assert "DELIVERED_FROM" not in arrived["past"].properties  # stored in its topic at once
    for name in ("early", "across"):
        assert arrived[name].store_ts_ms >= due[name], f"{name} delivered early"
    assert_check_clean(root)
