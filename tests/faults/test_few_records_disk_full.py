"""The supervisor's few-record sweep on a full disk: each request of the sweep is answered
DISK_FULL, nothing of it is in the log, no queue offset is used up, and the next sweep with room
stores where the refused one would have (the appender in this process, on a small tmpfs)."""

from __future__ import annotations

import time

import pytest

from engine.config import FlushPolicy, StoreConfig
from engine.files.mapped_file import Access
from engine.formats.record import encode_record
from engine.log.commitlog import CommitLog
from engine.status import PutStatus
from engine.topics.live import LiveTopics
from engine.topics.table import TopicDefaults, TopicTable, TopicTableFile
from ipc.mailbox import Mailbox, ProducerSlot, RequestFlag
from ipc.run_info import run_dir
from tests.faults.test_disk_full import small_disk  # noqa: F401  (the fixture)
from tools.torture.filesystems import MiB, fill, unfill
from workers.appender import Appender
from workers.group_commit import GroupCommit
from workers.shared_state import SharedState

pytestmark = pytest.mark.slow
BIG_BODY_BYTES = 600 * 1024  # three of them pass the commitlog's 1 MiB of zeros ahead


def record(body: bytes, queue_id: int) -> bytes:
    return bytes(encode_record("FULL", body, queue_id=queue_id, properties={"KEYS": "k"},
                               born_ts_ms=1, born_host=("127.0.0.1", 1), store_host=("127.0.0.1", 2),
                               max_body_bytes=1 << 20))


class InProcessStore:
    """A commitlog, shared state and appender on `root`, served by calling sweep()."""

    def __init__(self, root):
        (root / "run").mkdir(parents=True)
        self.config = StoreConfig(flush=FlushPolicy.SYNC, commitlog_file_size=8 * MiB,
                                  disk_warn_ratio=1.0, disk_clean_force_ratio=1.0, disk_full_ratio=1.0)
        self.commitlog = CommitLog.open(root, self.config.commitlog_file_size, Access.READ_WRITE)
        self.shared = SharedState.create(root, shard_count=1, flush=self.config.flush, commit_pos=0,
                                         generation=1, mailbox_slots=4)
        self.group_commit = GroupCommit(self.commitlog, self.shared.ctl, self.config,
                                        on_flushed=lambda: self.appender.answer_flushed())
        topics = LiveTopics(TopicTableFile(root), TopicTable(), TopicDefaults(self.config.queue_count))
        self.appender = Appender(self.commitlog, self.shared.server, self.group_commit, self.config,
                                 {}, root=root, topics=topics)
        self.mailbox = Mailbox.attach(root)
        self.slots = [ProducerSlot.claim(self.mailbox, run_dir(root), alive=lambda: True)
                      for _ in range(2)]

    def sweep_of(self, requests) -> list:
        """One sweep of (records, flags) per slot; each request's answer rows."""
        seqs = [slot.write_request(records, flags=flags)
                for slot, (records, flags) in zip(self.slots, requests, strict=True)]
        self.appender.sweep()
        return [slot.wait_response(seq, 5, lambda: True) for slot, seq in zip(self.slots, seqs, strict=True)]

    def close(self) -> None:
        for slot in self.slots:
            slot.release()
        self.mailbox.close()
        self.group_commit.stop()
        self.shared.destroy()
        self.commitlog.close()


def test_a_few_record_sweep_meeting_a_full_disk_is_refused_whole_and_stored_after(small_disk):  # noqa: F811
    store = InProcessStore(small_disk / "store")
    try:
        first = store.sweep_of([([record(b"a", 0)], RequestFlag.WAIT_FOR_FLUSH),
                                ([record(b"b", 0)], RequestFlag.NONE)])
        assert [int(rows["status"][0]) for rows in first] == [PutStatus.PUT_OK] * 2
        before = store.commitlog.written_pos
        big = [record(bytes([i]) * BIG_BODY_BYTES, 0) for i in range(3)]
        fill(small_disk, leave_bytes=64 * 1024)  # room for the check's ratio, not for the zeros
        started = time.monotonic()
        refused = store.sweep_of([(big[:2], RequestFlag.WAIT_FOR_FLUSH),
                                  ([big[2]], RequestFlag.WAIT_FOR_FLUSH)])
        assert time.monotonic() - started < 5  # answered by the sweep, not at a deadline
        assert [rows["status"].tolist() for rows in refused] == [[PutStatus.DISK_FULL] * 2,
                                                                 [PutStatus.DISK_FULL]]
        assert store.commitlog.written_pos == before and store.appender.waiting_count == 0
        assert store.appender.write_error is None  # a full disk does not stop the store
        assert store.shared.ctl.put_status_counts()[PutStatus.DISK_FULL] == 3
        unfill(small_disk)
        stored = store.sweep_of([(big[:2], RequestFlag.WAIT_FOR_FLUSH),
                                 ([big[2]], RequestFlag.WAIT_FOR_FLUSH)])
        assert [rows["status"].tolist() for rows in stored] == [[PutStatus.PUT_OK] * 2, [PutStatus.PUT_OK]]
        # claims start at pid % slot count and wrap: the sweep takes the slots in index order
        in_slot_order = [stored[k] for k in sorted(range(2), key=lambda k: store.slots[k].index)]
        assert [offset for rows in in_slot_order for offset in rows["queue_offset"].tolist()] == [2, 3, 4]
        assert int(in_slot_order[0]["commit_pos"][0]) == before  # none used up, nothing left behind
        assert store.group_commit.published_flushed == store.commitlog.written_pos
    finally:
        store.close()
