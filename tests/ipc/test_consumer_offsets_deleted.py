"""A commit of a topic deleted after the consumer read it is dropped (under the offsets lock,
against topics.json's tombstones): the delete's offset reset cannot be undone by a late commit
that would make the group skip the re-created topic's first messages."""

from __future__ import annotations

import pytest

from engine.errors import StoreError
from engine.topics.table import TopicTable, TopicTableFile
from ipc.consumer_offsets import ConsumerOffsets
from ipc.deleted_topic_offsets import forget_topic_offsets


def test_a_commit_of_a_topic_deleted_since_it_was_read_is_dropped(tmp_path, caplog):
    TopicTableFile(tmp_path).write(TopicTable(tombstones={"Gone": 4096}))
    offsets = ConsumerOffsets(tmp_path)
    offsets.commit_many("g", {("Gone", 0): 3, ("Kept", 0): 5}, tombstones_read={})  # read before the delete
    assert offsets.load() == {"Kept@g": {0: 5}}
    assert "commit of Gone/0 offset 3 dropped" in caplog.text


def test_a_commit_read_after_the_delete_or_without_tombstones_is_written(tmp_path):
    TopicTableFile(tmp_path).write(TopicTable(tombstones={"Gone": 4096}))
    offsets = ConsumerOffsets(tmp_path)
    offsets.commit("Gone", "g", 0, 2, tombstones_read={"Gone": 4096})  # the re-created topic's queue
    offsets.commit("Other", "g", 1, 7)  # no reads to judge it by: as before
    assert offsets.load() == {"Gone@g": {0: 2}, "Other@g": {1: 7}}


def test_the_supervisors_reset_forgets_every_groups_offsets_of_the_topic(tmp_path):
    offsets = ConsumerOffsets(tmp_path)
    offsets.commit_many("g1", {("Gone", 0): 3, ("Kept", 0): 5})
    offsets.commit("Gone", "g2", 1, 4)
    assert forget_topic_offsets(tmp_path, "Gone") == ["g1", "g2"]
    assert offsets.load() == {"Kept@g1": {0: 5}}
    assert forget_topic_offsets(tmp_path, "Gone") == []  # nothing left: the file is not rewritten


def test_the_supervisors_reset_of_an_unreadable_file_changes_nothing(tmp_path):
    path = tmp_path / "config" / "consumerOffset.json"
    path.parent.mkdir()
    path.write_text("{torn")
    with pytest.raises(StoreError, match=r"consumerOffset\.json unreadable"):
        forget_topic_offsets(tmp_path, "Gone")
    assert path.read_text() == "{torn"
