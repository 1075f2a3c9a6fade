"""`mqstore bench --disk`: the raw ceiling of sync writes on the store's file system.

Two probes, each on a temp file beside the store (same file system), allocated ahead in
4 MiB steps with posix_fallocate as engine.files.mapped_file does, deleted afterwards:

- *batch*: one writer, sequential pwrite of `write_bytes` then fdatasync, repeated. At the
  store's average flush size (flushed bytes / flush count of the run) this is what one
  group-commit flush per sync could reach: syncs/s x records per flush.
- *writers*: N threads share one file; each reserves the next `record_bytes`, pwrites them and
  fdatasyncs, repeated (pwrite and fdatasync release the GIL). This is the ceiling of N
  outstanding one-record durable writers -- what N producers waiting for each ack allow
  without any cleverness.
"""

from __future__ import annotations

import os
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

ALLOCATE_STEP_BYTES = 4 << 20
MAX_FILE_BYTES = 1 << 30
DEFAULT_PROBE_S = 3.0
SWEEP_WRITE_BYTES = (4096, 16384, 65536, 262144, 1 << 20)


class _SharedFile:
    """A temp file with a reservation cursor; blocks are allocated ahead of the writes."""

    def __init__(self, directory: Path):
        fd, name = tempfile.mkstemp(prefix=".bench-disk-", dir=directory)
        self.fd, self.path = fd, Path(name)
        self.next_pos = 0
        self.allocated = 0
        self.lock = threading.Lock()

    def reserve(self, size_bytes: int) -> int | None:
        """The position of the next `size_bytes`, or None once the file reached its cap."""
        with self.lock:
            pos = self.next_pos
            if pos + size_bytes > MAX_FILE_BYTES:
                return None
            self.next_pos += size_bytes
            if self.next_pos > self.allocated:
                end = -(-self.next_pos // ALLOCATE_STEP_BYTES) * ALLOCATE_STEP_BYTES
                os.posix_fallocate(self.fd, self.allocated, end - self.allocated)
                self.allocated = end
            return pos

    def close(self) -> None:
        os.close(self.fd)
        self.path.unlink(missing_ok=True)


def _write_loop(shared: _SharedFile, size_bytes: int, deadline: float, sync_ns: list[int]) -> None:
    data = os.urandom(size_bytes)
    while time.monotonic() < deadline:
        pos = shared.reserve(size_bytes)
        if pos is None:
            return
        os.pwrite(shared.fd, data, pos)
        started = time.perf_counter_ns()
        os.fdatasync(shared.fd)
        sync_ns.append(time.perf_counter_ns() - started)


def probe_writers(directory: str | Path, *, writers: int, write_bytes: int,
                  seconds: float = DEFAULT_PROBE_S) -> dict:
    """`writers` threads each doing pwrite(write_bytes) + fdatasync on one file, for `seconds`."""
    shared = _SharedFile(Path(directory))
    per_thread: list[list[int]] = [[] for _ in range(writers)]
    started = time.monotonic()
    try:
        threads = [threading.Thread(target=_write_loop, args=(shared, write_bytes,
                                                              started + seconds, per_thread[i]))
                   for i in range(writers)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        elapsed = max(time.monotonic() - started, 1e-9)
    finally:
        shared.close()
    sync_ns = np.asarray([x for lst in per_thread for x in lst] or [0], dtype=np.int64)
    writes = sum(map(len, per_thread))
    return {"writers": writers, "write_bytes": write_bytes, "writes": writes,
            "seconds": round(elapsed, 3), "writes_per_s": round(writes / elapsed, 1),
            "mib_per_s": round(writes * write_bytes / elapsed / 2**20, 2),
            "fdatasync_p50_ms": round(float(np.percentile(sync_ns, 50)) / 1e6, 3),
            "fdatasync_p99_ms": round(float(np.percentile(sync_ns, 99)) / 1e6, 3)}


def probe_disk(directory: str | Path, *, record_bytes: int, writers: int,
               flush_bytes: int | None = None, seconds: float = DEFAULT_PROBE_S) -> dict:
    """The ceilings a run is compared against (see the module docstring).

    With `flush_bytes` (the store's average bytes per flush) the batch probe runs at that size;
    without it, at a sweep of sizes."""
    sizes = [max(int(flush_bytes), record_bytes)] if flush_bytes else [record_bytes, *SWEEP_WRITE_BYTES]
    batch = [probe_writers(directory, writers=1, write_bytes=size, seconds=seconds) for size in sizes]
    for point in batch:
        point["records_per_s"] = round(point["writes_per_s"] * point["write_bytes"] / record_bytes, 1)
    concurrent = probe_writers(directory, writers=writers, write_bytes=record_bytes, seconds=seconds)
    single = (batch[0] if sizes[0] == record_bytes else
              probe_writers(directory, writers=1, write_bytes=record_bytes, seconds=seconds))
    return {"directory": str(directory), "record_bytes": record_bytes, "flush_bytes": flush_bytes,
            "probe_seconds": seconds, "batch": batch, "one_writer_one_record": single,
            "writers": concurrent,
            "ceiling_msgs_per_s_at_store_batch": batch[0]["records_per_s"] if flush_bytes else None,
            "ceiling_msgs_per_s_writers": concurrent["writes_per_s"]}


def disk_lines(disk: dict) -> list[str]:
    """Human-readable lines of probe_disk()'s result."""
    lines = [f"disk ceiling on {disk['directory']} (records of {disk['record_bytes']} B, "
             f"{disk['probe_seconds']:g} s per probe):"]
    for point in disk["batch"]:
        lines.append(f"  1 writer, {point['write_bytes']:>8} B per fdatasync: "
                     f"{point['writes_per_s']:>9.0f} syncs/s {point['mib_per_s']:>8.1f} MiB/s = "
                     f"{point['records_per_s']:>10.0f} records/s  (fdatasync p50 "
                     f"{point['fdatasync_p50_ms']} ms, p99 {point['fdatasync_p99_ms']} ms)")
    w = disk["writers"]
    lines.append(f"  {w['writers']} writers, 1 record per fdatasync each: {w['writes_per_s']:.0f} "
                 f"records/s (fdatasync p50 {w['fdatasync_p50_ms']} ms, p99 {w['fdatasync_p99_ms']} ms)")
    one = disk["one_writer_one_record"]
    lines.append(f"  1 writer, 1 record per fdatasync: {one['writes_per_s']:.0f} records/s")
    return lines
