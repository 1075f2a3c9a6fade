"""Operator commands: `mqstore topics`, `groups`, `lag`, `exporter` and `status --watch`.

The tables come from tools.inventory (read-only, live or stopped store); each prints a table
for people or, with --json, a JSON list for scripts. The exporter serves Prometheus metrics
(tools.exporter). `status --watch` redraws `mqstore status` every second until Ctrl-C.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable, Sequence

from engine.errors import BadInputError
from workers.exit_codes import CliExit

DEFAULT_LISTEN = "127.0.0.1:9460"
WATCH_INTERVAL_S = 1.0
CLEAR_SCREEN = "\x1b[H\x1b[2J"


def add_parsers(command) -> None:
    p = command("topics", "per topic and queue: min/max queue offset, messages, bytes, oldest "
                "and newest store time, disk its consume-queue files allocate and use, queue counts "
                "and perm; then the topics configured with no message yet (read-only; live or "
                "stopped store)", cmd_topics)
    p.add_argument("--json", action="store_true")
    p = command("groups", "consumer groups: committed offsets, queues and last commit time; "
                "--reset moves a group's offsets on a topic", cmd_groups)
    p.add_argument("--json", action="store_true")
    p.add_argument("--reset", action="store_true",
                   help="reset --group's committed offsets on --topic to --to (refused while the "
                   "group has live consumers)")
    p.add_argument("--group", help="with --reset: the consumer group")
    p.add_argument("--topic", help="with --reset: the topic (every queue of it)")
    p.add_argument("--to", help="with --reset: earliest, latest, a TIME (ISO 8601, or @<ms since "
                   "the epoch>) or an OFFSET (in every queue's [min, max])")
    p = command("lag", "per group and queue: committed offset, max offset, lag in messages and "
                "in time, last commit time", cmd_lag)
    p.add_argument("--group", help="only this consumer group (an unknown group is an error)")
    p.add_argument("--json", action="store_true")
    p = command("exporter", "serve Prometheus metrics of the store over HTTP (a process of its "
                "own; reads shared memory and files on each scrape)", cmd_exporter)
    p.add_argument("--listen", default=DEFAULT_LISTEN,
                   help=f"HOST:PORT to serve /metrics on (default {DEFAULT_LISTEN})")
    p.add_argument("--allow-remote", action="store_true",
                   help="allow a non-loopback --listen address (the metrics name topics and groups)")


# ---------------------------------------------------------------------------------- tables
def cmd_topics(args: argparse.Namespace) -> int:
    from engine.files.disk_use import human_bytes
    from tools.inventory import topic_overview

    topics = topic_overview(args.store)
    if args.json:
        print(json.dumps(topics_json(topics), indent=2))
        return CliExit.OK
    rows = [(t, r) for t in topics for r in t.queues]
    print(render_table(("topic", "queue", "min offset", "max offset", "messages", "bytes",
                        "oldest", "newest", "cq allocated", "cq used", "queues w/r", "perm"),
                       [(r.topic, r.queue_id, r.min_offset, r.max_offset, r.messages,
                         human_bytes(r.stored_bytes), clock(r.oldest_store_time_ms),
                         clock(r.newest_store_time_ms), human_bytes(r.cq_allocated_bytes),
                         human_bytes(r.cq_used_bytes), f"{dash(t.write_queues)}/{dash(t.read_queues)}",
                         dash(t.perm)) for t, r in rows],
                       empty="no messages yet"))
    empty = [t for t in topics if not t.queues]
    if empty:
        print("\ntopics with no message yet:")
        print(render_table(("topic", "write queues", "read queues", "perm"),
                           [(t.topic, t.write_queues, t.read_queues, t.perm) for t in empty], empty=""))
    return CliExit.OK


def topics_json(topics: list) -> list[dict]:
    """One object per queue, with its topic's configuration; a topic with no message yet is one
    object with queue_id null and no messages."""
    out = []
    for topic in topics:
        config = {"read_queues": topic.read_queues, "write_queues": topic.write_queues, "perm": topic.perm}
        out += [{**queue.as_dict(), **config} for queue in topic.queues] or [
            {"topic": topic.topic, "queue_id": None, "min_offset": 0, "max_offset": 0, "messages": 0,
             "stored_bytes": 0, "oldest_store_time_ms": None, "newest_store_time_ms": None,
             "cq_allocated_bytes": 0, "cq_used_bytes": 0, **config}]
    return out


def cmd_groups(args: argparse.Namespace) -> int:
    from tools.group_view import member_table
    from tools.inventory import group_table

    if args.reset:
        return cmd_reset(args)
    given = [f"--{name}" for name in ("group", "topic", "to") if getattr(args, name) is not None]
    if given:
        raise BadInputError(given[0], "only goes with --reset")
    rows = group_table(args.store)
    if args.json:
        print(json.dumps([row.as_dict() for row in rows], indent=2))
        return CliExit.OK
    members = member_table(args.store)
    print(render_table(("group", "topic", "queue", "committed offset", "committed at", "note"),
                       [(g.group, c.topic, c.queue_id, c.committed_offset, clock(c.commit_time_ms),
                         "refused until reset" if c.refused else "")
                        for g in rows for c in g.committed],
                       empty="no consumer group has committed an offset"))
    print()
    print(render_table(("group", "topic", "member", "pid", "since", "state", "queues", "lag"),
                       [(m.group, m.topic, m.member, m.pid, clock(m.since_ms), m.state,
                         ",".join(map(str, m.queue_ids)) or "-", m.lag_messages) for m in members],
                       empty="no consumer group has live members"))
    return CliExit.OK


def cmd_reset(args: argparse.Namespace) -> int:
    from tools.offset_reset import reset_offsets

    missing = [f"--{name}" for name in ("group", "topic", "to") if getattr(args, name) is None]
    if missing:
        raise BadInputError(missing[0], "--reset needs --group, --topic and --to")
    moves = reset_offsets(args.store, args.group, args.topic, args.to)
    if args.json:
        print(json.dumps({"group": args.group, "topic": args.topic, "to": args.to,
                          "queues": [move.as_dict() for move in moves]}, indent=2))
        return CliExit.OK
    print(f"group {args.group} on {args.topic}: reset to {args.to}")
    if any(m.instance is not None for m in moves):  # a BROADCASTING group: each instance's own
        print(render_table(("instance", "queue", "committed before", "committed now"),
                           [(m.instance, m.queue_id, dash(m.before), m.after) for m in moves],
                           empty="no queue"))
        return CliExit.OK
    print(render_table(("queue", "committed before", "committed now"),
                       [(m.queue_id, dash(m.before), m.after) for m in moves], empty="no queue"))
    return CliExit.OK


def cmd_lag(args: argparse.Namespace) -> int:
    from tools.inventory import lag_table

    rows = lag_table(args.store, args.group)
    if args.json:
        print(json.dumps([row.as_dict() for row in rows], indent=2))
        return CliExit.OK
    print(render_table(("group", "topic", "queue", "committed", "max offset", "lag msgs", "lag time",
                        "committed at", "note"),
                       [(r.group, r.topic, r.queue_id, dash(r.committed_offset), r.max_offset,
                         r.lag_messages, human_ms(r.lag_ms), clock(r.last_commit_time_ms),
                         r.offset_problem or "") for r in rows],
                       empty="no consumer group has committed an offset"))
    return CliExit.OK


def render_table(headers: Sequence[str], rows: Sequence[Sequence[object]], *, empty: str) -> str:
    """Columns padded to their widest cell; text left-aligned, numbers right-aligned."""
    if not rows:
        return empty
    cells = [[str(c) for c in headers]] + [[str(c) for c in row] for row in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    numeric = [all(isinstance(row[i], int) or row[i] == "-" for row in rows) for i in range(len(headers))]

    def line(row: list[str]) -> str:
        return "  ".join(c.rjust(w) if num else c.ljust(w)
                         for c, w, num in zip(row, widths, numeric, strict=True)).rstrip()

    return "\n".join(line(row) for row in cells)


def clock(ms: int | None) -> str:
    """Local date and time of an epoch-ms stamp, '-' for none."""
    if ms is None:
        return "-"
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(ms / 1000)) + f".{ms % 1000:03d}"


def dash(value: object) -> object:
    return "-" if value is None else value


def human_ms(ms: int) -> str:
    if ms < 1000:
        return f"{ms} ms"
    seconds = ms / 1000
    if seconds < 120:
        return f"{seconds:.1f} s"
    return f"{seconds / 60:.1f} min" if seconds < 7200 else f"{seconds / 3600:.1f} h"


# ---------------------------------------------------------------------------------- watch
def watch_status(args: argparse.Namespace) -> int:
    """Redraw the status each second until Ctrl-C (then exit 0: ending the view is the normal
    way out). Each sample spans the interval, so rates cover the time between two frames."""
    from workers.status_report import collect_status, render_status

    draw = _json_line if args.json else _frame(CLEAR_SCREEN if sys.stdout.isatty() else "")
    try:
        while True:
            started_s = time.monotonic()
            status = collect_status(args.store, sample_s=WATCH_INTERVAL_S)
            draw(status, render_status)
            # a stopped store answers at once: pace the frames, do not spin
            time.sleep(max(WATCH_INTERVAL_S - (time.monotonic() - started_s), 0.0))
    except KeyboardInterrupt:
        return CliExit.OK


def _json_line(status: dict, _render: Callable[[dict], str]) -> None:
    print(json.dumps(status), flush=True)


def _frame(head: str) -> Callable[[dict, Callable[[dict], str]], None]:
    """Frames each under a time line, after `head` (a terminal's clear-screen; nothing for a
    pipe, so a log of the view stays readable)."""
    def draw(status: dict, render: Callable[[dict], str]) -> None:
        stamp = time.strftime("%H:%M:%S")
        print(f"{head}--- {stamp}  (mqstore status --watch; Ctrl-C ends)\n{render(status)}\n",
              flush=True)

    return draw


# ---------------------------------------------------------------------------------- exporter
def cmd_exporter(args: argparse.Namespace) -> int:
    from tools.exporter import parse_listen, require_loopback, serve

    host, port = parse_listen(args.listen)
    if not args.allow_remote:
        require_loopback(host)
    return serve(args.store, host, port)
