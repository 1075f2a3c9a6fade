"""`mqstore clean`: one retention pass on demand.

With a supervisor running, the command asks it (the request word of the control block's
retention area, ipc/retention_block.py) and waits for the pass and for every child to clean up
to the new line. With none, it takes the store lock and runs the same pass in-process
(MessageStore.clean_expired, recovery first as for any writer), and runs passes (10 segments
each at most) until none leaves segments behind that may go. Either way it is a manual pass:
expired segments go at any hour, as RocketMQ's executeDeleteFilesManually; disk pressure still
deletes regardless of age. Offline, the retention settings come from --config (else defaults);
online, the running supervisor's settings apply.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from engine.config import StoreConfig, load_config_file
from engine.errors import BadInputError, NotAStoreError, ServiceNotAvailableError, StoreError
from engine.files.naming import ABORT_FILE
from engine.files.store_dir import StoreKind, holder_pid, inspect_store_dir, refuse_foreign_store
from workers.exit_codes import CliExit

DEFAULT_TIMEOUT_S = 30.0
POLL_S = 0.02


def add_parsers(command) -> None:
    p = command("clean", "run one retention pass now (through the running supervisor, or "
                "offline under the store lock)", cmd_clean)
    p.add_argument("--config", help="TOML file with [store] retention settings (offline only; "
                   "a running store uses its own)")
    p.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT_S,
                   help=f"seconds to wait for a running store's pass (default {DEFAULT_TIMEOUT_S:g})")
    p.add_argument("--json", action="store_true")


def cmd_clean(args: argparse.Namespace) -> int:
    if not args.timeout > 0:
        raise BadInputError("--timeout", f"must be a positive number of seconds, not {args.timeout:g}")
    root = Path(args.store)
    if holder_pid(root) is not None:
        report = clean_running(root, args.timeout)
    else:
        report = clean_offline(root, load_config_file(args.config) if args.config else StoreConfig())
    print(json.dumps(report, indent=2) if args.json else render_clean(report))
    return CliExit.OK


def clean_running(root: Path, timeout_s: float) -> dict:
    """Ask the running supervisor for a manual pass; wait for it and for the children."""
    from ipc.control_block import ControlBlock
    from ipc.retention_block import RetentionBlock

    with ControlBlock.attach(root) as ctl:
        if not ctl.is_ready():
            raise ServiceNotAvailableError(f"the store is {ctl.store_state.name}, not READY",
                                           path=str(root), hint="retry once it is running")
        block = RetentionBlock(ctl)
        before, cleans_before = block.line(), block.cleans()
        wanted = block.request_manual()
        deadline = time.monotonic() + timeout_s
        _wait(lambda: block.line().manual_done >= wanted, deadline, ctl, "the retention pass")
        line = block.line()
        _wait(lambda: all(c.clean_pos >= line.min_commit_pos for c in block.cleans().values()),
              deadline, ctl, "the dispatcher and index builders to clean up to the line")
        cleans = block.cleans()

    def removed(prefix: str) -> int:
        return sum(c.files_removed - cleans_before[k].files_removed
                   for k, c in cleans.items() if k.startswith(prefix))

    return {"mode": "running", "reason": line.last_reason.value,
            "segments_removed": line.segments_removed - before.segments_removed,
            "bytes_removed": line.bytes_removed - before.bytes_removed,
            "cq_files_removed": removed("consumequeue"), "index_files_removed": removed("index/"),
            "min_commit_pos": line.min_commit_pos}


def _wait(done, deadline: float, ctl, what: str) -> None:
    while not done():
        if not ctl.supervisor_alive():
            raise ServiceNotAvailableError(f"the supervisor exited while waiting for {what}")
        if time.monotonic() > deadline:
            raise StoreError(f"timed out waiting for {what}", hint="see mqstore.log; raise --timeout")
        time.sleep(POLL_S)


def clean_offline(root: Path, config: StoreConfig) -> dict:
    """The pass in this process, under the store lock (refused for a store left unclean)."""
    from engine.retention.expiry import PassKind
    from engine.store import MessageStore

    kind = inspect_store_dir(root)
    if kind is StoreKind.NEW:
        raise NotAStoreError("no store here: nothing to clean", path=str(root))
    if kind is StoreKind.ROCKETMQ:
        refuse_foreign_store(root, "clean never deletes from it")
    if (root / ABORT_FILE).exists():
        raise StoreError("the store did not stop cleanly", path=str(root),
                         hint="run `mqstore recover` (or start it) first")
    with MessageStore.open(root, config) as store:
        reports = [store.clean_expired(kind=PassKind.MANUAL)]
        while reports[-1].more_due:  # a full batch left segments that may go: the next pass at once
            reports.append(store.clean_expired(kind=PassKind.MANUAL))
        segment_bytes = store.commitlog.segment_bytes
    segments_removed = sum(len(r.segments_removed) for r in reports)
    return {"mode": "offline", "reason": reports[0].reason.value, "passes": len(reports),
            "segments_removed": segments_removed, "bytes_removed": segments_removed * segment_bytes,
            "cq_files_removed": sum(r.cq_files_removed for r in reports),
            "index_files_removed": sum(r.index_files_removed for r in reports),
            "min_commit_pos": reports[-1].min_commit_pos}


def render_clean(report: dict) -> str:
    return (f"retention pass ({report['mode']}, {report['reason']}): removed "
            f"{report['segments_removed']} commitlog segment(s) ({report['bytes_removed']} B), "
            f"{report['cq_files_removed']} consume-queue file(s), {report['index_files_removed']} "
            f"index file(s); the store now starts at commit_pos {report['min_commit_pos']}")
