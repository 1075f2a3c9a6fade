"""Who may use a path: the words for a refused file (another user's, or read-only for its
owner), and the directories a root-run store must not live under.

A permission error has two common causes that need opposite fixes: the store belongs to another
user (run as that user), or it is the caller's own but read-only (chmod u+w, or a read-only
copy). The error says which, from the owner and mode of the nearest existing path.
"""

from __future__ import annotations

import os
import pwd
import stat
from pathlib import Path

from engine.errors import StorePermissionError


def describe_uid(uid: int) -> str:
    """'uid 1001 (alice)', or 'uid 1001' when the password database does not know it."""
    try:
        return f"uid {uid} ({pwd.getpwuid(uid).pw_name})"
    except KeyError:
        return f"uid {uid}"


def permission_hint(path: str | os.PathLike) -> str:
    """Why this process may not use `path` (a file that may not exist yet: its directory)."""
    target = Path(path)
    while True:
        try:
            info = os.stat(target)
            break
        except FileNotFoundError:
            if target.parent == target:
                return "permission denied"
            target = target.parent
        except OSError:
            return "permission denied on a parent directory: the store belongs to another user?"
    mode = stat.filemode(info.st_mode)
    if info.st_uid != os.geteuid():
        return (f"the store belongs to another user: {target} is owned by "
                f"{describe_uid(info.st_uid)} (mode {mode}); run as that user")
    return (f"{target} is read-only (mode {mode}) for its owner, this user "
            f"({describe_uid(info.st_uid)}); make it writable (chmod u+w) or use another store")


def refuse_unsafe_parents(root: str | os.PathLike) -> None:
    """Refuse, when running as root, a store under a directory another user could rewrite: one
    writable by everybody without the sticky bit, or writable by everybody and owned by another
    user (a sticky directory's owner may still rename what it holds). There they could swap the
    store's files or directories for links to files root would then write."""
    if os.geteuid() != 0:
        return
    path = Path(os.path.abspath(root))
    for directory in [path, *path.parents]:
        try:
            info = os.stat(directory)
        except FileNotFoundError:
            continue
        world_writable = bool(info.st_mode & stat.S_IWOTH)
        sticky = bool(info.st_mode & stat.S_ISVTX)
        if world_writable and (not sticky or info.st_uid != 0):
            raise StorePermissionError(
                f"refusing to run a store as root under {directory} (mode "
                f"{stat.filemode(info.st_mode)}, owned by {describe_uid(info.st_uid)}): another "
                "user could swap the store's files for links to files root would then write",
                path=str(root), hint="put the store in a directory only root can write")
