"""Consumer groups share queues (issue 35, items 1 and 4): members split a topic's queues as
RocketMQ's average allocation does, a dead member's queues move to the survivors from the
committed offsets, a stopped member keeps its queues and shows as stalled, a member with
another subscription is refused at join, and seek_to_time works on a running store. One real
store per module; the member tests run real member processes."""

from __future__ import annotations

import os
import re
import signal
import threading
import time
from pathlib import Path

import pytest

from engine.errors import (
    BadInputError,
    MemberNameInUseError,
    QueueNotOwnedError,
    SubscriptionMismatchError,
)
from ipc.consumer import Consumer
from ipc.consumer_offsets import ConsumerOffsets
from ipc.group_roster import MessageModel, join_roster, live_members, topic_dir
from ipc.producer import Producer
from ipc.queue_allocation import allocate_averagely
from tests.workers.store_harness import cli, module_store, spawn_python, wait_for
from tools.client_commands import parse_time_ms
from tools.group_view import member_table

QUEUES = 8

MEMBER_SCRIPT = """
import signal, sys
from ipc.consumer import Consumer
store, group, topic, ledger_path = sys.argv[1:5]
signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))  # a clean stop: commit, then leave
with open(ledger_path, "a", buffering=1) as ledger, Consumer(store, group) as consumer:
    for record in consumer.iterate(topic, follow=True, poll_timeout_ms=100, commit_interval_ms=0):
        ledger.write(f"{record.queue_id} {record.queue_offset}\\n")
"""


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    yield from module_store(tmp_path_factory.mktemp("groups") / "store", store={"queue_count": QUEUES})


def send(store, topic: str, per_queue: int, queue_ids=range(QUEUES)) -> None:
    """`per_queue` messages to each queue, dispatched (readable) on return."""
    with Producer(store.root) as producer:
        for i in range(per_queue):
            for queue_id in queue_ids:
                assert producer.send(topic, f"{queue_id}-{i}".encode(), queue_id=queue_id).ok
    store.wait_caught_up()


def ledger(path: Path) -> list[tuple[int, int]]:
    """(queue id, queue offset) of each message a member handled, in order."""
    if not path.exists():
        return []
    return [tuple(map(int, line.split())) for line in path.read_text().splitlines() if line.count(" ") == 1]


def start_member(root: Path, group: str, topic: str, ledger_path: Path):
    return spawn_python(MEMBER_SCRIPT, str(root), group, topic, str(ledger_path))


def members_owning(root: Path, group: str, topic: str) -> dict[int, tuple[int, ...]]:
    return {record.pid: record.queue_ids for record in live_members(root, group, topic)}


def stop(member) -> None:
    member.send_signal(signal.SIGTERM)
    assert member.wait(timeout=30) == 0, member.stderr.read().decode()


# ------------------------------------------------------------------ real member processes
@pytest.mark.slow
def test_two_members_split_eight_queues_and_each_message_is_handled_once(store, tmp_path):
    topic, group = "Split", "workers"
    send(store, topic, 25)
    ledgers = [tmp_path / "a.txt", tmp_path / "b.txt"]
    members = [start_member(store.root, group, topic, path) for path in ledgers]
    try:
        wait_for(lambda: sorted(len(q) for q in members_owning(store.root, group, topic).values()) == [4, 4],
                 "the two members own four queues each")
        send(store, topic, 25)  # some after the split, to both members' queues
        wait_for(lambda: sum(len(ledger(path)) for path in ledgers) >= 400, "every message handled")
    finally:
        for member in members:
            stop(member)
    handled = [ledger(path) for path in ledgers]
    assert sorted(handled[0] + handled[1]) == [(q, o) for q in range(QUEUES) for o in range(50)]  # once
    assert all(len(h) >= 100 for h in handled)  # both worked (each ends with four queues of 25 new)
    committed = {q: ConsumerOffsets(store.root).get(topic, group, q) for q in range(QUEUES)}
    assert committed == dict.fromkeys(range(QUEUES), 50)  # neither member lost the other's commits
    assert live_members(store.root, group, topic) == []


@pytest.mark.slow
def test_a_stopped_member_keeps_its_queues_and_a_killed_ones_go_to_the_survivor(store, tmp_path):
    topic, group = "Handover", "workers"
    send(store, topic, 10)
    first_ledger, second_ledger = tmp_path / "first.txt", tmp_path / "second.txt"
    first = start_member(store.root, group, topic, first_ledger)
    wait_for(lambda: len(ledger(first_ledger)) == 80, "the first member handled the backlog")
    second = start_member(store.root, group, topic, second_ledger)
    try:
        wait_for(lambda: sorted(map(len, members_owning(store.root, group, topic).values())) == [4, 4],
                 "the queues split between the two")
        owned = members_owning(store.root, group, topic)
        first_queues, second_queues = owned[first.pid], owned[second.pid]
        os.kill(first.pid, signal.SIGSTOP)
        wait_for(lambda: [r for r in member_table(store.root) if r.topic == topic
                          and r.pid == first.pid and r.state == "stalled"], "stalled shown")
        send(store, topic, 5)  # 5 waiting on each of the stopped member's queues
        wait_for(lambda: sum(q in second_queues for q, _ in ledger(second_ledger)) >= 20,
                 "the survivor handled what came to its own queues")
        assert not [m for m in ledger(second_ledger) if m[0] in first_queues]  # nothing taken over
        assert members_owning(store.root, group, topic)[first.pid] == first_queues
        rows = [r for r in member_table(store.root) if r.topic == topic and r.pid == first.pid]
        assert rows[0].state == "stalled" and rows[0].lag_messages == 20
        shown = cli("groups", "--store", str(store.root))
        assert shown.returncode == 0 and f"{first.pid}" in shown.stdout.decode()
        assert "stalled" in shown.stdout.decode()
        committed = {q: ConsumerOffsets(store.root).get(topic, group, q) for q in first_queues}
        assert committed == dict.fromkeys(first_queues, 10)  # what it handled before the stop
        os.kill(first.pid, signal.SIGKILL)  # stopped, so nothing it committed moves meanwhile
        first.wait(timeout=30)
        wait_for(lambda: sum(q in first_queues for q, _ in ledger(second_ledger)) >= 20,
                 "the survivor serves the dead member's queues")
        assert members_owning(store.root, group, topic) == {second.pid: tuple(range(QUEUES))}
    finally:
        if first.poll() is None:
            first.kill()
            first.wait()
        stop(second)
    resumed = {}
    for queue_id, offset in ledger(second_ledger):
        if queue_id in first_queues:
            resumed.setdefault(queue_id, offset)
    assert resumed == committed  # from the dead member's committed offset: nothing skipped
    handled = ledger(first_ledger) + ledger(second_ledger)
    assert set(handled) == {(q, o) for q in range(QUEUES) for o in range(15)}


# ------------------------------------------------------------------ in-process, one real store
def test_a_member_with_another_expression_is_refused_at_join(store):
    topic, group = "Refusals", "picky"
    seat = join_roster(store.root, group, topic, "tagged", MessageModel.CLUSTERING, "TagA || TagB")
    try:
        with Consumer(store.root, group) as consumer:
            with pytest.raises(SubscriptionMismatchError) as refused:
                next(consumer.iterate(topic))
            assert refused.value.pids == [os.getpid()] and "TagA || TagB" in str(refused.value)
            assert [r.member for r in live_members(store.root, group, topic)] == ["tagged"]
    finally:
        seat.leave()


def test_a_broadcasting_member_with_a_live_members_name_is_refused(store):
    with (Consumer(store.root, "bc", model=MessageModel.BROADCASTING, instance_name="w1") as first,
          Consumer(store.root, "bc", model=MessageModel.BROADCASTING, instance_name="w1") as twin):
        first.assignment("Names")
        with pytest.raises(MemberNameInUseError):
            twin.assignment("Names")


def test_a_member_commits_only_the_queues_it_owns(store):
    topic = "Owners"
    with Consumer(store.root, "own") as first, Consumer(store.root, "own") as second:
        first.assignment(topic)
        second.assignment(topic)
        wait_for(lambda: len(first.assignment(topic)) == len(second.assignment(topic)) == 4, "split")
        theirs = second.assignment(topic)[0]
        with pytest.raises(QueueNotOwnedError):
            first.commit(topic, theirs, 1)
        assert ConsumerOffsets(store.root).get(topic, "own", theirs) is None  # nothing written
        first.commit(topic, first.assignment(topic)[0], 0)


def test_a_draining_member_waits_for_its_share_to_be_handed_over(store):
    topic = "Drain"
    send(store, topic, 2)
    with Consumer(store.root, "drainers") as owner, Consumer(store.root, "drainers") as newcomer:
        assert owner.assignment(topic) == list(range(QUEUES))  # alone: every queue
        done = threading.Event()

        def keep_sweeping() -> None:  # the owner's own loop, as in its process
            while not done.is_set():
                owner.assignment(topic)
                done.wait(0.01)

        sweeper = threading.Thread(target=keep_sweeping)
        sweeper.start()
        try:
            got = list(newcomer.iterate(topic, poll_timeout_ms=30_000))
        finally:
            done.set()
            sweeper.join()
        share = newcomer.assignment(topic)
        assert len(share) == QUEUES // 2 and not set(share) & set(owner.assignment(topic))
        assert sorted((r.queue_id, r.queue_offset) for r in got) == [(q, o) for q in share for o in (0, 1)]


@pytest.mark.slow
def test_broadcasting_members_each_read_everything_with_offsets_of_their_own(store):
    topic = "Everyone"
    send(store, topic, 3)
    readers = [Consumer(store.root, "fans", model=MessageModel.BROADCASTING, instance_name=name)
               for name in ("one", "two")]
    try:
        for reader in readers:
            assert len(list(reader.iterate(topic))) == 3 * QUEUES
        send(store, topic, 1)
        lags = {row.member: row.lag_messages for row in member_table(store.root) if row.topic == topic}
        assert lags == {"one": QUEUES, "two": QUEUES}  # each instance's own offsets
        assert len(list(readers[0].iterate(topic))) == QUEUES  # from its own offsets
    finally:
        for reader in readers:
            reader.close()
    assert ConsumerOffsets(store.root).get(topic, "fans", 0) is None  # not the group's file


def test_bad_subscriptions_are_refused_and_join_nothing(store):
    with Consumer(store.root, "bad") as consumer:
        with pytest.raises(BadInputError, match="tags"):
            consumer.assignment("T", tags=" || ")
        with pytest.raises(BadInputError, match="queue"):
            next(consumer.iterate("T", queue_ids=[QUEUES]))
    assert not topic_dir(store.root, "bad", "T").exists()  # nothing written on the way
    with pytest.raises(BadInputError, match="model"):
        Consumer(store.root, "bad", model="CLUSTERING")
    with pytest.raises(BadInputError, match="group"):  # an instance name follows the group rules
        Consumer(store.root, "bad", model=MessageModel.BROADCASTING, instance_name="a/b")
    with pytest.raises(BadInputError, match="instance_name"):
        Consumer(store.root, "bad", model=MessageModel.BROADCASTING)
    with pytest.raises(BadInputError, match="instance_name"):
        Consumer(store.root, "bad", instance_name="x")


def test_seek_to_time_on_a_running_store(store):
    topic = "Seek"
    send(store, topic, 2)
    between_ms = time.time_ns() // 1_000_000 + 1
    while time.time_ns() // 1_000_000 <= between_ms:  # the clock, not a sleep for another party
        pass
    send(store, topic, 3)
    with Consumer(store.root, "seekers") as consumer:
        assert consumer.seek_to_time(topic, between_ms) == dict.fromkeys(range(QUEUES), 2)
        assert sorted(r.queue_offset for r in consumer.iterate(topic)) == sorted([2, 3, 4] * QUEUES)
        assert consumer.seek_to_time(topic, 0) == dict.fromkeys(range(QUEUES), 0)
        assert consumer.seek_to_time(topic, 2**62) == dict.fromkeys(range(QUEUES), 5)
        with pytest.raises(BadInputError, match="ts_ms"):
            consumer.seek_to_time(topic, -1)
    assert ConsumerOffsets(store.root).get(topic, "seekers", 0) == 5  # what it consumed


@pytest.mark.slow
def test_consume_since_reads_from_that_time(store):
    topic = "Since"
    send(store, topic, 1, queue_ids=[0])
    between_ms = time.time_ns() // 1_000_000 + 1
    while time.time_ns() // 1_000_000 <= between_ms:
        pass
    send(store, topic, 2, queue_ids=[0])
    shown = cli("consume", "--store", str(store.root), "--topic", topic, "--group", "cli-since",
                "--since", str(between_ms), "--json")
    assert shown.returncode == 0, shown.stderr.decode()
    assert [line.count('"queue_offset": ') for line in shown.stdout.decode().splitlines()] == [1, 1]
    assert ConsumerOffsets(store.root).get(topic, "cli-since", 0) == 3
    bad = cli("consume", "--store", str(store.root), "--topic", topic, "--since", "yesterday")
    assert bad.returncode == 2 and b"since" in bad.stderr


def test_since_takes_iso_8601_with_a_zone():
    assert parse_time_ms("2026-12-01T10:00Z", "since") == 1_796_119_200_000


def test_the_guide_example_of_a_worker_runs_as_written(store, capsys):
    guide = (Path(__file__).resolve().parents[2] / "docs" / "GUIDE.md").read_text(encoding="utf-8")
    code = next(block for block in re.findall(r"^```python\n(.*?)^```", guide, re.MULTILINE | re.DOTALL)
                if 'consumer.iterate("jobs"' in block)
    send(store, "jobs", 3)
    with Producer(store.root) as producer:
        assert producer.send("jobs", b"last", queue_id=QUEUES - 1).ok
    store.wait_caught_up()
    exec(compile(code.replace("./data", str(store.root)), "GUIDE.md", "exec"), {})
    printed = capsys.readouterr().out.splitlines()
    assert len(printed) == 3 * QUEUES + 1 and printed[-1] == f"{QUEUES - 1} 3 b'last'"
    assert ConsumerOffsets(store.root).get("jobs", "workers", 0) == 3  # it committed what it handled
    assert live_members(store.root, "workers", "jobs") == []  # and left


# ------------------------------------------------------------------ the reviewer's repros (groups)
def split_between(topic: str, first: Consumer, second: Consumer) -> None:
    """Both join `topic` and poll until each owns half its queues."""
    first.assignment(topic)
    second.assignment(topic)
    wait_for(lambda: len(first.assignment(topic)) == len(second.assignment(topic)) == QUEUES // 2, "split")


def test_a_mark_on_another_members_queue_never_overrides_its_commit(store):
    topic = "StaleMark"
    send(store, topic, 10)
    x, y = Consumer(store.root, "stale"), Consumer(store.root, "stale")
    try:
        split_between(topic, x, y)
        theirs = y.assignment(topic)[0]
        y.commit(topic, theirs, 2)  # y handled offsets 0 and 1
        assert len(list(x.iterate(topic, queue_ids=[theirs]))) == 8  # x peeks with the assign API
        y.close()  # y leaves: its queues come to x, from y's commit
        wait_for(lambda: x.assignment(topic) == list(range(QUEUES)), "x owns every queue")
        got = [r.queue_offset for r in x.iterate(topic, poll_timeout_ms=300) if r.queue_id == theirs]
        assert got == list(range(2, 10))
    finally:
        x.close()
        y.close()


def test_a_queue_is_let_go_only_after_the_batch_being_handed_out_of_it(store):
    topic = "MidBatch"
    send(store, topic, 10)
    x, y = Consumer(store.root, "midbatch"), Consumer(store.root, "midbatch")
    try:
        it = x.iterate(topic, poll_timeout_ms=100)
        record = next(it)  # x is alone: it owns every queue
        y.assignment(topic)
        names = [member.member for member in live_members(store.root, "midbatch", topic)]
        x_name = next(member.member for member in live_members(store.root, "midbatch", topic)
                      if member.queue_ids == tuple(range(QUEUES)))
        lost = allocate_averagely(next(n for n in names if n != x_name), names, range(QUEUES))
        while record.queue_id != lost[0]:
            record = next(it)
        assert record.queue_offset == 0  # x is inside the batch of a queue y gets
        wait_for(lambda: (x.assignment(topic), len(y.assignment(topic)))[1] >= len(lost) - 1, "hand-over")
        assert lost[0] in x.assignment(topic) and lost[0] not in y.assignment(topic)
        rest = [(r.queue_id, r.queue_offset) for r in it]
        assert rest == [(lost[0], offset) for offset in range(1, 10)]  # none of y's other queues
        wait_for(lambda: (x.assignment(topic), lost[0] in y.assignment(topic))[1], "the last queue")
        assert y.committed(topic, lost[0]) == 10  # y starts past what x handed out
    finally:
        x.close()
        y.close()


def test_a_second_iterate_on_a_topic_is_refused_while_the_first_is_live(store):
    topic = "TwoIterates"
    send(store, topic, 2)
    with Consumer(store.root, "twice") as consumer:
        first = consumer.iterate(topic, poll_timeout_ms=100)
        next(first)
        with pytest.raises(BadInputError, match="live"):
            next(consumer.iterate(topic))
        first.close()
        assert len(list(consumer.iterate(topic, poll_timeout_ms=100))) == 2 * QUEUES  # nothing was marked


def in_forked_child(action) -> str:
    """What `action()` returned in a forked child, or the name of the error it raised."""
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: report, and never return into pytest
        try:
            os.close(read_fd)
            try:
                outcome = repr(action())
            except Exception as exc:
                outcome = type(exc).__name__
            os.write(write_fd, outcome.encode())
        finally:
            os._exit(0)
    os.close(write_fd)
    with os.fdopen(read_fd, "rb") as pipe:
        outcome = pipe.read().decode()
    os.waitpid(pid, 0)
    return outcome


def test_a_forked_child_writes_none_of_its_parents_marks_nor_resumes_its_iteration(store):
    topic = "Forked"
    send(store, topic, 10)
    with Consumer(store.root, "forks") as consumer:
        it = consumer.iterate(topic, poll_timeout_ms=100, commit_interval_ms=10**6)
        for _ in range(10 + 1):  # queue 0's batch consumed (marked, not written) and one of queue 1
            next(it)
        assert in_forked_child(consumer.flush_offsets) == "None"
        assert ConsumerOffsets(store.root).get(topic, "forks", 0) is None  # the parent's mark stayed its own
        assert in_forked_child(lambda: next(it)) == "StoreClosedError"
        assert in_forked_child(lambda: consumer.commit(topic, 0, 7)) == "QueueNotOwnedError"
        assert ConsumerOffsets(store.root).get(topic, "forks", 0) is None
        assert next(it).queue_offset == 1  # the parent goes on where it was
        it.close()
        assert ConsumerOffsets(store.root).get(topic, "forks", 0) == 10


def test_a_consumer_that_has_not_joined_cannot_commit_a_live_members_queue(store):
    topic = "NonMember"
    send(store, topic, 10)
    with Consumer(store.root, "nonmember") as member:
        assert len(list(member.iterate(topic, poll_timeout_ms=100))) == 10 * QUEUES  # commits 10 each
        with Consumer(store.root, "nonmember") as outsider:
            with pytest.raises(QueueNotOwnedError, match="live member"):
                outsider.commit(topic, 5, 1)
            assert len(list(outsider.iterate(topic, queue_ids=[3], poll_timeout_ms=100))) == 0
        shown = cli("consume", "--store", str(store.root), "--topic", topic, "--group", "nonmember",
                    "--queue-id", "3", "--offset", "0", "--max", "2")
        assert shown.returncode != 0 and b"live member" in shown.stderr
        assert [ConsumerOffsets(store.root).get(topic, "nonmember", q) for q in (3, 5)] == [10, 10]
    with Consumer(store.root, "nonmember") as outsider:  # the member left: no one owns queue 5
        outsider.commit(topic, 5, 1)
        assert outsider.committed(topic, 5) == 1


def test_a_seek_moves_only_the_members_own_queues_and_never_rewinds_one_it_gets_later(store):
    topic = "SeekGain"
    send(store, topic, 10)
    x, y = Consumer(store.root, "seekgain"), Consumer(store.root, "seekgain")
    try:
        split_between(topic, x, y)
        theirs = y.assignment(topic)
        for queue_id in theirs:
            y.commit(topic, queue_id, 10)  # y handled all of its queues
        mine = x.assignment(topic)
        moved = x.seek_to_time(topic, 0)  # x replays its own queues
        assert len(list(x.iterate(topic, poll_timeout_ms=200))) == 10 * len(mine)
        y.close()
        wait_for(lambda: x.assignment(topic) == list(range(QUEUES)), "x owns every queue")
        assert [r for r in x.iterate(topic, poll_timeout_ms=300) if r.queue_id in theirs] == []
        assert sorted(moved) == mine  # what the seek moved
    finally:
        x.close()
        y.close()


def test_a_topic_delete_forgets_broadcast_offsets_and_reset_reaches_them(store):
    topic = "ReBroadcast"
    send(store, topic, 2)
    with Consumer(store.root, "rebc", model=MessageModel.BROADCASTING, instance_name="b1") as reader:
        assert len(list(reader.iterate(topic, poll_timeout_ms=100))) == 2 * QUEUES
    for args in (("delete", "--topic", topic), ("create", "--topic", topic, "--queues", str(QUEUES))):
        done = cli("topic", *args, "--store", str(store.root))
        assert done.returncode == 0, done.stderr.decode()
    send(store, topic, 3)
    with Consumer(store.root, "rebc", model=MessageModel.BROADCASTING, instance_name="b1") as reader:
        assert len(list(reader.iterate(topic, poll_timeout_ms=100))) == 3 * QUEUES  # from offset 0
    reset = cli("groups", "--reset", "--group", "rebc", "--topic", topic, "--to", "earliest",
                "--store", str(store.root))
    assert reset.returncode == 0, reset.stderr.decode()
    with Consumer(store.root, "rebc", model=MessageModel.BROADCASTING, instance_name="b1") as reader:
        assert reader.committed(topic, 0) == 0
