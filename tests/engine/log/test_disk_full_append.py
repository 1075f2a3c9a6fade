"""A full filesystem under the commitlog gives DISK_FULL (not SIGBUS), writes nothing partial,
and writes resume when space returns. Runs on a real 8 MiB tmpfs mounted under tmp_path."""

from __future__ import annotations

import os
import subprocess

import pytest

from engine.check.fsck import check
from engine.config import StoreConfig
from engine.errors import DiskFullError
from engine.files.mapped_file import Access
from engine.formats.record import FILLER_SIZE
from engine.log.commitlog import CommitLog
from engine.message import Message
from engine.status import GetStatus, PutStatus
from engine.store import MessageStore
from tests.engine.log.test_commitlog import record

CONFIG = StoreConfig(commitlog_file_size=1 << 20, consume_queue_entries=64, index_slot_count=64,
                     index_entry_count=256, index_shards=1, disk_full_ratio=1.0,
                     disk_clean_force_ratio=1.0, disk_warn_ratio=1.0)


@pytest.fixture
def small_fs(tmp_path):
    mount_point = tmp_path / "mnt"
    mount_point.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=8m,mode=0700", "tmpfs", str(mount_point)],
                          capture_output=True)
    assert done.returncode == 0, f"cannot mount a tmpfs: {done.stderr.decode().strip()}"
    try:
        yield mount_point
    finally:
        subprocess.run(["umount", "-l", str(mount_point)], check=True)


def fill(path, keep_free_bytes: int) -> None:
    """Take all free space of the filesystem holding `path` but `keep_free_bytes`."""
    st = os.statvfs(path.parent)
    size = max(st.f_bavail * st.f_frsize - keep_free_bytes, 0)
    with open(path, "wb") as fh:
        os.posix_fallocate(fh.fileno(), 0, size)


def test_append_on_full_filesystem_is_disk_full_then_resumes(small_fs):
    root = small_fs / "store"
    body = bytes(200_000)
    with MessageStore.open(root, CONFIG) as store:
        first = store.put("orders", b"first", keys=("k0",))
        assert first.status is PutStatus.PUT_OK
        written_before = store.commitlog.written_pos
        filler = small_fs / "filler"
        fill(filler, keep_free_bytes=0)
        results = store.put_batch([Message("orders", body, keys=(f"k{i}",)) for i in range(30)])
        assert {r.status for r in results} == {PutStatus.DISK_FULL}
        assert store.commitlog.written_pos == written_before  # nothing partial
        assert store.max_offset("orders", 0) == 1
        filler.unlink()
        again = store.put("orders", b"second", keys=("k1",))
        assert again.status is PutStatus.PUT_OK and again.queue_offset == 1
        got = store.get_messages("orders", 0, 0, 10)
        assert got.status is GetStatus.FOUND
        assert [m.body for m in got.messages] == [b"first", b"second"]
    assert check(root) == []


def test_a_roll_refused_for_a_full_disk_keeps_the_segment_files_a_reader_mapped(small_fs):
    """The dispatcher maps the writer's preallocated next segment before the writer rolls into it.
    A roll taken back for DISK_FULL must not delete that file and later make a new one under its
    name: the reader would go on reading the deleted file's zeros where the records are."""
    segment_bytes, size = 256 << 10, 20_000
    writer = CommitLog.open(small_fs / "store", segment_bytes, Access.READ_WRITE)
    offset = 0
    while writer.written_pos + size + FILLER_SIZE <= segment_bytes:  # the next record rolls
        writer.append(record(size), queue_offset=offset, store_ts_ms=1000)
        offset += 1
    writer.flush()
    reader = CommitLog.open(small_fs / "store", segment_bytes, Access.READ_ONLY)
    assert len(reader.segments.segments) == 2  # segment 0 and the preallocated next one
    written_before = writer.written_pos
    fill(small_fs / "filler", keep_free_bytes=0)
    with pytest.raises(DiskFullError):
        writer.append_batch([record(size)], [offset], 2000)
    assert writer.written_pos == written_before  # the filler was taken back too
    assert check(small_fs / "store") == []  # a stop here leaves a consistent log
    (small_fs / "filler").unlink()
    positions = writer.append_batch([record(size), record(size)], [offset, offset + 1], 3000)
    writer.flush()
    assert positions[0] == segment_bytes
    reader.refresh()
    assert [reader.read_at(pos).queue_offset for pos in positions] == [offset, offset + 1]
    reader.close()
    writer.close()
    assert check(small_fs / "store") == []
