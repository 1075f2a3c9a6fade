"""One sweep, many requests: the appender checks each request on its own and appends the good
records of all of them with one write. Each request still gets exactly its own answer rows;
a malformed request or a bad record refuses only itself; queue offsets and commit positions
follow slot order. The supervisor is stopped (SIGSTOP) while the requests are published, so its
next sweep finds them all at once."""

from __future__ import annotations

import os
import signal
import struct

import numpy as np
import pytest

from engine.files.mapped_file import Access
from engine.formats.record import BODY_CRC_OFFSET, encode_record
from engine.log.commitlog import CommitLog
from engine.status import PutStatus
from ipc.mailbox import Mailbox, ProducerSlot, RequestFlag
from ipc.run_info import run_dir
from tests.workers.store_harness import assert_check_clean, start_store

SEGMENT_BYTES = 1 << 20


def record(body: bytes, queue_id: int) -> bytes:
    return bytes(encode_record("SWEEP", body, queue_id=queue_id, properties={"KEYS": body.decode()},
                               born_ts_ms=1, born_host=("127.0.0.1", 1), store_host=("127.0.0.1", 2),
                               max_body_bytes=1 << 20))


def bad_crc(raw: bytes) -> bytes:
    damaged = bytearray(raw)
    struct.pack_into(">i", damaged, BODY_CRC_OFFSET, 12345)
    return bytes(damaged)


def test_requests_of_one_sweep_are_appended_together_and_answered_apart(tmp_path):
    a = [record(f"a{i}".encode(), 1) for i in range(30)]       # checked as a batch, waits
    c = [record(f"c{i}".encode(), 1) for i in range(4)]        # one bad record, does not wait
    c[2] = bad_crc(c[2])
    d = [record(f"d{i}".encode(), i % 2) for i in range(3)]    # queues 0 and 1
    requests = [(a, len(a), RequestFlag.WAIT_FOR_FLUSH),
                ([record(b"b0", 1), record(b"b1", 1)], 3, RequestFlag.WAIT_FOR_FLUSH),  # framing broken
                (c, len(c), RequestFlag.NONE),
                (d, len(d), RequestFlag.WAIT_FOR_FLUSH)]
    running = start_store(tmp_path / "store", store={"commitlog_file_size": SEGMENT_BYTES})
    try:
        before, answers, slot_indexes, written = sweep_of(running, requests)
        # claims start at pid % slot count and wrap: slot order need not be request order
        in_slot_order = sorted(range(len(requests)), key=lambda k: slot_indexes[k])
    finally:
        assert running.stop() == 0
    ok, illegal = PutStatus.PUT_OK, PutStatus.MESSAGE_ILLEGAL
    assert [[PutStatus(s) for s in answer["status"]] for answer in answers] == [
        [ok] * 30, [illegal] * 3, [ok, ok, illegal, ok], [ok] * 3]
    stored = [(answers[k], requests[k][0]) for k in in_slot_order]  # as the sweep took them
    good = [(row, raw) for answer, records in stored for row, raw in zip(answer, records, strict=False)
            if row["status"] == ok]
    assert written - before == sum(len(raw) for _, raw in good)
    positions = [int(row["commit_pos"]) for row, _ in good]
    assert positions == sorted(positions) and positions[0] == before  # slot order, back to back
    queue_1 = [int(row["queue_offset"]) for row, _ in good if row["queue_id"] == 1]
    assert queue_1 == list(range(len(queue_1)))  # no offset skipped for the refused records
    assert np.all(answers[2]["store_ts_ms"][[0, 1, 3]] == answers[0]["store_ts_ms"][0])
    log = CommitLog.open(running.root, SEGMENT_BYTES, Access.READ_ONLY)
    try:
        for row, raw in good:
            read = log.read_at(int(row["commit_pos"]))
            assert (read.total_size, read.queue_offset) == (len(raw), int(row["queue_offset"]))
            assert read.properties["KEYS"] == read.body.decode()  # this record's own body
            assert raw.find(read.body + b"\x05SWEEP") > 0
    finally:
        log.close()
    assert_check_clean(running.root)


def sweep_of(running, requests) -> tuple[int, list[np.ndarray], list[int], int]:
    """Publish `requests` ((records, count, flags) each) while the supervisor is stopped, so
    one sweep takes them all; (written_pos before, the answers, the slots, written_pos after)."""
    with running.ctl() as ctl:
        mailbox = Mailbox.attach(running.root)
        slots = [ProducerSlot.claim(mailbox, run_dir(running.root), alive=ctl.supervisor_alive)
                 for _ in requests]
        try:
            before = ctl.written_pos
            os.kill(ctl.supervisor_pid, signal.SIGSTOP)
            try:
                seqs = [slot.write_request(b"".join(records), count=count, flags=flags)
                        for slot, (records, count, flags) in zip(slots, requests, strict=True)]
            finally:
                os.kill(ctl.supervisor_pid, signal.SIGCONT)
            answers = [slot.wait_response(seq, 10, ctl.supervisor_alive)
                       for slot, seq in zip(slots, seqs, strict=True)]
            return before, answers, [slot.index for slot in slots], ctl.written_pos
        finally:
            for slot in slots:
                slot.release()
            mailbox.close()


@pytest.mark.parametrize("bad", [None, 2])
def test_a_sweep_of_one_record_requests_is_stored_back_to_back_and_each_answered(tmp_path, bad):
    """Send-and-wait's sweep (a few one-record requests: the few-record path): each request gets
    its own row, positions follow slot order back to back, offsets per queue count on without a
    gap; one bad record (then the batch path serves the sweep) is refused alone."""
    raws = [record(f"s{i}".encode(), i % 2) for i in range(5)]
    if bad is not None:
        raws[bad] = bad_crc(raws[bad])
    flags = [RequestFlag.WAIT_FOR_FLUSH, RequestFlag.NONE] * 2 + [RequestFlag.WAIT_FOR_FLUSH]
    running = start_store(tmp_path / "store", store={"commitlog_file_size": SEGMENT_BYTES})
    try:
        before, answers, slot_of, written = sweep_of(
            running, [([raw], 1, flag) for raw, flag in zip(raws, flags, strict=True)])
    finally:
        assert running.stop() == 0
    statuses = [PutStatus(int(answer["status"][0])) for answer in answers]
    assert statuses == [PutStatus.MESSAGE_ILLEGAL if i == bad else PutStatus.PUT_OK for i in range(5)]
    stored = sorted((slot_of[i], i) for i in range(5) if i != bad)  # the order the sweep took them
    positions = [int(answers[i]["commit_pos"][0]) for _, i in stored]
    assert positions[0] == before and written == before + sum(len(raws[i]) for _, i in stored)
    ends = [position + len(raws[i]) for position, (_, i) in zip(positions, stored, strict=True)]
    assert positions[1:] == ends[:-1]
    for queue_id in (0, 1):
        offsets = [int(answers[i]["queue_offset"][0]) for _, i in stored if i % 2 == queue_id]
        assert offsets == list(range(len(offsets)))
        assert all(int(answers[i]["queue_id"][0]) == queue_id for _, i in stored if i % 2 == queue_id)
    log = CommitLog.open(running.root, SEGMENT_BYTES, Access.READ_ONLY)
    try:
        for _, i in stored:
            read = log.read_at(int(answers[i]["commit_pos"][0]))
            assert read.body == f"s{i}".encode() and read.queue_offset == int(answers[i]["queue_offset"][0])
            assert read.store_ts_ms == int(answers[i]["store_ts_ms"][0])
    finally:
        log.close()
    assert_check_clean(running.root)
