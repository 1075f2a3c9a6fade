"""A control block in a test's store directory, created and removed as a supervisor does."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

from ipc.control_block import ControlBlock, FlushCode
from ipc.shm import issue_shm_token, unlink_stale_regions
from ipc.wakeup import unlink_all


@contextlib.contextmanager
def control_block(store_dir: Path, shard_count: int) -> Iterator[ControlBlock]:
    """A new control block of `shard_count` shards; afterwards every region of the store is unlinked."""
    issue_shm_token(store_dir)  # what a supervisor does before creating its regions
    block = ControlBlock.create(store_dir, shard_count, FlushCode.SYNC)
    yield block
    block.close()
    unlink_stale_regions(store_dir)
    unlink_all(store_dir)
