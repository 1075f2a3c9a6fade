"""The soak's client processes: a paced producer that writes a ledger of what the store
acknowledged, and a consumer (in front: as fast as it can; behind: paced below the producer's
rate, so retention overtakes it) that writes what it read and every jump OFFSET_TOO_SMALL made.

Ledger lines: `seq status queue_id queue_offset commit_pos ack_ms`. Consumer lines:
`M queue_id queue_offset seq`, `J queue_id from_offset to_offset`, `S queue_id queue_offset`
(a record passed over as corrupt). Bodies start with `<seq>:`, so a read names its message.
"""

from __future__ import annotations

import enum
import time
from pathlib import Path

from engine.message import Message
from engine.status import GetStatus
from ipc.consumer import Consumer
from ipc.producer import Producer

TOPIC = "SoakRetention"
BATCHES_PER_S = 20
PULL_MAX = 32
IDLE_POLL_MS = 100  # a consumer with nothing to read long-polls this long per queue


class ConsumerRole(enum.Enum):
    """FRONT reads as fast as it can and drains at the end; BEHIND reads at a fixed rate and
    stops when told."""

    FRONT = "front"
    BEHIND = "behind"


def body_for(seq: int, body_bytes: int) -> bytes:
    return f"{seq}:".encode().ljust(body_bytes, b"x")


def seq_of(body: bytes) -> int:
    return int(bytes(body[:body.index(b":")]))


def produce(root: Path, ledger_path: Path, *, until_s: float, rate_msgs_per_s: int,
            body_bytes: int, queue_count: int) -> int:
    """Send at `rate_msgs_per_s` until the wall clock passes `until_s`; messages acknowledged."""
    batch = max(1, rate_msgs_per_s // BATCHES_PER_S)
    interval_s = batch / rate_msgs_per_s
    seq = acked = 0
    with Producer(root) as producer, open(ledger_path, "w") as ledger:
        next_at = time.monotonic()
        while time.time() < until_s:
            messages = [Message(TOPIC, body_for(s, body_bytes), queue_id=s % queue_count,
                                keys=(f"s{s}",)) for s in range(seq, seq + batch)]
            results = producer.send_batch(messages)
            ack_ms = int(time.time() * 1000)
            for s, r in zip(range(seq, seq + batch), results, strict=True):
                ledger.write(f"{s} {r.status.name} {r.queue_id} {r.queue_offset} {r.commit_pos} {ack_ms}\n")
                acked += r.ok
            seq += batch
            next_at += interval_s
            time.sleep(max(0.0, next_at - time.monotonic()))  # pacing the load, not a wait for state
    return acked


def consume(root: Path, group: str, out_path: Path, stop_path: Path, *, role: ConsumerRole,
            queue_count: int, rate_msgs_per_s: int = 0) -> int:
    """Read every queue from offset 0 until `stop_path` exists (FRONT: and a round finds nothing
    more); messages read."""
    offsets = dict.fromkeys(range(queue_count), 0)
    read = 0
    with Consumer(root, group) as consumer, open(out_path, "w") as out:
        while True:
            moved = False
            for queue_id in offsets:
                offset, count = offsets[queue_id], _pull_once(consumer, queue_id, offsets, out)
                moved |= offsets[queue_id] != offset
                read += count
                if role is ConsumerRole.BEHIND:
                    time.sleep(PULL_MAX / rate_msgs_per_s)  # its pace: behind the producer by design
            if stop_path.exists() and (role is ConsumerRole.BEHIND or not moved):
                return read
            if not moved:
                consumer.pull(TOPIC, 0, offsets[0], max_count=1, timeout_ms=IDLE_POLL_MS)


def _pull_once(consumer: Consumer, queue_id: int, offsets: dict[int, int], out) -> int:
    """One pull of a queue (its offset moves on in `offsets`); messages read."""
    offset = offsets[queue_id]
    result = consumer.pull(TOPIC, queue_id, offset, max_count=PULL_MAX)
    for skipped in result.skipped:
        out.write(f"S {queue_id} {skipped.queue_offset}\n")
    if result.status is GetStatus.OFFSET_TOO_SMALL:
        out.write(f"J {queue_id} {offset} {result.next_offset}\n")
    for record in result.messages:
        out.write(f"M {queue_id} {record.queue_offset} {seq_of(record.body)}\n")
    if result.status in (GetStatus.FOUND, GetStatus.OFFSET_TOO_SMALL, GetStatus.NO_MATCHED_MESSAGE) \
            and result.next_offset != offset:
        offsets[queue_id] = result.next_offset
    return len(result.messages)
