"""Topics as configuration against a real store: `mqstore topic` reaches the running supervisor,
producers in other processes follow a topic's queues, a deleted topic stays deleted across a
SIGKILL and a restart, and `consume` of a topic that does not exist says so.

The rules themselves are tested in-process in tests/engine/topics/test_topic_table.py.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from ipc.offset_table_codec import parse_offset_table
from tests.workers.store_harness import (
    assert_check_clean,
    checked_store,
    cli,
    run_python,
    start_store,
    wait_for,
)
from tools.inventory import topic_overview
from tools.ops_commands import topics_json as topics_rows
from workers.child_env import REPO_ROOT, child_env

TWO_TOPICS_PRODUCER = """
import json, sys
from engine.message import Message
from ipc.producer import Producer
with Producer(sys.argv[1]) as producer:  # no queue ids: the producer spreads them
    solo = producer.send_batch([Message("Solo", b"s%d" % i) for i in range(12)])
    trio = [producer.send("Trio", b"t%d" % i) for i in range(9)]
print(json.dumps([[[r.status.name, r.queue_id] for r in rs] for rs in (solo, trio)]))
"""


def ok(*args: str) -> str:
    done = cli(*args)
    assert done.returncode == 0, done.stderr.decode()
    return done.stdout.decode()


def topics_json(root) -> dict:
    """What `mqstore topics --json` prints, by topic: the rows of its queues (in-process: the
    command's own functions, without a process start per look)."""
    rows: dict = {}
    for row in topics_rows(topic_overview(root)):
        rows.setdefault(row["topic"], []).append(row)
    return rows


@pytest.mark.slow
def test_topic_created_used_and_deleted_stays_deleted_after_a_kill(tmp_path):
    root = tmp_path / "store"
    running = start_store(root)
    try:
        ok("topic", "create", "--store", str(root), "--topic", "Solo", "--queues", "1")
        ok("topic", "create", "--store", str(root), "--topic", "Trio", "--queues", "3", "--perm", "rw")
        listed = topics_json(root)
        assert [(r["queue_id"], r["write_queues"], r["messages"]) for r in listed["Solo"]] == [(None, 1, 0)]

        sent = run_python(TWO_TOPICS_PRODUCER, str(root))
        assert sent.returncode == 0, sent.stderr.decode()
        solo, trio = json.loads(sent.stdout)
        assert solo == [["PUT_OK", 0]] * 12
        assert sorted(trio) == [["PUT_OK", q] for q in (0, 0, 0, 1, 1, 1, 2, 2, 2)]  # round robin

        refused = cli("send", "--store", str(root), "--topic", "Solo", "--queue-id", "1", "--body", "x")
        assert refused.returncode == 2
        assert b"invalid queue_id: 1 is outside 0..0" in refused.stderr  # the producer's view

        ok("consume", "--store", str(root), "--topic", "Solo", "--group", "g", "--max", "12")
        deleted = json.loads(ok("topic", "delete", "--store", str(root), "--topic", "Solo", "--json"))
        assert deleted["groups_reset"] == ["g"]
        wait_for(lambda: not (root / "consumequeue" / "Solo").exists(), "the dispatcher drops Solo's queue")
        children = running.child_pids()
        running.kill()  # every record of Solo is in the log below its tombstone
        running.wait_orphans_gone(children)
    except BaseException:
        running.kill()
        raise
    with checked_store(root) as restarted:
        assert not (root / "consumequeue" / "Solo").exists()
        assert "Solo" not in topics_json(root) and "Trio" in topics_json(root)
        gone = cli("consume", "--store", str(root), "--topic", "Solo")
        assert gone.returncode == 1 and b"no topic Solo" in gone.stderr
        offsets = parse_offset_table((root / "config" / "consumerOffset.json").read_text())
        assert offsets == {}  # the group's offsets of Solo went with it
        restarted.wait_caught_up()
    assert_check_clean(root)


@pytest.mark.slow
def test_consume_of_a_missing_topic_fails_and_with_follow_waits_for_it(tmp_path):
    root = tmp_path / "store"
    with checked_store(root):
        missing = cli("consume", "--store", str(root), "--topic", "Later")
        assert missing.returncode == 1 and b"no topic Later" in missing.stderr
        assert b"0 message(s)" not in missing.stderr
        stderr_path = tmp_path / "consume.stderr"
        with open(stderr_path, "wb") as stderr:
            follower = subprocess.Popen(
                [sys.executable, "-m", "tools.cli", "consume", "--store", str(root), "--topic", "Later",
                 "--follow", "--max", "1", "--timeout-ms", "100"],
                cwd=REPO_ROOT, env=child_env(), stdout=subprocess.PIPE, stderr=stderr)
            try:
                wait_for(lambda: b"no topic Later yet" in stderr_path.read_bytes(), "the waiting notice")
                assert follower.poll() is None  # it waits instead of ending with 0 message(s)
                ok("send", "--store", str(root), "--topic", "Later", "--body", "hello")
                out, _ = follower.communicate(timeout=30)
            finally:
                if follower.poll() is None:
                    follower.kill()
                    follower.wait()
        assert follower.returncode == 0 and b"body=hello" in out


NEW_TOPIC_PRODUCER = """
import json, sys
from ipc.producer import Producer
with Producer(sys.argv[1]) as producer:
    result = producer.send("Fresh", b"x", queue_id=0)
print(json.dumps([result.status.name, result.reason]))
"""


@pytest.mark.slow
def test_auto_create_whose_topics_json_cannot_be_written_refuses_the_record_and_keeps_running(tmp_path):
    root = tmp_path / "store"
    with checked_store(root) as running:
        blocker = root / "config" / "topics.json.tmp"
        blocker.mkdir(parents=True)  # the atomic write's temporary file cannot be created
        sent = run_python(NEW_TOPIC_PRODUCER, str(root))
        assert sent.returncode == 0, sent.stderr.decode()
        status, reason = json.loads(sent.stdout)
        assert status == "SERVICE_NOT_AVAILABLE" and "errno 21" in reason, reason
        assert running.running and "Fresh" not in topics_json(root)
        blocker.rmdir()
        again = run_python(NEW_TOPIC_PRODUCER, str(root))
        assert json.loads(again.stdout)[0] == "PUT_OK", again.stderr.decode()
        running.wait_caught_up()
    assert_check_clean(root)


@pytest.mark.slow
def test_hostile_request_files_leave_the_supervisor_serving_topic_changes(tmp_path):
    root = tmp_path / "store"
    with checked_store(root) as running:
        requests = root / "run" / "topic-requests"
        requests.mkdir(exist_ok=True)
        (requests / "1-dir.json").mkdir()
        os.mkfifo(requests / "2-fifo.json")
        (requests / "3-deep.json").write_text("[" * 200_000 + "]" * 200_000)
        ok("topic", "create", "--store", str(root), "--topic", "After", "--queues", "2", "--timeout", "20")
        assert running.running and topics_json(root)["After"][0]["write_queues"] == 2
        moved = sorted(path.name for path in requests.glob("*.bad"))
        assert moved == ["1-dir.bad", "2-fifo.bad", "3-deep.bad"]
    assert_check_clean(root)


@pytest.mark.slow
def test_a_long_lived_consumer_reads_the_recreated_topic_not_the_deleted_queue(tmp_path):
    from ipc.consumer import Consumer
    from ipc.producer import Producer

    root = tmp_path / "store"
    with checked_store(root) as running:
        with Producer(root) as producer:
            for i in range(3):
                assert producer.send("Gone", b"old-%d" % i, queue_id=0).status.name == "PUT_OK"
        running.wait_caught_up()
        with Consumer(root, "g1") as consumer:
            old = consumer.pull("Gone", 0, 0, 10).messages
            assert [m.body for m in old] == [b"old-0", b"old-1", b"old-2"]
            ok("topic", "delete", "--store", str(root), "--topic", "Gone")
            wait_for(lambda: not (root / "consumequeue" / "Gone").exists(), "the queue dropped")
            with Producer(root) as producer:
                for i in range(2):
                    assert producer.send("Gone", b"NEW-%d" % i, queue_id=0).status.name == "PUT_OK"
            running.wait_caught_up()
            assert [m.body for m in consumer.pull("Gone", 0, 0, 10).messages] == [b"NEW-0", b"NEW-1"]
    assert_check_clean(root)


@pytest.mark.slow
def test_a_commit_landing_after_the_delete_does_not_skip_the_recreated_topic(tmp_path):
    from ipc.consumer import Consumer
    from ipc.producer import Producer

    root = tmp_path / "store"
    with checked_store(root) as running:
        with Producer(root) as producer:
            for i in range(3):
                producer.send("Gone", b"old-%d" % i, queue_id=0)
        running.wait_caught_up()
        with Consumer(root, "g") as late:
            read = late.pull("Gone", 0, 0, 10)
            assert read.next_offset == 3
            ok("topic", "delete", "--store", str(root), "--topic", "Gone")
            late.commit("Gone", 0, read.next_offset)  # read before the delete, committed after it
        with Producer(root) as producer:
            for i in range(3):
                producer.send("Gone", b"NEW-%d" % i, queue_id=0)
        running.wait_caught_up()
        with Consumer(root, "g") as resumed:
            assert resumed.committed("Gone", 0) is None
            assert [m.body for m in resumed.iterate("Gone", follow=False)] == [b"NEW-0", b"NEW-1", b"NEW-2"]
    assert_check_clean(root)


@pytest.mark.slow
def test_the_supervisor_forgets_a_deleted_topics_offsets_as_part_of_the_delete(tmp_path):
    from ipc.consumer_offsets import ConsumerOffsets
    from ipc.topic_requests import post_request, wait_for_answer

    root = tmp_path / "store"
    with checked_store(root) as running:
        ok("send", "--store", str(root), "--topic", "Gone", "--body", "old")
        ConsumerOffsets(root).commit("Gone", "g", 0, 1)
        # the request alone, as a CLI killed right after the supervisor's answer leaves it
        answer = wait_for_answer(post_request(root, {"op": "delete", "topic": "Gone"}), 30,
                                 lambda: running.running)
        assert answer["groups_reset"] == ["g"], answer
        assert ConsumerOffsets(root).load() == {}
        running.wait_caught_up()
    assert_check_clean(root)


@pytest.mark.slow
def test_a_topic_without_read_permission_is_not_read(tmp_path):
    from engine.errors import BadInputError
    from ipc.consumer import Consumer

    root = tmp_path / "store"
    with checked_store(root) as running:
        ok("topic", "create", "--store", str(root), "--topic", "WOnly", "--queues", "1", "--perm", "w")
        ok("send", "--store", str(root), "--topic", "WOnly", "--queue-id", "0", "--body", "w")
        running.wait_caught_up()
        with Consumer(root, "g") as consumer:
            with pytest.raises(BadInputError, match="perm w does not allow reads"):
                consumer.pull("WOnly", 0, 0, 10)
            with pytest.raises(BadInputError, match="perm w does not allow reads"):
                next(consumer.iterate("WOnly"))
            ok("topic", "update", "--store", str(root), "--topic", "WOnly", "--perm", "rw")
            assert [m.body for m in consumer.pull("WOnly", 0, 0, 10).messages] == [b"w"]
    assert_check_clean(root)
