"""Offsets outside a queue are refused when read, and `mqstore groups --reset` moves them,
refused while the group has live consumers (issue 32, defect 3). One real store per module."""

from __future__ import annotations

import contextlib
import gc
import json
import os
import signal
import time
from datetime import datetime

import pytest

from engine.errors import BadInputError, CommittedOffsetError, GroupInUseError
from ipc.consumer import Consumer
from ipc.consumer_offsets import ConsumerOffsets, encode_offset_table
from ipc.control_block import Role
from ipc.group_members import group_held_alone, group_lock_path
from ipc.producer import Producer
from tests.helpers import snapshot
from tests.workers.store_harness import cli, module_store, spawn_python
from tools.inventory import lag_table
from tools.offset_reset import parse_reset_target, reset_offsets

TOPIC = "Resets"
SENT = {0: 6, 1: 3}  # messages per queue
EXIT_OK, EXIT_BAD_INPUT = 0, 2


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    for running in module_store(tmp_path_factory.mktemp("resets") / "store"):
        with Producer(running.root) as producer:
            for queue_id, count in SENT.items():
                for i in range(count):
                    assert producer.send(TOPIC, f"m{queue_id}-{i}".encode(), queue_id=queue_id).ok
        running.wait_caught_up()
        running.sent_ms = time.time_ns() // 1_000_000
        yield running


def write_offsets(root, table: dict) -> None:
    """Hand-edit the offsets file as an operator (or a bug) would: no check on the way in."""
    path = ConsumerOffsets(root).path
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(encode_offset_table(table))


# ---------------------------------------------------------------------------------- refused when read
@pytest.mark.slow
@pytest.mark.parametrize("offset, words", [(99_999, "past the queue's end 6"), (-5, "below zero")])
def test_an_offset_outside_its_queue_is_refused_when_read(store, offset, words):
    write_offsets(store.root, {f"{TOPIC}@outside": {0: offset, 1: 1}})
    with Consumer(store.root, "outside") as consumer:
        for read in (lambda: consumer.committed(TOPIC, 0), lambda: consumer.pull(TOPIC, 0),
                     lambda: list(consumer.iterate(TOPIC))):
            with pytest.raises(CommittedOffsetError, match=words) as caught:
                read()
            error = caught.value
            assert (error.group, error.topic, error.queue_id, error.offset) == ("outside", TOPIC, 0, offset)
            assert error.path.endswith("consumerOffset.json")
            assert "mqstore groups --reset --group outside --topic Resets" in error.hint
        assert consumer.pull(TOPIC, 1).messages[0].body == b"m1-1"  # the sound queue still reads
    [row] = [r for r in lag_table(store.root, "outside") if r.queue_id == 0]
    assert row.refused and ("below zero" if offset < 0 else "past the end 6") in row.offset_problem


@pytest.mark.slow
def test_a_commit_below_zero_is_refused_and_changes_nothing(store):
    write_offsets(store.root, {f"{TOPIC}@late": {0: 2}})
    before = ConsumerOffsets(store.root).path.read_bytes()
    with (Consumer(store.root, "late") as consumer,
          pytest.raises(BadInputError, match="-1 is not a non-negative int")):
        consumer.commit(TOPIC, 0, -1)
    assert ConsumerOffsets(store.root).path.read_bytes() == before


@pytest.mark.slow
def test_a_commit_of_an_acknowledged_offset_is_taken_while_the_dispatcher_lags(tmp_path):
    """The consume queue lags the commitlog: the next offset of an acknowledged message may lie
    past the queue's end on disk, and is neither refused at commit nor when read back."""
    for running in module_store(tmp_path / "store"):
        dispatcher = running.child_pid(Role.DISPATCHER)
        os.kill(dispatcher, signal.SIGSTOP)
        try:
            with Producer(running.root) as producer:
                sent = producer.send("Lag", b"acked", queue_id=0)
            assert sent.ok
            with Consumer(running.root, "g") as consumer:
                consumer.commit("Lag", 0, sent.queue_offset + 1)
        finally:
            os.kill(dispatcher, signal.SIGCONT)
        with Consumer(running.root, "g") as consumer:  # read back at once: it waits for dispatch
            assert consumer.committed("Lag", 0) == sent.queue_offset + 1


@pytest.mark.slow
def test_a_consumer_dropped_without_close_leaves_its_group(store):
    def handle_one() -> None:  # a handler that forgets close(), as an exception path would
        Consumer(store.root, "dropped").commit(TOPIC, 0, 1)

    handle_one()
    gc.collect()
    assert [m.after for m in reset_offsets(store.root, "dropped", TOPIC, "earliest")] == [0, 0]


@pytest.mark.slow
def test_a_forked_child_keeps_the_group_only_once_it_uses_the_consumer(store):
    child = spawn_python("""
        import os, sys
        from ipc.consumer import Consumer
        consumer = Consumer(sys.argv[1], "forked")
        consumer.commit(sys.argv[2], 0, 1)
        kids = []
        for adopts in (False, True):
            ready_read, ready_write = os.pipe()
            pid = os.fork()
            if pid == 0:
                if adopts:
                    consumer.committed(sys.argv[2], 0)
                os.write(ready_write, b"r")
                sys.stdin.read()  # until the test closes stdin
                os._exit(0)
            os.read(ready_read, 1)
            kids.append(pid)
        consumer.close()
        print(*kids, flush=True)
        """, str(store.root), TOPIC, stdin=-1)
    line = child.stdout.readline()
    assert line, child.stderr.read().decode()
    idle, adopter = map(int, line.split())
    try:
        assert child.wait() == 0
        with pytest.raises(GroupInUseError) as refused:
            reset_offsets(store.root, "forked", TOPIC, "earliest")
        assert refused.value.pids == [adopter]  # not the parent, gone; not the idle child
        os.kill(adopter, signal.SIGKILL)
        deadline = time.monotonic() + 10
        while os.path.exists(f"/proc/{adopter}") and time.monotonic() < deadline:
            time.sleep(0.01)  # polling the orphan's exit (reaped by init), not waiting a guess
        assert os.path.exists(f"/proc/{idle}")
        assert [m.after for m in reset_offsets(store.root, "forked", TOPIC, "earliest")] == [0, 0]
    finally:
        child.stdin.close()
        for pid in (idle, adopter):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


# ---------------------------------------------------------------------------------- the reset
@pytest.mark.slow
def test_reset_to_earliest_latest_time_and_offset_moves_every_queue_and_logs_it(store):
    write_offsets(store.root, {f"{TOPIC}@ops": {0: 99_999}})
    assert [(m.queue_id, m.before, m.after) for m in reset_offsets(store.root, "ops", TOPIC, "earliest")] \
        == [(0, 99_999, 0), (1, None, 0)]
    assert [m.after for m in reset_offsets(store.root, "ops", TOPIC, "latest")] == [6, 3]
    assert [m.after for m in reset_offsets(store.root, "ops", TOPIC, "2")] == [2, 2]
    assert [m.after for m in reset_offsets(store.root, "ops", TOPIC, f"@{store.sent_ms + 60_000}")] == [6, 3]
    assert [m.after for m in reset_offsets(store.root, "ops", TOPIC, "2001-01-01T00:00:00+00:00")] == [0, 0]
    log = (store.root / "mqstore.log").read_text()
    assert "offsets of group ops on Resets reset to earliest by `mqstore groups --reset`" in log
    assert "0: 99999 -> 0, 1: - -> 0" in log and " WARNING cli[" in log
    with Consumer(store.root, "ops") as consumer:
        assert consumer.pull(TOPIC, 0).messages[0].body == b"m0-0"  # read from the reset offset


@pytest.mark.slow
def test_reset_is_refused_while_a_consumer_process_of_the_group_lives(store):
    write_offsets(store.root, {f"{TOPIC}@busy": {0: 1}})
    child = spawn_python("""
        import sys
        from ipc.consumer import Consumer
        with Consumer(sys.argv[1], "busy"):
            print("ready", flush=True)
            sys.stdin.read()
        """, str(store.root), stdin=-1)
    try:
        assert child.stdout.readline() == b"ready\n"
        before = snapshot(store.root / "config")
        result = cli("groups", "--reset", "--group", "busy", "--topic", TOPIC, "--to", "latest",
                     "--store", str(store.root))
        assert result.returncode != EXIT_OK
        assert f"group 'busy' has live consumers (pid {child.pid})" in result.stderr.decode()
        assert snapshot(store.root / "config") == before
    finally:
        child.send_signal(signal.SIGKILL)  # a crashed consumer: the kernel drops its lock
        child.wait()
    result = cli("groups", "--reset", "--group", "busy", "--topic", TOPIC, "--to", "latest",
                 "--json", "--store", str(store.root))
    assert result.returncode == EXIT_OK, result.stderr.decode()
    assert [q["after"] for q in json.loads(result.stdout)["queues"]] == [6, 3]


def test_a_reset_holds_the_group_so_no_consumer_starts_meanwhile(tmp_path):
    with (group_held_alone(tmp_path, "g"), pytest.raises(GroupInUseError, match="live consumers"),
          group_held_alone(tmp_path, "g")):
        pass
    long_group = "g" * 255
    assert len(group_lock_path(tmp_path, long_group).name.encode()) <= 255


@pytest.mark.slow
@pytest.mark.parametrize("args, words", [
    (("--group", "nobody", "--topic", TOPIC, "--to", "latest"), "'nobody' has committed no offset"),
    (("--group", "known", "--topic", "Nothing", "--to", "latest"), "'Nothing' has no queue"),
    (("--group", "known", "--topic", TOPIC, "--to", "5"), "offset 5 is outside Resets/1"),
    (("--group", "known", "--topic", TOPIC, "--to", "1764600000000"), "write @1764600000000"),
    (("--group", "known", "--topic", TOPIC, "--to", "yesterday"), "none of earliest, latest"),
    (("--group", "known", "--topic", TOPIC), "--reset needs --group, --topic and --to"),
    (("--group", "bad/name", "--topic", TOPIC, "--to", "latest"), "invalid group"),
])
def test_a_bad_reset_exits_2_with_one_line_and_changes_nothing(store, args, words):
    write_offsets(store.root, {f"{TOPIC}@known": {0: 1}})
    before = snapshot(store.root / "config")
    result = cli("groups", "--reset", *args, "--store", str(store.root))
    assert result.returncode == EXIT_BAD_INPUT, result.stderr.decode()
    assert words in result.stderr.decode() and "Traceback" not in result.stderr.decode()
    assert snapshot(store.root / "config") == before


def test_reset_targets_parse_as_documented():
    assert parse_reset_target("earliest") == "earliest" and parse_reset_target("17") == 17
    assert parse_reset_target("@0") == datetime.fromtimestamp(0).astimezone()
    assert parse_reset_target("2026-01-02T03:04:05").hour == 3
    with pytest.raises(BadInputError, match="--to"):
        parse_reset_target("-3")


def test_group_options_without_reset_are_refused(tmp_path):
    result = cli("groups", "--group", "g", "--store", str(tmp_path))
    assert result.returncode == EXIT_BAD_INPUT and "only goes with --reset" in result.stderr.decode()
