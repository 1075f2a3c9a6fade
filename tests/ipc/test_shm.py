"""SharedRegion: naming, cross-process mapping, owner-only permissions and lifetime."""

from __future__ import annotations

import multiprocessing
import os
import re
import stat
import sys

import pytest

from engine.errors import BadInputError, ServiceNotAvailableError, StoreError, StorePermissionError
from ipc.shm import (
    SHM_DIR,
    SharedRegion,
    issue_shm_token,
    region_name,
    token_path,
    unlink_stale,
    unlink_stale_regions,
)
from ipc.wakeup import unlink_all

SPAWN = multiprocessing.get_context("spawn")
NOBODY_UID = 65534
PATTERN = bytes(range(256)) * 16
CHILD_OFFSET = 8192


@pytest.fixture
def store_dir(tmp_path):
    issue_shm_token(tmp_path)  # what a supervisor does before creating its regions
    yield tmp_path
    unlink_stale_regions(tmp_path)
    unlink_all(tmp_path)


def shm_path(name: str):
    return SHM_DIR / name.lstrip("/")


def mapping_count(name: str) -> int:
    """How many mappings of the region this process has (from /proc/self/maps)."""
    with open("/proc/self/maps") as maps:
        return sum(line.rstrip().endswith(str(shm_path(name))) for line in maps)


def run_child(target, *args, timeout_s: float = 30.0) -> int:
    proc = SPAWN.Process(target=target, args=args)
    proc.start()
    proc.join(timeout_s)
    if proc.is_alive():
        proc.kill()
        proc.join()
        pytest.fail(f"child {target.__name__} did not finish within {timeout_s}s")
    return proc.exitcode


def drop_to_nobody() -> None:
    os.setgroups([])
    os.setgid(NOBODY_UID)
    os.setuid(NOBODY_UID)


# -- children (run in spawned processes) ----------------------------------------------------------

def child_check_and_answer(name: str) -> None:
    with SharedRegion.attach(name) as region:
        assert region.owner_pid is None
        assert bytes(region.buf[:len(PATTERN)]) == PATTERN
        region.buf[CHILD_OFFSET:CHILD_OFFSET + 5] = b"hello"


def child_attach_as_nobody(name: str, expect_owner_uid: int) -> None:
    drop_to_nobody()
    try:
        SharedRegion.attach(name)
    except StorePermissionError as exc:
        assert f"belongs to uid {expect_owner_uid}" in str(exc), str(exc)
        assert "hint:" in str(exc)
        assert mapping_count(name) == 0
        sys.exit(0)
    sys.exit(3)


def child_attach_own_region_as_nobody(name: str) -> None:
    drop_to_nobody()
    with SharedRegion.attach(name) as region:
        assert bytes(region.buf[:4]) == b"mine"


# -- tests -----------------------------------------------------------------------------------------

def test_region_names_come_from_a_random_token_in_an_owner_only_file(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    with pytest.raises(ServiceNotAvailableError, match="no supervisor runs"):
        region_name(tmp_path / "a", "ctl")  # no token: nothing to attach, nothing to guess
    issue_shm_token(tmp_path / "a")
    issue_shm_token(tmp_path / "b")
    name = region_name(tmp_path / "a", "ctl")
    assert re.fullmatch(r"/mqstore-[0-9a-f]{16}-ctl", name)
    assert stat.S_IMODE(os.stat(token_path(tmp_path / "a")).st_mode) == 0o600
    assert region_name(tmp_path / "b" / ".." / "a", "ctl") == name
    assert region_name(tmp_path / "b", "ctl") != name
    assert region_name(tmp_path / "a", "mbox") != name
    issue_shm_token(tmp_path / "a")  # the next start: a name nobody could have known before
    assert region_name(tmp_path / "a", "ctl") != name
    with pytest.raises(BadInputError):
        region_name(tmp_path / "a", "../etc")


def test_a_name_another_user_created_first_is_refused_naming_that_user(store_dir):
    name = region_name(store_dir, "ctl")
    squatter = SharedRegion.create(name, 4096)
    os.chown(shm_path(name), NOBODY_UID, NOBODY_UID)
    try:
        with pytest.raises(StorePermissionError) as caught:
            SharedRegion.create(name, 4096)
        text = str(caught.value)
        assert f"uid {NOBODY_UID} (nobody)" in text and "another user created it first" in text
        assert shm_path(name).stat().st_uid == NOBODY_UID  # the squatter's object is untouched
    finally:
        squatter.unlink()
        squatter.close()


def test_region_create_then_attach_in_other_process_shares_bytes(store_dir):
    name = region_name(store_dir, "test")
    with SharedRegion.create(name, 64 * 1024) as region:
        assert region.size_bytes == 64 * 1024 and region.is_owner
        assert bytes(region.buf[:16]) == bytes(16)  # zero-filled
        region.buf[:len(PATTERN)] = PATTERN
        assert run_child(child_check_and_answer, name) == 0
        assert bytes(region.buf[CHILD_OFFSET:CHILD_OFFSET + 5]) == b"hello"
        region.unlink()
    assert not shm_path(name).exists()


def test_region_create_mode_is_owner_only_whatever_the_umask(store_dir):
    name = region_name(store_dir, "test")
    old_umask = os.umask(0)
    try:
        region = SharedRegion.create(name, 4096)
    finally:
        os.umask(old_umask)
    try:
        info = os.stat(shm_path(name))
        assert stat.S_IMODE(info.st_mode) == 0o600
        assert info.st_uid == os.geteuid()
    finally:
        region.close()
        region.unlink()


def test_region_attach_missing_raises_service_not_available(store_dir):
    with pytest.raises(ServiceNotAvailableError, match="does not exist"):
        SharedRegion.attach(region_name(store_dir, "nothing"))


def test_region_create_over_stale_region_raises_until_unlinked(store_dir):
    name = region_name(store_dir, "test")
    stale = SharedRegion.create(name, 4096)
    stale.close()
    with pytest.raises(StoreError, match="already exists"):
        SharedRegion.create(name, 4096)
    assert unlink_stale(name) is True
    assert unlink_stale(name) is False
    fresh = SharedRegion.create(name, 4096)
    fresh.close()
    fresh.unlink()


def test_region_unlink_from_attacher_is_refused(store_dir):
    name = region_name(store_dir, "test")
    with SharedRegion.create(name, 4096) as owner:
        attached = SharedRegion.attach(name)
        with pytest.raises(StoreError, match="may not unlink"):
            attached.unlink()
        attached.close()
        assert shm_path(name).exists()
        owner.unlink()
    assert not shm_path(name).exists()


def test_region_unlink_from_forked_child_is_refused(store_dir):
    name = region_name(store_dir, "test")
    with SharedRegion.create(name, 4096) as owner:
        pid = os.fork()
        if pid == 0:  # the child inherits the owner object but not the ownership
            code = 1
            try:
                owner.unlink()
            except StoreError:
                code = 0
            os._exit(code)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
        assert shm_path(name).exists()
        owner.unlink()


def test_region_close_with_live_numpy_view_keeps_view_valid(store_dir):
    np = pytest.importorskip("numpy")
    name = region_name(store_dir, "test")
    region = SharedRegion.create(name, 4096)
    view = np.frombuffer(region.buf, dtype="<u8")
    view[0] = 7
    region.close()  # must not unmap under the live view
    assert view[0] == 7
    region.close()  # idempotent
    unlink_stale(name)


needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="needs root to change uids")


@needs_root
def test_region_attach_by_other_user_raises_permission_error(store_dir):
    name = region_name(store_dir, "test")
    with SharedRegion.create(name, 4096) as region:
        assert run_child(child_attach_as_nobody, name, 0) == 0
        region.unlink()


@needs_root
def test_region_attach_to_region_owned_by_other_uid_raises_permission_error(store_dir):
    name = region_name(store_dir, "test")
    with SharedRegion.create(name, 4096) as region:
        os.chown(shm_path(name), NOBODY_UID, NOBODY_UID)
        mapped_before = mapping_count(name)
        with pytest.raises(StorePermissionError, match=f"belongs to uid {NOBODY_UID}"):
            SharedRegion.attach(name)  # root could open it; ownership is checked anyway
        assert mapping_count(name) == mapped_before == 1
        region.unlink()


@needs_root
def test_region_attach_by_its_owning_uid_succeeds(store_dir):
    name = region_name(store_dir, "test")
    with SharedRegion.create(name, 4096) as region:
        region.buf[:4] = b"mine"
        os.chown(shm_path(name), NOBODY_UID, NOBODY_UID)
        assert run_child(child_attach_own_region_as_nobody, name) == 0
        region.unlink()
