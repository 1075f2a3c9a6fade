"""A hostile client process: random and bit-flipped requests straight into a mailbox slot.

    python -m tools.torture.hostile --store DIR --seed N --requests N --acks FILE

It bypasses the Producer's encoder the way a buggy or malicious client would: each request
holds 1-5 records, well-formed ones beside one broken by a MUTATIONS entry (every SYSFLAG bit
and random SYSFLAG words, lying TOTALSIZE, BODYLENGTH, TOPICLENGTH and PROPERTIESLENGTH,
queue ids out of range, random bit flips anywhere, a record count that disagrees with the
bytes, plain garbage). Whatever the store answers PUT_OK it must keep like any message:
each such answer (topic, queue id, commit_pos, queue offset) goes to the `--acks` file as a
JSON line, which `verify_hostile_acks` checks against the stopped store.

Exit codes: 0 after `--requests` requests, EXIT_STORE_GONE when the supervisor stopped
answering (which is the failure this client looks for). The last stdout line is a JSON object
with the count of each status answered.
"""

from __future__ import annotations

import argparse
import json
import random
import struct
import subprocess
import sys
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

from engine.errors import StoreError
from engine.files.mapped_file import Access
from engine.formats.record import (
    BODY_LENGTH_OFFSET,
    BODY_OFFSET,
    QUEUE_ID_OFFSET,
    SYS_FLAG_OFFSET,
    TOTAL_SIZE_OFFSET,
    Verify,
    encode_record,
)
from engine.log.commitlog import CommitLog
from engine.queues.table import ConsumeQueueTable
from engine.status import PutStatus
from ipc.mailbox import Mailbox, ProducerSlot, RequestFlag
from ipc.producer import attach_running_store
from ipc.run_info import run_dir
from tools.torture.verify import store_config
from workers.child_env import REPO_ROOT, child_env

TOPIC = "Hostile"
EXIT_STORE_GONE = 4
RESPONSE_TIMEOUT_S = 30.0
MAX_BODY_BYTES = 300
ATTACK_TIMEOUT_S = 600.0


def _put(fmt: str, offset: Callable[[bytearray], int], value: Callable[[random.Random, bytearray], int]):
    def mutate(rng: random.Random, raw: bytearray) -> bytearray:
        struct.pack_into(fmt, raw, offset(raw), value(rng, raw))
        return raw
    return mutate


def _flip_bits(rng: random.Random, raw: bytearray) -> bytearray:
    for _ in range(rng.randint(1, 3)):
        raw[rng.randrange(len(raw))] ^= 1 << rng.randrange(8)
    return raw


def _topic_length_at(raw: bytearray) -> int:
    return BODY_OFFSET + struct.unpack_from(">i", raw, BODY_LENGTH_OFFSET)[0]


MUTATIONS: dict[str, Callable[[random.Random, bytearray], bytearray]] = {
    "sysflag one bit": _put(">I", lambda r: SYS_FLAG_OFFSET, lambda rng, r: 1 << rng.randrange(32)),
    "sysflag word": _put(">I", lambda r: SYS_FLAG_OFFSET, lambda rng, r: rng.getrandbits(32)),
    "sysflag transaction": _put(">i", lambda r: SYS_FLAG_OFFSET, lambda rng, r: rng.choice((0x4, 0x8, 0xC))),
    "total size": _put(">i", lambda r: TOTAL_SIZE_OFFSET,
                       lambda rng, r: len(r) + rng.choice((-9, -1, 1, 64))),
    "body length": _put(">i", lambda r: BODY_LENGTH_OFFSET,
                        lambda rng, r: rng.choice((-1, 1 << 30, rng.randrange(len(r))))),
    "topic length": _put(">b", _topic_length_at, lambda rng, r: rng.randrange(-128, 128)),
    "properties length": _put(">h", lambda r: _topic_length_at(r) + 1 + len(TOPIC),
                              lambda rng, r: rng.randrange(-32768, 32768)),
    "queue id": _put(">i", lambda r: QUEUE_ID_OFFSET,
                     lambda rng, r: rng.choice((-1, 1 << 20, rng.randrange(64)))),
    "bit flips": _flip_bits,
    "garbage": lambda rng, raw: bytearray(rng.randbytes(len(raw))),
    "good": lambda rng, raw: raw,
}


def good_record(rng: random.Random, queue_count: int) -> bytearray:
    return bytearray(encode_record(
        TOPIC, rng.randbytes(rng.randrange(MAX_BODY_BYTES)), queue_id=rng.randrange(queue_count),
        properties={"KEYS": f"h{rng.getrandbits(32):08x}"}, born_ts_ms=1,
        born_host=("127.0.0.1", 1), store_host=("127.0.0.1", 10911)))


class HostileRequest(NamedTuple):
    """The bytes of one request and the header it announces (count and length may lie)."""

    data: bytes
    count: int
    announced_bytes: int
    announced_count: int
    rewrite_after: bool  # write the lying header after publishing, racing the supervisor
    mutation: str


def hostile_request(rng: random.Random, queue_count: int, max_batch: int, data_bytes: int) -> HostileRequest:
    """Good records and one mutated; one request in ten also lies in its slot header about
    its record count or its length."""
    records = [good_record(rng, queue_count) for _ in range(rng.randint(1, 5))]
    name = rng.choice(sorted(MUTATIONS))
    at = rng.randrange(len(records))
    records[at] = MUTATIONS[name](rng, records[at])
    data = b"".join(records)
    count, length = len(records), len(data)
    rewrite_after = False
    lie = rng.random()
    if lie < 0.05:
        count = rng.choice((0, count - 1, count + 1, max_batch, max_batch + 1, 2**32 - 1))
        name += " + lying count"
    elif lie < 0.10:
        length = rng.choice((0, length - 1, length + 1, data_bytes, data_bytes + 1))
        name += " + lying length"
    elif lie < 0.15:
        count, length, rewrite_after = rng.randrange(2**32), rng.randrange(2**40), True
        name += " + header rewritten after publishing"
    return HostileRequest(data, len(records), length, count, rewrite_after, name)


def publish(slot: ProducerSlot, request: HostileRequest) -> int:
    """Stage the request as any producer does and write the lying header fields over it,
    before publishing it or (racing the supervisor) just after."""
    slot.stage_request(request.data, count=request.count, flags=RequestFlag.WAIT_FOR_FLUSH)
    mb, i = slot.mailbox, slot.index
    if request.rewrite_after:
        seq = slot.publish_request()
        mb.req_count[i], mb.req_bytes[i] = request.announced_count, request.announced_bytes
        return seq
    mb.req_count[i], mb.req_bytes[i] = request.announced_count, request.announced_bytes
    return slot.publish_request()


def run(store: Path, seed: int, requests: int, acks_path: Path) -> tuple[int, Counter[str]]:
    """Send `requests` hostile requests; (exit code, status counts)."""
    rng = random.Random(seed)
    counts: Counter[str] = Counter()
    ctl, info = attach_running_store(store)
    mailbox = Mailbox.attach(store)
    slot = ProducerSlot.claim(mailbox, run_dir(store), alive=ctl.supervisor_alive)
    try:
        with acks_path.open("a") as acks:
            for _ in range(requests):
                request = hostile_request(rng, info.queue_count, mailbox.max_batch, mailbox.data_bytes)
                seq = publish(slot, request)
                try:
                    slot.wait_answered(seq, RESPONSE_TIMEOUT_S, ctl.supervisor_alive)
                except StoreError as exc:
                    print(f"hostile: request '{request.mutation}' got no answer: {exc}", file=sys.stderr)
                    return EXIT_STORE_GONE, counts
                counts["requests"] += 1
                results = mailbox.results[slot.index][:int(mailbox.resp_count[slot.index])].copy()
                if len(results) != request.count:
                    counts["requests refused whole"] += 1
                for row in results:
                    status = PutStatus(int(row["status"]))
                    counts[status.name] += 1
                    if status is PutStatus.PUT_OK:
                        acks.write(json.dumps({"queue_id": int(row["queue_id"]),
                                               "commit_pos": int(row["commit_pos"]),
                                               "queue_offset": int(row["queue_offset"])}) + "\n")
    finally:
        slot.release()
        mailbox.close()
        ctl.close()
    return 0, counts


def attack(root: Path, work_dir: Path, seed: int, requests: int) -> tuple[Counter[str], list[str]]:
    """Run one hostile client process to its end (beside whatever load runs); the statuses it
    was answered, and what went wrong (it found the store gone, or failed itself). Its PUT_OK
    answers go to acks_path(work_dir)."""
    out, err = work_dir / f"hostile-{seed}.out", work_dir / f"hostile-{seed}.err"
    with out.open("wb") as stdout, err.open("wb") as stderr:
        proc = subprocess.run(
            [sys.executable, "-m", "tools.torture.hostile", "--store", str(root), "--seed", str(seed),
             "--requests", str(requests), "--acks", str(acks_path(work_dir))],
            cwd=REPO_ROOT, env=child_env(), stdin=subprocess.DEVNULL, stdout=stdout, stderr=stderr,
            timeout=ATTACK_TIMEOUT_S, check=False)
    lines = out.read_text(errors="replace").splitlines()
    counts: Counter[str] = Counter(json.loads(lines[-1])["counts"]) if lines else Counter()
    if proc.returncode == 0:
        return counts, []
    return counts, [f"hostile client (seed {seed}) exited {proc.returncode}: "
                    f"{err.read_text(errors='replace')[-2000:]}"]


def acks_path(work_dir: Path) -> Path:
    return Path(work_dir) / "hostile-acks.jsonl"


def verify_hostile_acks(root: Path, acks_path: Path) -> list[str]:
    """Every record the store answered PUT_OK to the hostile client is in the stopped store: a
    valid record at its commit_pos with its queue id and offset, and its consume-queue entry
    points at it. Returns the problems (empty: all kept)."""
    if not acks_path.exists():
        return []
    acks = [json.loads(line) for line in acks_path.read_text().splitlines() if line]
    config = store_config(root)
    commitlog = CommitLog.open(root, config.commitlog_file_size, Access.READ_ONLY)
    queues = ConsumeQueueTable.load(root, config.consume_queue_entries, Access.READ_ONLY)
    problems = []
    try:
        for ack in acks:
            problem = _ack_problem(commitlog, queues, ack)
            if problem:
                problems.append(f"hostile ack {ack}: {problem}")
    finally:
        commitlog.close()
        queues.close()
    return problems


def _ack_problem(commitlog: CommitLog, queues: ConsumeQueueTable, ack: dict) -> str | None:
    try:
        record = commitlog.read_at(ack["commit_pos"], Verify.MQSTORE)
    except StoreError as exc:
        return f"unreadable: {exc}"
    if (record.queue_id, record.queue_offset) != (ack["queue_id"], ack["queue_offset"]):
        return f"holds {record.topic}/{record.queue_id} offset {record.queue_offset}"
    queue = queues.get(record.topic, ack["queue_id"])  # a flipped bit may name another valid topic
    entry = queue.entry(ack["queue_offset"]) if queue is not None else None
    if entry is None or entry.commit_pos != ack["commit_pos"]:
        return f"consume-queue entry is {entry}"
    return None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.torture.hostile")
    parser.add_argument("--store", required=True)
    parser.add_argument("--seed", type=int, required=True)
    parser.add_argument("--requests", type=int, default=300)
    parser.add_argument("--acks", required=True, help="append PUT_OK answers here (JSON lines)")
    args = parser.parse_args(argv)
    code, counts = run(Path(args.store), args.seed, args.requests, Path(args.acks))
    print(json.dumps({"counts": dict(counts)}), flush=True)
    return code


if __name__ == "__main__":
    sys.exit(main())
