"""The roster of a group's members on a topic (ipc.group_roster): entries under members/ that
are not member files are passed over, never taken for dead members, and never block a look."""

from __future__ import annotations

import os
import subprocess
import sys

from ipc.group_roster import MEMBERS_DIR, MessageModel, join_roster, live_members, topic_dir
from tests.workers.store_harness import REPO_ROOT, child_env


def members_dir(root):
    return topic_dir(root, "G", "T") / MEMBERS_DIR


def test_a_directory_named_like_a_member_is_passed_over_by_joins_and_looks(tmp_path):
    first = join_roster(tmp_path, "G", "T", "a", MessageModel.CLUSTERING, "*")
    try:
        (members_dir(tmp_path) / "hostile.json").mkdir()
        (members_dir(tmp_path) / "link.json").symlink_to(first.path)
        second = join_roster(tmp_path, "G", "T", "b", MessageModel.CLUSTERING, "*")  # reaps: no crash
        assert [r.member for r in live_members(tmp_path, "G", "T")] == ["a", "b"]
        assert (members_dir(tmp_path) / "hostile.json").is_dir()  # left alone, not unlinked
        second.leave()
    finally:
        first.leave()


def test_a_fifo_named_like_a_member_does_not_block_a_join(tmp_path):
    members_dir(tmp_path).mkdir(parents=True)
    os.mkfifo(members_dir(tmp_path) / "fifo.json")
    code = ("import sys\nfrom ipc.group_roster import MessageModel, join_roster, live_members\n"
            "seat = join_roster(sys.argv[1], 'G', 'T', 'a', MessageModel.CLUSTERING, '*')\n"
            "print([r.member for r in live_members(sys.argv[1], 'G', 'T')])")
    # in a child with a timeout: the bug blocks the open forever, which would hang the suite
    done = subprocess.run([sys.executable, "-c", code, str(tmp_path)], cwd=REPO_ROOT, env=child_env(None),
                          capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "['a']"


def test_a_joiner_killed_before_its_rename_leaves_no_tmp_file_behind(tmp_path):
    members_dir(tmp_path).mkdir(parents=True)
    (members_dir(tmp_path) / ".ghost.tmp").write_text("{")
    join_roster(tmp_path, "G", "T", "a", MessageModel.CLUSTERING, "*").leave()
    assert not (members_dir(tmp_path) / ".ghost.tmp").exists()
