"""The appender's private copy of a request is one buffer reused across requests: a smaller
request after a larger one (the buffer's tail still holds the old bytes) is checked and stored
exactly as sent."""

from __future__ import annotations

import random

from engine.files.mapped_file import Access
from engine.formats.record import encode_record
from engine.log.commitlog import CommitLog
from engine.status import PutStatus
from ipc.mailbox import Mailbox, ProducerSlot, RequestFlag
from ipc.run_info import run_dir
from tests.workers.store_harness import assert_check_clean, start_store

SEGMENT_BYTES = 1 << 20
STORE = {"commitlog_file_size": SEGMENT_BYTES, "max_body_bytes": 1 << 16}


def records(rnd: random.Random, count: int, body_bytes: int) -> list[tuple[bytes, bytes]]:
    """(encoded record, its body) of `count` records."""
    bodies = [rnd.randbytes(body_bytes) for _ in range(count)]
    return [(bytes(encode_record("COPY", body, queue_id=i % 4, properties={"KEYS": f"k{i}"}, born_ts_ms=1,
                                 born_host=("127.0.0.1", 1), store_host=("127.0.0.1", 2),
                                 max_body_bytes=1 << 16)), body)
            for i, body in enumerate(bodies)]


def test_a_smaller_request_after_a_larger_one_is_stored_as_sent(tmp_path):
    rnd = random.Random(4)
    requests = [records(rnd, 40, 20000), records(rnd, 3, 100), records(rnd, 30, 50)]
    running = start_store(tmp_path / "store", store=STORE)
    stored: list[tuple[int, bytes]] = []
    try:
        with running.ctl() as ctl:
            mailbox = Mailbox.attach(running.root)
            slot = ProducerSlot.claim(mailbox, run_dir(running.root), alive=ctl.supervisor_alive)
            try:
                for batch in requests:
                    seq = slot.write_request(b"".join(raw for raw, _ in batch), count=len(batch),
                                             flags=RequestFlag.WAIT_FOR_FLUSH)
                    results = slot.wait_response(seq, 10, ctl.supervisor_alive)
                    assert [PutStatus(s) for s in results["status"]] == [PutStatus.PUT_OK] * len(batch)
                    stored += zip(results["commit_pos"].tolist(), batch, strict=True)
            finally:
                slot.release()
                mailbox.close()
    finally:
        assert running.stop() == 0
    assert_check_clean(running.root)
    log = CommitLog.open(running.root, SEGMENT_BYTES, Access.READ_ONLY)
    try:
        for commit_pos, (raw, body) in stored:
            record = log.read_at(commit_pos)
            assert (record.total_size, record.body, record.topic) == (len(raw), body, "COPY")
    finally:
        log.close()
