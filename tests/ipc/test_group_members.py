"""A group's membership lock lives exactly as long as a consumer that can still commit: it is
let go when the membership is collected, and a forked child does not keep its parent's."""

from __future__ import annotations

import errno
import gc
import os
import signal

import pytest

from engine.errors import GroupInUseError
from ipc import group_members
from ipc.group_members import GroupMembership, group_held_alone, group_lock_path


def _group_is_free(root, group: str) -> bool:
    try:
        with group_held_alone(root, group):
            return True
    except GroupInUseError:
        return False


def test_a_dropped_membership_lets_the_group_go_when_collected(tmp_path):
    membership = GroupMembership(tmp_path, "g")
    assert not _group_is_free(tmp_path, "g")
    del membership
    gc.collect()
    assert _group_is_free(tmp_path, "g")


def test_close_is_idempotent(tmp_path):
    membership = GroupMembership(tmp_path, "g")
    membership.close()
    membership.close()
    assert not membership.held and _group_is_free(tmp_path, "g")


def _fork(child_body, release_write_end: int) -> int:
    """Fork a child that runs `child_body(write_end)` and exits 0 (1 on an exception); it dies
    by SIGALRM after 30 s should the test never release it."""
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:
        signal.alarm(30)
        os.close(read_end)
        os.close(release_write_end)  # else the child's own copy keeps its release read open
        code = 0
        try:
            child_body(write_end)
        except BaseException:
            code = 1
        os._exit(code)
    os.close(write_end)
    assert os.read(read_end, 1) == b"r"  # the child is ready
    os.close(read_end)
    return pid


def _wait_in_child(write_end: int, release_read_end: int) -> None:
    os.write(write_end, b"r")
    os.read(release_read_end, 1)  # returns once the parent closes its end


def _reap(pid: int) -> None:
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0


def test_a_forked_child_does_not_keep_the_group_and_the_parent_keeps_it(tmp_path):
    membership = GroupMembership(tmp_path, "g")
    release_read, release_write = os.pipe()
    pid = _fork(lambda ready: _wait_in_child(ready, release_read), release_write)
    try:
        with pytest.raises(GroupInUseError) as refused, group_held_alone(tmp_path, "g"):
            pass  # the child's close of its inherited descriptor released nothing
        assert refused.value.pids == [os.getpid()]
        membership.close()
        assert _group_is_free(tmp_path, "g")  # the idle child does not keep the group live
    finally:
        os.close(release_write)
        os.close(release_read)
        _reap(pid)


def test_a_forked_child_that_rejoins_holds_the_group_alone(tmp_path):
    membership = GroupMembership(tmp_path, "g")
    release_read, release_write = os.pipe()

    def rejoin_and_wait(ready: int) -> None:
        membership.rejoin()
        _wait_in_child(ready, release_read)

    pid = _fork(rejoin_and_wait, release_write)
    try:
        membership.close()
        with pytest.raises(GroupInUseError) as refused, group_held_alone(tmp_path, "g"):
            pass
        assert refused.value.pids == [pid]
    finally:
        os.close(release_write)
        os.close(release_read)
        _reap(pid)
    assert _group_is_free(tmp_path, "g")


def test_a_store_whose_config_cannot_be_written_still_takes_consumers(tmp_path, monkeypatch):
    """Read-only: an existing lock file is flocked through O_RDONLY; a missing one that cannot
    be created leaves the consumer without a membership rather than refusing it."""
    group_lock_path(tmp_path, "old").parent.mkdir(parents=True)
    group_lock_path(tmp_path, "old").touch()
    real_open = os.open

    def read_only_open(path, flags, *mode):
        if flags & (os.O_CREAT | os.O_WRONLY | os.O_RDWR):
            raise OSError(errno.EROFS, "Read-only file system", str(path))
        return real_open(path, flags, *mode)

    monkeypatch.setattr(group_members.os, "open", read_only_open)
    existing = GroupMembership(tmp_path, "old")
    missing = GroupMembership(tmp_path, "new")
    monkeypatch.undo()
    assert existing.held and not _group_is_free(tmp_path, "old")
    assert not missing.held and not group_lock_path(tmp_path, "new").exists()
    existing.close()
    missing.close()
