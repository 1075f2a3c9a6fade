"""ConsumeQueueTable: loading every queue, foreign entries, queues created later, per-queue steps."""

from __future__ import annotations

import pytest

from engine.errors import BadInputError
from engine.files.mapped_file import Access
from engine.files.naming import consume_queue_dir
from engine.queues.table import ConsumeQueueTable

EPF = 10  # entries per file: files of 200 bytes, so rolls happen
TOPIC = "TopicTest"
MSG = 100  # every test record is 100 bytes: entry i points at commit_pos i * 100


def qdir(root, topic=TOPIC, queue_id=0):
    return consume_queue_dir(root, topic, queue_id)


def put_range(queue, start: int, stop: int) -> None:
    for i in range(start, stop):
        assert queue.put_entries([i], [i * MSG], [MSG], [i % 7]) == 1


def test_consume_queue_table_loads_queues_and_reports_foreign(tmp_path):
    table = ConsumeQueueTable.load(tmp_path, EPF, Access.READ_WRITE)
    put_range(table.get_or_create("A", 0), 0, 3)
    put_range(table.get_or_create("A", 1), 0, 12)
    put_range(table.get_or_create("B", 0), 5, 6)
    table.close()
    cq_root = tmp_path / "consumequeue"
    (cq_root / "A" / "abc").mkdir()
    (cq_root / "A" / "01").mkdir()
    (cq_root / "bad.topic").mkdir()
    (cq_root / "stray.txt").write_text("x")
    table = ConsumeQueueTable.load(tmp_path, EPF, Access.READ_WRITE)
    assert sorted((q.topic, q.queue_id, q.max_offset) for q in table) == \
        [("A", 0, 3), ("A", 1, 12), ("B", 0, 6)]
    assert sorted(p.name for p in table.foreign) == ["01", "abc", "bad.topic", "stray.txt"]
    assert table.get("A", 7) is None and len(table) == 3
    assert table.max_commit_end() == 1200
    with pytest.raises(BadInputError):
        table.get("../x", 0)


def test_consume_queue_table_truncate_recover_flush_drop(tmp_path):
    table = ConsumeQueueTable.load(tmp_path, EPF, Access.READ_WRITE)
    put_range(table.get_or_create("A", 0), 0, 20)
    put_range(table.get_or_create("B", 0), 0, 5)
    assert table.truncate_all_from(1000) == 10
    assert table.max_commit_end() == 1000
    assert table.recover_all() == 1000
    table.flush_all()
    assert all(q.flushed_offset == q.max_offset for q in table)
    table.drop("A", 0)
    assert table.get("A", 0) is None and not qdir(tmp_path, "A").exists()
    assert table.get_or_create("A", 0).max_offset == 0
    table.close()


def test_consume_queue_table_get_loads_queue_created_later(tmp_path):
    reader = ConsumeQueueTable.load(tmp_path, EPF, Access.READ_ONLY)
    writer = ConsumeQueueTable.load(tmp_path, EPF, Access.READ_WRITE)
    queue = writer.get_or_create("A", 2)
    put_range(queue, 0, 4)
    seen = reader.get("A", 2)
    assert seen is not None and seen.max_offset == 4
    put_range(queue, 4, 13)
    seen.refresh()
    assert seen.max_offset == 13 and seen.entry(12) == queue.entry(12)
