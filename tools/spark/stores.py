"""Which stores one read covers: `load(path)` with one path, several (comma-separated, or a
list, which PySpark hands over as the `paths` option, a JSON array), or globs.

Each store is named by its absolute, normalized path: the value of the `store` column, the
key of its offset in a stream's checkpoint, and what `where(store = ...)` compares with. A
glob is expanded when a read is planned (a stream expands it again for every batch, so a
store that appears later is read from its beginning); a glob matching nothing is an error,
as is a plain path that is not there.
"""

from __future__ import annotations

import glob
import json
import os
from collections.abc import Sequence
from dataclasses import dataclass

import pyarrow as pa

from engine.errors import BadInputError

STORE_COLUMN = "store"
_GLOB_CHARS = frozenset("*?[")


def store_name(path: str) -> str:
    """The name of the store at `path`: its absolute, normalized path."""
    return os.path.abspath(os.path.expanduser(path))


@dataclass(frozen=True)
class StorePaths:
    """The paths a read was given: plain store directories and glob patterns, in order."""

    entries: tuple[str, ...]

    @property
    def is_single(self) -> bool:
        """One plain path: the read of one store, as before several were possible."""
        return len(self.entries) == 1 and not _is_glob(self.entries[0])

    def resolve(self) -> tuple[str, ...]:
        """The store names now: plain paths as they are, globs expanded (sorted); duplicates
        dropped. BadInputError for a glob matching nothing or a missing plain path."""
        out: dict[str, None] = {}
        for entry in self.entries:
            if _is_glob(entry):
                matches = sorted(glob.glob(os.path.expanduser(entry)))
                if not matches:
                    raise BadInputError("path", f"the glob {entry!r} matches no store directory")
                out.update((store_name(m), None) for m in matches)
            else:
                if not os.path.isdir(entry):
                    raise BadInputError("path", f"{entry!r} is not a directory")
                out[store_name(entry)] = None
        return tuple(out)


def _is_glob(entry: str) -> bool:
    return any(c in _GLOB_CHARS for c in entry)


def parse_store_paths(path: str | None, paths: str | None) -> StorePaths:
    """The `path` option (comma-separated) and the `paths` option (a JSON array of strings,
    what `.load([p1, p2])` sends) as one StorePaths."""
    entries: list[str] = []
    if paths:
        try:
            listed = json.loads(paths)
        except ValueError:
            raise BadInputError("paths", f"{paths!r} is not a JSON array of paths") from None
        if not isinstance(listed, list) or not all(isinstance(p, str) for p in listed):
            raise BadInputError("paths", f"{paths!r} is not a JSON array of paths")
        entries += listed
    if path:
        entries += path.split(",")
    entries = [e.strip() for e in entries if e.strip()]
    if not entries:
        raise BadInputError("path", "give the store directory: .load(STORE_DIR), "
                            ".load('DIR1,DIR2'), .load([DIR1, DIR2]) or a glob")
    return StorePaths(tuple(entries))


def only_stores(stores: Sequence[str], wanted: frozenset[str] | None) -> tuple[str, ...]:
    """`stores` kept by a pushed-down `store` filter (None: all)."""
    return tuple(stores) if wanted is None else tuple(s for s in stores if s in wanted)


def with_store_column(batch: pa.RecordBatch, store: str) -> pa.RecordBatch:
    """`batch` with the `store` column appended (the same value in every row)."""
    return batch.append_column(STORE_COLUMN, pa.repeat(pa.scalar(store, pa.string()), batch.num_rows))
