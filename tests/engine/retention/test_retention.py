"""engine.retention.expiry: the pure plan, RocketMQ's DefaultMessageStoreCleanFilesTest scenarios, DISK_FULL
on a real (tmpfs) filesystem, and a crash after every step of a pass.

One message per segment: a 4096-byte segment holds one ~2.6 KiB record (two do not fit with
the 8-byte filler), as RocketMQ's test forces one message per file. Segments are aged with
os.utime; `now_ms` is passed in, so no test sleeps.
"""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from engine.check.fsck import check
from engine.config import StoreConfig
from engine.errors import BadInputError
from engine.files.filesystem import disk_usage_ratio, usage_ratio_of
from engine.files.mapped_file import Access
from engine.files.naming import commitlog_dir, consume_queue_dir, index_shard_dir
from engine.files.store_dir import mark_running
from engine.formats.record import BODY_OFFSET, FILLER_SIZE
from engine.message import Message
from engine.recovery.recover import StoreParts
from engine.retention import expiry as retention
from engine.retention.expiry import RetentionReason, local_hour, plan_retention, run_retention
from engine.retention.line import read_retention_line
from engine.retention.segment_age import SegmentAge, SegmentAges
from engine.status import GetStatus, PutStatus
from engine.store import MessageStore
from engine.store_open import close_parts, open_parts

HOUR_MS = 3_600_000
SEGMENT_BYTES = 4096
BODY = b"r" * 2500  # one record per segment
TOPIC = "T"
NOW_MS = int(time.time() * 1000)
CLOCK_START_MS = NOW_MS  # the conftest's `clock` starts here: records stamped near the wall clock
DELETE_HOUR = local_hour(NOW_MS)
CONFIG = StoreConfig(commitlog_file_size=SEGMENT_BYTES, consume_queue_entries=10, index_slot_count=64,
                     index_entry_count=11, index_shards=1, queue_count=1, file_reserved_hours=72,
                     delete_when_hour=DELETE_HOUR)  # 10 keys (one message each) per index file
OFF_HOUR = CONFIG.replace(delete_when_hour=(DELETE_HOUR + 12) % 24)
LOW, WARN, FORCE, FULL = 0.10, 0.80, 0.86, 0.95


# ------------------------------------------------------------------------------ the pure plan


def ages(*ages_h: float | None, now_ms: int = NOW_MS) -> dict[int, SegmentAge]:
    """Sealed segments oldest first, by the age in hours of their last record (None: unreadable)."""
    return {i * SEGMENT_BYTES: SegmentAge(i * SEGMENT_BYTES,
                                          None if age is None else round(now_ms - age * HOUR_MS))
            for i, age in enumerate(ages_h)}


def plan(*ages_h: float | None, usage: float = LOW, config: StoreConfig = CONFIG, max_files: int = 10,
         asked: list[int] | None = None) -> retention.RetentionPlan:
    """plan_retention over `ages(*ages_h)`; the bases whose age it read go to `asked`."""
    known = ages(*ages_h)

    def age_of(base_pos: int) -> SegmentAge:
        if asked is not None:
            asked.append(base_pos)
        return known[base_pos]

    return plan_retention(list(known), age_of, NOW_MS, usage, config, max_files)


@pytest.mark.parametrize(("usage", "config", "reason"), [
    (LOW, CONFIG, RetentionReason.TIME_UP),
    (LOW, OFF_HOUR, RetentionReason.NONE),
    (WARN, OFF_HOUR, RetentionReason.SPACE_WARN),
    (FORCE, OFF_HOUR, RetentionReason.SPACE_FORCE),
    (FULL, OFF_HOUR, RetentionReason.SPACE_FORCE),
    (0.75, OFF_HOUR, RetentionReason.SPACE_WARN),  # thresholds are inclusive
    (0.85, OFF_HOUR, RetentionReason.SPACE_FORCE),
])
def test_plan_reason_follows_hour_and_usage(usage, config, reason):
    assert retention.retention_reason(NOW_MS, usage, config) is reason


def test_plan_disk_full_only_at_top_threshold():
    assert not retention.is_disk_full(0.899, CONFIG)
    assert retention.is_disk_full(0.90, CONFIG)


def test_plan_time_up_stops_at_first_unexpired():
    """MappedFileQueueTest.testDeleteExpiredFileByTime: never from the middle."""
    assert plan(100, 100, 1, 100, 100) == ([0, SEGMENT_BYTES], RetentionReason.TIME_UP, False)


def test_plan_expiry_boundary_is_inclusive():
    assert plan(72, 71.999).base_positions == [0]


def test_plan_outside_delete_hour_keeps_expired_below_warn():
    asked: list[int] = []
    assert plan(100, 100, config=OFF_HOUR, asked=asked) == ([], RetentionReason.NONE, False)
    assert asked == []  # no trigger: no segment is read


def test_plan_space_warn_deletes_only_expired():
    assert plan(100, 1, 100, usage=WARN, config=OFF_HOUR)[:2] == ([0], RetentionReason.SPACE_WARN)


def test_plan_space_force_ignores_age_and_reads_none():
    asked: list[int] = []
    assert plan(0, None, usage=FORCE, config=OFF_HOUR, asked=asked)[:2] == (
        [0, SEGMENT_BYTES], RetentionReason.SPACE_FORCE)
    assert asked == []


def test_plan_unreadable_last_record_is_never_expired_by_age():
    """A torn or flipped last record gives no age: the segment (and those after it) stays."""
    assert plan(100, None, 100).base_positions == [0]
    assert plan(None, 100).base_positions == []


def test_plan_future_store_time_keeps_the_segment():
    """A clock that was ahead when the record was stored: kept until that time has aged."""
    assert plan(-1, 100).base_positions == []


def test_plan_at_most_max_files_and_says_more_are_due():
    asked: list[int] = []
    full = plan(*[100] * 29, max_files=10, asked=asked)
    assert full == ([i * SEGMENT_BYTES for i in range(10)], RetentionReason.TIME_UP, True)
    assert len(asked) == 11  # the batch and the one that tells whether more are due
    assert plan(*[100] * 10, 1, max_files=10).more_due is False  # the 11th has not expired
    assert plan(*[100] * 10, max_files=10).more_due is False  # nothing after the batch
    assert plan(*[0] * 29, usage=FULL, max_files=10).more_due is True
    assert plan(100, 100, usage=FULL, max_files=0) == ([], RetentionReason.SPACE_FORCE, False)


def test_plan_empty_deletes_nothing():
    assert plan(usage=FULL) == ([], RetentionReason.SPACE_FORCE, False)


@given(ages_h=st.lists(st.sampled_from([None, -5, 0, 1, 71, 72, 73, 500]), max_size=25),
       usage=st.sampled_from([LOW, 0.75, WARN, 0.85, FORCE, FULL]),
       hour_matches=st.booleans(), max_files=st.integers(0, 12))
def test_plan_properties(ages_h, usage, hour_matches, max_files):
    config = CONFIG if hour_matches else OFF_HOUR
    asked: list[int] = []
    chosen, reason, more_due = plan(*ages_h, usage=usage, config=config, max_files=max_files, asked=asked)
    force = usage >= config.disk_clean_force_ratio
    may_delete = force or usage >= config.disk_warn_ratio or hour_matches
    expired = [age is not None and age >= 72 for age in ages_h]
    assert chosen == [i * SEGMENT_BYTES for i in range(len(chosen))]  # a prefix: never from the middle
    assert len(chosen) <= max_files
    assert len(asked) <= max_files + 1 and (not force or asked == [])
    assert may_delete or chosen == []
    assert (reason is RetentionReason.NONE) == (not may_delete)
    assert force or all(expired[:len(chosen)])
    left = ages_h[len(chosen):]
    assert more_due == (may_delete and max_files > 0 and len(chosen) == max_files and bool(left)
                        and (force or expired[len(chosen)]))
    if may_delete and len(chosen) < min(max_files, len(ages_h)):
        assert not force and not expired[len(chosen)]  # stopped at the first one it may not delete


# ------------------------------------------------------------------------------ stores


def make_store(root: Path, count: int, config: StoreConfig = CONFIG, *, clock=None, aged: int = 0,
               hours: float = 100) -> MessageStore:
    """A store of `count` one-record segments; the first `aged` records stamped `hours` before
    NOW_MS (through `clock`), the others at NOW_MS."""
    store = MessageStore.open(root, config)
    for i in range(count):
        if clock is not None:
            clock.now_ms = round(NOW_MS - hours * HOUR_MS) if i < aged else NOW_MS
        result = store.put(TOPIC, BODY + str(i).encode())
        assert result.ok, result
    assert len(store.commitlog.segments.segments) == count  # one message per segment
    return store


def parts_of(store: MessageStore) -> StoreParts:
    return StoreParts(store.root, store.commitlog, store.queues, store.shards)


def set_mtimes(root: Path, epoch_s: float) -> None:
    """Every commitlog file's mtime (a restore, a copy tool, a clock set after boot)."""
    for path in commitlog_dir(root).iterdir():
        os.utime(path, (epoch_s, epoch_s))


def file_count(directory: Path) -> int:
    return len(list(directory.iterdir()))


def test_retention_time_up_deletes_expired_10_per_pass(tmp_path, clock):
    """DefaultMessageStoreCleanFilesTest.testDeleteExpiredFilesByTimeUp."""
    store = make_store(tmp_path, 55, clock=clock, aged=15)
    cq_dir, index_dir = consume_queue_dir(tmp_path, TOPIC, 0), index_shard_dir(tmp_path, 0)
    assert (file_count(cq_dir), file_count(index_dir)) == (6, 6)
    first = run_retention(parts_of(store), OFF_HOUR, now_ms=NOW_MS, usage_ratio=LOW)
    assert first.segments_removed == [] and first.reason is RetentionReason.NONE

    first = run_retention(parts_of(store), CONFIG, now_ms=NOW_MS, usage_ratio=LOW)
    assert first.reason is RetentionReason.TIME_UP and not first.disk_full
    assert len(first.segments_removed) == 10 and first.more_due  # five more have expired
    assert (first.cq_files_removed, first.index_files_removed) == (1, 1)
    assert store.min_offset(TOPIC, 0) == 10
    assert first.min_commit_pos == store.commitlog.min_pos == 10 * SEGMENT_BYTES

    second = run_retention(parts_of(store), CONFIG, now_ms=NOW_MS, usage_ratio=LOW)
    assert len(second.segments_removed) == 5  # stops at the first segment that has not expired
    assert not second.more_due
    assert (second.cq_files_removed, second.index_files_removed) == (0, 0)
    assert store.min_offset(TOPIC, 0) == 15
    assert run_retention(parts_of(store), CONFIG, now_ms=NOW_MS, usage_ratio=LOW).segments_removed == []
    assert (file_count(cq_dir), file_count(index_dir)) == (5, 5)
    assert len(store.commitlog.segments.segments) == 40
    store.close()
    assert check(tmp_path) == []

    with MessageStore.open(tmp_path, CONFIG) as reopened:
        too_small = reopened.get_messages(TOPIC, 0, 3)
        assert (too_small.status, too_small.next_offset) == (GetStatus.OFFSET_TOO_SMALL, 15)
        found = reopened.get_messages(TOPIC, 0, 15, 1)
        assert found.status is GetStatus.FOUND and found.messages[0].body == BODY + b"15"
        assert reopened.query_by_key(TOPIC, found.messages[0].uniq_key)
    assert check(tmp_path) == []


def test_retention_space_warn_deletes_expired_outside_delete_hour(tmp_path, clock):
    store = make_store(tmp_path, 20, clock=clock, aged=5)
    report = run_retention(parts_of(store), OFF_HOUR, now_ms=NOW_MS, usage_ratio=WARN)
    assert report.reason is RetentionReason.SPACE_WARN and len(report.segments_removed) == 5
    store.close()
    assert check(tmp_path) == []


def test_retention_space_force_deletes_unexpired_10_per_pass(tmp_path):
    """DefaultMessageStoreCleanFilesTest.testDeleteFilesImmediatelyBySpaceFull."""
    store = make_store(tmp_path, 25)
    for expected_removed, expected_min in ((10, 10), (10, 20), (4, 24), (0, 24)):
        report = run_retention(parts_of(store), OFF_HOUR, now_ms=NOW_MS, usage_ratio=FORCE)
        assert report.reason is RetentionReason.SPACE_FORCE and not report.disk_full
        assert len(report.segments_removed) == expected_removed
        assert store.min_offset(TOPIC, 0) == expected_min
    store.close()
    assert check(tmp_path) == []


def test_retention_never_deletes_active_segment_even_when_all_expired(tmp_path):
    store = make_store(tmp_path, 12)
    later_ms = NOW_MS + 100 * HOUR_MS  # every record has expired, the active segment's too
    for _ in range(3):
        report = run_retention(parts_of(store), CONFIG, now_ms=later_ms, usage_ratio=FULL)
        assert report.disk_full
    assert len(store.commitlog.segments.segments) == 1
    assert store.min_offset(TOPIC, 0) == 11 and store.max_offset(TOPIC, 0) == 12
    assert store.get_messages(TOPIC, 0, 11).messages[0].body == BODY + b"11"
    assert store.put(TOPIC, b"after").ok
    store.close()
    assert check(tmp_path) == []
    with MessageStore.open(tmp_path, CONFIG) as reopened:  # after reopen the active one stays too
        assert run_retention(parts_of(reopened), CONFIG, now_ms=later_ms, usage_ratio=FULL).segments_removed \
            == []
    assert check(tmp_path) == []


def test_retention_steps_refuse_the_middle_and_the_active_segment(tmp_path):
    store = make_store(tmp_path, 3)
    parts = parts_of(store)
    with pytest.raises(BadInputError):
        retention.delete_segments(parts, [SEGMENT_BYTES])  # not the oldest
    retention.delete_segments(parts, [0, SEGMENT_BYTES])
    with pytest.raises(BadInputError):
        retention.delete_segments(parts, [2 * SEGMENT_BYTES])  # the active one
    assert run_retention(parts, CONFIG, now_ms=NOW_MS, usage_ratio=FULL).to_dict()["reason"] == "space_force"
    store.close()
    assert check(tmp_path) == []


def statvfs(blocks: int, free: int, available: int) -> os.statvfs_result:
    return os.statvfs_result((4096, 4096, blocks, free, available, 1000, 900, 900, 0, 255))


def test_usage_counts_blocks_reserved_for_root_as_neither_used_nor_available():
    """df's Use% and RocketMQ's rule: a disk 40 % used with half its blocks reserved is not
    90 % full (which would start forced retention on a healthy disk)."""
    assert usage_ratio_of(statvfs(blocks=100, free=60, available=10)) == 0.8
    assert usage_ratio_of(statvfs(blocks=100, free=60, available=60)) == 0.4  # no reserve
    assert usage_ratio_of(statvfs(blocks=100, free=0, available=0)) == 1.0
    assert usage_ratio_of(statvfs(blocks=0, free=0, available=0)) == 0.0


def test_usage_of_a_real_disk_is_what_df_says(tmp_path):
    out = subprocess.run(["df", "--output=pcent", str(tmp_path)], capture_output=True, text=True,
                         check=True).stdout.split()
    df_percent = int(out[-1].rstrip("%"))  # df rounds up
    assert abs(disk_usage_ratio(tmp_path) * 100 - df_percent) <= 1.5


def test_retention_through_store_uses_real_usage(tmp_path):
    store = make_store(tmp_path, 3)
    report = store.clean_expired(now_ms=NOW_MS)
    assert abs(report.disk_usage_ratio - disk_usage_ratio(tmp_path)) < 0.01
    store.close()


# ------------------------------------------------------------------------------ DISK_FULL, for real


@pytest.fixture
def tmpfs(tmp_path):
    """A 1 MiB tmpfs under tmp_path: a real filesystem whose usage the test controls."""
    mount_point = tmp_path / "mnt"
    mount_point.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m,mode=0700", "tmpfs", str(mount_point)],
                          capture_output=True, check=False)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.decode().strip()}")
    try:
        yield mount_point
    finally:
        if subprocess.run(["umount", str(mount_point)], check=False).returncode != 0:
            subprocess.run(["umount", "-l", str(mount_point)], check=False)


def fill_to(directory: Path, ratio: float) -> Path:
    """Write a real file so the filesystem's used fraction reaches `ratio`."""
    st = os.statvfs(directory)
    total = st.f_blocks * st.f_frsize
    used = total - st.f_bavail * st.f_frsize
    path = directory / "ballast"
    with open(path, "wb") as fh:
        fh.write(b"\xa5" * max(0, int(total * ratio) - used + st.f_frsize))
    return path


def test_disk_full_set_and_cleared_on_a_real_filesystem(tmpfs):
    """DefaultMessageStoreCleanFilesTest.testIsSpaceFullFunctionEmpty2Full / Full2Empty."""
    root = tmpfs / "store"
    store = make_store(root, 4)
    try:
        assert store.put(TOPIC, b"fits").status is PutStatus.PUT_OK
        ballast = fill_to(tmpfs, 0.93)
        report = store.clean_expired(now_ms=NOW_MS)
        assert report.disk_usage_ratio >= CONFIG.disk_full_ratio and report.disk_full
        assert report.reason is RetentionReason.SPACE_FORCE
        assert len(report.segments_removed) == 3  # regardless of age, never the active one
        refused = store.put(TOPIC, b"no room")
        assert refused.status is PutStatus.DISK_FULL and refused.commit_pos is None
        ballast.unlink()
        report = store.clean_expired(now_ms=NOW_MS)
        assert report.disk_usage_ratio < CONFIG.disk_warn_ratio and not report.disk_full
        assert store.put(TOPIC, b"room again").status is PutStatus.PUT_OK
    finally:
        store.close()
    assert check(root) == []


def test_retention_on_a_disk_with_no_byte_free_moves_its_line_and_the_store_reopens(tmpfs):
    """The retention line is rewritten in place: a disk with no free block does not stop the
    pass that frees it, and the segments it removed do not look lost at the next start."""
    root = tmpfs / "store"
    store = make_store(root, 4)
    try:
        with open(tmpfs / "ballast", "wb", buffering=0) as fh, pytest.raises(OSError, match="No space"):
            while True:
                fh.write(b"\xa5" * 4096)
        report = store.clean_expired(now_ms=NOW_MS)
        assert report.reason is RetentionReason.SPACE_FORCE and len(report.segments_removed) == 3
    finally:
        store.close()
    assert read_retention_line(root) == 3 * SEGMENT_BYTES == report.min_commit_pos
    MessageStore.open(root, CONFIG).close()  # not refused as a lost head
    assert check(root) == []


# ------------------------------------------------------------------------------ crash after each step


def _delete_some(parts, plan, count):
    return retention.delete_segments(parts, plan[:count])


STEPS = {
    "segments": lambda parts, plan: retention.delete_segments(parts, plan),
    "consume_queues": lambda parts, plan: retention.clean_consume_queues(parts, parts.commitlog.min_pos),
    "index": lambda parts, plan: retention.clean_index(parts, parts.commitlog.min_pos),
}


@pytest.mark.parametrize("steps", [
    [],
    [lambda parts, plan: _delete_some(parts, plan, 3)],  # died between two segment deletions
    [STEPS["segments"]],
    [STEPS["segments"], STEPS["consume_queues"]],
    [STEPS["segments"], STEPS["consume_queues"], STEPS["index"]],
], ids=["none", "3_of_10_segments", "segments", "segments+cq", "segments+cq+index"])
def test_retention_crash_after_step_recovers_clean(tmp_path, clock, steps):
    make_store(tmp_path, 25, clock=clock, aged=15).close()
    mark_running(tmp_path)  # the supervisor running the cleaner dies: `abort` stays behind
    parts = open_parts(tmp_path, CONFIG, Access.READ_WRITE)
    plan = retention.plan_pass(parts, CONFIG, now_ms=NOW_MS, usage_ratio=LOW,
                               ages=SegmentAges()).base_positions
    assert len(plan) == 10
    for step in steps:
        step(parts, plan)
    min_pos = parts.commitlog.min_pos
    close_parts(parts)
    assert check(tmp_path) == []  # entries below the log start are expired, not corrupt
    with MessageStore.open(tmp_path, CONFIG) as store:
        assert store.recovery_report.shutdown == "crash"
        low = min_pos // SEGMENT_BYTES
        assert store.min_offset(TOPIC, 0) == low
        result = store.get_messages(TOPIC, 0, 0)
        if low:
            assert (result.status, result.next_offset) == (GetStatus.OFFSET_TOO_SMALL, low)
        else:
            assert result.status is GetStatus.FOUND
        assert store.put(TOPIC, b"after").ok
        report = store.clean_expired(now_ms=NOW_MS)  # the next pass finishes what the dead one began
    assert check(tmp_path) == []
    assert report.min_commit_pos >= min_pos


# ------------------------------------------------------------------------------ age by store time


@pytest.mark.slow
def test_retention_keeps_fresh_segments_whose_mtimes_say_1970(tmp_path):
    """Issue #32: 2,000 messages a minute old, the store stopped, its segments' mtimes set to
    1970, a manual pass with a 1-hour retention. By mtime 10 of 12 segments went; by the store
    time of each segment's last record none does, until those records are an hour old."""
    config = StoreConfig(commitlog_file_size=64 << 10, consume_queue_entries=1000, index_shards=1,
                         queue_count=1, file_reserved_hours=1)
    with MessageStore.open(tmp_path, config) as store:
        results = store.put_batch([Message(TOPIC, b"m" * 250 + str(i).encode()) for i in range(2000)])
        assert all(r.ok for r in results)
        segment_count = len(store.commitlog.segments.segments)
        assert segment_count >= 10
    set_mtimes(tmp_path, 0)
    with MessageStore.open(tmp_path, config) as store:
        kept = run_retention(parts_of(store), config, now_ms=NOW_MS + 60_000, usage_ratio=LOW,
                             kind=retention.PassKind.MANUAL)
        assert (kept.segments_removed, kept.reason) == ([], RetentionReason.MANUAL)
        assert (store.min_offset(TOPIC, 0), store.max_offset(TOPIC, 0)) == (0, 2000)
        assert store.get_messages(TOPIC, 0, 0, 1).messages[0].body == b"m" * 250 + b"0"
        aged = run_retention(parts_of(store), config, now_ms=NOW_MS + 2 * HOUR_MS, usage_ratio=LOW,
                             kind=retention.PassKind.MANUAL)
        sealed = segment_count - 1
        assert (len(aged.segments_removed), aged.more_due) == (min(10, sealed), sealed > 10)
    assert check(tmp_path) == []


def test_retention_ignores_a_recent_mtime_on_an_old_segment(tmp_path, clock):
    """The other way round: records 100 h old in files just touched (a copy) expire."""
    store = make_store(tmp_path, 6, clock=clock, aged=3)
    set_mtimes(tmp_path, NOW_MS / 1000)
    report = run_retention(parts_of(store), CONFIG, now_ms=NOW_MS, usage_ratio=LOW)
    assert len(report.segments_removed) == 3 and not report.more_due
    store.close()
    assert check(tmp_path) == []


def test_retention_keeps_a_segment_whose_store_time_is_in_the_future(tmp_path, clock):
    """Records stamped by a clock 10 h ahead: their segments wait until that time has aged."""
    store = make_store(tmp_path, 6, clock=clock, aged=3, hours=-10)
    parts, manual = parts_of(store), retention.PassKind.MANUAL
    early = run_retention(parts, CONFIG, now_ms=NOW_MS + 73 * HOUR_MS, usage_ratio=LOW, kind=manual)
    assert early.segments_removed == []
    late = run_retention(parts, CONFIG, now_ms=NOW_MS + 82 * HOUR_MS, usage_ratio=LOW, kind=manual)
    assert len(late.segments_removed) == 5
    store.close()
    assert check(tmp_path) == []


def _flip_body_byte(root: Path, base_pos: int) -> None:
    with open(commitlog_dir(root) / f"{base_pos:020d}", "r+b") as fh:
        fh.seek(BODY_OFFSET + 10)
        byte = fh.read(1)
        fh.seek(BODY_OFFSET + 10)
        fh.write(bytes([byte[0] ^ 0xFF]))


def _zero_head(root: Path, base_pos: int) -> None:
    with open(commitlog_dir(root) / f"{base_pos:020d}", "r+b") as fh:
        fh.write(bytes(FILLER_SIZE))  # TOTALSIZE and magic: the chain ends before the filler


@pytest.mark.parametrize("damage", [_flip_body_byte, _zero_head], ids=["flipped", "torn"])
def test_retention_ages_a_segment_whose_last_record_does_not_read_by_the_next_ones_first(
        tmp_path, caplog, damage):
    """The next segment's first record was stored after all of the damaged one: expired by it,
    and the log says so."""
    store = make_store(tmp_path, 4)
    damage(tmp_path, SEGMENT_BYTES)  # segment 1's only record, through the store's shared mapping
    parts, later_ms = parts_of(store), NOW_MS + 100 * HOUR_MS
    report = run_retention(parts, CONFIG, now_ms=later_ms, usage_ratio=LOW, kind=retention.PassKind.MANUAL)
    assert report.segments_removed == [f"{0:020d}", f"{SEGMENT_BYTES:020d}", f"{2 * SEGMENT_BYTES:020d}"]
    warned = [r.getMessage() for r in caplog.records if "next segment's first record" in r.getMessage()]
    assert len(warned) == 1 and f"segment at {SEGMENT_BYTES}" in warned[0]
    store.close()
    assert check(tmp_path) == []


@pytest.mark.parametrize("damage", [_flip_body_byte, _zero_head], ids=["flipped", "torn"])
def test_retention_keeps_a_segment_whose_last_record_does_not_read(tmp_path, caplog, damage):
    """Never expired by a bad read: when neither its last record nor the next segment's first
    reads, the segment, and every one after it, stays (warned once) until disk pressure
    removes segments regardless of age."""
    store = make_store(tmp_path, 6)
    damage(tmp_path, SEGMENT_BYTES)  # segment 1's only record, through the store's shared mapping
    damage(tmp_path, 2 * SEGMENT_BYTES)  # and segment 2's, the record that would age segment 1
    parts, later_ms = parts_of(store), NOW_MS + 100 * HOUR_MS
    ages, manual = SegmentAges(), retention.PassKind.MANUAL
    first = run_retention(parts, CONFIG, now_ms=later_ms, usage_ratio=LOW, ages=ages, kind=manual)
    assert first.segments_removed == [f"{0:020d}"] and not first.more_due
    again = run_retention(parts, CONFIG, now_ms=later_ms, usage_ratio=LOW, ages=ages, kind=manual)
    assert again.segments_removed == []
    warned = [r.getMessage() for r in caplog.records if "retention keeps it" in r.getMessage()]
    assert len(warned) == 1 and f"segment at {SEGMENT_BYTES}" in warned[0]
    assert store.min_offset(TOPIC, 0) == 1
    forced = run_retention(parts, CONFIG, now_ms=later_ms, usage_ratio=FORCE, ages=ages)
    assert len(forced.segments_removed) == 4  # regardless of age, the damaged one too
    store.close()
    assert check(tmp_path) == []
