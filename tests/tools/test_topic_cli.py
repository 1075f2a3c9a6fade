"""`mqstore topic` on a stopped store (offline, under the store lock) and `mqstore topics`
listing a topic with no message yet; bad arguments exit 2 and change nothing.

The running-store path is tests/workers/test_topics_live.py.
"""

from __future__ import annotations

import json

import pytest

from engine.files.naming import LOCK_FILE
from engine.store import MessageStore
from tests.helpers import SMALL_CONFIG, snapshot
from tests.workers.store_harness import cli


def unlocked(files: dict) -> dict:
    """A snapshot without the lock file (taking the lock writes the holder's pid into it)."""
    return {name: digest for name, digest in files.items() if name != LOCK_FILE}


@pytest.mark.slow
def test_topic_commands_offline_and_the_empty_topic_listed(tmp_path):
    root = tmp_path / "store"
    MessageStore.open(root, SMALL_CONFIG).close()
    made = cli("topic", "create", "--store", str(root), "--topic", "Empty", "--queues", "2", "--perm", "r")
    assert made.returncode == 0, made.stderr.decode()
    assert b"2 write and 2 read queues, perm 4" in made.stdout
    before = unlocked(snapshot(root))
    for args, words in ((("create", "--topic", "Empty", "--queues", "3"), b"exists"),  # the store's
                        (("update", "--topic", "Empty"), b"give --queues N, --perm, or both")):  # args
        refused = cli("topic", *args, "--store", str(root))
        assert refused.returncode == 2 and words in refused.stderr, refused.stderr.decode()
    assert unlocked(snapshot(root)) == before
    listed = cli("topics", "--store", str(root), "--json")
    assert json.loads(listed.stdout) == [
        {"topic": "Empty", "queue_id": None, "min_offset": 0, "max_offset": 0, "messages": 0,
         "stored_bytes": 0, "oldest_store_time_ms": None, "newest_store_time_ms": None,
         "cq_allocated_bytes": 0, "cq_used_bytes": 0, "read_queues": 2, "write_queues": 2, "perm": "r"}]
