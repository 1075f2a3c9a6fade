"""The environment of a child Python process of this project (a store's children, the CLI's
detached supervisor, the tools' and tests' processes): this checkout first on PYTHONPATH, so a
child imports the same code as its parent wherever it runs from."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent


def python_path(current: str | None = None) -> str:
    """PYTHONPATH with the repository root first, then `current`'s other entries (default: this
    process's PYTHONPATH), each once."""
    current = os.environ.get("PYTHONPATH", "") if current is None else current
    entries = [str(REPO_ROOT), *(p for p in current.split(os.pathsep) if p)]
    return os.pathsep.join(dict.fromkeys(entries))


def child_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """This process's environment with `python_path()` as PYTHONPATH, updated with `extra`."""
    env = dict(os.environ)
    env["PYTHONPATH"] = python_path(env.get("PYTHONPATH", ""))
    env.update(extra or {})
    return env
