"""ipc.Producer against a real supervisor: concurrency, ordering, crashes, bad input, limits
(sends from the caller's thread: test_slot_sender.py)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import threading
import time

import pytest

from engine.errors import (
    FormatVersionError,
    NotAStoreError,
    ServiceNotAvailableError,
    StorePermissionError,
)
from engine.formats.record import encode_record
from engine.message import Message
from engine.refusal import Refusal
from engine.status import PutStatus
from ipc.consumer import Consumer
from ipc.control_block import Role
from ipc.mailbox import REFUSAL_DTYPE, Mailbox, ProducerSlot, RequestFlag
from ipc.producer import Producer
from ipc.run_info import run_dir
from ipc.shm import region_name
from tests.workers.store_harness import (
    PRODUCER_SCRIPT,
    assert_check_clean,
    claimed_producer_slots,
    module_store,
    read_acks,
    spawn_python,
    start_store,
    wait_for,
)

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    yield from module_store(tmp_path_factory.mktemp("producer") / "store")


def drain_queue(consumer: Consumer, topic: str, queue_id: int) -> list:
    records, offset = [], 0
    while True:
        result = consumer.pull(topic, queue_id, offset, 512)
        if not result.messages:
            return records
        records += result.messages
        offset = result.next_offset


def test_eight_producer_processes_every_ack_readable_once_in_order(store):
    count = 400
    procs = [spawn_python(PRODUCER_SCRIPT, str(store.root), f"p{i}", str(count), str(1 + i * 9), "EIGHT")
             for i in range(8)]
    acked = []
    for proc in procs:
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err.decode()
        acks = read_acks(out)
        assert len(acks) == count and {a[1] for a in acks} == {"PUT_OK"}
        acked += acks
    store.wait_caught_up()
    with Consumer(store.root, "eight") as consumer:
        seen = {}
        for queue_id in range(4):
            for record in drain_queue(consumer, "EIGHT", queue_id):
                assert record.body.decode() not in seen, "duplicate"
                seen[record.body.decode()] = (record.queue_id, record.queue_offset, record.commit_pos,
                                              record.msg_id)
    assert len(seen) == len(acked)  # nothing unacknowledged slipped in
    for key, _status, queue_id, queue_offset, commit_pos, msg_id in acked:
        assert seen[key] == (queue_id, queue_offset, commit_pos, msg_id)
    for producer in range(8):  # send order per producer and queue
        mine = [a for a in acked if a[0].startswith(f"p{producer}-")]
        for queue_id in range(4):
            offsets = [a[3] for a in mine if a[2] == queue_id]
            assert offsets == sorted(offsets)


SIXTEEN = """
import os, sys, time
from ipc.producer import Producer
store, go = sys.argv[1], sys.argv[2]
with Producer(store) as producer:
    while not os.path.exists(go):
        time.sleep(0.01)
    results = [producer.send("SIXTEEN", f"{os.getpid()}-{i}".encode()) for i in range(10)]
    print(sum(r.ok for r in results))
"""


def test_sixteen_producer_processes_at_once(store, tmp_path):
    go = tmp_path / "go"
    procs = [spawn_python(SIXTEEN, str(store.root), str(go)) for _ in range(16)]
    try:
        wait_for(lambda: claimed_producer_slots(store.root) >= 16, "16 producers connected at once")
    finally:
        go.touch()
    for proc in procs:
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err.decode()
        assert out.decode().strip() == "10"


def test_send_async_from_many_threads_coalesces_requests(store):
    with Producer(store.root) as producer:
        slot = producer._sender.slot.index
        mailbox = producer._sender.mailbox
        seq_before = int(mailbox.req_seq[slot])
        futures = []

        def worker(t):
            for i in range(100):
                futures.append((t, producer.send_async("ASYNC", f"{t}-{i}".encode(), queue_id=t % 4)))

        threads = [threading.Thread(target=worker, args=(t,)) for t in range(8)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        results = [(t, f.result(timeout=30)) for t, f in futures]
        requests = int(mailbox.req_seq[slot]) - seq_before
    assert {r.status for _, r in results} == {PutStatus.PUT_OK}
    assert requests < len(results) / 4, requests  # coalesced, not one request per message
    for t in range(8):  # per thread, send order is queue order
        offsets = [r.queue_offset for owner, r in results if owner == t]
        assert len(offsets) == 100 and offsets == sorted(offsets)


def test_round_robin_and_explicit_queue(store):
    with Producer(store.root) as producer:
        ids = [producer.send("RR", b"x").queue_id for _ in range(8)]
        assert ids == [0, 1, 2, 3, 0, 1, 2, 3]
        assert producer.send("RR", b"x", queue_id=2).queue_id == 2


@pytest.mark.parametrize("kwargs,status,words", [
    ({"topic": "a/b"}, PutStatus.MESSAGE_ILLEGAL, "invalid topic"),
    ({"topic": ""}, PutStatus.MESSAGE_ILLEGAL, "must not be empty"),
    ({"topic": "x" * 200}, PutStatus.MESSAGE_ILLEGAL, "longer than 127"),
    ({"body": b"x" * 9000}, PutStatus.MESSAGE_ILLEGAL, "exceeds the maximum of 8192"),
    ({"queue_id": 4}, PutStatus.MESSAGE_ILLEGAL, "outside 0..3"),
    ({"queue_id": -1}, PutStatus.MESSAGE_ILLEGAL, "outside 0..3"),
    ({"keys": ("bad\udcffkey",)}, PutStatus.MESSAGE_ILLEGAL, "not valid UTF-8"),
    ({"tags": "bad\udcfftag"}, PutStatus.MESSAGE_ILLEGAL, "not valid UTF-8"),
    ({"keys": ("two words",)}, PutStatus.MESSAGE_ILLEGAL, "no spaces"),
    ({"keys": None}, PutStatus.MESSAGE_ILLEGAL, "must be a str or an iterable of str"),
    ({"properties": {"UNIQ_KEY": "x"}}, PutStatus.MESSAGE_ILLEGAL, "set by the store"),
    ({"properties": {"big": "v" * 40000}}, PutStatus.PROPERTIES_SIZE_EXCEEDED, "exceed 32767"),
])
def test_bad_input_gets_a_status_and_changes_nothing(store, kwargs, status, words):
    args = {"topic": "BAD", "body": b"x", **kwargs}
    with Producer(store.root) as producer, store.ctl() as ctl:
        before = ctl.written_pos
        result = producer.send(args.pop("topic"), args.pop("body"), **args)
        assert result.status is status and words in result.reason, result
        assert ctl.written_pos == before


def test_garbage_request_is_refused_by_the_supervisor(store):
    """A buggy producer bypassing the encoder: MESSAGE_ILLEGAL, nothing reaches the log."""
    good = encode_record("GARBAGE", b"ok", queue_id=0, properties={}, born_ts_ms=1,
                         born_host=("127.0.0.1", 1), store_host=("127.0.0.1", 10911))
    garbage = bytearray(good)
    garbage[8:12] = b"\xff\xff\xff\x7f"  # a wrong BODYCRC
    with store.ctl() as ctl:
        mailbox = Mailbox.attach(store.root)
        slot = ProducerSlot.claim(mailbox, run_dir(store.root), alive=ctl.supervisor_alive)
        try:
            before = ctl.written_pos
            seq = slot.write_request([bytes(garbage), bytes(good)], flags=RequestFlag.WAIT_FOR_FLUSH)
            results = slot.wait_response(seq, 10, ctl.supervisor_alive)
            assert [PutStatus(s) for s in results["status"]] == [PutStatus.MESSAGE_ILLEGAL, PutStatus.PUT_OK]
            assert results.view(REFUSAL_DTYPE)["refusal"][0] == Refusal.BODY_CRC  # the row says why
            assert ctl.written_pos == before + len(good)
            seq = slot.write_request(b"\x00\x00\x00\x09garbage!", count=1)  # framing garbage
            results = slot.wait_response(seq, 10, ctl.supervisor_alive)
            assert PutStatus(results["status"][0]) is PutStatus.MESSAGE_ILLEGAL
            assert results.view(REFUSAL_DTYPE)["refusal"][0] == Refusal.MALFORMED_REQUEST
            assert ctl.written_pos == before + len(good)
        finally:
            slot.release()
            mailbox.close()



def test_a_record_the_supervisor_refuses_carries_its_reason_to_the_producer(tmp_path):
    """A body within max_body_bytes whose properties make the record too big for a segment
    passes the producer's checks; the supervisor's refusal names why, in the producer's error."""
    running = start_store(tmp_path / "store", store={"max_body_bytes": 60_000})  # 64 KiB segments
    try:
        with Producer(running.root) as producer, running.ctl() as ctl:
            before = ctl.written_pos
            result = producer.send("BIG", b"b" * 60_000, properties={"big": "v" * 8000})
            assert result.status is PutStatus.MESSAGE_ILLEGAL
            assert "does not fit a commitlog segment, which holds records of at most" in result.reason
            assert ctl.written_pos == before
            assert producer.send("BIG", b"b" * 60_000).ok  # the limit itself fits
    finally:
        assert running.stop() == 0
    assert_check_clean(running.root)


def test_transaction_half_and_rollback_records_are_refused_and_the_store_stays_up(store):
    """PREPARED and ROLLBACK records (which enter no consume queue) get MESSAGE_ILLEGAL; a COMMIT
    record is a message; the messages around them keep consecutive queue offsets, the
    dispatcher stays up and every acknowledged one can be consumed."""
    def raw(sys_flag: int, body: bytes) -> bytes:
        return encode_record("TXFLAGS", body, queue_id=1, properties={}, born_ts_ms=1,
                             born_host=("127.0.0.1", 1), store_host=("127.0.0.1", 10911),
                             sys_flag=sys_flag)
    flags = {"plain": 0, "prepared": 0x4, "commit": 0x8, "rollback": 0xC, "prepared+bits": 0x4C7}
    with store.ctl() as ctl:
        dispatcher = store.child_pid(Role.DISPATCHER)
        mailbox = Mailbox.attach(store.root)
        slot = ProducerSlot.claim(mailbox, run_dir(store.root), alive=ctl.supervisor_alive)
        try:
            seq = slot.write_request([raw(f, name.encode()) for name, f in flags.items()],
                                     flags=RequestFlag.WAIT_FOR_FLUSH)
            statuses = [PutStatus(s) for s in slot.wait_response(seq, 10, ctl.supervisor_alive)["status"]]
        finally:
            slot.release()
            mailbox.close()
    assert statuses == [PutStatus.PUT_OK, PutStatus.MESSAGE_ILLEGAL, PutStatus.PUT_OK,
                        PutStatus.MESSAGE_ILLEGAL, PutStatus.MESSAGE_ILLEGAL]
    with Producer(store.root) as producer:
        assert producer.send("TXFLAGS", b"after", queue_id=1).status is PutStatus.PUT_OK
    store.wait_caught_up()
    with Consumer(store.root, "txflags") as consumer:
        bodies = [m.body for m in drain_queue(consumer, "TXFLAGS", 1)]
    assert bodies == [b"plain", b"commit", b"after"]
    assert store.child_pid(Role.DISPATCHER) == dispatcher  # never stopped on a gap


KILL_MID_STAGE = """
import os, signal, sys
from ipc.control_block import ControlBlock
from ipc.mailbox import Mailbox, ProducerSlot
from ipc.run_info import run_dir
from engine.formats.record import encode_record
store = sys.argv[1]
ctl = ControlBlock.attach(store)
slot = ProducerSlot.claim(Mailbox.attach(store), run_dir(store), alive=ctl.supervisor_alive)
record = encode_record("HALF", b"never", queue_id=0, born_ts_ms=1, born_host=("127.0.0.1", 1),
                       store_host=("127.0.0.1", 10911))
slot.stage_request([record] * 50)  # copied into shared memory, not yet published ...
print(slot.index, flush=True)
os.kill(os.getpid(), signal.SIGKILL)  # ... and the producer dies before publishing
"""


def test_producer_killed_mid_request_leaves_nothing(store):
    with store.ctl() as ctl:
        before = ctl.written_pos
    proc = spawn_python(KILL_MID_STAGE, str(store.root))
    proc.communicate(timeout=30)
    assert proc.returncode == -signal.SIGKILL
    time.sleep(0.2)  # give a (wrong) supervisor the chance to pick something up
    with store.ctl() as ctl:
        assert ctl.written_pos == before
    # producers killed at random moments under load: never a partial record
    procs = [spawn_python(PRODUCER_SCRIPT, str(store.root), f"k{i}", "100000", "32", "KILLED")
             for i in range(3)]
    wait_for(lambda: store.positions().written_pos > before + 50_000, "load")
    for i, proc in enumerate(procs):
        time.sleep(0.05 * i)
        proc.kill()
        proc.wait()
    with Producer(store.root) as producer:  # the dead producers' slots are free again
        assert producer.send("KILLED", b"after").ok
    store.wait_caught_up()


def test_bounded_queue_answers_busy_when_the_supervisor_is_behind(store):
    body = b"x" * 3000
    with Producer(store.root, max_pending_bytes=4000, enqueue_timeout_s=0.2) as producer:
        os.kill(store.proc.pid, signal.SIGSTOP)
        try:
            first = producer.send_async("BUSY", body)  # taken by the sender, in flight
            wait_for(lambda: not producer._sender.queue, "the sender to take the first message")
            second = producer.send_async("BUSY", body)  # waits in the local queue
            started = time.monotonic()
            third = producer.send_async("BUSY", body)  # no room: waits 0.2 s, then a status
            assert time.monotonic() - started >= 0.19
            result = third.result(timeout=5)
            assert result.status is PutStatus.OS_PAGE_CACHE_BUSY and "behind" in result.reason
        finally:
            os.kill(store.proc.pid, signal.SIGCONT)
        assert first.result(timeout=30).ok and second.result(timeout=30).ok


def test_shared_memory_of_another_user_is_refused_without_attaching(store):
    name = "/dev/shm/" + region_name(store.root, "ctl").lstrip("/")
    os.chown(name, 65534, 65534)
    try:
        with pytest.raises(StorePermissionError, match="belongs to uid 65534"):
            Producer(store.root)
    finally:
        os.chown(name, os.getuid(), os.getgid())


def test_store_of_another_user_is_a_permission_error(store):
    """A process of another uid (nobody) cannot even look into the owner-only store."""
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - child
        os.close(read_fd)
        try:
            os.setgid(65534)
            os.setuid(65534)
            try:
                Producer(store.root)
                outcome = "attached"
            except StorePermissionError as exc:
                outcome = f"permission: {exc}"
            except BaseException as exc:
                outcome = f"other: {exc!r}"
            os.write(write_fd, outcome.encode())
        finally:
            os._exit(0)
    os.close(write_fd)
    with os.fdopen(read_fd, "rb") as pipe:
        outcome = pipe.read().decode()
    os.waitpid(pid, 0)
    assert outcome.startswith("permission: no permission to read the store directory"), outcome


def test_not_a_store_and_newer_format_are_refused(tmp_path):
    junk = tmp_path / "junk"
    junk.mkdir()
    (junk / "notes.txt").write_text("hello")
    with pytest.raises(NotAStoreError):
        Producer(junk)
    newer = tmp_path / "newer"
    newer.mkdir()
    (newer / "store.json").write_text(json.dumps({
        "format_version": 99, "commitlog_file_size": 65536, "consume_queue_entries": 500,
        "index_slot_count": 64, "index_entry_count": 256, "index_shards": 2,
        "checksum": "crc32c", "store_host": "127.0.0.1:10911"}))
    with pytest.raises(FormatVersionError):
        Producer(newer)


def test_producer_against_stopped_store_fails_fast(tmp_path):
    running = start_store(tmp_path / "store")
    assert running.stop() == 0
    started = time.monotonic()
    with pytest.raises(ServiceNotAvailableError, match="no supervisor runs"):
        Producer(running.root)
    with pytest.raises(ServiceNotAvailableError):
        Consumer(running.root, "g")
    with pytest.raises(ServiceNotAvailableError):
        Producer(tmp_path / "empty-dir-never-started")
    assert time.monotonic() - started < 1.0


def test_send_batch_mixed_good_and_bad(store):
    with Producer(store.root) as producer:
        results = producer.send_batch([Message("MIX", b"a"), Message("bad/topic", b"b"),
                                       Message("MIX", b"c", wait=False), "not a message"])
    assert [r.status for r in results] == [PutStatus.PUT_OK, PutStatus.MESSAGE_ILLEGAL,
                                           PutStatus.PUT_OK, PutStatus.MESSAGE_ILLEGAL]
    assert results[0].queue_offset is not None and results[2].msg_id


@pytest.fixture
def small_filesystem(tmp_path):
    mount_point = tmp_path / "fs"
    mount_point.mkdir()
    result = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=8M,mode=0700", "tmpfs",
                             str(mount_point)], capture_output=True)
    if result.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs here: {result.stderr.decode().strip()}")
    yield mount_point
    subprocess.run(["umount", "-l", str(mount_point)], check=False)


def test_full_disk_is_a_status_and_writes_resume_when_space_returns(small_filesystem):
    store = start_store(small_filesystem / "store")
    try:
        with Producer(store.root) as producer:
            assert producer.send("DISK", b"before").ok
            stats = os.statvfs(small_filesystem)
            junk = small_filesystem / "junk"
            junk.write_bytes(b"\0" * int(stats.f_bavail * stats.f_frsize * 0.97))
            full = wait_for(lambda: (r := producer.send("DISK", b"no room")).status
                            is PutStatus.DISK_FULL and r, "DISK_FULL")
            assert not full.status.is_stored and "disk is full" in full.reason
            with store.ctl() as ctl:
                before = ctl.written_pos
                assert producer.send("DISK", b"refused").status is PutStatus.DISK_FULL
                assert ctl.written_pos == before  # nothing written while full
            junk.unlink()
            assert wait_for(lambda: producer.send("DISK", b"room again").ok, "writes to resume")
    finally:
        assert store.stop() == 0
    assert_check_clean(store.root)
