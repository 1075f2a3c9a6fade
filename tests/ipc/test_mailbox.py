"""Mailbox: many producer processes, exact in-order results, crash points, dead supervisor."""

from __future__ import annotations

import multiprocessing
import os
import random
import signal
import struct
import time

import numpy as np
import pytest

from engine.errors import BadInputError, ServiceNotAvailableError, StoreError
from ipc.control_block import pid_alive
from ipc.mailbox import (
    RESULT_DTYPE,
    RESULT_ROW,
    Mailbox,
    MailboxServer,
    ProducerSlot,
    RequestFlag,
    split_records,
)
from ipc.shm import SHM_DIR, issue_shm_token, store_prefix, unlink_stale_regions
from ipc.slot_claim import is_slot_owner_alive
from ipc.wakeup import unlink_all

SPAWN = multiprocessing.get_context("spawn")
RECORD_HEAD = struct.Struct(">IHII")  # TOTALSIZE, producer id, batch number, record number
PRODUCER_COUNT = 8
BATCH_COUNT = 200
SMALL = {"slot_count": 8, "data_bytes": 256 * 1024, "max_batch": 64}


@pytest.fixture
def store_dir(tmp_path):
    issue_shm_token(tmp_path)  # what a supervisor does before creating its regions
    yield tmp_path
    unlink_stale_regions(tmp_path)
    unlink_all(tmp_path)


def wait_until(condition, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout_s}s waiting for {what}")
        time.sleep(0.001)


def leftovers(store_dir) -> list[str]:
    """Regions and semaphores of this store still named in /dev/shm."""
    hash_part = store_prefix(store_dir)[1:]
    return [e for e in os.listdir(SHM_DIR) if e.startswith((hash_part, "sem." + hash_part))]


def make_record(producer: int, batch: int, number: int, body_bytes: int) -> bytes:
    body = bytes([(producer * 31 + batch * 7 + number) % 251]) * body_bytes
    return RECORD_HEAD.pack(RECORD_HEAD.size + body_bytes, producer, batch, number) + body


def parse_record(record: memoryview) -> tuple[int, int, int]:
    size, producer, batch, number = RECORD_HEAD.unpack_from(record)
    assert len(record) == size
    expected = bytes([(producer * 31 + batch * 7 + number) % 251]) * (size - RECORD_HEAD.size)
    assert record[RECORD_HEAD.size:] == expected, "record bytes damaged in transit"
    return producer, batch, number


def serve(server: MailboxServer, state: dict) -> int:
    """Answer every pending request: queue_id = producer, queue_offset = batch*1000+number."""
    answered = 0
    for request in server.pending_slots():
        results = np.zeros(request.count, RESULT_DTYPE)
        for i, record in enumerate(split_records(request.data, request.count)):
            producer, batch, number = parse_record(record)
            results[i] = (0, producer, state["commit_pos"], batch * 1000 + number,
                          request.seq)
            state["commit_pos"] += len(record)
        server.complete(request.slot_index, request.seq, results)
        answered += 1
    return answered


# -- children --------------------------------------------------------------------------------------

def child_producer(store_dir: str, run_dir: str, producer: int, server_pid: int) -> None:
    rng = random.Random(producer)
    mailbox = Mailbox.attach(store_dir)
    alive = lambda: pid_alive(server_pid)  # noqa: E731
    slot = ProducerSlot.claim(mailbox, run_dir, alive=alive)
    last_commit_pos = -1
    for batch in range(BATCH_COUNT):
        count = rng.randint(1, SMALL["max_batch"])
        records = [make_record(producer, batch, n, rng.randint(0, 3000)) for n in range(count)]
        flags = RequestFlag.WAIT_FOR_FLUSH if batch % 2 else RequestFlag.NONE
        seq = slot.write_request(records, flags=flags)
        results = slot.wait_response(seq, 30, alive)
        assert len(results) == count
        assert (results["queue_id"] == producer).all()
        assert results["queue_offset"].tolist() == [batch * 1000 + n for n in range(count)]
        assert (results["store_ts_ms"] == seq).all()
        assert results["commit_pos"][0] > last_commit_pos
        assert (np.diff(results["commit_pos"]) > 0).all()
        last_commit_pos = int(results["commit_pos"][-1])
    slot.release()
    mailbox.close()


def child_stage_then_hang(store_dir: str, run_dir: str, staged, publish: bool) -> None:
    mailbox = Mailbox.attach(store_dir)
    slot = ProducerSlot.claim(mailbox, run_dir, alive=lambda: True)
    slot.stage_request([make_record(9, 9, 0, 100), make_record(9, 9, 1, 100)])
    if publish:
        slot.publish_request()
    staged.set()
    time.sleep(3600)  # killed here by the test


def child_supervisor(store_dir: str, ready, answered_one) -> None:
    server = MailboxServer.create(store_dir, **SMALL)
    ready.set()
    state = {"commit_pos": 0}
    while not serve(server, state):
        server.wait_for_requests(0.05)
    answered_one.set()
    time.sleep(3600)  # killed here by the test


# -- tests -----------------------------------------------------------------------------------------

@pytest.mark.slow
def test_mailbox_eight_producers_each_receive_exactly_their_results_in_order(store_dir):
    server = MailboxServer.create(store_dir, **SMALL)
    run_dir = store_dir / "run"
    producers = [SPAWN.Process(target=child_producer,
                               args=(str(store_dir), str(run_dir), p, os.getpid()))
                 for p in range(PRODUCER_COUNT)]
    for proc in producers:
        proc.start()
    state, answered = {"commit_pos": 0}, 0
    deadline = time.monotonic() + 120
    while any(proc.is_alive() for proc in producers) and time.monotonic() < deadline:
        server.wait_for_requests(0.05)
        answered += serve(server, state)
    for proc in producers:
        proc.join(5)
        assert proc.exitcode == 0, f"producer {proc.pid} failed"
    assert answered == PRODUCER_COUNT * BATCH_COUNT
    assert server.pending_slots() == []
    assert len(leftovers(store_dir)) == 1 + 1 + SMALL["slot_count"]
    server.close()
    server.unlink()
    assert leftovers(store_dir) == []


def test_producer_killed_before_publish_leaves_no_visible_request(store_dir):
    server = MailboxServer.create(store_dir, slot_count=1, data_bytes=4096, max_batch=8)
    run_dir = store_dir / "run"
    staged = SPAWN.Event()
    child = SPAWN.Process(target=child_stage_then_hang,
                          args=(str(store_dir), str(run_dir), staged, False))
    child.start()
    assert staged.wait(30), "child never staged its request"
    assert is_slot_owner_alive(run_dir, 0)
    assert server.mailbox.owner_pid[0] == child.pid
    os.kill(child.pid, signal.SIGKILL)
    child.join(10)
    assert not is_slot_owner_alive(run_dir, 0)
    assert server.pending_slots() == []
    assert int(server.mailbox.req_seq[0]) == 0
    with ProducerSlot.claim(server.mailbox, run_dir, alive=lambda: True) as slot:
        record = make_record(1, 2, 0, 10)
        seq = slot.write_request([record])
        (request,) = server.pending_slots()
        assert (request.slot_index, request.seq, request.count) == (0, seq, 1)
        assert bytes(request.data) == record  # nothing of the dead producer's batch
        assert request.owner_pid == os.getpid()
        server.complete(0, seq, [(0, 1, 500, 7, 1)])
        assert slot.wait_response(seq, 5, lambda: True)["commit_pos"].tolist() == [500]
    server.close()
    server.unlink()


def test_producer_killed_after_publish_request_is_whole_and_slot_waits_for_it(store_dir):
    server = MailboxServer.create(store_dir, slot_count=1, data_bytes=4096, max_batch=8)
    run_dir = store_dir / "run"
    staged = SPAWN.Event()
    child = SPAWN.Process(target=child_stage_then_hang,
                          args=(str(store_dir), str(run_dir), staged, True))
    child.start()
    assert staged.wait(30), "child never published its request"
    os.kill(child.pid, signal.SIGKILL)
    child.join(10)
    (request,) = server.pending_slots()
    assert [parse_record(r) for r in split_records(request.data, request.count)] == [
        (9, 9, 0), (9, 9, 1)]
    with pytest.raises(ServiceNotAvailableError, match="no answer"):
        ProducerSlot.claim(server.mailbox, run_dir, alive=lambda: True, timeout_s=0.2)
    server.complete(0, request.seq, [(0, 9, 0, 0, 0), (0, 9, 1, 1, 0)])
    with ProducerSlot.claim(server.mailbox, run_dir, alive=lambda: True, timeout_s=5) as slot:
        seq = slot.write_request([make_record(1, 1, 1, 1)])
        assert seq == request.seq + 1
        server.complete(0, seq, [(0, 1, 2, 3, 4)])
        assert len(slot.wait_response(seq, 5, lambda: True)) == 1
    server.close()
    server.unlink()


def test_claim_prefers_a_slot_without_a_request_in_flight(store_dir):
    server = MailboxServer.create(store_dir, slot_count=2, data_bytes=4096, max_batch=8)
    run_dir = store_dir / "run"
    first = ProducerSlot.claim(server.mailbox, run_dir, alive=lambda: True)
    seq = first.write_request([make_record(1, 0, 0, 10)])
    first.release()  # gives up on the answer, e.g. after a timeout; the request stays in flight
    second = ProducerSlot.claim(server.mailbox, run_dir, alive=lambda: True, timeout_s=0.2)
    assert second.index != first.index  # the same start index (our pid), but it was skipped
    (request,) = server.pending_slots()
    assert (request.slot_index, request.seq) == (first.index, seq)
    second.release()
    server.close()
    server.unlink()


def test_wait_response_raises_promptly_when_supervisor_dies(store_dir):
    ready, answered_one = SPAWN.Event(), SPAWN.Event()
    supervisor = SPAWN.Process(target=child_supervisor, args=(str(store_dir), ready,
                                                              answered_one))
    supervisor.start()
    assert ready.wait(30), "supervisor child never created the mailbox"
    alive = supervisor.is_alive
    mailbox = Mailbox.attach(store_dir)
    slot = ProducerSlot.claim(mailbox, store_dir / "run", alive=alive)
    seq = slot.write_request([make_record(1, 0, 0, 50)])
    assert len(slot.wait_response(seq, 30, alive)) == 1  # the live supervisor answers
    assert answered_one.wait(30)
    seq = slot.write_request([make_record(1, 1, 0, 50)])
    os.kill(supervisor.pid, signal.SIGKILL)
    started = time.monotonic()
    with pytest.raises(ServiceNotAvailableError, match="exited before answering"):
        slot.wait_response(seq, 30, alive)
    assert time.monotonic() - started < 2.0
    supervisor.join(10)
    slot.release()
    mailbox.close()


def test_stage_request_rejects_bad_batches_and_a_second_request_in_flight(store_dir):
    server = MailboxServer.create(store_dir, slot_count=1, data_bytes=1024, max_batch=4)
    with ProducerSlot.claim(server.mailbox, store_dir / "run", alive=lambda: True) as slot:
        with pytest.raises(BadInputError, match="exceed"):
            slot.write_request([make_record(0, 0, 0, 2000)])
        with pytest.raises(BadInputError, match="a batch holds"):
            slot.write_request([make_record(0, 0, n, 1) for n in range(5)])
        with pytest.raises(BadInputError, match="required"):
            slot.write_request(make_record(0, 0, 0, 1))
        with pytest.raises(StoreError, match="no staged request"):
            slot.publish_request()
        joined = make_record(0, 0, 0, 1) + make_record(0, 0, 1, 2)
        seq = slot.write_request(joined, count=2, flags=RequestFlag.WAIT_FOR_FLUSH)
        with pytest.raises(StoreError, match="in flight"):
            slot.write_request([make_record(0, 0, 2, 1)])
        (request,) = server.pending_slots()
        assert request.flags is RequestFlag.WAIT_FOR_FLUSH and bytes(request.data) == joined
        server.complete(0, seq, [(0, 0, 0, 0, 0), (0, 0, 1, 1, 0)])
        assert slot.wait_response(seq, 5, lambda: True)["commit_pos"].tolist() == [0, 1]
    server.close()
    server.unlink()


@pytest.mark.parametrize("field,value", [("req_count", 0), ("req_count", 3), ("req_count", 2**32 - 1),
                                         ("req_seq", 0), ("req_seq", 2**63 - 1), ("resp_seq", 2**63 - 1)])
def test_a_header_rewritten_after_publishing_cannot_make_the_server_raise(store_dir, field, value):
    """The slot header is the producer's memory: a buggy or hostile producer that rewrites it
    between pending_slots and complete still gets its answer (as many results as were read),
    and the supervisor's complete never raises (it did, and the supervisor exited)."""
    server = MailboxServer.create(store_dir, slot_count=1, data_bytes=1024, max_batch=4)
    with ProducerSlot.claim(server.mailbox, store_dir / "run", alive=lambda: True) as slot:
        seq = slot.write_request([make_record(0, 0, 0, 1), make_record(0, 0, 1, 2)])
        (request,) = server.pending_slots()
        getattr(server.mailbox, field)[0] = value
        server.complete(0, request.seq, [(0, 0, 0, 0, 0), (0, 0, 1, 1, 0)])
        assert int(server.mailbox.resp_seq[0]) == seq and int(server.mailbox.resp_count[0]) == 2
    server.close()
    server.unlink()


def test_malformed_request_is_answered_empty_and_producer_sees_rejection(store_dir):
    server = MailboxServer.create(store_dir, slot_count=1, data_bytes=1024, max_batch=4)
    with ProducerSlot.claim(server.mailbox, store_dir / "run", alive=lambda: True) as slot:
        slot.stage_request([make_record(0, 0, 0, 1)])
        server.mailbox.req_bytes[0] = 5000  # a buggy producer overstates its data
        seq = slot.publish_request()
        assert server.pending_slots() == []
        with pytest.raises(StoreError, match="rejected"):
            slot.wait_response(seq, 5, lambda: True)
    server.close()
    server.unlink()


def test_split_records_rejects_inconsistent_framing():
    good = make_record(0, 0, 0, 3) + make_record(0, 0, 1, 4)
    assert [len(r) for r in split_records(memoryview(good), 2)] == [17, 18]
    for data, count in ((good, 3), (good, 1), (good[:-1], 2), (b"\0\0\0\2", 1)):
        with pytest.raises(BadInputError):
            split_records(memoryview(data), count)


def test_attach_without_supervisor_raises_service_not_available(store_dir):
    with pytest.raises(ServiceNotAvailableError):
        Mailbox.attach(store_dir)


def test_wait_response_gives_a_private_writable_copy_of_its_rows(store_dir):
    server = MailboxServer.create(store_dir, slot_count=2, data_bytes=4096, max_batch=8)
    with ProducerSlot.claim(server.mailbox, store_dir / "run", alive=lambda: True) as slot:
        seq = slot.write_request([make_record(1, 0, 0, 10), make_record(1, 0, 1, 10)])
        server.complete(slot.index, seq, [(0, 1, 500, 7, 1), (0, 1, 600, 8, 1)])
        first = slot.wait_response(seq, 5, lambda: True)
        seq = slot.write_request([make_record(1, 1, 0, 10)])
        server.complete(slot.index, seq, [(2, 0, 0, 0, 0)])
        second = slot.wait_response(seq, 5, lambda: True)
    assert first.dtype == RESULT_DTYPE and first["commit_pos"].tolist() == [500, 600]
    assert first["queue_offset"].tolist() == [7, 8] and second["status"].tolist() == [2]
    first["status"][0] = 3  # the producer's own rows (BatchResultBuilder writes into them)
    assert server.mailbox.results[slot.index]["status"][0] == 2
    server.close()
    server.unlink()


def test_complete_rows_answers_as_complete_does_and_refuses_partial_or_too_many_rows(store_dir):
    """The packed answer (RESULT_ROW after RESULT_ROW) reads back as the same RESULT_DTYPE rows
    as complete()'s; rows that are not whole, or more than a batch holds, raise and answer nothing."""
    server = MailboxServer.create(store_dir, slot_count=2, data_bytes=4096, max_batch=2)
    rows = [(0, 1, 500, 7, 1_700_000_000_001), (1, 3, 2**40, 2**33, -1)]
    with ProducerSlot.claim(server.mailbox, store_dir / "run", alive=lambda: True) as slot:
        seq = slot.write_request([make_record(1, 0, 0, 10), make_record(1, 0, 1, 10)])
        packed = b"".join(RESULT_ROW.pack(*row) for row in rows)
        for bad in (packed[:-1], packed + RESULT_ROW.pack(*rows[0])):
            with pytest.raises(ValueError, match="results for slot"):
                server.complete_rows(slot.index, seq, bad)
        assert not server.is_answered(slot.index, seq)
        server.complete_rows(slot.index, seq, bytearray(packed))
        packed_answer = slot.wait_response(seq, 5, lambda: True)
        seq = slot.write_request([make_record(1, 1, 0, 10), make_record(1, 1, 1, 10)])
        server.complete(slot.index, seq, rows)
        answer = slot.wait_response(seq, 5, lambda: True)
    assert packed_answer.tobytes() == answer.tobytes() and packed_answer.tolist() == rows
    server.close()
    server.unlink()
