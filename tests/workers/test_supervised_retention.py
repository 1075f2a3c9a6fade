"""Retention in the supervised store (issue 20, item 1): the supervisor deletes expired commitlog
segments on RocketMQ's schedule (never the active one), the dispatcher and each index builder
drop their own files wholly below the line, the line is published in the control block, and a
consumer behind it gets OFFSET_TOO_SMALL with the new minimum and continues from it.

Real processes (store_harness: `mqstore start` with small files); every wait polls a published
counter with a deadline.
"""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import pytest

from engine.files.mapped_file import Access
from engine.files.naming import commitlog_dir, index_shard_dir, name_to_offset
from engine.formats.checkpoint import decode_checkpoint
from engine.formats.cq_entry import CQ_ENTRY_SIZE, decode_cq_entry
from engine.index.file import IndexFile
from engine.log.commitlog import CommitLog
from engine.message import Message
from engine.queues.table import ConsumeQueueTable
from engine.status import GetStatus
from ipc.consumer import Consumer
from ipc.control_block import Role, pid_alive
from ipc.producer import Producer
from ipc.retention_block import RetentionBlock
from tests.workers.store_harness import (
    SMALL_STORE,
    assert_check_clean,
    checked_store,
    cli,
    start_store,
    wait_for,
)
from tools.store_process import StoreProcess

TOPIC = "Ret"
PAD = b"r" * 300
PER_WAVE = 400  # ~2 commitlog segments of 64 KiB
FAST_PASSES = {"clean_resource_interval_ms": 100}
EXPIRE_AT_ONCE = {"file_reserved_hours": 0.0003}  # ~1 s
# usage at or above the warn ratio: expired segments go at any hour (the machine's disk is used
# well above 0.1 %), so the test does not depend on the local hour
ANY_HOUR = {"disk_warn_ratio": 0.001, "disk_clean_force_ratio": 0.999, "disk_full_ratio": 1.0}


def body(i: int) -> bytes:
    return b"%d-" % i + PAD


def send_wave(root: Path, start: int, count: int = PER_WAVE) -> list:
    with Producer(root) as producer:
        acks = list(producer.send_batch([Message(TOPIC, body(i), queue_id=0, keys=(f"k{i}",))
                                         for i in range(start, start + count)]))
    assert all(a.ok for a in acks)
    return acks


def stopped_after_three_waves(tmp_path: Path, settings: dict) -> StoreProcess:
    """A store started with `settings`, sent three waves (~6 segments) and stopped cleanly."""
    running = start_store(tmp_path / "store", store=settings)
    try:
        for wave in range(3):
            send_wave(running.root, wave * PER_WAVE)
    finally:
        assert running.stop() == 0
    return running


def line_of(running: StoreProcess):
    with running.ctl() as ctl:
        return RetentionBlock(ctl).line()


def cleans_of(running: StoreProcess) -> dict:
    with running.ctl() as ctl:
        return RetentionBlock(ctl).cleans()


def wait_removed(running: StoreProcess, count: int, what: str):
    """The published line once its passes have removed `count` segments in all."""
    def removed():
        line = line_of(running)
        return line if line.segments_removed >= count else None
    return wait_for(removed, what)


def segment_bases(root: Path) -> list[int]:
    return sorted(name_to_offset(p.name) for p in commitlog_dir(root).iterdir())


def wait_children_clean(running: StoreProcess, min_pos: int) -> None:
    wait_for(lambda: all(c.clean_pos >= min_pos for c in cleans_of(running).values()),
             "every child to clean up to the retention line")


def assert_parts_above(root: Path, min_pos: int) -> None:
    """No consume-queue or index file lies wholly below `min_pos` (the last file of each
    excepted: it is never deleted)."""
    queues = ConsumeQueueTable.load(root, SMALL_STORE["consume_queue_entries"], Access.READ_ONLY)
    try:
        for queue in queues:
            segments = queue.segments.segments
            if len(segments) > 1:
                last = decode_cq_entry(segments[0].buf, queue.file_bytes - CQ_ENTRY_SIZE)
                assert last.commit_pos >= min_pos, f"{segments[0].path} lies below {min_pos}"
    finally:
        queues.close()
    for shard in range(SMALL_STORE["index_shards"]):
        paths = sorted(index_shard_dir(root, shard).iterdir())
        if len(paths) > 1:
            first = IndexFile.open(paths[0], SMALL_STORE["index_slot_count"],
                                   SMALL_STORE["index_entry_count"], Access.READ_ONLY)
            try:
                assert first.end_commit_pos >= min_pos, f"{paths[0]} lies below {min_pos}"
            finally:
                first.close()


@pytest.mark.slow
def test_expired_segments_go_and_every_part_follows_the_line(tmp_path):
    with checked_store(tmp_path / "store", store={**FAST_PASSES, **EXPIRE_AT_ONCE, **ANY_HOUR}) as running:
        acks = send_wave(running.root, 0)
        running.wait_caught_up()
        early = Consumer(running.root, "early")  # maps the first segment before it goes
        assert early.pull(TOPIC, 0, 0, max_count=2).status is GetStatus.FOUND
        for wave in range(1, 4):
            acks += send_wave(running.root, wave * PER_WAVE)
        cq_files_before = len(list((running.root / "consumequeue" / TOPIC / "0").iterdir()))
        assert cq_files_before >= 3
        running.wait_caught_up()
        with running.ctl() as ctl:
            written = ctl.written_pos
        segment_bytes = SMALL_STORE["commitlog_file_size"]
        active = written - written % segment_bytes
        # nothing more is sent: every sealed segment expires within ~1 s and goes, the active stays
        wait_for(lambda: line_of(running).min_commit_pos == active, "every expired segment to go")
        line = line_of(running)
        assert line.segments_removed == active // segment_bytes >= 6
        assert line.bytes_removed == active
        assert segment_bases(running.root)[0] == active  # the active segment stays
        min_pos = line.min_commit_pos
        wait_children_clean(running, min_pos)
        cleans = cleans_of(running)
        assert cleans["consumequeue"].files_removed >= 1
        assert sum(c.files_removed for k, c in cleans.items() if k.startswith("index/")) >= 1
        assert len(list((running.root / "consumequeue" / TOPIC / "0").iterdir())) < cq_files_before
        assert_parts_above(running.root, min_pos)

        first = next(a.queue_offset for a in acks if a.commit_pos >= min_pos)
        for consumer in (early, Consumer(running.root, "late")):
            with consumer:
                small = consumer.pull(TOPIC, 0, 0)
                assert (small.status, small.min_offset, small.next_offset) == \
                    (GetStatus.OFFSET_TOO_SMALL, first, first)
                found = consumer.pull(TOPIC, 0, small.next_offset, max_count=3)
                assert [r.body for r in found.messages] == [body(first + i) for i in range(3)]

        status = cli("status", "--store", str(running.root), "--json")
        assert status.returncode == 0, status.stderr.decode()
        retained = json.loads(status.stdout)["retention"]
        assert retained["min_commit_pos"] == min_pos
        assert retained["oldest_retained_ms"] == found.messages[0].store_ts_ms
        assert retained["segments_removed"] == line.segments_removed
        used = retained["bytes_used"]
        assert 0 < used["commitlog"] <= 2 * segment_bytes  # the active segment (and the next, sparse)
        assert used["consumequeue"] > 0 and used["index"] > 0
        text = cli("status", "--store", str(running.root))
        assert "oldest retained" in text.stdout.decode()


def _three_waves_removed_for(running: StoreProcess, reason: str, what: str) -> None:
    """Send three waves, wait for a pass to remove three segments for `reason`; the store then
    starts at the line."""
    for wave in range(3):
        send_wave(running.root, wave * PER_WAVE)
    line = wait_removed(running, 3, what)
    assert line.last_reason.value == reason
    assert segment_bases(running.root)[0] == line_of(running).min_commit_pos


@pytest.mark.slow
def test_disk_pressure_deletes_regardless_of_age(tmp_path):
    pressure = {"disk_warn_ratio": 0.001, "disk_clean_force_ratio": 0.001, "disk_full_ratio": 1.0}
    with checked_store(tmp_path / "store", store={**FAST_PASSES, **pressure}) as running:
        _three_waves_removed_for(running, "space_force", "disk pressure to delete segments of any age")


def _delete_hour_zone() -> tuple[int, str]:
    """(the local hour now, TZ) in a zone where the hour does not end within minutes: UTC, or
    UTC+0:30 when UTC's hour is about to change, so the supervisor's hour is the test's."""
    now = time.time()
    minute = time.gmtime(now).tm_min
    shift_s, tz = (0, "UTC0") if 2 <= minute <= 50 else (1800, "XST-0:30")
    return time.gmtime(now + shift_s).tm_hour, tz


@pytest.mark.slow
def test_at_the_delete_hour_expired_segments_go(tmp_path):
    hour, tz = _delete_hour_zone()
    at_hour = {"delete_when_hour": hour, "disk_warn_ratio": 0.999, "disk_clean_force_ratio": 0.999,
               "disk_full_ratio": 1.0}
    with checked_store(tmp_path / "store", store={**FAST_PASSES, **EXPIRE_AT_ONCE, **at_hour},
                       env={"TZ": tz}) as running:
        _three_waves_removed_for(running, "time_up", "the delete hour to delete expired segments")


def _hour_far_from_now() -> int:
    return (time.localtime().tm_hour + 12) % 24


@pytest.mark.slow
def test_off_the_delete_hour_nothing_goes_until_mqstore_clean(tmp_path):
    off_hour = {"delete_when_hour": _hour_far_from_now(), "disk_warn_ratio": 0.999,
                "disk_clean_force_ratio": 0.999, "disk_full_ratio": 1.0}
    with checked_store(tmp_path / "store", store={**FAST_PASSES, **EXPIRE_AT_ONCE, **off_hour}) as running:
        for wave in range(3):
            send_wave(running.root, wave * PER_WAVE)
        running.wait_caught_up()
        passes = line_of(running).passes
        wait_for(lambda: line_of(running).passes >= passes + 15, "more scheduled passes")  # > 1 s
        assert line_of(running).segments_removed == 0
        before = len(segment_bases(running.root))
        done = cli("clean", "--store", str(running.root), "--json")
        assert done.returncode == 0, done.stderr.decode()
        report = json.loads(done.stdout)
        assert report["mode"] == "running" and report["reason"] == "manual"
        assert report["segments_removed"] >= 3
        assert report["cq_files_removed"] >= 1
        assert report["min_commit_pos"] == segment_bases(running.root)[0] > 0
        assert len(segment_bases(running.root)) == before - report["segments_removed"]
        assert all(c.clean_pos >= report["min_commit_pos"] for c in cleans_of(running).values())


def test_the_line_is_published_at_start(tmp_path):
    running = start_store(tmp_path / "store")
    try:
        with running.ctl() as ctl:
            block = RetentionBlock(ctl)
            assert block.line().min_commit_pos == CommitLog.open(
                running.root, SMALL_STORE["commitlog_file_size"], Access.READ_ONLY).min_pos
            assert block.child_clean(Role.DISPATCHER).clean_pos == 0
    finally:
        assert running.stop() == 0


@pytest.mark.slow
def test_mqstore_clean_without_a_supervisor_runs_the_pass_offline(tmp_path):
    settings = {**EXPIRE_AT_ONCE, "delete_when_hour": _hour_far_from_now(),
                "disk_warn_ratio": 0.999, "disk_clean_force_ratio": 0.999, "disk_full_ratio": 1.0}
    running = stopped_after_three_waves(tmp_path, settings)
    before = segment_bases(running.root)
    config = tmp_path / "store.toml"  # the harness's config file, with the retention settings
    wait_for(lambda: time.time() - max(p.stat().st_mtime for p in commitlog_dir(running.root).iterdir()
                                       if name_to_offset(p.name) < before[-2]) > 1.2,
             "the sealed segments to expire")
    done = cli("clean", "--store", str(running.root), "--config", str(config), "--json")
    assert done.returncode == 0, done.stderr.decode()
    report = json.loads(done.stdout)
    assert report["mode"] == "offline" and report["reason"] == "manual"
    assert report["segments_removed"] >= 3 and report["cq_files_removed"] >= 1
    assert segment_bases(running.root)[0] == report["min_commit_pos"] > before[0]
    assert_check_clean(running.root)


def _store_times_in(root: Path, end_pos: int) -> list[int]:
    """The store time of every record below `end_pos`, in log order."""
    log = CommitLog.open(root, SMALL_STORE["commitlog_file_size"], Access.READ_ONLY)
    try:
        return [record.store_ts_ms for record in log.scan(log.min_pos, end_pos)]
    finally:
        log.close()


def _sealed_index_end_ts(root: Path) -> int:
    """The lowest end timestamp over the shards of each one's newest full (next to last) index file."""
    ends = []
    for shard in range(SMALL_STORE["index_shards"]):
        path = sorted(index_shard_dir(root, shard).iterdir())[-2]
        index_file = IndexFile.open(path, SMALL_STORE["index_slot_count"], SMALL_STORE["index_entry_count"],
                                    Access.READ_ONLY)
        ends.append(index_file.end_ts_ms)
        index_file.close()
    return min(ends)


@pytest.mark.slow
def test_a_stopped_store_with_1970_mtimes_keeps_its_fresh_messages(tmp_path):
    """Issue #32: the segments' mtimes set to 1970 (a restore, a copy tool) do not make fresh
    messages expire; `mqstore clean` with a 1-hour retention removes nothing. The stop's
    checkpoint, written by the supervisor, carries the store times of what it holds."""
    settings = {"file_reserved_hours": 1, "disk_warn_ratio": 0.999, "disk_clean_force_ratio": 0.999,
                "disk_full_ratio": 1.0}
    running = stopped_after_three_waves(tmp_path, settings)
    cp = decode_checkpoint((running.root / "checkpoint").read_bytes())
    times = _store_times_in(running.root, cp.commitlog_flushed_pos)
    assert cp.physic_msg_ts_ms == cp.logics_msg_ts_ms == times[-1]  # a clean stop: all durable
    assert cp.index_msg_ts_ms == _sealed_index_end_ts(running.root) <= times[-1]
    before = segment_bases(running.root)
    assert len(before) >= 5
    for path in commitlog_dir(running.root).iterdir():
        os.utime(path, (0, 0))
    done = cli("clean", "--store", str(running.root), "--config", str(tmp_path / "store.toml"), "--json")
    assert done.returncode == 0, done.stderr.decode()
    report = json.loads(done.stdout)
    assert (report["mode"], report["segments_removed"]) == ("offline", 0)
    assert segment_bases(running.root)[:len(before) - 1] == before[:-1]  # (the last one: preallocated)
    assert len(_store_times_in(running.root, cp.commitlog_flushed_pos)) == len(times) == 3 * PER_WAVE
    assert_check_clean(running.root)


@pytest.mark.parametrize("args, message", [
    (["--timeout", "0"], "invalid --timeout"),
    (["--timeout", "-1"], "invalid --timeout"),
])
def test_mqstore_clean_refuses_bad_input_and_changes_nothing(tmp_path, args, message):
    root = tmp_path / "store"
    done = cli("clean", "--store", str(root), *args)
    assert done.returncode == 2 and message in done.stderr.decode()
    assert not root.exists()


def test_mqstore_clean_of_no_store_says_so_and_creates_nothing(tmp_path):
    root = tmp_path / "nothing"
    done = cli("clean", "--store", str(root))
    assert done.returncode == 2 and "no store here" in done.stderr.decode()
    assert not root.exists()


def test_mqstore_clean_refuses_a_store_left_unclean(tmp_path):
    running = start_store(tmp_path / "store")
    send_wave(running.root, 0, 10)
    children = [running.child_pid(Role.DISPATCHER)] + [running.child_pid(Role.INDEX_BUILDER, shard)
                                                       for shard in range(SMALL_STORE["index_shards"])]
    running.kill()
    wait_for(lambda: not any(pid_alive(pid) for pid in children), "the orphaned children to exit")
    listing = sorted(p.name for p in running.root.rglob("*"))
    done = cli("clean", "--store", str(running.root))
    assert done.returncode == 1 and "did not stop cleanly" in done.stderr.decode()
    assert sorted(p.name for p in running.root.rglob("*")) == listing
    restarted = start_store(running.root)  # recovers, and removes the crash's shared memory
    assert restarted.stop() == 0
    assert_check_clean(running.root)


@pytest.mark.slow
def test_no_segment_goes_that_a_child_has_not_made_durable(tmp_path):
    """An index builder that stops (SIGSTOP) holds the line at its durable position; once it
    goes on, so does retention."""
    running = start_store(tmp_path / "store", store={**FAST_PASSES, **EXPIRE_AT_ONCE, **ANY_HOUR},
                          supervisor={"child_timeout_s": 120.0})
    builder = running.child_pid(Role.INDEX_BUILDER, 0)
    try:
        send_wave(running.root, 0)
        running.wait_caught_up()
        os.kill(builder, signal.SIGSTOP)
        held = running.positions().shard_durable_pos[0]
        for wave in range(1, 4):
            send_wave(running.root, wave * PER_WAVE)
        passes = line_of(running).passes
        wait_for(lambda: line_of(running).passes >= passes + 30, "passes while the builder is stopped")
        segment_bytes = SMALL_STORE["commitlog_file_size"]
        assert line_of(running).min_commit_pos <= held - held % segment_bytes
        with running.ctl() as ctl:
            written = ctl.written_pos
        assert written - held > 3 * segment_bytes  # there was much more to delete
    finally:
        os.kill(builder, signal.SIGCONT)
    try:
        wait_for(lambda: line_of(running).min_commit_pos > held, "retention to go on")
    finally:
        assert running.stop() == 0
    assert_check_clean(running.root)
