"""`mqstore topic create|update|delete`: a topic's queues and permission in config/topics.json.

With a supervisor running, the change goes to it (ipc.topic_requests) and applies between two
of its sweeps, so producers and the dispatcher follow without a restart. With none, the command
takes the store lock and applies it in-process (MessageStore.change_topic, recovery first as for
any writer). A delete removes the topic's consume queues and every group's offsets of it; its
records stay in the commitlog until retention, below a tombstone no dispatch reads again.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from engine.config import StoreConfig, load_config_file
from engine.errors import BadInputError, NotAStoreError, ServiceNotAvailableError, StoreError
from engine.files.naming import ABORT_FILE
from engine.files.store_dir import StoreKind, holder_pid, inspect_store_dir, refuse_foreign_store
from engine.topics.table import TopicChange, TopicOp, parse_perm
from workers.exit_codes import CliExit

DEFAULT_TIMEOUT_S = 30.0


def add_parsers(command) -> None:
    p = command("topic", "create, update or delete a topic: its queue count and permission "
                "(through the running supervisor, or offline under the store lock)", cmd_topic)
    p.add_argument("action", choices=[op.value for op in TopicOp])
    p.add_argument("--topic", required=True)
    p.add_argument("--queues", type=int, help="create (required), update: read and write queues, "
                   "1..1024")
    p.add_argument("--perm", help="create, update: rw (a create's default), r (no sends) or w (no "
                   "reads); an update keeps what it is not given")
    p.add_argument("--config", help="TOML file with [store] settings (offline only)")
    p.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT_S,
                   help=f"seconds to wait for a running store (default {DEFAULT_TIMEOUT_S:g})")
    p.add_argument("--json", action="store_true")


def cmd_topic(args: argparse.Namespace) -> int:
    change = _change(args)
    root = Path(args.store)
    reset_by_supervisor: list[str] = []
    if holder_pid(root) is not None:
        said, reset_by_supervisor = change_running(root, change, args.timeout)
    else:
        said = change_offline(root, change, load_config_file(args.config) if args.config else StoreConfig())
    groups = sorted({*reset_by_supervisor, *_forget_offsets(root, change)})
    report = {"topic": change.topic, "action": change.op.value, "result": said, "groups_reset": groups}
    if args.json:
        print(json.dumps(report))
    else:
        extra = f"; offsets of group(s) {', '.join(groups)} removed" if groups else ""
        print(f"topic {change.topic}: {change.op.value}d: {said}{extra}")
    return CliExit.OK


def _change(args: argparse.Namespace) -> TopicChange:
    """The change asked for; BadInputError for arguments that do not fit the action."""
    op = TopicOp(args.action)
    if op is TopicOp.DELETE:
        if args.queues is not None:
            raise BadInputError("queues", "a delete takes no --queues")
        return TopicChange(op, args.topic)
    if op is TopicOp.CREATE and args.queues is None:
        raise BadInputError("queues", "`topic create` needs --queues N")
    if op is TopicOp.UPDATE and args.queues is None and args.perm is None:
        raise BadInputError("topic update", "give --queues N, --perm, or both")
    return TopicChange(op, args.topic, args.queues, None if args.perm is None else parse_perm(args.perm))


def change_running(root: Path, change: TopicChange, timeout_s: float) -> tuple[str, list[str]]:
    """Hand the change to the running supervisor and wait for its answer: what it did, and the
    groups whose offsets of a deleted topic it removed (as part of the delete)."""
    from ipc.control_block import ControlBlock
    from ipc.topic_requests import post_request, wait_for_answer

    if not timeout_s > 0:
        raise BadInputError("--timeout", f"must be a positive number of seconds, not {timeout_s:g}")
    with ControlBlock.attach(root) as ctl:
        if not ctl.is_ready():
            raise ServiceNotAvailableError(f"the store is {ctl.store_state.name}, not READY",
                                           path=str(root), hint="retry once it is running")
        answer = wait_for_answer(post_request(root, change.as_dict()), timeout_s, ctl.supervisor_alive)
    if "error" in answer:
        raise BadInputError("topic", answer["error"])  # the supervisor's words; nothing changed
    return answer["ok"], list(answer.get("groups_reset", []))


def change_offline(root: Path, change: TopicChange, config: StoreConfig) -> str:
    """The change in this process, under the store lock (refused for a store left unclean)."""
    from engine.store import MessageStore
    from engine.topics.live import describe

    kind = inspect_store_dir(root)
    if kind is StoreKind.NEW:
        raise NotAStoreError("no store here", path=str(root), hint="start it once to create it")
    if kind is StoreKind.ROCKETMQ:
        refuse_foreign_store(root, "topic changes are written by mqstore only")
    if (root / ABORT_FILE).exists():
        raise StoreError("the store did not stop cleanly", path=str(root),
                         hint="run `mqstore recover` (or start it) first")
    with MessageStore.open(root, config) as store:
        table = store.change_topic(change)
    return describe(table, change.topic)


def _forget_offsets(root: Path, change: TopicChange) -> list[str]:
    """A deleted topic's offsets go with it (every group); the groups that had any. The running
    supervisor removed them already; this covers an offline delete and a file it could not read."""
    from ipc.consumer_offsets import ConsumerOffsets

    if change.op is not TopicOp.DELETE:
        return []
    return ConsumerOffsets(root).forget_topic(change.topic)
