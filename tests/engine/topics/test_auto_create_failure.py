"""Auto-create whose config/topics.json write fails: the record is refused with the store's
status (SERVICE_NOT_AVAILABLE, DISK_FULL for a full disk) and the errno, nothing is appended,
and the store keeps running; the same put succeeds once the file can be written."""

from __future__ import annotations

import errno

from engine.check.fsck import check
from engine.files.naming import CONFIG_DIR, TEMP_SUFFIX, TOPICS_FILE
from engine.refusal import Refusal, describe_refusal
from engine.status import PutStatus
from engine.store import MessageStore
from tests.helpers import SMALL_CONFIG, snapshot


def test_put_to_a_new_topic_whose_topics_json_cannot_be_written_is_refused_unstored(tmp_path):
    with MessageStore.open(tmp_path, SMALL_CONFIG) as store:
        blocker = tmp_path / CONFIG_DIR / (TOPICS_FILE + TEMP_SUFFIX)
        blocker.mkdir(parents=True)  # the atomic write's temporary file cannot be created
        before, end_pos = snapshot(tmp_path), store.commitlog.written_pos
        result = store.put("Fresh", b"x", queue_id=0)
        assert result.status is PutStatus.SERVICE_NOT_AVAILABLE
        assert "config/topics.json was not written" in result.reason and "Is a directory" in result.reason
        assert store.commitlog.written_pos == end_pos and snapshot(tmp_path) == before
        assert "Fresh" not in store.topics.topics
        blocker.rmdir()
        assert store.put("Fresh", b"y", queue_id=0).status is PutStatus.PUT_OK
    assert check(tmp_path) == []


def test_put_to_a_new_topic_on_a_full_disk_is_refused_disk_full(tmp_path):
    with MessageStore.open(tmp_path, SMALL_CONFIG) as store:
        topics = store._topics

        def full_disk_write(table):
            raise OSError(errno.ENOSPC, "No space left on device")

        topics.file.write = full_disk_write  # a fake topic file on a full disk
        result = store.put("Fresh", b"x", queue_id=0)
        assert result.status is PutStatus.DISK_FULL and "No space left" in result.reason
        assert store.commitlog.written_pos == 0


def test_a_topics_json_refusal_row_describes_the_errno_for_the_producer():
    said = describe_refusal(int(Refusal.TOPIC_NOT_WRITTEN), 0, errno.EACCES)
    assert said == ("topic creating it failed: config/topics.json was not written "
                    "(errno 13: Permission denied); nothing was stored")
