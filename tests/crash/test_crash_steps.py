"""Phase-N crash tests (style anchors F.2): each multi-file operation is written out as an ordered
list of small steps acting on the store's files, exactly as the writer performs them. For every
k the test runs steps 1..k on a copy of a crashed store (the process died with the operation half
done), reopens it (recovery) and asserts the invariants and an empty `check`.

Nothing is hooked in production code: the steps re-enact the writer's order with the codecs.
Process death keeps every byte written (the page cache survives), so "written but not flushed"
only differs under power loss; those states are separate tests at the end of each section.
"""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from engine.check.fsck import check
from engine.config import StoreConfig
from engine.files.naming import (
    CHECKPOINT_FILE,
    TEMP_SUFFIX,
    commitlog_dir,
    index_file_name,
    index_shard_dir,
    offset_to_name,
)
from engine.formats.checkpoint import Checkpoint, encode_checkpoint
from engine.formats.cq_entry import CQ_ENTRY_SIZE, encode_cq_entry
from engine.formats.index_file import (
    IndexEntry,
    IndexHeader,
    decode_index_header,
    encode_index_entry,
    encode_index_header,
    encode_slot,
    entry_pos,
    index_file_size,
    index_key,
    slot_pos,
    time_diff_s,
)
from engine.formats.java_hash import index_key_hash, tags_code
from engine.formats.properties import PROP_KEYS, PROP_TAGS, PROP_UNIQ_KEY
from engine.formats.record import FILLER_SIZE, encode_filler, encode_record, stamp_record
from engine.formats.uniq_key import new_uniq_key
from engine.message import Message
from engine.retention.line import raise_retention_line, read_retention_line
from engine.status import GetStatus
from engine.store import MessageStore
from tests.helpers import (
    SEGMENT_BYTES,
    SMALL_CONFIG,
    TOPIC,
    cq_entry_of,
    die,
    patch,
    queue_bodies,
    read,
    segment_of,
)

Step = Callable[[Path], None]


@dataclass
class Scenario:
    """A crashed base store, the steps of one operation, and what the test needs to know."""

    base: Path
    config: StoreConfig
    steps: list[tuple[str, Step]] = field(default_factory=list)
    facts: dict = field(default_factory=dict)


def state_after(scenario: Scenario, k: int, dest: Path) -> Path:
    """A copy of the base store with steps 1..k applied: the files a crash after step k leaves."""
    shutil.copytree(scenario.base, dest)
    for _, step in scenario.steps[:k]:
        step(dest)
    return dest


def step_ids(names: list[str]) -> list[str]:
    return ["before"] + [f"after_{name}" for name in names]


def check_names(steps: list[tuple[str, Step]], names: list[str]) -> list[tuple[str, Step]]:
    assert [name for name, _ in steps] == names
    return steps


def body(i: int) -> bytes:
    return b"body-%03d" % i


def encoded(config: StoreConfig, body_bytes: bytes, *, queue_id: int, queue_offset: int,
            commit_pos: int, keys: str | None = None, tags: str | None = None,
            store_ts_ms: int | None = None) -> tuple[bytearray, str]:
    """A record as the writer builds it (properties in the store's order), stamped."""
    uniq = new_uniq_key()
    props = {**({PROP_TAGS: tags} if tags else {}), **({PROP_KEYS: keys} if keys else {}),
             PROP_UNIQ_KEY: uniq}
    now = int(time.time() * 1000) if store_ts_ms is None else store_ts_ms
    record = encode_record(TOPIC, body_bytes, queue_id=queue_id, properties=props, born_ts_ms=now,
                           born_host=("127.0.0.1", os.getpid()), store_host=config.store_ip_port)
    stamp_record(record, 0, queue_offset=queue_offset, commit_pos=commit_pos, store_ts_ms=now)
    return record, uniq


def reopen_and_verify(root: Path, config: StoreConfig, verify: Callable[[MessageStore], None]) -> None:
    store = MessageStore.open(root, config)
    try:
        assert store.recovery_report.shutdown == "crash"
        verify(store)
    finally:
        store.close()
    assert check(root) == []


# ------------------------------------------------------------------------------ segment roll

ROLL_BODY = b"R" * 600  # does not fit what is left of segment 0
ROLL_STEPS = ["filler", "next_next_segment_preallocated", "record_written", "cq_entry_dispatched"]


@pytest.fixture(scope="module")
def roll(tmp_path_factory) -> Scenario:
    """Segment 0 filled until a 600-byte body no longer fits; checkpointed; the writer dies."""
    base = tmp_path_factory.mktemp("roll") / "store"
    config = SMALL_CONFIG
    store = MessageStore.open(base, config)
    count = 0
    while store.commitlog.written_pos < SEGMENT_BYTES - len(ROLL_BODY):
        assert store.put(TOPIC, body(count), keys=(f"k{count}",)).ok
        count += 1
    store.checkpoint()
    end = store.commitlog.written_pos
    die(store)
    record, uniq = encoded(config, ROLL_BODY, queue_id=0, queue_offset=count, commit_pos=SEGMENT_BYTES,
                           keys="roll")
    assert len(record) + FILLER_SIZE > SEGMENT_BYTES - end
    next_segment = commitlog_dir(base) / offset_to_name(SEGMENT_BYTES)
    after_next = commitlog_dir(base) / offset_to_name(2 * SEGMENT_BYTES)
    assert next_segment.exists() and not after_next.exists()  # preallocated when 0 was created

    def write_filler(root: Path) -> None:
        patch(*segment_of(root, end), encode_filler(SEGMENT_BYTES - end))

    def preallocate_after_next(root: Path) -> None:
        (commitlog_dir(root) / after_next.name).write_bytes(bytes(SEGMENT_BYTES))

    def write_record(root: Path) -> None:
        patch(*segment_of(root, SEGMENT_BYTES), bytes(record))

    def dispatch_cq_entry(root: Path) -> None:  # after the flush; under sync flush nothing earlier
        patch(*cq_entry_of(root, 0, count), encode_cq_entry(SEGMENT_BYTES, len(record), tags_code(None)))

    steps = check_names([("filler", write_filler),
                         ("next_next_segment_preallocated", preallocate_after_next),
                         ("record_written", write_record), ("cq_entry_dispatched", dispatch_cq_entry)],
                        ROLL_STEPS)
    return Scenario(base, config, steps, {"count": count, "end": end, "record": record, "uniq": uniq})


@pytest.mark.parametrize("k", range(len(ROLL_STEPS) + 1), ids=step_ids(ROLL_STEPS))
def test_segment_roll_crash_after_each_step(roll, tmp_path, k):
    root = state_after(roll, k, tmp_path / "store")
    count, end, record = roll.facts["count"], roll.facts["end"], roll.facts["record"]
    record_written = k >= 3

    def verify(store: MessageStore) -> None:
        want = [body(i) for i in range(count)] + ([ROLL_BODY] if record_written else [])
        assert queue_bodies(store, 0) == want
        expected_end = SEGMENT_BYTES + len(record) if record_written else \
            SEGMENT_BYTES if k >= 1 else end
        assert store.commitlog.written_pos == expected_end
        assert store.recovery_report.cut_reason is None  # a clean end, nothing torn
        found = store.query_by_key(TOPIC, "roll")
        assert [m.commit_pos for m in found] == ([SEGMENT_BYTES] if record_written else [])
        nxt = store.put(TOPIC, b"after", keys=("after",))
        assert nxt.queue_offset == len(want)
        assert nxt.commit_pos == expected_end  # a small body still fits before the filler point

    reopen_and_verify(root, roll.config, verify)


@pytest.mark.parametrize("lost", ["record_page", "filler_page", "both_pages"])
def test_segment_roll_power_loss_before_the_flush(roll, tmp_path, lost):
    """Filler and record written, not yet msync'd: either page may be lost. The record was never
    acknowledged; the log must come back whole up to the last flushed record."""
    root = state_after(roll, 3, tmp_path / "store")
    count, end = roll.facts["count"], roll.facts["end"]
    if lost in ("record_page", "both_pages"):
        patch(*segment_of(root, SEGMENT_BYTES), bytes(SEGMENT_BYTES))
    if lost in ("filler_page", "both_pages"):
        patch(*segment_of(root, end), bytes(SEGMENT_BYTES - end))

    def verify(store: MessageStore) -> None:
        assert queue_bodies(store, 0) == [body(i) for i in range(count)]
        assert store.commitlog.written_pos == (SEGMENT_BYTES if lost == "record_page" else end)
        assert store.query_by_key(TOPIC, "roll") == []
        again = store.put(TOPIC, ROLL_BODY, keys=("roll",))
        assert (again.queue_offset, again.commit_pos) == (count, SEGMENT_BYTES)

    reopen_and_verify(root, roll.config, verify)


# ------------------------------------------------------------------------------ index roll

INDEX_CONFIG = SMALL_CONFIG.replace(index_shards=1, index_entry_count=8)  # 7 keys per file
INDEX_STEPS = ["record_appended", "cq_entry_dispatched", "index_file_created", "seed_header_written",
               "first_entry_written", "slot_written", "header_updated"]


@pytest.fixture(scope="module")
def index_roll(tmp_path_factory) -> Scenario:
    """The shard's only index file is full (7 UNIQ_KEYs); the 8th message's record and consume-
    queue entry are written, then the index rolls to a new file step by step."""
    base = tmp_path_factory.mktemp("index_roll") / "store"
    config = INDEX_CONFIG
    store = MessageStore.open(base, config)
    results = [store.put(TOPIC, body(i)) for i in range(7)]
    uniqs = [store.read_at(r.commit_pos).uniq_key for r in results]
    store.checkpoint()
    end = store.commitlog.written_pos
    die(store)
    (full,) = sorted(index_shard_dir(base, 0).iterdir())
    prev = decode_index_header(full.read_bytes())
    assert prev.index_count == config.index_entry_count  # full
    now = int(time.time() * 1000)
    record, uniq = encoded(config, body(7), queue_id=0, queue_offset=7, commit_pos=end, store_ts_ms=now)
    new_name = index_file_name(now + 1000)
    assert new_name > full.name
    slots, key_hash = config.index_slot_count, index_key_hash(index_key(TOPIC, uniq))
    seed = IndexHeader(prev.end_ts_ms, prev.end_ts_ms, prev.end_commit_pos, prev.end_commit_pos, 0, 1)

    def new_file(root: Path) -> Path:
        return index_shard_dir(root, 0) / new_name

    def append_record(root: Path) -> None:
        patch(*segment_of(root, end), bytes(record))

    def dispatch_cq_entry(root: Path) -> None:
        patch(*cq_entry_of(root, 0, 7), encode_cq_entry(end, len(record), tags_code(None)))

    def create_index_file(root: Path) -> None:  # ftruncate: all zeros
        new_file(root).write_bytes(bytes(index_file_size(slots, config.index_entry_count)))

    def write_seed_header(root: Path) -> None:
        patch(new_file(root), 0, encode_index_header(seed))

    def write_entry(root: Path) -> None:
        patch(new_file(root), entry_pos(slots, 1),
              encode_index_entry(IndexEntry(key_hash, end, time_diff_s(now, seed.begin_ts_ms), 0)))

    def write_slot(root: Path) -> None:
        patch(new_file(root), slot_pos(key_hash % slots), encode_slot(1))

    def update_header(root: Path) -> None:
        patch(new_file(root), 0, encode_index_header(IndexHeader(now, now, end, end, 1, 2)))

    steps = check_names([("record_appended", append_record), ("cq_entry_dispatched", dispatch_cq_entry),
                         ("index_file_created", create_index_file),
                         ("seed_header_written", write_seed_header),
                         ("first_entry_written", write_entry), ("slot_written", write_slot),
                         ("header_updated", update_header)], INDEX_STEPS)
    return Scenario(base, config, steps, {"uniqs": [*uniqs, uniq], "end": end})


@pytest.mark.parametrize("k", range(len(INDEX_STEPS) + 1), ids=step_ids(INDEX_STEPS))
def test_index_roll_crash_after_each_step(index_roll, tmp_path, k):
    root = state_after(index_roll, k, tmp_path / "store")
    uniqs = index_roll.facts["uniqs"]
    present = 8 if k >= 1 else 7

    def verify(store: MessageStore) -> None:
        assert queue_bodies(store, 0) == [body(i) for i in range(present)]
        for i, uniq in enumerate(uniqs):
            assert [m.body for m in store.query_by_key(TOPIC, uniq)] == ([body(i)] if i < present else [])
        more = [store.put(TOPIC, body(i)) for i in range(present, 16)]  # the shard keeps rolling
        assert [r.queue_offset for r in more] == list(range(present, 16))
        for i, r in enumerate(more, start=present):
            assert [m.body for m in store.query_by_key(TOPIC, store.read_at(r.commit_pos).uniq_key)] \
                == [body(i)]

    reopen_and_verify(root, index_roll.config, verify)


# ------------------------------------------------------------------------------ checkpoint write


CHECKPOINT_STEPS = ["temp_torn", "temp_complete", "bak_temp_torn", "bak_temp_complete", "bak_renamed",
                    "temp_renamed"]


@pytest.fixture(scope="module")
def checkpoint_write(tmp_path_factory) -> Scenario:
    """Checkpoint A after 10 messages, 10 more, then the checkpoint B of all 20 is being written
    (temp, fsync, copy old to .bak via a temp, rename) when the process dies."""
    base = tmp_path_factory.mktemp("checkpoint") / "store"
    store = MessageStore.open(base, SMALL_CONFIG)
    for i in range(20):
        assert store.put(TOPIC, body(i), keys=(f"k{i}",), queue_id=i % 2).ok
        if i == 9:
            a = store.checkpoint()
    end = store.commitlog.written_pos
    die(store)
    now = int(time.time() * 1000)
    b = encode_checkpoint(Checkpoint(now, now, now, 0, end, end, end, (end, end)))
    primary = CHECKPOINT_FILE
    temp, bak = primary + TEMP_SUFFIX, primary + ".bak"
    bak_temp = bak + TEMP_SUFFIX

    def steps_file(name: str, data: Callable[[Path], bytes]) -> Step:
        return lambda root: (root / name).write_bytes(data(root))

    steps = check_names([
        ("temp_torn", steps_file(temp, lambda root: b[:len(b) // 3])),
        ("temp_complete", steps_file(temp, lambda root: b)),
        ("bak_temp_torn", steps_file(bak_temp, lambda root: (root / primary).read_bytes()[:100])),
        ("bak_temp_complete", steps_file(bak_temp, lambda root: (root / primary).read_bytes())),
        ("bak_renamed", lambda root: os.replace(root / bak_temp, root / bak)),
        ("temp_renamed", lambda root: os.replace(root / temp, root / primary)),
    ], CHECKPOINT_STEPS)
    return Scenario(base, SMALL_CONFIG, steps, {"a": a, "end": end})


@pytest.mark.parametrize("k", range(len(CHECKPOINT_STEPS) + 1), ids=step_ids(CHECKPOINT_STEPS))
def test_checkpoint_write_crash_after_each_step(checkpoint_write, tmp_path, k):
    root = state_after(checkpoint_write, k, tmp_path / "store")
    a, end = checkpoint_write.facts["a"], checkpoint_write.facts["end"]

    def verify(store: MessageStore) -> None:
        report = store.recovery_report
        assert report.checkpoint_source == "checkpoint" and not report.checkpoint_problems
        if k < len(CHECKPOINT_STEPS):
            assert report.scan_start_pos <= a.cq_durable_pos  # still checkpoint A
        for q in (0, 1):
            assert queue_bodies(store, q) == [body(i) for i in range(q, 20, 2)]
        assert store.commitlog.written_pos == end

    reopen_and_verify(root, checkpoint_write.config, verify)
    assert not list(root.glob(f"*{TEMP_SUFFIX}"))  # the next checkpoint write replaced the leftovers


# ------------------------------------------------------------------------------ retention pass

RETENTION_CONFIG = SMALL_CONFIG.replace(consume_queue_entries=4, index_entry_count=8, index_shards=1)
RETENTION_STEPS = ["line_raised", "oldest_segment_removed", "cq_files_removed", "index_files_removed"]


@pytest.fixture(scope="module")
def retention_pass(tmp_path_factory) -> Scenario:
    """Three segments over two queues; a pass deleting the oldest segment dies between steps."""
    base = tmp_path_factory.mktemp("retention") / "store"
    config = RETENTION_CONFIG
    store = MessageStore.open(base, config)
    results = store.put_batch([Message(TOPIC, body(i), keys=(f"k{i}",), queue_id=i % 2)
                               for i in range(50)])
    assert results[-1].commit_pos >= 2 * SEGMENT_BYTES
    store.checkpoint()
    die(store)
    first_kept = next(i for i, r in enumerate(results) if r.commit_pos >= SEGMENT_BYTES)

    def raise_line(root: Path) -> None:  # engine.retention.expiry.remove_segments: the line first
        raise_retention_line(root, SEGMENT_BYTES)

    def remove_segment(root: Path) -> None:
        (commitlog_dir(root) / offset_to_name(0)).unlink()

    def remove_cq_files(root: Path) -> None:
        for q in (0, 1):
            files = sorted(cq_entry_of(root, q, 0, entries_per_file=4)[0].parent.iterdir())
            for path in files[:-1]:
                last_pos = int.from_bytes(read(path, path.stat().st_size - CQ_ENTRY_SIZE, 8), "big")
                if last_pos >= SEGMENT_BYTES:
                    break
                path.unlink()

    def remove_index_files(root: Path) -> None:
        files = sorted(index_shard_dir(root, 0).iterdir())
        for path in files[:-1]:
            if decode_index_header(path.read_bytes()).end_commit_pos >= SEGMENT_BYTES:
                break
            path.unlink()

    # The last state, "min offsets not yet corrected", is every state here: min offsets live in
    # memory and a crash always leaves them for the next open to recompute.
    steps = check_names([("line_raised", raise_line), ("oldest_segment_removed", remove_segment),
                         ("cq_files_removed", remove_cq_files), ("index_files_removed", remove_index_files)],
                        RETENTION_STEPS)
    counts = {name: len(list(base.rglob(pattern))) for name, pattern in
              (("cq", "consumequeue/*/*/*"), ("index", "index/*/*"))}
    return Scenario(base, config, steps, {"first_kept": first_kept, "counts": counts})


@pytest.mark.parametrize("k", range(len(RETENTION_STEPS) + 1), ids=step_ids(RETENTION_STEPS))
def test_retention_pass_crash_after_each_step(retention_pass, tmp_path, k):
    root = state_after(retention_pass, k, tmp_path / "store")
    first_kept = retention_pass.facts["first_kept"] if k >= 2 else 0
    counts = retention_pass.facts["counts"]
    if k >= 3:
        assert len(list(root.rglob("consumequeue/*/*/*"))) < counts["cq"]
    if k >= 4:
        assert len(list(root.rglob("index/*/*"))) < counts["index"]

    def verify(store: MessageStore) -> None:
        assert store.commitlog.min_pos == (SEGMENT_BYTES if k >= 2 else 0)
        assert read_retention_line(root) == store.commitlog.min_pos  # settled by the reopen
        for q in (0, 1):
            live = [i for i in range(first_kept, 50) if i % 2 == q]
            assert store.min_offset(TOPIC, q) == live[0] // 2
            assert queue_bodies(store, q) == [body(i) for i in live]
            if live[0] // 2:
                small = store.get_messages(TOPIC, q, 0)
                assert (small.status, small.next_offset) == (GetStatus.OFFSET_TOO_SMALL, live[0] // 2)
        for i in range(50):
            assert [m.body for m in store.query_by_key(TOPIC, f"k{i}")] == \
                ([body(i)] if i >= first_kept else [])
        assert store.put(TOPIC, b"more", queue_id=0).queue_offset == 25

    reopen_and_verify(root, retention_pass.config, verify)
