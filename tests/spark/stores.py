"""Small real stores written by the engine for the Spark tests (a fake clock sets store times)."""

from __future__ import annotations

from pathlib import Path

import pytest

from engine.config import StoreConfig
from engine.message import Message
from engine.store import MessageStore

REPO_ROOT = Path(__file__).resolve().parents[2]
SMALL_CONFIG = StoreConfig(commitlog_file_size=16384, consume_queue_entries=16, index_slot_count=16,
                           index_entry_count=48, index_shards=2, queue_count=4)
TOPICS = ("orders", "payments", "audit")
T0_MS = 1_700_000_000_000  # 2023-11-14T22:13:20Z; the fake clock starts here
STEP_MS = 7_000  # store time between batches: spans minutes and (with the jump) two days
DAY_JUMP_AT = 12  # batch number after which the clock jumps a day ahead


class FakeClock:
    def __init__(self, start_ms: int):
        self.now_ms = start_ms

    def __call__(self) -> int:
        return self.now_ms


def message_batches(batch_count: int = 24, per_batch: int = 12) -> list[list[Message]]:
    """Deterministic messages: three topics, four queues, tags, keys, bodies of varied sizes."""
    batches = []
    n = 0
    for _ in range(batch_count):
        batch = []
        for _ in range(per_batch):
            topic = TOPICS[n % 3]
            body = (f"m{n:05d}-".encode() * (1 + n % 37))[: 20 + (n * 53) % 700]
            keys = (f"k{n}", f"g{n % 5}") if n % 4 else ()
            batch.append(Message(topic, body, tags=f"t{n % 3}" if n % 2 else None, keys=keys,
                                 queue_id=n % 4, properties={"seq": str(n)}))
            n += 1
        batches.append(batch)
    return batches


def write_store(root: Path, batches: list[list[Message]], clock: FakeClock,
                config: StoreConfig = SMALL_CONFIG) -> None:
    """Put each batch at its own store time (the fake clock), then close the store."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr("engine.store._now_ms", clock)
        store = MessageStore.open(root, config)
        try:
            for i, batch in enumerate(batches):
                results = store.put_batch(batch)
                assert all(r.status.name == "PUT_OK" for r in results), results
                clock.now_ms += STEP_MS + (86_400_000 if i == DAY_JUMP_AT else 0)
        finally:
            store.close()


def engine_records(root: Path) -> dict[int, object]:
    """Every record of the store as the engine reads it (get_messages), by commit_pos."""
    out = {}
    store = MessageStore.open(root, SMALL_CONFIG)
    try:
        for queue in store.queues:
            offset = queue.min_offset
            while offset < queue.max_offset:
                result = store.get_messages(queue.topic, queue.queue_id, offset, 64)
                for record in result.messages:
                    out[record.commit_pos] = record
                offset = result.next_offset
    finally:
        store.close()
    return out


def start_available_now(frame, out: Path, checkpoint: Path):
    """Start a Trigger.AvailableNow query writing the streaming `frame` to `out` as Parquet."""
    return (frame.writeStream.format("parquet").option("path", str(out))
            .option("checkpointLocation", str(checkpoint)).trigger(availableNow=True).start())


def run_available_now(frame, out: Path, checkpoint: Path, timeout_s: float) -> None:
    """start_available_now, waited for; the query must end without an exception."""
    query = start_available_now(frame, out, checkpoint)
    query.awaitTermination(timeout_s)
    assert query.exception() is None
