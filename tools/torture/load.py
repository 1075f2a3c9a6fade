"""A load producer process: sends seeded messages to a running store and records every answer.

    python -m tools.torture.load --store DIR --ledger-dir DIR --tag TAG --seed N [--max-batch N]

Each message carries a unique identity (`TAG-SEQ`) in the TORTURE_ID property and as its first
key, a second key, random tags, a random queue (or the producer's round robin) and a random
body (mostly small, sometimes large enough to force segment rolls). After each batch the
answers that mean "stored" go to the ledger (tools.torture.ledger) with one fsync, before the
next batch is sent. Identities are never re-sent: a message whose answer was lost is simply
unknown, so any identity found twice in the store is a duplicate made by the store.

It may be started before the store is ready: it polls until it can attach. It runs until
SIGTERM (finishes the batch in flight, then exits 0), or until the store is gone
(SERVICE_NOT_AVAILABLE; exits 0 as well -- the driver killed it on purpose). It does not wait
for a restarted supervisor (`--reattach-timeout-s`, default 0: the driver starts new producers
with each store), but one already READY when it looks is taken up. A batch in flight at a
supervisor kill is answered OUTCOME_UNKNOWN: not ledgered, like any lost answer. The last line
on stdout is a JSON object with the counts of every status it was answered.
"""

from __future__ import annotations

import argparse
import json
import random
import signal
import sys
import time
from collections import Counter
from pathlib import Path

from engine.errors import StoreError
from engine.formats.record import encode_record
from engine.message import Message, build_properties
from engine.status import PutStatus
from ipc.producer import Producer
from tools.torture.ledger import (
    IDENTITY_PROPERTY,
    LEDGER_SUFFIX,
    STATUS_OK,
    STATUS_TIMEOUT,
    LedgerEntry,
    LedgerWriter,
    body_digest,
)

TOPICS = ("TortureA", "TortureB", "TortureC")
TAGS = (None, "TagA", "TagB", "TagC")
SMALL_BODY_BYTES = (8, 400)
LARGE_BODY_CHANCE = 0.03
EXIT_NO_STORE = 3
ATTACH_POLL_S = 0.01
_STORED = {PutStatus.PUT_OK: STATUS_OK, PutStatus.FLUSH_DISK_TIMEOUT: STATUS_TIMEOUT}
_SIZE_HOST = ("127.0.0.1", 0)


class MessageMaker:
    """Seeded messages with unique identities; also knows each one's encoded record size."""

    def __init__(self, tag: str, seed: int, queue_count: int, max_body_bytes: int):
        self.tag = tag
        self.rng = random.Random(seed)
        self.queue_count = queue_count
        self.max_body_bytes = max_body_bytes
        self.seq = 0

    def next_message(self) -> Message:
        rng = self.rng
        identity = f"{self.tag}-{self.seq}"
        self.seq += 1
        if rng.random() < LARGE_BODY_CHANCE:
            size = rng.randint(self.max_body_bytes // 2, self.max_body_bytes)
        else:
            size = rng.randint(*SMALL_BODY_BYTES)
        queue_id = rng.randrange(self.queue_count) if rng.random() < 0.5 else None
        return Message(rng.choice(TOPICS), rng.randbytes(size), tags=rng.choice(TAGS),
                       keys=(identity, f"{identity}.k2"), queue_id=queue_id,
                       properties={IDENTITY_PROPERTY: identity})

    def record_bytes(self, message: Message) -> int:
        """The size the record of `message` has in the log (UNIQ_KEY has a fixed length)."""
        return len(encode_record(message.topic, message.body, queue_id=0,
                                 properties=build_properties(message), born_ts_ms=0,
                                 born_host=_SIZE_HOST, store_host=_SIZE_HOST,
                                 max_body_bytes=self.max_body_bytes))


def ledger_entry(message: Message, result, record_bytes: int) -> LedgerEntry:
    return LedgerEntry(
        identity=message.properties[IDENTITY_PROPERTY], topic=message.topic,
        queue_id=result.queue_id, queue_offset=result.queue_offset, commit_pos=result.commit_pos,
        record_bytes=record_bytes, body_digest=body_digest(message.body), keys=message.keys,
        tags=message.tags, status=_STORED[result.status], ack_ms=time.time_ns() // 1_000_000)


class LoadProducer:
    """The send loop of one load process."""

    def __init__(self, args: argparse.Namespace):
        self.args = args
        self.stopping = False
        self.counts: Counter[str] = Counter()

    def run(self) -> int:
        args = self.args
        ledger = Path(args.ledger_dir) / f"{args.tag}{LEDGER_SUFFIX}"
        producer = self._attach()
        if producer is None:
            return 0 if self.stopping else EXIT_NO_STORE
        maker = MessageMaker(args.tag, args.seed, producer.info.queue_count,
                             min(args.max_body_bytes, producer.info.max_body_bytes))
        rng = random.Random(args.seed ^ 0x5EED)
        with LedgerWriter(ledger) as writer:
            try:
                while not self.stopping and self._send_one_batch(producer, maker, writer, rng):
                    pass
            finally:
                producer.close()
        return 0

    def _attach(self) -> Producer | None:
        """Attach to the store, polling until its supervisor is ready (it may still be booting
        or recovering: producers are started together with it)."""
        deadline = time.monotonic() + self.args.attach_timeout_s
        while not self.stopping:
            try:
                return Producer(self.args.store, reattach_timeout_s=self.args.reattach_timeout_s)
            except StoreError as exc:
                if time.monotonic() > deadline:
                    print(f"load {self.args.tag}: {exc}", file=sys.stderr)
                    self.counts["attach_failed"] += 1
                    return None
            time.sleep(ATTACH_POLL_S)
        return None

    def _send_one_batch(self, producer: Producer, maker: MessageMaker, writer: LedgerWriter,
                        rng: random.Random) -> bool:
        """Send one batch and ledger its stored answers; False once the store is gone."""
        messages = [maker.next_message() for _ in range(rng.randint(1, self.args.max_batch))]
        results = producer.send_batch(messages)
        entries = []
        for message, result in zip(messages, results, strict=True):
            self.counts[result.status.name] += 1
            if result.status in _STORED:
                entries.append(ledger_entry(message, result, maker.record_bytes(message)))
        writer.append_batch(entries)
        statuses = {r.status for r in results}
        if PutStatus.DISK_FULL in statuses and self.args.refusal_pause_ms:
            time.sleep(self.args.refusal_pause_ms / 1000.0)  # pacing only: do not spin on a full disk
        return PutStatus.SERVICE_NOT_AVAILABLE not in statuses


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m tools.torture.load")
    parser.add_argument("--store", required=True)
    parser.add_argument("--ledger-dir", required=True)
    parser.add_argument("--tag", required=True, help="unique among all producers of a run")
    parser.add_argument("--seed", type=int, required=True)
    parser.add_argument("--max-batch", type=int, default=8)
    parser.add_argument("--max-body-bytes", type=int, default=6000)
    parser.add_argument("--refusal-pause-ms", type=float, default=20.0)
    parser.add_argument("--attach-timeout-s", type=float, default=120.0)
    parser.add_argument("--reattach-timeout-s", type=float, default=0.0,
                        help="how long to wait for a restarted supervisor (0: exit at once)")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    load = LoadProducer(parse_args(argv))

    def stop(_signum, _frame):  # only set a flag: the batch in flight finishes
        load.stopping = True

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    code = load.run()
    print(json.dumps({"tag": load.args.tag, "counts": dict(load.counts)}), flush=True)
    return code


if __name__ == "__main__":
    sys.exit(main())
