"""One bad record does not block its neighbours (issue 19, item 6), with real processes: a
Consumer against a running supervisor, `mqstore consume` and `mqstore query` deliver the good
records around a corrupt one, report it with its commit position and move past it.

Bytes of a sealed record are changed on disk while the store runs and put back before it stops
(the store then checks clean).
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator

import pytest

from engine.formats.record import BODY_OFFSET
from engine.message import Message
from engine.status import GetStatus
from ipc.consumer import Consumer
from ipc.producer import Producer
from tests.helpers import patch, read, segment_of
from tests.workers.store_harness import SMALL_STORE, assert_check_clean, cli, start_store
from tools.store_process import StoreProcess

COUNT = 6
BAD = 2
KEY = "shared"
SEGMENT_BYTES = SMALL_STORE["commitlog_file_size"]
FLIPPED_BODY = (BODY_OFFSET + 1, b"\xff")  # BODYCRC and CRC32C fail; the frame is sound
TORN_HEADER = (4, bytes(4))  # MAGICCODE zeroed: no sound frame


@pytest.fixture(scope="module")
def running(tmp_path_factory):
    store = start_store(tmp_path_factory.mktemp("corrupt") / "store")
    yield store
    assert store.stop() == 0
    assert_check_clean(store.root)


def fill(running: StoreProcess, topic: str) -> list:
    with Producer(running.root) as producer:
        acks = list(producer.send_batch([Message(topic, b"body-%d" % i, keys=(KEY, f"k{i}"), queue_id=0)
                                         for i in range(COUNT)]))
    assert all(a.ok for a in acks)
    running.wait_caught_up()
    return acks


@contextlib.contextmanager
def damaged(running: StoreProcess, topic: str, change: tuple[int, bytes]) -> Iterator[int]:
    """Fill `topic`, change bytes of its record at offset BAD on disk and yield that record's
    commit_pos; the bytes are put back afterwards, so the store still checks clean."""
    bad_pos = fill(running, topic)[BAD].commit_pos
    path, file_pos = segment_of(running.root, bad_pos, SEGMENT_BYTES)
    file_pos += change[0]
    old = read(path, file_pos, len(change[1]))
    patch(path, file_pos, change[1])
    try:
        yield bad_pos
    finally:
        patch(path, file_pos, old)


@pytest.mark.slow
def test_pull_and_iterate_deliver_the_records_around_a_bad_checksum(running):
    with damaged(running, "CRC", FLIPPED_BODY) as bad_pos, Consumer(running.root, "crc") as consumer:
        result = consumer.pull("CRC", 0, 0)
        assert result.status is GetStatus.FOUND and result.next_offset == COUNT
        assert [r.queue_offset for r in result.messages] == [0, 1, 3, 4, 5]
        assert [(s.commit_pos, s.topic, s.queue_id, s.queue_offset, s.reason)
                for s in result.skipped] == [(bad_pos, "CRC", 0, BAD, "BODYCRC mismatch")]
        alone = consumer.pull("CRC", 0, BAD, max_count=1)
        assert (alone.status, alone.next_offset, len(alone.skipped)) == \
                (GetStatus.NO_MATCHED_MESSAGE, BAD + 1, 1)
        seen = []
        records = list(consumer.iterate("CRC", on_skipped=seen.append))
        assert [r.queue_offset for r in records] == [0, 1, 3, 4, 5]
        assert [s.commit_pos for s in seen] == [bad_pos]
        assert consumer.committed("CRC", 0) == COUNT  # went on past it
        # the columns read checks frames, not checksums (ipc.consumer): all six come back,
        # and asking for checked Records passes the bad one over
        columns = consumer.pull_columns("CRC", 0, 0)
        assert (columns.count, columns.skipped) == (COUNT, [])
        assert [r.queue_offset for r in columns.records()] == [0, 1, 3, 4, 5]
        assert [(s.commit_pos, s.queue_offset) for s in columns.skipped] == [(bad_pos, BAD)]
        assert len(columns.records()) == COUNT - 1 and len(columns.skipped) == 1  # reported once


@pytest.mark.slow
def test_pull_and_pull_columns_pass_over_a_torn_header(running):
    with damaged(running, "TORN", TORN_HEADER) as bad_pos, Consumer(running.root, "torn") as consumer:
        pulled = consumer.pull("TORN", 0, 0)
        assert [r.queue_offset for r in pulled.messages] == [0, 1, 3, 4, 5]
        assert [s.commit_pos for s in pulled.skipped] == [bad_pos]
        columns = consumer.pull_columns("TORN", 0, 0)
        assert (columns.status, columns.next_offset, columns.count) == (GetStatus.FOUND, COUNT, 5)
        assert [r.queue_offset for r in columns.records()] == [0, 1, 3, 4, 5]
        assert [(s.commit_pos, s.queue_offset) for s in columns.skipped] == [(bad_pos, BAD)]
        alone = consumer.pull_columns("TORN", 0, BAD, max_count=1)
        assert (alone.status, alone.next_offset, alone.count) == \
                (GetStatus.NO_MATCHED_MESSAGE, BAD + 1, 0)


@pytest.mark.slow
def test_cli_consume_and_query_print_the_good_records_and_warn_of_the_bad_one(running):
    store = str(running.root)
    with damaged(running, "CLI", FLIPPED_BODY) as bad_pos:
        for extra in ([], ["--queue-id", "0"]):
            group = f"cli{len(extra)}"
            consumed = cli("consume", "--store", store, "--topic", "CLI", "--group", group, "--json", *extra)
            stderr = consumed.stderr.decode()
            assert consumed.returncode == 1, stderr  # everything readable printed, then exit 1
            lines = consumed.stdout.decode().splitlines()
            assert [json.loads(line)["queue_offset"] for line in lines] == [0, 1, 3, 4, 5]
            assert f"commit position {bad_pos} (CLI/0 offset {BAD})" in stderr and "WARNING" in stderr
            assert "Traceback" not in stderr
            again = cli("consume", "--store", store, "--topic", "CLI", "--group", group, *extra)
            assert again.returncode == 0 and again.stdout == b"", again.stderr.decode()  # committed past it
        queried = cli("query", "--store", store, "--topic", "CLI", "--key", KEY)
        assert queried.returncode == 1, queried.stderr.decode()
        assert len(queried.stdout.decode().splitlines()) == COUNT - 1
        assert f"commit position {bad_pos}" in queried.stderr.decode()
        assert "5 message(s), 1 corrupt record(s) skipped" in queried.stderr.decode()
    whole = cli("query", "--store", store, "--topic", "CLI", "--key", KEY)
    assert whole.returncode == 0 and len(whole.stdout.decode().splitlines()) == COUNT
