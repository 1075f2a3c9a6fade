"""Run the retention soak: a real supervisor (`mqstore start`), a paced producer process, a
consumer in front and one behind, for `duration_s`, with `file_reserved_hours` of minutes.

The store expires segments at any hour: the soak sets `disk_warn_ratio` near 0, RocketMQ's own
rule (above the warn ratio expired files go at once), since a run cannot wait for the delete
hour. What it checks, after the producer stops and the store caught up:

* disk bounded: the largest disk use of the run's last third is at most that of its middle third
  (retention has reached its steady state by then) plus a quarter and a few segments;
* segments were deleted, the consumer behind was overtaken (OFFSET_TOO_SMALL) and went on;
* nothing acknowledged and still inside retention is lost: every acknowledged message at or
  above the final line reads back with its own body, and none acknowledged less than the
  retention time before the line was read (less a slack) lies below it;
* the consumer in front read every acknowledged message exactly once, never jumped;
* every message either consumer read is the one the ledger put at that offset;
* after a clean stop, `check` finds nothing.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from engine.check.fsck import check
from engine.files.disk_use import allocated_bytes
from engine.files.naming import commitlog_dir, segment_files
from engine.status import GetStatus
from ipc.consumer import Consumer
from ipc.control_block import ControlBlock
from ipc.retention_block import RetentionBlock
from tools.retention_soak.clients import TOPIC, ConsumerRole, seq_of
from tools.store_process import StoreProcess, wait_until, write_store_config
from workers.child_env import REPO_ROOT, child_env

SAMPLE_S = 1.0
POLL_S = 0.05
READY_TIMEOUT_S = 60.0
CATCH_UP_TIMEOUT_S = 60.0
YOUNG_SLACK_S = 5.0  # an ack comes after the store time; a message this much younger is certainly kept
GROWTH_ALLOWANCE = 0.25
GROWTH_SEGMENTS = 4
_MOVES = (GetStatus.FOUND, GetStatus.OFFSET_TOO_SMALL, GetStatus.NO_MATCHED_MESSAGE)


@dataclass(frozen=True)
class SoakSettings:
    """One soak run (defaults: `make soak`)."""

    duration_s: float = 600.0
    reserved_s: float = 120.0
    rate_msgs_per_s: int = 300
    behind_share: float = 0.25  # the consumer behind reads at this share of the producer's rate
    body_bytes: int = 512
    segment_bytes: int = 1 << 20
    queue_count: int = 4
    clean_interval_ms: int = 1000
    cq_entries: int = 10_000  # per consume-queue file
    index_entries: int = 20_000  # per index file

    def store_table(self) -> dict:
        return {"commitlog_file_size": self.segment_bytes, "consume_queue_entries": self.cq_entries,
                "index_slot_count": self.index_entries // 4, "index_entry_count": self.index_entries,
                "index_shards": 2,
                "queue_count": self.queue_count, "cq_flush_interval_ms": 500,
                "index_flush_interval_ms": 1000, "max_body_bytes": max(self.body_bytes, 4096),
                "file_reserved_hours": self.reserved_s / 3600.0,
                "clean_resource_interval_ms": self.clean_interval_ms,
                "disk_warn_ratio": 0.001, "disk_clean_force_ratio": 0.95, "disk_full_ratio": 0.97}


def _spawn(workdir: Path, name: str, *args: str) -> subprocess.Popen:
    with open(workdir / f"{name}.stderr", "ab") as err:
        return subprocess.Popen([sys.executable, *args], cwd=REPO_ROOT, env=child_env(),
                                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=err)


def run_soak(settings: SoakSettings, workdir: Path, progress=print) -> dict:
    """Run one soak in `workdir` (the store is workdir/store); returns the figures."""
    workdir.mkdir(parents=True, exist_ok=True)
    root = workdir / "store"
    config = write_store_config(workdir / "store.toml", settings.store_table())
    supervisor = StoreProcess(root, config, workdir / "supervisor.stderr", timeout_s=CATCH_UP_TIMEOUT_S,
                              poll_s=POLL_S)
    supervisor.start()
    clients: list[subprocess.Popen] = []
    try:
        supervisor.wait_ready(READY_TIMEOUT_S)
        clients = _start_clients(settings, workdir, root)
        samples = _sample_until_done(settings, root, supervisor, clients[0], progress)
        wait_until(lambda: _caught_up(root), "the store to catch up", CATCH_UP_TIMEOUT_S, POLL_S)
        (workdir / "stop").touch()
        for client in clients[1:]:
            client.wait(CATCH_UP_TIMEOUT_S)
        figures = _verify(settings, workdir, root, samples)
    finally:
        for client in clients:
            if client.poll() is None:
                client.kill()
                client.wait()
        stopped = supervisor.stop()
    findings = check(root)
    figures.update(supervisor_exit=stopped, check_findings=len(findings),
                   check_first=[str(f) for f in findings[:5]])
    figures["ok"] = _verdict(figures)
    return figures


def _caught_up(root: Path) -> bool:
    with ControlBlock.attach(root) as ctl:
        p = ctl.snapshot()
    return p.written_pos == p.flushed_pos == p.dispatched_pos


def _start_clients(settings: SoakSettings, workdir: Path, root: Path) -> list[subprocess.Popen]:
    common = ["-m", "tools.retention_soak"]
    producer = _spawn(workdir, "producer", *common, "produce", "--store", str(root),
                      "--ledger", str(workdir / "ledger.txt"),
                      "--until", repr(time.time() + settings.duration_s),
                      "--rate", str(settings.rate_msgs_per_s), "--body-bytes", str(settings.body_bytes),
                      "--queues", str(settings.queue_count))
    consumers = [_spawn(workdir, role.value, *common, "consume", "--store", str(root),
                        "--role", role.value, "--out", str(workdir / f"{role.value}.txt"),
                        "--stop", str(workdir / "stop"), "--queues", str(settings.queue_count),
                        "--rate", str(max(1, int(settings.rate_msgs_per_s * settings.behind_share))))
                 for role in ConsumerRole]
    return [producer, *consumers]


def _sample_until_done(settings: SoakSettings, root: Path, supervisor: StoreProcess,
                       producer: subprocess.Popen, progress) -> list[tuple[float, int, int]]:
    """(seconds since start, disk bytes used, commitlog segments) every SAMPLE_S until the
    producer exits (it stops by itself at the end of the run)."""
    samples: list[tuple[float, int, int]] = []
    started = time.monotonic()
    deadline = started + settings.duration_s + READY_TIMEOUT_S
    next_report = started + 60.0
    while producer.poll() is None:
        if not supervisor.running:
            raise RuntimeError(f"the supervisor exited with {supervisor.proc.returncode} during the soak")
        if time.monotonic() > deadline:
            raise RuntimeError("the producer did not stop at the end of the run")
        now = time.monotonic()
        segments = len(segment_files(commitlog_dir(root)))
        samples.append((now - started, allocated_bytes(root), segments))
        if now >= next_report:
            next_report += 60.0
            progress(f"  {now - started:5.0f} s: {samples[-1][1] / 2**20:.1f} MiB used, "
                     f"{segments} segments")
        time.sleep(SAMPLE_S)  # the sampling period of a measurement, not a wait for state
    if producer.returncode != 0:
        raise RuntimeError(f"the producer exited with {producer.returncode}")
    return samples


def _read_lines(path: Path) -> list[list[str]]:
    return [line.split() for line in path.read_text().splitlines() if line.strip()]


def _verify(settings: SoakSettings, workdir: Path, root: Path, samples) -> dict:
    """The figures; the store still runs (and its passes go on), so the line is read after the
    read-back: a message at or above that line was in the store during the whole read-back."""
    stored = _read_back(root, settings.queue_count)
    with ControlBlock.attach(root) as ctl:
        block = RetentionBlock(ctl)
        line, cleans = block.line(), block.cleans()
    line_read_s = time.time()
    acked, placed = {}, {}
    for seq, status, queue_id, offset, commit_pos, ack_ms in _read_lines(workdir / "ledger.txt"):
        placed[int(seq)] = (int(queue_id), int(offset))
        if status == "PUT_OK":
            acked[(int(queue_id), int(offset))] = (int(seq), int(commit_pos), int(ack_ms))
    young_ms = (line_read_s - settings.reserved_s + YOUNG_SLACK_S) * 1000
    lost_retained = sum(1 for key, (seq, pos, _) in acked.items()
                        if pos >= line.min_commit_pos and stored.get(key) != seq)
    lost_young = sum(1 for seq, pos, ack_ms in acked.values()
                     if ack_ms > young_ms and pos < line.min_commit_pos)
    front, behind = (_reads(workdir / f"{role.value}.txt") for role in ConsumerRole)
    wrong = sum(1 for reads in (front, behind) for key, seq in reads["messages"]
                if placed.get(seq) != key)
    front_missed = len(set(acked) - {key for key, _ in front["messages"]})
    front_twice = len(front["messages"]) - len({key for key, _ in front["messages"]})
    mid, last = _thirds(samples)
    bound = mid * (1 + GROWTH_ALLOWANCE) + GROWTH_SEGMENTS * settings.segment_bytes
    return {
        "duration_s": settings.duration_s, "reserved_s": settings.reserved_s,
        "rate_msgs_per_s": settings.rate_msgs_per_s, "segment_bytes": settings.segment_bytes,
        "peak_disk_bytes": max(s[1] for s in samples), "final_disk_bytes": samples[-1][1],
        "middle_third_peak_bytes": mid, "last_third_peak_bytes": last, "bounded": last <= bound,
        "peak_segments": max(s[2] for s in samples), "final_segments": samples[-1][2],
        "segments_deleted": line.segments_removed, "bytes_deleted": line.bytes_removed,
        "retention_passes": line.passes, "min_commit_pos": line.min_commit_pos,
        "cq_files_deleted": cleans["consumequeue"].files_removed,
        "index_files_deleted": sum(c.files_removed for k, c in cleans.items() if k != "consumequeue"),
        "acknowledged": len(acked), "consumed_front": len(front["messages"]),
        "consumed_behind": len(behind["messages"]), "behind_jumps": behind["jumps"],
        "behind_skipped_by_retention": behind["skipped"], "front_jumps": front["jumps"],
        "corrupt_skipped": front["corrupt"] + behind["corrupt"],
        "lost_retained": lost_retained, "lost_young": lost_young, "front_missed": front_missed,
        "front_twice": front_twice, "wrong_reads": wrong,
        "losses": lost_retained + lost_young + front_missed + wrong,
    }


def _read_back(root: Path, queue_count: int) -> dict[tuple[int, int], int]:
    """Every message still in the store: (queue_id, queue_offset) -> seq."""
    stored = {}
    with Consumer(root, "soak-verify") as consumer:
        for queue_id in range(queue_count):
            offset = 0
            while True:
                result = consumer.pull(TOPIC, queue_id, offset, max_count=256)
                for record in result.messages:
                    stored[(queue_id, record.queue_offset)] = seq_of(record.body)
                if result.status not in _MOVES or result.next_offset == offset:
                    break
                offset = result.next_offset
    return stored


def _reads(path: Path) -> dict:
    messages, jumps, skipped, corrupt = [], 0, 0, 0
    for kind, queue_id, a, *rest in _read_lines(path):
        if kind == "M":
            messages.append(((int(queue_id), int(a)), int(rest[0])))
        elif kind == "J":
            jumps += 1
            skipped += int(rest[0]) - int(a)
        else:
            corrupt += 1
    return {"messages": messages, "jumps": jumps, "skipped": skipped, "corrupt": corrupt}


def _thirds(samples) -> tuple[int, int]:
    """Peak disk bytes of the middle and of the last third of the run."""
    n = len(samples)
    middle = [s[1] for s in samples[n // 3:2 * n // 3]] or [samples[-1][1]]
    last = [s[1] for s in samples[2 * n // 3:]] or [samples[-1][1]]
    return max(middle), max(last)


def _verdict(f: dict) -> bool:
    return (f["losses"] == 0 and f["check_findings"] == 0 and f["supervisor_exit"] == 0
            and f["segments_deleted"] > 0 and f["behind_jumps"] > 0 and f["front_jumps"] == 0
            and f["front_twice"] == 0 and f["bounded"])


def render(figures: dict) -> str:
    keys = ("duration_s", "reserved_s", "rate_msgs_per_s", "peak_disk_bytes", "final_disk_bytes",
            "middle_third_peak_bytes", "last_third_peak_bytes", "bounded",
            "peak_segments", "final_segments", "segments_deleted", "cq_files_deleted",
            "index_files_deleted", "acknowledged", "consumed_front", "consumed_behind",
            "behind_jumps", "behind_skipped_by_retention", "losses", "check_findings", "ok")
    return "\n".join(f"{k:<28}{json.dumps(figures[k])}" for k in keys)
