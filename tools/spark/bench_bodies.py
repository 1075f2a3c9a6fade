"""Message bodies for the scan benchmark's store: random bytes, or JSON-like text events.

Random bytes are Parquet's worst case (nothing to compress); real bodies are mostly text
events, which Parquet compresses (snappy) and must decompress to scan. Both kinds are
deterministic for a seed and distinct per message (each carries or is drawn anew per index).
"""

from __future__ import annotations

import enum
import random
import time

T0_MS = 1_795_000_000_000  # 2026-11-18T11:06:40Z: the first event's time; later ones step forward
EVENTS = ("order.created", "order.paid", "order.shipped", "cart.updated", "user.login",
          "payment.refunded", "stock.reserved")
REGIONS = ("eu-west-1", "eu-central-1", "us-east-1", "us-west-2", "ap-south-1")
CURRENCIES = ("EUR", "USD", "GBP", "INR")
STATUSES = ("new", "pending", "paid", "failed", "done")
WORDS = ("the", "order", "was", "placed", "by", "customer", "with", "express", "delivery",
         "gift", "wrap", "requested", "please", "call", "before", "arrival", "leave", "at",
         "door", "fragile", "items", "inside", "handle", "care", "return", "window", "thirty",
         "days", "loyalty", "points", "applied", "discount", "code", "spring", "sale", "note",
         "from", "support", "ticket", "resolved", "address", "updated", "second", "floor",
         "apartment", "building", "north", "entrance", "weekday", "morning", "evening", "only",
         "invoice", "attached", "company", "purchase", "reference", "split", "shipment", "two",
         "parcels", "warehouse", "backorder", "restock")
JSON_MIN_BODY_BYTES = 400  # the fixed fields take up to ~330 bytes; the rest is the note


class BodyKind(enum.Enum):
    RANDOM = "random"
    JSON = "json"


NOTE_CORPUS_WORDS = 200_000  # ~1.3 MB of words; each note is a slice of it at a random word


class BodyMaker:
    """Bodies of exactly `body_bytes` of one kind, drawn from one seeded generator: the same
    seed and calls give the same bodies."""

    def __init__(self, kind: BodyKind, body_bytes: int, seed: int = 0):
        if kind is BodyKind.JSON and body_bytes < JSON_MIN_BODY_BYTES:
            raise ValueError(f"json bodies need at least {JSON_MIN_BODY_BYTES} bytes, asked {body_bytes}")
        self.kind, self.body_bytes, self.rng = kind, body_bytes, random.Random(seed)
        # slicing one text keeps a note to a few string operations instead of a draw per word
        self.corpus = " ".join(self.rng.choices(WORDS, k=NOTE_CORPUS_WORDS)) if kind is BodyKind.JSON else ""

    def batch(self, first_index: int, count: int) -> list[bytes]:
        """Bodies of messages `first_index`, `first_index + 1`, ... `count` of them."""
        size = self.body_bytes
        if self.kind is BodyKind.RANDOM:
            blob = self.rng.randbytes(size * count)
            return [blob[i * size:(i + 1) * size] for i in range(count)]
        return [self.json_body(first_index + i) for i in range(count)]

    def json_body(self, index: int) -> bytes:
        """One event as compact JSON of exactly `body_bytes` ASCII bytes: fixed fields with
        varying ids, amounts and a timestamp, then a note of words padded to the size. The
        message index is the event id, so no two bodies are equal."""
        rng = self.rng
        ts_ms = T0_MS + index * 37 + rng.randrange(37)
        stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(ts_ms // 1000)) + f".{ts_ms % 1000:03d}Z"
        items = ",".join(f'{{"sku":"SKU-{rng.randrange(100_000):05d}","qty":{rng.randrange(1, 9)},'
                         f'"price_cents":{rng.randrange(99, 99_999)}}}' for _ in range(rng.randrange(1, 4)))
        head = (f'{{"event":"{rng.choice(EVENTS)}","id":{index},"ts":"{stamp}",'
                f'"user":"u-{rng.randrange(1_000_000):06d}","region":"{rng.choice(REGIONS)}",'
                f'"amount_cents":{rng.randrange(100, 1_000_000)},"currency":"{rng.choice(CURRENCIES)}",'
                f'"status":"{rng.choice(STATUSES)}","items":[{items}],"note":"')
        room = self.body_bytes - len(head) - 2  # the closing `"}`
        start = self.corpus.find(" ", rng.randrange(len(self.corpus) - room - 1)) + 1
        note = self.corpus[start:start + room + 1]
        note = note[:note.rfind(" ")]  # whole words only
        return (head + note.ljust(room) + '"}').encode("ascii")
