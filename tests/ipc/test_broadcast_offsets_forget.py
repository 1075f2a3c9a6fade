"""A deleted topic's offsets go from every BROADCASTING instance's own file too, by the
supervisor's part of the delete and by the CLI's: else a re-created topic is read from the old
offsets and its first messages are skipped."""

from __future__ import annotations

from ipc.consumer_offsets import ConsumerOffsets, broadcast_offsets_path
from ipc.deleted_topic_offsets import broadcast_instance_paths, forget_topic_offsets


def commit_everywhere(root) -> tuple[ConsumerOffsets, ConsumerOffsets]:
    groups = ConsumerOffsets(root)
    groups.commit_many("g", {("Gone", 0): 3, ("Kept", 0): 5})
    instance = ConsumerOffsets(root, broadcast_offsets_path(root, "b1"))
    instance.commit_many("gb", {("Gone", 0): 5, ("Gone", 1): 2, ("Kept", 1): 1})
    return groups, instance


def test_the_supervisors_forget_covers_broadcast_instances(tmp_path):
    groups, instance = commit_everywhere(tmp_path)
    assert broadcast_instance_paths(tmp_path) == [instance.path]
    assert forget_topic_offsets(tmp_path, "Gone") == ["g", "gb"]
    assert groups.load() == {"Kept@g": {0: 5}}
    assert instance.load() == {"Kept@gb": {1: 1}}


def test_the_clis_forget_covers_broadcast_instances(tmp_path):
    groups, instance = commit_everywhere(tmp_path)
    assert groups.forget_topic("Gone") == ["g", "gb"]
    assert instance.load() == {"Kept@gb": {1: 1}}
    assert groups.forget_topic("Gone") == []  # nothing left anywhere
