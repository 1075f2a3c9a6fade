"""engine.files.open_files: a consume-queue table holds a bounded number of open files, however many
queues it has; a closed (parked) file reopens with the same bytes; the soft limit is raised."""

from __future__ import annotations

import os
import resource
from pathlib import Path

import pytest

from engine.errors import BadInputError, SegmentLayoutError, StoreClosedError
from engine.files.mapped_file import Access, MappedFile
from engine.files.open_files import (
    LIMIT_SHARE,
    MIN_QUEUE_FILES,
    OpenFileBudget,
    queue_file_budget,
    raise_open_file_limit,
)
from engine.queues.table import ConsumeQueueTable

EPF = 10  # entries per file: 12 entries per queue span two files
QUEUES = 40
MSG = 100


def open_fds_under(root: Path) -> int:
    """This process's file descriptors open on files under `root` (mmap's dups included)."""
    count = 0
    for name in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{name}")
        except OSError:
            continue  # the listing's own fd, gone already
        count += target.startswith(str(root))
    return count


def fill(table: ConsumeQueueTable, topic_count: int) -> None:
    for t in range(topic_count):
        queue = table.get_or_create(f"T{t}", 0)
        for i in range(12):
            assert queue.put_entries([i], [(t * 12 + i) * MSG], [MSG], [t])


def test_table_keeps_at_most_its_budget_of_files_open(tmp_path):
    table = ConsumeQueueTable.load(tmp_path, EPF, Access.READ_WRITE, max_open_files=4)
    fill(table, QUEUES)  # 80 files
    assert len(table.budget) == 4
    assert open_fds_under(tmp_path) <= 2 * 4  # a writer's file: its fd and mmap's dup
    assert table.budget.closed_count >= 2 * QUEUES - 4
    for t in range(QUEUES):  # every parked file reopens with what was written into it
        entries = table.get(f"T{t}", 0).entries(0, 12)
        assert entries["commit_pos"].tolist() == [(t * 12 + i) * MSG for i in range(12)]
        assert open_fds_under(tmp_path) <= 2 * 4
    table.flush_all()
    table.close()
    assert open_fds_under(tmp_path) == 0
    reader = ConsumeQueueTable.load(tmp_path, EPF, Access.READ_ONLY, max_open_files=3)
    assert sorted(q.max_offset for q in reader) == [12] * QUEUES
    assert open_fds_under(tmp_path) <= 3
    assert reader.get("T7", 0).entry(11).commit_pos == (7 * 12 + 11) * MSG
    reader.close()


def test_recovery_over_more_queues_than_the_budget_keeps_every_entry(tmp_path):
    table = ConsumeQueueTable.load(tmp_path, EPF, Access.READ_WRITE, max_open_files=5)
    fill(table, QUEUES)
    table.close()
    table = ConsumeQueueTable.load(tmp_path, EPF, Access.READ_WRITE, max_open_files=5)
    assert table.recover_all() == (QUEUES * 12) * MSG
    assert table.truncate_all_from((QUEUES - 1) * 12 * MSG) == 12  # the last topic's entries
    assert table.get(f"T{QUEUES - 1}", 0).max_offset == 0
    assert open_fds_under(tmp_path) <= 2 * 5
    table.close()


def test_parked_file_reopens_with_the_same_bytes_and_closed_file_stays_closed(tmp_path):
    budget = OpenFileBudget(1)
    first = MappedFile.create(tmp_path / "a", 4096, budget=budget)
    first.reserve(4096)
    first.write(100, b"kept")
    second = MappedFile.create(tmp_path / "b", 4096, budget=budget)
    assert first.parked and not second.parked
    assert open_fds_under(tmp_path) == 2
    assert bytes(first.read(100, 4)) == b"kept"  # mapped again; `second` parks in its place
    assert second.parked and open_fds_under(tmp_path) == 2
    first.close()
    second.close()
    assert open_fds_under(tmp_path) == 0
    with pytest.raises(StoreClosedError):
        first.read(100, 4)


def test_parked_reader_whose_file_was_removed_gets_a_layout_error(tmp_path):
    MappedFile.create(tmp_path / "a", 4096).close()
    MappedFile.create(tmp_path / "b", 4096).close()
    budget = OpenFileBudget(1)
    reader = MappedFile.open(tmp_path / "a", Access.READ_ONLY, 4096, budget=budget)
    other = MappedFile.open(tmp_path / "b", Access.READ_ONLY, 4096, budget=budget)
    (tmp_path / "a").unlink()
    with pytest.raises(SegmentLayoutError, match="removed while it was closed"):
        reader.read(0, 4)
    other.close()


def test_budget_refuses_a_bound_below_one():
    with pytest.raises(BadInputError, match="max_files"):
        OpenFileBudget(0)


@pytest.fixture
def soft_limit():
    """Restores RLIMIT_NOFILE after a test lowers the soft limit (lowering and raising it back
    to the hard limit need no privilege)."""
    saved = resource.getrlimit(resource.RLIMIT_NOFILE)
    yield saved
    resource.setrlimit(resource.RLIMIT_NOFILE, saved)


def test_queue_file_budget_stays_within_the_soft_limit(soft_limit):
    _, hard = soft_limit
    resource.setrlimit(resource.RLIMIT_NOFILE, (256, hard))
    assert queue_file_budget(4096) == 256 // LIMIT_SHARE
    assert queue_file_budget(10) == MIN_QUEUE_FILES
    assert ConsumeQueueTable(Path("/nonexistent"), EPF, Access.READ_ONLY).budget.max_files == 64


def test_raise_open_file_limit_lifts_the_soft_limit_to_the_hard_one(soft_limit):
    _, hard = soft_limit
    if hard == resource.RLIM_INFINITY or hard <= 256:
        pytest.skip(f"hard limit {hard} leaves nothing to raise")
    resource.setrlimit(resource.RLIMIT_NOFILE, (256, hard))
    assert raise_open_file_limit() == hard
    assert resource.getrlimit(resource.RLIMIT_NOFILE) == (hard, hard)
