"""Small and failing filesystems for the disk faults (root only; tests skip with the reason).

- `small_tmpfs(mount_point, size_bytes)`: a tmpfs of a few MiB, to fill the disk for real.
  Fallback when tmpfs cannot be mounted: `small_loop_ext4` (an ext4 image on a loop device).
- `ThinDisk`: ext4 on a loop device whose backing file is sparse and larger than the tmpfs
  holding it. Writes succeed into the page cache; when writeback needs blocks the backing tmpfs
  does not have, the loop device fails the write and msync/fsync return EIO -- a real failing
  flush, with no hook in the store. `grow()` gives the backing store room again, `repair()`
  unmounts, runs e2fsck and mounts again (ext4 aborts its journal after such an error).
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

MiB = 1024 * 1024


class FilesystemUnavailable(RuntimeError):
    """This host cannot provide the filesystem (not root, no tmpfs, no loop devices...)."""


def _run(*argv: str) -> None:
    result = subprocess.run(argv, capture_output=True, text=True)
    if result.returncode != 0:
        raise FilesystemUnavailable(f"`{' '.join(argv)}` failed ({result.returncode}): "
                                    f"{(result.stderr or result.stdout).strip()}")


def small_tmpfs(mount_point: Path, size_bytes: int) -> Path:
    """Mount a tmpfs of `size_bytes` (owner-only) at `mount_point`."""
    if shutil.which("mount") is None:
        raise FilesystemUnavailable("no mount command")
    Path(mount_point).mkdir(parents=True, exist_ok=True)
    _run("mount", "-t", "tmpfs", "-o", f"size={size_bytes},mode=0700", "tmpfs", str(mount_point))
    return Path(mount_point)


def resize_tmpfs(mount_point: Path, size_bytes: int) -> None:
    _run("mount", "-o", f"remount,size={size_bytes}", str(mount_point))


def small_loop_ext4(image: Path, mount_point: Path, size_bytes: int) -> Path:
    """An ext4 filesystem of `size_bytes` in `image`, loop-mounted at `mount_point`."""
    for tool in ("mkfs.ext4", "mount", "losetup"):
        if shutil.which(tool) is None:
            raise FilesystemUnavailable(f"no {tool} command")
    with open(image, "wb") as fh:
        fh.truncate(size_bytes)
    _run("mkfs.ext4", "-q", "-F", "-m", "0", str(image))
    Path(mount_point).mkdir(parents=True, exist_ok=True)
    _run("mount", "-o", "loop", str(image), str(mount_point))
    return Path(mount_point)


def unmount(mount_point: Path) -> None:
    """Unmount (lazily if busy); never raises: used in teardown."""
    result = subprocess.run(["umount", str(mount_point)], capture_output=True)
    if result.returncode != 0:
        subprocess.run(["umount", "-l", str(mount_point)], capture_output=True)


def free_bytes(path: Path) -> int:
    import os

    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize


def fill(path: Path, leave_bytes: int = 0) -> int:
    """Fill the filesystem holding directory `path` with a ballast file, leaving about
    `leave_bytes` free; returns the ballast's size. Blocks are allocated (not sparse)."""
    import errno
    import os

    ballast = Path(path) / "ballast"
    size = max(free_bytes(path) - leave_bytes, 0)
    fd = os.open(ballast, os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        while size > 0:
            try:
                os.posix_fallocate(fd, 0, size)
                break
            except OSError as exc:  # metadata took some room: ask for a little less
                if exc.errno != errno.ENOSPC:
                    raise
                size -= 4096
        os.fsync(fd)
    finally:
        os.close(fd)
    return size


def unfill(path: Path) -> None:
    (Path(path) / "ballast").unlink(missing_ok=True)


class ThinDisk:
    """ext4 on a loop device over a sparse image bigger than the tmpfs that holds it."""

    def __init__(self, work_dir: Path, *, backing_bytes: int = 6 * MiB, image_bytes: int = 64 * MiB):
        self.work_dir = Path(work_dir)
        self.backing = self.work_dir / "backing"
        self.image = self.backing / "disk.img"
        self.mount_point = self.work_dir / "disk"
        self.backing_bytes = backing_bytes
        self.image_bytes = image_bytes
        self._mounted: list[Path] = []

    def create(self) -> Path:
        small_tmpfs(self.backing, self.backing_bytes)
        self._mounted.append(self.backing)
        with open(self.image, "wb") as fh:
            fh.truncate(self.image_bytes)
        _run("mkfs.ext4", "-q", "-F", "-m", "0", str(self.image))
        self.mount_point.mkdir(exist_ok=True)
        _run("mount", "-o", "loop", str(self.image), str(self.mount_point))
        self._mounted.append(self.mount_point)
        return self.mount_point

    def grow(self, backing_bytes: int) -> None:
        """Give the backing tmpfs room: writes to the loop device succeed again."""
        resize_tmpfs(self.backing, backing_bytes)
        self.backing_bytes = backing_bytes

    def repair(self) -> None:
        """Unmount, e2fsck (ext4 aborted its journal after the write errors), mount again."""
        _run("umount", str(self.mount_point))
        self._mounted.remove(self.mount_point)
        result = subprocess.run(["e2fsck", "-fy", str(self.image)], capture_output=True, text=True)
        if result.returncode not in (0, 1, 2):  # 1, 2: errors corrected
            raise FilesystemUnavailable(f"e2fsck failed ({result.returncode}): {result.stdout}")
        _run("mount", "-o", "loop", str(self.image), str(self.mount_point))
        self._mounted.append(self.mount_point)

    def destroy(self) -> None:
        for mount_point in reversed(self._mounted):
            unmount(mount_point)
        self._mounted.clear()
