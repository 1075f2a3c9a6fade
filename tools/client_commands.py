"""`mqstore send`, `mqstore consume` and `mqstore query`: the client commands of the CLI.

send and consume go through a running supervisor (ipc.Producer, ipc.Consumer); query reads the
files read-only and works with or without one (bounded by the published positions when one
runs, so it never shows what a crash could take back under sync flush).

A corrupt record (a checksum fails, a torn header) does not stop consume or query: the records
around it are printed, a WARNING line on stderr names its commit position (and queue offset),
consume commits past it, and the command exits 1 (FAILED) once everything readable is printed,
so a script sees that something was lost; 0 when nothing was skipped.
"""

from __future__ import annotations

import argparse
import base64
import json
import random
import signal
import sys
import time
from datetime import datetime
from pathlib import Path

from engine.errors import BadInputError
from engine.formats.msg_id import parse_msg_id
from engine.formats.record import Record
from engine.status import PutStatus
from tools.read_view import ReadView
from workers.exit_codes import CliExit

DEFAULT_GROUP = "mqstore-cli"
COMMIT_EVERY_S = 1.0
SEND_CHUNK = 1024  # messages per send_batch; Ctrl-C stops between two
TOPIC_POLL_S = 0.1  # consume --follow of a topic not created yet looks again this often


def add_parsers(command) -> None:
    p = command("send", "put one message (or --count copies) into a running store", cmd_send)
    p.add_argument("--topic", required=True)
    body = p.add_mutually_exclusive_group()
    body.add_argument("--body", help="message body as UTF-8 text")
    body.add_argument("--body-file", help="read the body from a file ('-' = stdin)")
    p.add_argument("--tags", help="one tag")
    p.add_argument("--key", action="append", default=[], dest="keys", help="a key (repeatable)")
    p.add_argument("--queue-id", type=int, help="queue (default: round robin from a random first "
                   "queue, so single sends spread over the queues too)")
    p.add_argument("--property", action="append", default=[], metavar="NAME=VALUE",
                   help="a user property (repeatable)")
    p.add_argument("--count", type=int, default=1, help="send the message this many times")
    p.add_argument("--delay-level", type=int, help="deliver after level N's delay of the store's "
                   "message_delay_level (1 = 1s, ... 18 = 2h by default); stored meanwhile in "
                   "SCHEDULE_TOPIC_XXXX")
    p.add_argument("--deliver-at", help="deliver at this time: ISO 8601 (e.g. 2026-12-24T18:00:00Z; "
                   "local time unless it has a zone) or ms since the epoch; at most the store's "
                   "timer_max_delay_s ahead, a time already past at once")
    p.add_argument("--no-wait", action="store_true", help="do not wait for the flush (WAIT=false)")
    p.add_argument("--json", action="store_true")

    p = command("consume", "read messages of a topic as a consumer group", cmd_consume)
    p.add_argument("--topic", required=True)
    p.add_argument("--group", default=DEFAULT_GROUP,
                   help=f"consumer group: joins it and reads the queues it gives this member (default "
                   f"{DEFAULT_GROUP}, which reads every queue and joins nothing)")
    p.add_argument("--queue-id", type=int, help="only this queue (joins nothing)")
    p.add_argument("--offset", type=int, help="start offset (with --queue-id; default: committed)")
    p.add_argument("--since", help="start at the first message stored at or after this time (ISO "
                   "8601, local time unless it has a zone, e.g. 2026-12-01T10:00Z; or ms since the epoch)")
    p.add_argument("--max", type=int, dest="max_messages", help="stop after this many messages")
    p.add_argument("--tags", help="only messages with these tags: 'A || B' (RocketMQ's syntax; '*' all)")
    p.add_argument("--where", help="only messages whose properties match this SQL92 filter, "
                   "e.g. \"region = 'eu' AND amount > 100\"")
    p.add_argument("--follow", "-f", action="store_true", help="keep waiting for new messages")
    p.add_argument("--timeout-ms", type=int, default=1000, help="long-poll wait (default 1000)")
    p.add_argument("--no-commit", action="store_true", help="do not commit the group's offsets")
    p.add_argument("--json", action="store_true", help="one JSON object per line")

    p = command("query", "find messages by key (and time range), msgId or commit position",
                cmd_query)
    p.add_argument("--topic", help="topic (with --key)")
    p.add_argument("--key", help="a KEYS token or UNIQ_KEY")
    p.add_argument("--begin", help="with --key: earliest store time (ms since epoch or ISO 8601)")
    p.add_argument("--end", help="with --key: latest store time (ms since epoch or ISO 8601)")
    p.add_argument("--max", type=int, default=64, dest="max_messages")
    p.add_argument("--msg-id", help="RocketMQ offset msgId (32 hex)")
    p.add_argument("--commit-pos", type=int, help="commit position of a record")
    p.add_argument("--json", action="store_true")


# ---------------------------------------------------------------------------------- send
def _read_body(args: argparse.Namespace) -> bytes:
    if args.body is not None:
        return args.body.encode("utf-8", "surrogateescape")
    if args.body_file is not None:
        if args.body_file == "-":
            return sys.stdin.buffer.read()
        try:
            return Path(args.body_file).read_bytes()
        except OSError as exc:
            raise BadInputError("body-file", exc.strerror or str(exc), path=args.body_file) from None
    if not sys.stdin.isatty():
        return sys.stdin.buffer.read()
    raise BadInputError("body", "give --body, --body-file or pipe the body on stdin")


def _properties(pairs: list[str]) -> dict[str, str]:
    props = {}
    for pair in pairs:
        name, sep, value = pair.partition("=")
        if not sep or not name:
            raise BadInputError("property", f"{pair!r} is not NAME=VALUE")
        props[name] = value
    return props


def cmd_send(args: argparse.Namespace) -> int:
    from ipc.producer import Producer

    body = _read_body(args)
    props = _properties(args.property)
    deliver_at_ms = None if args.deliver_at is None else parse_time_ms(args.deliver_at, "deliver-at")
    if args.count < 1:
        raise BadInputError("count", f"{args.count} must be >= 1")
    tally = _SendTally(args)
    with Producer(args.store) as producer, _InterruptBetweenChunks() as interrupt:
        queue_ids = _queue_ids(args.queue_id, args.count, producer.write_queue_count(args.topic))
        for first in range(0, args.count, SEND_CHUNK):
            if interrupt.asked:
                tally.interrupted()
                return CliExit.INTERRUPTED
            chunk = queue_ids[first:first + SEND_CHUNK]
            tally.report(producer.send_batch([_message(args, body, props, q, deliver_at_ms) for q in chunk]))
    return tally.worst


class _InterruptBetweenChunks:
    """The first Ctrl-C stops the send after the chunk in flight is answered (so every stored
    message is listed and none is in doubt); a second one interrupts at once."""

    def __init__(self):
        self.asked = False
        self._previous = None

    def _on_sigint(self, signum, frame) -> None:
        if self.asked:
            raise KeyboardInterrupt
        self.asked = True

    def __enter__(self) -> _InterruptBetweenChunks:
        self._previous = signal.signal(signal.SIGINT, self._on_sigint)
        return self

    def __exit__(self, *exc_info) -> None:
        signal.signal(signal.SIGINT, self._previous)


def _message(args: argparse.Namespace, body: bytes, props: dict[str, str], queue_id: int,
             deliver_at_ms: int | None):
    from engine.message import Message

    return Message(args.topic, body, tags=args.tags, keys=tuple(args.keys), queue_id=queue_id,
                   properties=props, wait=not args.no_wait, delay_level=args.delay_level,
                   deliver_at_ms=deliver_at_ms)


def _queue_ids(queue_id: int | None, count: int, queue_count: int) -> list[int]:
    """--queue-id for every copy, or round robin from a random first queue (as RocketMQ's
    producer starts its index), so one-message sends spread over the queues too."""
    if queue_id is not None:
        return [queue_id] * count
    first = random.randrange(queue_count)
    return [(first + i) % queue_count for i in range(count)]


class _SendTally:
    """Prints each answer as its chunk returns, so an interrupted send says what was stored."""

    def __init__(self, args: argparse.Namespace):
        self.args = args
        self.answered = 0
        self.stored = 0
        self.worst = CliExit.OK

    def report(self, results: list) -> None:
        args = self.args
        for result in results:
            if args.json:
                print(json.dumps({"status": result.status.name, "msg_id": result.msg_id,
                                  "commit_pos": result.commit_pos, "queue_id": result.queue_id,
                                  "queue_offset": result.queue_offset,
                                  "store_ts_ms": result.store_ts_ms, "reason": result.reason}))
            elif result.status.is_stored:
                print(f"{result.status.name} msgId={result.msg_id} commit_pos={result.commit_pos} "
                      f"queue={args.topic}/{result.queue_id} offset={result.queue_offset}")
            code = _send_exit(result.status)
            if code is not CliExit.OK and not args.json:
                print(f"mqstore: error: {result.status.name}: {result.reason}", file=sys.stderr)
            if self.worst is CliExit.OK:
                self.worst = code
            self.stored += result.status.is_stored
        self.answered += len(results)
        sys.stdout.flush()

    def interrupted(self) -> None:
        print(f"mqstore: interrupted: {self.stored} of {self.args.count} message(s) stored "
              f"(listed above); the other {self.args.count - self.answered} were not sent",
              file=sys.stderr, flush=True)


def _send_exit(status: PutStatus) -> CliExit:
    if status is PutStatus.PUT_OK:
        return CliExit.OK
    if status in (PutStatus.MESSAGE_ILLEGAL, PutStatus.PROPERTIES_SIZE_EXCEEDED):
        return CliExit.BAD_INPUT
    if status is PutStatus.SERVICE_NOT_AVAILABLE:
        return CliExit.NOT_RUNNING
    return CliExit.FAILED


# ---------------------------------------------------------------------------------- output
def record_dict(record: Record) -> dict:
    data = {"topic": record.topic, "queue_id": record.queue_id, "queue_offset": record.queue_offset,
            "commit_pos": record.commit_pos, "msg_id": record.msg_id,
            "store_ts_ms": record.store_ts_ms, "born_ts_ms": record.born_ts_ms,
            "tags": record.tags, "keys": list(record.keys), "uniq_key": record.uniq_key,
            "properties": record.properties}
    try:
        data["body"] = record.body.decode("utf-8")
    except UnicodeDecodeError:
        data["body_base64"] = base64.b64encode(record.body).decode()
    return data


def record_line(record: Record) -> str:
    try:
        body = record.body.decode("utf-8")
    except UnicodeDecodeError:
        body = repr(record.body)
    if len(body) > 200:
        body = body[:200] + f"... ({len(record.body)} bytes)"
    extra = f" tags={record.tags}" if record.tags else ""
    extra += f" keys={','.join(record.keys)}" if record.keys else ""
    return (f"{record.topic}/{record.queue_id}@{record.queue_offset} msgId={record.msg_id}"
            f"{extra} body={body}")


def _print_record(record: Record, as_json: bool) -> None:
    print(json.dumps(record_dict(record)) if as_json else record_line(record), flush=True)


# ---------------------------------------------------------------------------------- consume
def cmd_consume(args: argparse.Namespace) -> int:
    from engine.filters.subscription import subscription_of
    from ipc.consumer import Consumer

    subscription_of(args.tags, args.where)  # a bad expression is refused before attaching
    if args.offset is not None and args.queue_id is None:
        raise BadInputError("offset", "needs --queue-id")
    if args.offset is not None and args.since is not None:
        raise BadInputError("since", "give --offset or --since, not both")
    if args.max_messages is not None and args.max_messages < 1:
        raise BadInputError("max", f"{args.max_messages} must be >= 1")
    since_ms = None if args.since is None else parse_time_ms(args.since, "since")
    with Consumer(args.store, args.group) as consumer:
        if not _wait_for_topic(consumer, args.topic, args.follow):
            return CliExit.FAILED
        if since_ms is not None:
            moved = consumer.seek_to_time(args.topic, since_ms)
            if args.queue_id is not None:
                args.offset = moved[args.queue_id]
        if args.queue_id is not None:
            return _consume_queue(args, consumer)
        if args.group == DEFAULT_GROUP:
            return _consume_every_queue(args, consumer)
        return _consume_as_member(args, consumer)


def _consume_queue(args: argparse.Namespace, consumer) -> int:
    """One queue by id, as the assign API reads it: no group membership."""
    from engine.status import GetStatus

    printed, offset, skipped = 0, args.offset, []
    while args.max_messages is None or printed < args.max_messages:
        want = 32 if args.max_messages is None else min(32, args.max_messages - printed)
        result = consumer.pull(args.topic, args.queue_id, offset, want, timeout_ms=args.timeout_ms,
                               tags=args.tags, where=args.where)
        skipped.extend(result.skipped)
        for record in result.messages:
            _print_record(record, args.json)
            printed += 1
        if result.status in (GetStatus.FOUND, GetStatus.OFFSET_TOO_SMALL,
                             GetStatus.OFFSET_OVERFLOW_BADLY, GetStatus.NO_MATCHED_MESSAGE):
            offset = result.next_offset
            if not args.no_commit:
                consumer.commit(args.topic, args.queue_id, offset)
        elif not args.follow:
            break
    return _summary(printed, skipped, args.json)


def _consume_every_queue(args: argparse.Namespace, consumer) -> int:
    """Every queue of the topic, joining nothing (the CLI's own group)."""
    return _print_iteration(args, consumer, range(consumer.read_queue_count(args.topic)))


def _consume_as_member(args: argparse.Namespace, consumer) -> int:
    """The queues the group gives this member, handed over as members come and go."""
    return _print_iteration(args, consumer, None)


def _print_iteration(args: argparse.Namespace, consumer, queue_ids) -> int:
    """Print what `iterate` hands out; commit every COMMIT_EVERY_S and at the end what was
    printed (a --max stop inside a batch included), never a queue this member let go."""
    from engine.errors import QueueNotOwnedError

    printed = 0
    skipped: list = []  # corrupt records passed over, each logged at WARNING on stderr
    last_printed: dict[int, int] = {}
    records = consumer.iterate(args.topic, tags=args.tags, where=args.where, queue_ids=queue_ids,
                               follow=args.follow,
                               poll_timeout_ms=args.timeout_ms, auto_commit=not args.no_commit,
                               on_skipped=skipped.append, commit_interval_ms=int(COMMIT_EVERY_S * 1000))
    try:
        for record in records:
            _print_record(record, args.json)
            printed += 1
            last_printed[record.queue_id] = record.queue_offset + 1
            if args.max_messages is not None and printed >= args.max_messages:
                break
    finally:
        records.close()  # writes the marks of whole batches
        if not args.no_commit:
            for queue_id, offset in last_printed.items():
                try:
                    if (consumer.committed(args.topic, queue_id) or 0) < offset:
                        consumer.commit(args.topic, queue_id, offset)
                except QueueNotOwnedError:
                    pass  # let go already, after committing it
    return _summary(printed, skipped, args.json)


def _wait_for_topic(consumer, topic: str, follow: bool) -> bool:
    """Whether `topic` exists; without --follow a missing one is an error on stderr, with it a
    notice and a wait until it is created (workers often start before their producers)."""
    if consumer.topic_exists(topic):
        return True
    if not follow:
        print(f"mqstore: error: no topic {topic} in this store (`mqstore topics` lists them; "
              "--follow waits for it)", file=sys.stderr)
        return False
    print(f"mqstore: no topic {topic} yet; waiting for it to be created", file=sys.stderr, flush=True)
    while not consumer.topic_exists(topic):
        time.sleep(TOPIC_POLL_S)
    return True


def _summary(printed: int, skipped: list, as_json: bool) -> CliExit:
    """The closing count on stderr; exit 1 (FAILED) when a corrupt record was passed over,
    after everything readable was printed, so a script notices the loss."""
    if not as_json:
        extra = f", {len(skipped)} corrupt record(s) skipped" if skipped else ""
        print(f"{printed} message(s){extra}", file=sys.stderr)
    return CliExit.FAILED if skipped else CliExit.OK


# ---------------------------------------------------------------------------------- query
def parse_time_ms(text: str, field: str) -> int:
    """Milliseconds since the epoch, or an ISO 8601 date/time (local time unless it has a zone)."""
    if text.isdigit():
        return int(text)
    try:
        return int(datetime.fromisoformat(text).timestamp() * 1000)
    except ValueError:
        raise BadInputError(field, f"{text!r} is neither ms since the epoch nor ISO 8601") from None


def cmd_query(args: argparse.Namespace) -> int:
    chosen = [name for name, value in (("--key", args.key), ("--msg-id", args.msg_id),
                                        ("--commit-pos", args.commit_pos)) if value is not None]
    if len(chosen) != 1:
        raise BadInputError("query", "give exactly one of --key (with --topic), --msg-id, --commit-pos")
    with ReadView(Path(args.store)) as view:
        if args.key is not None:
            if not args.topic:
                raise BadInputError("topic", "--key needs --topic")
            begin = parse_time_ms(args.begin, "begin") if args.begin else 0
            end = parse_time_ms(args.end, "end") if args.end else 2**63 - 1
            records, skipped = view.by_key(args.topic, args.key, begin, end, args.max_messages)
        else:
            pos = args.commit_pos if args.commit_pos is not None else parse_msg_id(args.msg_id)[1]
            records, skipped = [view.at(pos)], []
    for record in records:
        _print_record(record, args.json)
    code = _summary(len(records), skipped, args.json)
    return code if records else CliExit.FAILED
