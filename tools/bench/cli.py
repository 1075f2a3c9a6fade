"""`mqstore bench`: load-test a store with co-located producer and consumer processes.

    mqstore bench --start --producers 4 --consumers 1 --batch 64 --size 256 --keys --seconds 20
    mqstore bench --store ./data --rate 20000 --json run.json --plot run.png
    mqstore bench --start --batch 64 --peer redis --disk
    mqstore bench --start --batch 64 --peer redis,sqlite
    mqstore bench --disk                      # the disk's sync-write ceiling alone

Prints one line per 5 s interval (publish rate and latency, consume rate, backlog, end-to-end
latency, errors by status, store lag, load average), then a summary; --json writes the same
figures, --plot a PNG. With --rate, latency runs from each message's intended send time, so a
stall is not hidden (coordinated omission). --peer runs the same workload against a peer after
the store and prints the ratios: redis, a private redis-server (Redis Streams, AOF appendfsync
always/everysec); sqlite, one WAL database of the standard library's sqlite3 (synchronous
FULL/NORMAL, one transaction per batch); or both, as a comma list.
"""

from __future__ import annotations

import argparse
import json
import shlex
import signal
import sys
from contextlib import nullcontext
from pathlib import Path

from engine.errors import BadInputError
from tools.bench import disk, peers, report
from tools.bench.harness import (
    SCHEDULE_ALIGNED,
    SCHEDULES,
    BenchPlan,
    StartedStore,
    check_running_store,
    run_workload,
)

DEFAULT_RECORD_OVERHEAD_BYTES = 120  # header + topic + properties of a bench record, roughly


def _rate(text: str) -> float | None:
    if text == "max":
        return None
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of msgs/s or 'max'") from None


def add_bench_parser(subparsers) -> argparse.ArgumentParser:
    """Add the `bench` subcommand to an argparse subparsers object."""
    p = subparsers.add_parser("bench", help="load-test a store (and optionally Redis Streams)",
                              description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    where = p.add_mutually_exclusive_group()
    where.add_argument("--store", help="directory of a running store")
    where.add_argument("--start", action="store_true",
                       help="start a fresh store in a temp directory for the run, stop and remove it after")
    p.add_argument("--producers", type=int, default=1, help="producer processes (default 1)")
    p.add_argument("--consumers", type=int, default=1, help="consumer processes (default 1)")
    p.add_argument("--seconds", type=float, default=20.0, help="measured seconds (default 20)")
    p.add_argument("--warmup", type=float, default=2.0, help="seconds before measuring (default 2)")
    p.add_argument("--size", type=int, default=256, help="body bytes (default 256, min 24)")
    p.add_argument("--batch", type=int, default=1, help="messages per send (default 1: send and wait)")
    p.add_argument("--rate", type=_rate, default=None, metavar="MSGS_PER_S|max",
                   help="total offered rate over all producers (default max)")
    p.add_argument("--schedule", choices=SCHEDULES, default=SCHEDULE_ALIGNED,
                   help="with --rate: every producer's batch j due at once (aligned, the default: "
                        "bursts of one batch per producer), or spread evenly over a batch interval")
    p.add_argument("--topics", type=int, default=1, help="topics (default 1)")
    p.add_argument("--queues", type=int, default=4, help="queues per topic (default 4)")
    p.add_argument("--keys", action="store_true", help="give every message one unique key")
    p.add_argument("--flush", choices=("sync", "async"), help="flush policy (--start; default sync)")
    p.add_argument("--index-shards", type=int, default=2, help="index shards of a --start store")
    p.add_argument("--inflight", type=int, default=1, help="sends each producer keeps in flight")
    p.add_argument("--pull-count", type=int, default=1024, help="max messages per consumer pull")
    p.add_argument("--consume-from", choices=("end", "start"), default="end",
                   help="consumers start at the queues' end (default) or read the backlog from 0")
    p.add_argument("--interval", type=float, default=5.0, help="seconds per report line (default 5)")
    p.add_argument("--json", metavar="FILE", help="write the figures as JSON")
    p.add_argument("--plot", metavar="FILE.png", help="write throughput/latency plots (matplotlib)")
    p.add_argument("--peer", type=peers.parse_peers, default=(), metavar="redis|sqlite|redis,sqlite",
                   help="run the same workload against Redis Streams, a SQLite table, or both")
    p.add_argument("--redis-server", default="redis-server", help="redis-server binary")
    p.add_argument("--disk", action="store_true", help="measure the disk's fdatasync ceiling too")
    p.add_argument("--disk-seconds", type=float, default=disk.DEFAULT_PROBE_S, help="seconds per disk probe")
    p.add_argument("--disk-writers", type=int,
                   help="concurrent writers of the disk probe (default --producers)")
    p.add_argument("--workdir", help="where --start and the peer put their temp directories")
    p.add_argument("--keep", action="store_true", help="keep the --start store afterwards")
    p.set_defaults(func=run_bench)
    return p


def bench_parser(prog: str) -> argparse.ArgumentParser:
    """A parser of `bench ...` alone (what `python -m tools.bench` and the sweep parse with)."""
    parser = argparse.ArgumentParser(prog=prog)
    add_bench_parser(parser.add_subparsers(dest="command", required=True))
    return parser


def plan_from_args(args: argparse.Namespace) -> BenchPlan:
    return BenchPlan(producers=args.producers, consumers=args.consumers, seconds=args.seconds,
                     size_bytes=args.size, batch=args.batch, rate_msgs_per_s=args.rate,
                     topics=args.topics, queues=args.queues, keys=args.keys,
                     flush=args.flush or "sync", warmup_s=args.warmup, interval_s=args.interval,
                     inflight=args.inflight, pull_count=args.pull_count,
                     consume_from=args.consume_from, schedule=args.schedule)


def _out(line: str) -> None:
    print(line, flush=True)


def run_bench(args: argparse.Namespace) -> int:
    """Run what the arguments ask for; returns the exit code (1 if messages went missing).

    SIGTERM (a `kill`, a CI timeout) stops the run as Ctrl-C does, through Python's own
    KeyboardInterrupt: the workers, the store started for the run and its temp directory are
    cleaned up. By default SIGTERM ended this process at once and left them running."""
    previous = signal.signal(signal.SIGTERM, signal.default_int_handler)
    try:
        return _run_bench(args)
    finally:
        signal.signal(signal.SIGTERM, previous)


def _run_bench(args: argparse.Namespace) -> int:
    if args.workdir is not None and not Path(args.workdir).is_dir():
        raise BadInputError("--workdir", f"{args.workdir} is not a directory (create it first: the "
                            "bench puts its temp directories inside it)")
    if not args.store and not args.start:
        if args.disk:
            return _disk_only(args)
        raise BadInputError("store", "give --store DIR (a running store) or --start")
    plan = plan_from_args(args)
    for name in args.peer:
        _require_peer(name, args)  # fail before the store run, with the install hints
    doc = {"schema": report.SCHEMA, "command": shlex.join(["mqstore", *sys.argv[1:]]),
           "machine": report.machine_info(), "config": plan.to_dict(), "runs": {}}
    store_cm = (StartedStore(plan, index_shards=args.index_shards, workdir=args.workdir,
                             keep=args.keep, out=_out) if args.start else nullcontext())
    with store_cm as started:
        store_dir = str(started.store_dir) if args.start else args.store
        doc["config"]["store"] = check_running_store(plan, store_dir, args.flush is not None)
        doc["config"]["index_shards"] = doc["config"]["store"]["index_shards"]
        ours = run_workload(plan, "mqstore", store_dir, _out, store_dir=store_dir)
        doc["runs"]["mqstore"] = ours
        _print_lines(report.summary_lines("mqstore", ours))
        if args.disk:
            doc["disk"] = _disk_for_run(args, plan, ours, Path(store_dir).resolve().parent)
    for name in args.peer:
        _run_peer(args, plan, doc, name)
    doc["machine"]["load_avg_after"] = report.machine_info()["load_avg"]
    _write_outputs(args, doc)
    missing = [name for name, run in doc["runs"].items()
               if run["summary"]["sent_total"] != run["summary"]["received_total"] and plan.consumers
               and plan.producers]
    for name in missing:
        _out(f"WARNING: {name}: consumers received {doc['runs'][name]['summary']['received_total']} "
             f"of {doc['runs'][name]['summary']['sent_total']} stored messages")
    return 1 if missing else 0


def _require_peer(name: str, args: argparse.Namespace) -> None:
    """Raise PeerUnavailableError (with an install hint) if peer `name` cannot run here."""
    if name == "redis":
        from tools.bench.redis_peer import require_redis

        require_redis(args.redis_server)
    else:
        from tools.bench.sqlite_peer import require_sqlite

        require_sqlite()


def _start_peer(name: str, flush: str, args: argparse.Namespace):
    """Peer `name` set up for one run with flush policy `flush` (a context manager)."""
    if name == "redis":
        from tools.bench.redis_peer import RedisServer

        return RedisServer(flush, server_binary=args.redis_server, workdir=args.workdir)
    from tools.bench.sqlite_peer import SqliteDatabase

    return SqliteDatabase(flush, workdir=args.workdir)


def _run_peer(args: argparse.Namespace, plan: BenchPlan, doc: dict, name: str) -> None:
    """The same workload against peer `name`; its run and the mqstore/peer ratios into `doc`."""
    with _start_peer(name, plan.flush, args) as peer:
        _out(peer.started_line)
        run = run_workload(plan, name, peer.target, _out, peer_pid=peer.pid)
    run["peer_setting"] = peer.setting
    run["peer_counters"] = report.worker_counters(run["workers"])
    doc["runs"][name] = run
    _print_lines(report.summary_lines(name, run))
    ratios = report.comparison(doc["runs"]["mqstore"], run)
    doc.setdefault("ratios", {})[name] = ratios  # mqstore / peer, one entry per peer
    _print_lines(report.comparison_lines(doc["runs"]["mqstore"], run, ratios))


def _disk_for_run(args: argparse.Namespace, plan: BenchPlan, ours: dict, directory: Path) -> dict:
    flush = (ours.get("store") or {}).get("flush") or {}
    record_bytes = int(flush.get("avg_record_bytes") or plan.size_bytes + DEFAULT_RECORD_OVERHEAD_BYTES)
    flush_bytes = int(flush.get("avg_flush_bytes") or 0) or None
    result = disk.probe_disk(directory, record_bytes=record_bytes,
                             writers=args.disk_writers or max(plan.producers, 1),
                             flush_bytes=flush_bytes, seconds=args.disk_seconds)
    result["load_avg"] = report.machine_info()["load_avg"]
    pub = ours["summary"]["pub_msgs_per_s"]
    result["fractions"] = {
        "pub_vs_batch_ceiling": round(pub / result["ceiling_msgs_per_s_at_store_batch"], 3)
        if result["ceiling_msgs_per_s_at_store_batch"] else None,
        "pub_vs_writers_ceiling": round(pub / result["ceiling_msgs_per_s_writers"], 3)
        if result["ceiling_msgs_per_s_writers"] else None}
    _print_lines(disk.disk_lines(result))
    _out(f"  mqstore published {pub:.0f} msg/s = {result['fractions']['pub_vs_batch_ceiling']} of the "
         f"ceiling at its own flush size, {result['fractions']['pub_vs_writers_ceiling']} of "
         f"{result['writers']['writers']} one-record writers")
    return result


def _disk_only(args: argparse.Namespace) -> int:
    directory = Path(args.workdir or ".").resolve()
    record_bytes = args.size + DEFAULT_RECORD_OVERHEAD_BYTES
    result = disk.probe_disk(directory, record_bytes=record_bytes,
                             writers=args.disk_writers or max(args.producers, 1), seconds=args.disk_seconds)
    result["load_avg"] = report.machine_info()["load_avg"]
    _print_lines(disk.disk_lines(result))
    if args.json:
        doc = {"schema": report.SCHEMA, "command": shlex.join(["mqstore", *sys.argv[1:]]),
               "machine": report.machine_info(), "config": {}, "runs": {}, "disk": result}
        Path(args.json).write_text(json.dumps(doc, indent=1) + "\n")
    return 0


def _write_outputs(args: argparse.Namespace, doc: dict) -> None:
    if args.json:
        Path(args.json).write_text(json.dumps(doc, indent=1) + "\n")
        _out(f"wrote {args.json}")
    if args.plot:
        from tools.bench import plot

        plot.render(doc, args.plot)
        _out(f"wrote {args.plot}")


def _print_lines(lines: list[str]) -> None:
    for line in lines:
        _out(line)
