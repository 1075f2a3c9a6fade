"""Consumer.pull, pull_columns and iterate with a subscription (tags, where) against a running
store, and `mqstore consume --tags / --where` with the producer in another process: the
same messages and next offsets by every path, the hash collision, the scan bound."""

from __future__ import annotations

import json

import pytest

from engine.config import StoreConfig
from engine.filters.subscription import MIN_FILTER_SCAN_ENTRIES
from engine.message import Message
from engine.status import GetStatus, PutStatus
from engine.store import MessageStore
from ipc.consumer import Consumer
from ipc.producer import Producer
from tests.workers.store_harness import checked_store, cli, run_python, start_store

TAGS = ["Aa", "BB", "C", "Aa", None, "BB", "C", "C"]  # "Aa" and "BB" share tagsCode 2112


def _pulled(consumer: Consumer, queue_id: int, max_count: int, **subscription) -> tuple[list, list[int]]:
    """Every body `pull` and `pull_columns` deliver from offset 0 to the end, and the offsets."""
    by_pull, by_columns, offsets = [], [], []
    offset = 0
    while True:
        result = consumer.pull("F", queue_id, offset, max_count, **subscription)
        columns = consumer.pull_columns("F", queue_id, offset, max_count, **subscription)
        assert (columns.status, columns.next_offset) == (result.status, result.next_offset)
        if result.status not in (GetStatus.FOUND, GetStatus.NO_MATCHED_MESSAGE):
            return by_pull, offsets
        by_pull += [r.body for r in result.messages]
        by_columns += [bytes(v.body(i)) for v in columns.views for i in range(v.count)]
        assert by_columns == by_pull
        offsets.append(result.next_offset)
        offset = result.next_offset


@pytest.mark.slow
def test_pull_columns_and_iterate_share_the_filter_rule(tmp_path):
    with checked_store(tmp_path / "store") as store:
        with Producer(store.root) as producer:
            for i, tag in enumerate(TAGS):
                assert producer.send("F", b"m%d" % i, tags=tag, queue_id=0,
                                     properties={"amount": str(i * 50), "region": "eu" if i % 2 else "us"}).ok
            run = MIN_FILTER_SCAN_ENTRIES + 100
            sent = producer.send_columns("F", [b"x"] * run, queue_ids=1)
            assert sent.status_counts() == {PutStatus.PUT_OK: run}
            assert producer.send("F", b"last", tags="Aa", queue_id=1).ok
        store.wait_caught_up()
        with Consumer(store.root, "g") as consumer:
            assert _pulled(consumer, 0, 2, tags="BB") == ([b"m1", b"m5"], [6, 8])
            assert _pulled(consumer, 0, 32, tags="Aa || C") == ([b"m0", b"m2", b"m3", b"m6", b"m7"], [8])
            eu_over_100 = "region = 'eu' AND amount > 100"
            assert _pulled(consumer, 0, 32, where=eu_over_100) == ([b"m3", b"m5", b"m7"], [8])
            assert _pulled(consumer, 0, 32, tags="C", where="amount >= 300") == ([b"m6", b"m7"], [8])
            bounded = consumer.pull("F", 1, 0, 32, tags="Aa")
            columns = consumer.pull_columns("F", 1, 0, 32, tags="Aa")
            for result in (bounded, columns):  # a long run of misses costs one bounded read
                assert result.status is GetStatus.NO_MATCHED_MESSAGE
                assert result.next_offset == MIN_FILTER_SCAN_ENTRIES
            assert _pulled(consumer, 1, 32, tags="Aa")[0] == [b"last"]
            seen = [r.body for r in consumer.iterate("F", tags="BB || Aa", max_count=4)]
            assert sorted(seen) == [b"last", b"m0", b"m1", b"m3", b"m5"]
            assert consumer.committed("F", 0) == 8 and consumer.committed("F", 1) == run + 1


PRODUCE = """
import sys
from ipc.producer import Producer
with Producer(sys.argv[1]) as producer:
    for i, (tag, region, amount) in enumerate([("A", "eu", 150), ("B", "us", 500), ("C", "eu", 900),
                                               ("B", "eu", 50), ("Aa", "eu", 120), ("BB", "eu", 130)]):
        assert producer.send("Orders", b"o%d" % i, tags=tag, queue_id=i % 2,
                             properties={"region": region, "amount": str(amount)}).ok
"""


@pytest.mark.slow
def test_consume_command_with_tags_and_where(tmp_path):
    with checked_store(tmp_path / "store") as store:
        produced = run_python(PRODUCE, str(store.root))
        assert produced.returncode == 0, produced.stderr.decode()
        store.wait_caught_up()

        def consume(*args: str) -> list[str]:
            done = cli("consume", "--store", str(store.root), "--topic", "Orders", "--json", *args)
            assert done.returncode == 0, done.stderr.decode()
            return sorted(json.loads(line)["body"] for line in done.stdout.decode().splitlines())

        assert consume("--tags", "A || B", "--group", "g1") == ["o0", "o1", "o3"]
        eu_over_100 = "region = 'eu' AND amount > 100"
        assert consume("--where", eu_over_100, "--group", "g2") == ["o0", "o2", "o4", "o5"]
        assert consume("--tags", "BB", "--queue-id", "1", "--group", "g3") == ["o5"]
        assert consume("--tags", "A || B", "--group", "g1") == []  # its offsets were committed
        bad = cli("consume", "--store", str(store.root), "--topic", "Orders", "--where", "amount >> 1")
        assert bad.returncode == 2 and b"position 8" in bad.stderr and b"amount >> 1" in bad.stderr
        deep = cli("consume", "--store", str(store.root), "--topic", "Orders", "--group", "g4",
                   "--where", "(" * 200 + "amount > 1" + ")" * 200)
        assert deep.returncode == 2 and b"nested deeper than 64" in deep.stderr
        assert b"Traceback" not in deep.stderr


LAYOUT = dict(commitlog_file_size=65536, consume_queue_entries=500, queue_count=2, index_slot_count=64,
              index_entry_count=256, index_shards=2, max_body_bytes=4096)


@pytest.mark.slow
def test_pull_columns_passes_over_properties_that_do_not_decode(tmp_path):
    """pull_columns checks no CRC, so a filter meets a record whose property bytes were flipped:
    it is skipped and reported as pull reports it, and the read moves past it."""
    with MessageStore.open(tmp_path / "s", StoreConfig(**LAYOUT)) as s:
        put = s.put_batch([Message("T", b"m%d" % i, tags="A", queue_id=0,
                                   properties={"region": "eu", "n": str(i)}) for i in range(5)])
    segment = sorted((tmp_path / "s" / "commitlog").iterdir())[0]
    data = bytearray(segment.read_bytes())
    data[data.index(b"region\x01eu", put[2].commit_pos) + len(b"region\x01")] = 0xFF  # not UTF-8
    segment.write_bytes(data)
    store = start_store(tmp_path / "s", store=LAYOUT)
    try:
        with Consumer(store.root, "g") as consumer:
            for subscription in ({"where": "region = 'eu'"}, {"tags": "A", "where": "n >= 0"}):
                got = consumer.pull_columns("T", 0, 0, 32, **subscription)
                assert [bytes(v.body(i)) for v in got.views for i in range(v.count)] == [
                    b"m0", b"m1", b"m3", b"m4"]
                assert [(r.queue_offset, r.commit_pos) for r in got.skipped] == [(2, put[2].commit_pos)]
                assert got.status is GetStatus.FOUND and got.next_offset == 5
            first = consumer.pull_columns("T", 0, 0, 2, where="region = 'eu'")
            assert first.next_offset == 2 and first.skipped == []  # the bad one lies past this read
    finally:
        assert store.stop() == 0


@pytest.mark.slow
def test_consume_command_commits_past_what_its_filter_passed_over(tmp_path):
    """Without --queue-id, consume commits where iterate got to (filtered-out entries included)
    once the messages before are printed; with --max it commits only what it printed."""
    with MessageStore.open(tmp_path / "s", StoreConfig(**LAYOUT)) as s:
        s.put_batch([Message("T", b"q0-%d" % i, tags=tag, queue_id=0) for i, tag in enumerate("AXAXX")])
        s.put_batch([Message("T", b"q1-%d" % i, tags="X", queue_id=1) for i in range(3)])
    store = start_store(tmp_path / "s", store=LAYOUT)
    try:
        for group, args, printed, committed in (("g1", ["--tags", "A"], 2, (5, 3)),
                                                ("g2", ["--where", "TAGS = 'A'"], 2, (5, 3)),
                                                ("g3", ["--tags", "A", "--max", "1"], 1, (1, None))):
            done = cli("consume", "--store", str(store.root), "--topic", "T", "--group", group, *args)
            assert done.returncode == 0, done.stderr.decode()
            assert len(done.stdout.decode().splitlines()) == printed
            with Consumer(store.root, group) as consumer:
                assert (consumer.committed("T", 0), consumer.committed("T", 1)) == committed
    finally:
        assert store.stop() == 0
