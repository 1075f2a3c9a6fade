"""The fastest durable acknowledgement a Python group commit gets on this machine: the floor
under the durable targets of `mqstore bench` (docs/BENCHMARKS.md, durable batched and one at a
time) for the store's process shape, with none of its work (docs/DECISIONS.md#python-floor).

N producer processes each put one request (B records of S bytes) into a shared-memory slot,
post the server's semaphore and sleep on their own; one server process takes every pending
request, copies the records into a preallocated file with one pwrite, runs one fdatasync,
and answers each producer with a post (ipc.wakeup.Wakeup, as the store's processes do). No
checks, no stamping beyond an optional CRC32C per record, no dispatcher, no index, no
zero-ahead: whatever the store does costs more than this.

What-if shapes of the server (docs/DECISIONS.md#group-commit): --work-us W spends W us of busy
Python a round, standing in for the store's own work, and --server-threads K lets K threads
take, write, sync and answer on their own, their syncs overlapping.

    .venv/bin/python -m tools.bench.probes.ack_floor [--producers 4] [--batch 1] [--size 256]
        [--seconds 5] [--runs 3] [--crc] [--work-us 0] [--server-threads 1] [--dir DIR] [--json]

Prints messages/s, acknowledgements/s, fdatasyncs/s, messages per fdatasync and CPU per
message (server, producers), median run of --runs.
"""

from __future__ import annotations

import argparse
import json
import mmap
import os
import signal
import statistics
import struct
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import crc32c
import numpy as np

from ipc.wakeup import Wakeup

NAME_PREFIX = "/mqstore-ack-floor-"
FILE_BYTES = 1 << 30
SLOT_HEADER = struct.Struct("<II")  # state (0 free, 1 request, 2 answered, 3 taken), record count
SLOT_HEADER_SIZE = 64
REQUEST, ANSWERED, TAKEN = 1, 2, 3
WAIT_S = 0.5


def _slot_bytes(batch: int, size_bytes: int) -> int:
    return SLOT_HEADER_SIZE + batch * size_bytes


def _producer(index: int, region: mmap.mmap, slot_bytes: int, batch: int, size_bytes: int,
              server: Wakeup, mine: Wakeup, start: float, deadline: float, gap_s: float,
              report_path: str) -> None:
    """Send requests until `deadline`, closed loop (gap_s 0) or batch j due at start + j*gap_s
    (latency counted from then); write (acks, cpu_s, latencies_us) to `report_path`."""
    base = index * slot_bytes
    payload = os.urandom(batch * size_bytes)
    latencies_us = []
    cpu0 = time.process_time()
    while True:
        due = start + len(latencies_us) * gap_s if gap_s else time.monotonic()
        if due >= deadline:
            break
        wait_s = due - time.monotonic()
        if wait_s > 0:
            time.sleep(wait_s)
        region[base + SLOT_HEADER_SIZE:base + slot_bytes] = payload
        SLOT_HEADER.pack_into(region, base, REQUEST, batch)
        server.post()
        while SLOT_HEADER.unpack_from(region, base)[0] != ANSWERED:
            mine.wait(WAIT_S)
        latencies_us.append(round((time.monotonic() - due) * 1e6, 1))
    _report(report_path, ["producer", len(latencies_us), time.process_time() - cpu0, latencies_us])


@dataclass(frozen=True)
class ServerShape:
    """How the server works a round. `thread_count` threads each take, write, sync and answer
    on their own, so their fdatasyncs overlap; `work_us` of busy Python a round stands in for
    the store's check, stamp and answer work (3/5 before the write, under the take lock as the
    store's sweep lock, 2/5 after the sync)."""

    thread_count: int = 1
    work_us: float = 0.0


def _busy(work_us: float) -> None:
    """Spend `work_us` microseconds of this thread's CPU time in Python, as the store's own work
    does (by the thread's CPU clock: time preempted does not count)."""
    end = time.thread_time() + work_us / 1e6
    while time.thread_time() < end:
        pass


class _Rounds:
    """The server's rounds over the producers' slots; `run` is one server thread."""

    def __init__(self, region: mmap.mmap, producers: int, slot_bytes: int, size_bytes: int, fd: int,
                 server: Wakeup, slots: list[Wakeup], use_crc: bool, shape: ServerShape):
        self.region, self.view = region, memoryview(region)
        self.producers, self.slot_bytes, self.size_bytes, self.fd = producers, slot_bytes, size_bytes, fd
        self.server, self.slots, self.use_crc, self.shape = server, slots, use_crc, shape
        self.take_lock = threading.Lock()
        self.next_pos = 0  # the file position of the next write, under take_lock
        self.sync_counts: list[int] = []  # one a finished thread
        self.answered_count = 0  # requests answered, under take_lock

    def take(self) -> tuple[list[int], bytes]:
        """Every request not yet taken (marked TAKEN, so no other thread takes it), joined."""
        self.server.drain()
        taken, chunks = [], []
        for index in range(self.producers):
            base = index * self.slot_bytes
            state, count = SLOT_HEADER.unpack_from(self.region, base)
            if state != REQUEST:
                continue
            records = self.view[base + SLOT_HEADER_SIZE:base + SLOT_HEADER_SIZE + count * self.size_bytes]
            if self.use_crc:
                for start in range(0, len(records), self.size_bytes):
                    crc32c.crc32c(records[start:start + self.size_bytes])
            chunks.append(records)
            taken.append(index)
            SLOT_HEADER.pack_into(self.region, base, TAKEN, count)
        return taken, b"".join(chunks)

    def run(self, deadline: float) -> None:
        """Rounds until `deadline` + a grace: take, write, sync, answer each taken request."""
        sync_count, work_us = 0, self.shape.work_us
        while time.monotonic() < deadline + 1.0:
            if not self.server.wait(WAIT_S):
                continue
            with self.take_lock:
                taken, data = self.take()
                if not taken:
                    continue
                if work_us:
                    _busy(work_us * 0.6)
                file_pos = 0 if self.next_pos + len(data) > FILE_BYTES else self.next_pos
                os.pwrite(self.fd, data, file_pos)
                self.next_pos = file_pos + len(data)
                self.answered_count += len(taken)
            os.fdatasync(self.fd)
            sync_count += 1
            if work_us:
                _busy(work_us * 0.4)
            for index in taken:
                SLOT_HEADER.pack_into(self.region, index * self.slot_bytes, ANSWERED, 0)
                self.slots[index].post()
        self.sync_counts.append(sync_count)


def _server(region: mmap.mmap, producers: int, slot_bytes: int, size_bytes: int, fd: int,
            server: Wakeup, slots: list[Wakeup], deadline: float, use_crc: bool, shape: ServerShape,
            report_path: str) -> None:
    """Answer requests until `deadline` + a grace with `shape.thread_count` threads; write
    (syncs, cpu_s, requests answered, the fewest syncs of a thread) to `report_path`."""
    cpu0 = time.process_time()
    rounds = _Rounds(region, producers, slot_bytes, size_bytes, fd, server, slots, use_crc, shape)
    threads = [threading.Thread(target=rounds.run, args=(deadline,), name=f"server-{i}")
               for i in range(shape.thread_count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    rounds.view.release()
    _report(report_path, ["server", sum(rounds.sync_counts), time.process_time() - cpu0,
                          rounds.answered_count, min(rounds.sync_counts)])


def _report(path: str, report: list) -> None:
    with open(path, "w") as out:
        json.dump(report, out)


def run_once(producers: int, batch: int, size_bytes: int, seconds: float, use_crc: bool,
             directory: str, rate_msgs_per_s: float = 0.0, shape: ServerShape = ServerShape()
             ) -> dict[str, float]:
    """One run: fork the server and the producers, wait, sum what they report. At a fixed
    rate every producer's batch j is due at the same instant (the bench's aligned schedule)."""
    tag = f"{NAME_PREFIX}{os.getpid()}-"
    server = Wakeup.create(tag + "server")
    slots = [Wakeup.create(f"{tag}slot-{i}") for i in range(producers)]
    slot_bytes = _slot_bytes(batch, size_bytes)
    region = mmap.mmap(-1, producers * slot_bytes)
    fd, path = tempfile.mkstemp(prefix=".ack-floor-", dir=directory)
    gap_s = batch * producers / rate_msgs_per_s if rate_msgs_per_s else 0.0
    children: list[int] = []
    with tempfile.TemporaryDirectory(prefix="mqstore-ack-floor-") as reports_dir:
        try:
            os.posix_fallocate(fd, 0, FILE_BYTES)
            os.pwrite(fd, bytes(64 << 20), 0)  # the first 64 MiB written once, as the store's zeros
            os.fsync(fd)
            start = time.monotonic() + 0.5  # time to fork
            deadline = start + seconds
            children.append(_fork(lambda: _server(region, producers, slot_bytes, size_bytes, fd, server,
                                                  slots, deadline, use_crc, shape,
                                                  f"{reports_dir}/server")))
            for i in range(producers):
                children.append(_fork(lambda i=i: _producer(
                    i, region, slot_bytes, batch, size_bytes, server, slots[i], start, deadline,
                    gap_s, f"{reports_dir}/producer-{i}")))
            for child in children:
                os.waitpid(child, 0)
            children = []
            reports = [json.loads(Path(reports_dir, name).read_text())
                       for name in sorted(os.listdir(reports_dir))]
        finally:
            for child in children:
                os.kill(child, signal.SIGKILL)
                os.waitpid(child, 0)
            os.close(fd)
            os.unlink(path)
            region.close()
            for wakeup in (server, *slots):
                wakeup.close()
                wakeup.unlink()
    return _summarize(reports, producers, batch, seconds)


def _fork(body) -> int:
    pid = os.fork()
    if pid == 0:
        try:
            body()
        finally:
            os._exit(0)
    return pid


def _summarize(reports: list[list], producers: int, batch: int, seconds: float) -> dict[str, float]:
    """Sum the children's reports into rates, CPU per message and latency percentiles."""
    servers = [r for r in reports if r[0] == "server"]
    producer_reports = [r for r in reports if r[0] == "producer"]
    if len(servers) != 1 or len(producer_reports) != producers:
        raise RuntimeError(f"expected 1 server and {producers} producer reports, got {len(reports)}")
    syncs, server_cpu_s, server_answered, fewest_thread_syncs = servers[0][1:]
    msgs = sum(r[1] for r in producer_reports) * batch
    latencies_us = np.asarray([x for r in producer_reports for x in r[3]] or [0.0])
    p50, p99, p999 = np.percentile(latencies_us, [50, 99, 99.9])
    return {"msgs_per_s": msgs / seconds, "acks_per_s": msgs / batch / seconds,
            "syncs_per_s": syncs / seconds, "msgs_per_sync": msgs / max(syncs, 1),
            "server_answers_per_s": server_answered / seconds,
            "idlest_thread_syncs_per_s": fewest_thread_syncs / seconds,
            "server_cpu_us_per_msg": 1e6 * server_cpu_s / max(msgs, 1),
            "producers_cpu_us_per_msg": 1e6 * sum(r[2] for r in producer_reports) / max(msgs, 1),
            "latency_p50_ms": p50 / 1000, "latency_p99_ms": p99 / 1000, "latency_p999_ms": p999 / 1000,
            "latency_max_ms": float(latencies_us.max()) / 1000}


def main(argv: list[str] | None = None) -> dict[str, float]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--producers", type=int, default=4)
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--size", type=int, default=256)
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--rate", type=float, default=0.0,
                        help="messages/s over all producers, batches due together (default: closed loop)")
    parser.add_argument("--crc", action="store_true", help="CRC32C each record in the server")
    parser.add_argument("--work-us", type=float, default=0.0,
                        help="busy Python a server round, standing in for the store's work (default 0)")
    parser.add_argument("--server-threads", type=int, default=1,
                        help="server threads, each taking, syncing and answering on its own (default 1)")
    parser.add_argument("--dir", default=".", help="where the file goes (the store's file system)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    for name in ("producers", "batch", "size", "runs", "server_threads"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be at least 1, not {getattr(args, name)}")
    if args.seconds <= 0 or args.rate < 0 or args.work_us < 0:
        parser.error("--seconds must be > 0, --rate and --work-us >= 0")
    if not os.path.isdir(args.dir):
        parser.error(f"--dir {args.dir}: no such directory")
    shape = ServerShape(thread_count=args.server_threads, work_us=args.work_us)
    runs = [run_once(args.producers, args.batch, args.size, args.seconds, args.crc, args.dir,
                     args.rate, shape)
            for _ in range(args.runs)]
    median = {key: statistics.median(r[key] for r in runs) for key in runs[0]}
    if args.json:
        print(json.dumps({"runs": runs, "median": median}))
    else:
        print(f"{args.producers} producers x batch {args.batch} x {args.size} B"
              f"{' + CRC32C' if args.crc else ''}, server {args.server_threads} thread(s) + "
              f"{args.work_us:g} us work a round, median of {args.runs} x {args.seconds:g} s:")
        print(f"  {median['msgs_per_s']:10.0f} msg/s  {median['acks_per_s']:9.0f} acks/s  "
              f"{median['syncs_per_s']:7.0f} fdatasync/s  {median['msgs_per_sync']:6.1f} msgs per sync")
        print(f"  latency ms p50 {median['latency_p50_ms']:.3f} p99 {median['latency_p99_ms']:.3f} "
              f"p99.9 {median['latency_p999_ms']:.3f} max {median['latency_max_ms']:.3f}")
        print(f"  cpu us/msg: server {median['server_cpu_us_per_msg']:.2f}, "
              f"producers {median['producers_cpu_us_per_msg']:.2f}")
    return median


if __name__ == "__main__":
    main()
