"""The `mqstore` command line: thin commands over engine, ipc and workers.

    mqstore start [--store DIR] [--config FILE.toml] [--index-shards N] [--flush sync|async] [--detach]
    mqstore stop | status [--json] [--watch] | send | consume [--follow] | query | clean | check | recover
    mqstore topics | groups | lag [--group G] | exporter [--listen HOST:PORT]   (tools.ops_commands)
    mqstore bench | torture | spark      (delegated to tools.bench, tools.torture, tools.spark)

Every command takes --store (default ./data) and --log-level. Errors are one line on stderr (no
traceback) with the exit codes listed in `mqstore --help`. Logs go to stderr and to
<store>/mqstore.log.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from engine.errors import (
    BadInputError,
    FormatVersionError,
    NotAStoreError,
    ReadOnlyStoreError,
    ServiceNotAvailableError,
    StoreError,
    StoreLockedError,
    StorePermissionError,
)
from engine.files.owners import refuse_unsafe_parents
from tools import client_commands, ops_commands, retention_commands, topic_commands
from tools.logging_setup import hold_records, open_store_log, setup_logging
from tools.typo_hints import HintingParser
from workers.child_env import child_env
from workers.exit_codes import CliExit, cli_epilog
from workers.fatal_log import last_error, log_fatal_signals
from workers.log_level import LOG_LEVEL_ENV, LOG_LEVEL_NAMES

DEFAULT_STORE = "data"
DETACH_TIMEOUT_S = 300.0
STOP_TIMEOUT_S = 120.0

log = logging.getLogger("mqstore")


class CliError(Exception):
    """A one-line error with its exit code."""

    def __init__(self, message: str, code: CliExit = CliExit.FAILED):
        super().__init__(message)
        self.code = code


def exit_code_for(exc: BaseException) -> CliExit:
    if isinstance(exc, StoreLockedError):
        return CliExit.LOCKED
    if isinstance(exc, StorePermissionError):
        return CliExit.PERMISSION
    if isinstance(exc, ServiceNotAvailableError):
        return CliExit.NOT_RUNNING
    if isinstance(exc, BadInputError | NotAStoreError | FormatVersionError | ReadOnlyStoreError):
        return CliExit.BAD_INPUT
    return CliExit.FAILED


# ---------------------------------------------------------------------------------- config
def refuse_changes_to(root: Path, args: argparse.Namespace):
    """store.json of an existing store we may write, once no asked setting and no file
    contradicts it."""
    from engine.files.store_dir import read_meta, require_writable
    from engine.frozen_settings import refuse_changed_settings, refuse_inconsistent_meta
    from tools.start_settings import asked_store_settings

    require_writable(root)
    meta = read_meta(root)  # a newer format version is refused before anything is written
    refuse_changed_settings(meta, asked_store_settings(args), root)
    refuse_inconsistent_meta(root, meta)
    return meta


# ---------------------------------------------------------------------------------- start/stop
def cmd_start(args: argparse.Namespace) -> int:
    from engine.files.store_dir import StoreKind, create_store_dir, inspect_store_dir, refuse_foreign_store
    from tools.start_settings import asked_store_settings, fit_body_limit, load_settings
    from workers.supervisor import Supervisor

    os.umask(0o077)
    root = Path(args.store)
    config, settings = load_settings(args)
    refuse_unsafe_parents(root)
    if args.detach:
        return _start_detached(args, root)
    ready_fd = args.ready_fd  # the --ready-fd pipe while open: on_ready closes it
    try:
        setup_logging("supervisor", to_stderr=args.ready_fd is None)
        held = hold_records("supervisor")  # the store's log is not ours before its lock is
        kind = inspect_store_dir(root)
        if kind is StoreKind.NEW:
            config = fit_body_limit(config, config.commitlog_file_size, asked_store_settings(args))
            create_store_dir(root, config)
        elif kind is StoreKind.MQSTORE:
            meta = refuse_changes_to(root, args)
            config = fit_body_limit(config, meta.commitlog_file_size, asked_store_settings(args))
        else:  # a foreign store keeps every byte and every name
            refuse_foreign_store(root, "start would write it")

        def on_locked() -> None:  # the store is this supervisor's now, and so is its log
            open_store_log("supervisor", root, held)
            log_fatal_signals(root)

        def on_ready(sup: Supervisor) -> None:
            nonlocal ready_fd
            if ready_fd is not None:
                report = "".join(f"report {line}\n" for line in sup.open_lines)
                os.write(ready_fd, f"{report}ready {os.getpid()}\n".encode())
                os.close(ready_fd)
                ready_fd = None
            else:
                print(f"mqstore ready: store {root}, pid {os.getpid()} "
                      f"(Ctrl-C or `mqstore stop --store {root}` stops it)", flush=True)

        return Supervisor(root, config, settings, on_locked=on_locked, on_ready=on_ready).run()
    except Exception as exc:  # a StoreError, EMFILE, a bug: the log and `start --detach` name it
        message = str(exc) if isinstance(exc, StoreError) else f"{type(exc).__name__}: {exc}"
        log.error("supervisor failed: %s", message, exc_info=not isinstance(exc, StoreError))
        if ready_fd is not None:  # the error line `start --detach` waits for on its pipe
            os.write(ready_fd, f"error {int(exit_code_for(exc))} {message}\n".encode())
        raise


def _start_detached(args: argparse.Namespace, root: Path) -> int:
    """Run `mqstore start` in the background; return once it is ready, printing its pid."""
    read_fd, write_fd = os.pipe()
    argv = [sys.executable, "-m", "tools.cli", "start", "--store", str(root.resolve()),
            "--ready-fd", str(write_fd)]
    if args.config:
        argv += ["--config", str(Path(args.config).resolve())]
    if args.index_shards is not None:
        argv += ["--index-shards", str(args.index_shards)]
    if args.flush is not None:
        argv += ["--flush", args.flush]
    proc = subprocess.Popen(argv, pass_fds=(write_fd,), start_new_session=True, env=child_env(),
                            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    os.close(write_fd)
    chunks = []
    with os.fdopen(read_fd, "rb") as pipe:
        while chunk := pipe.read(4096):
            chunks.append(chunk)
    lines = b"".join(chunks).decode(errors="replace").splitlines()
    for report_line in (x for x in lines if x.startswith("report ")):
        print(report_line[len("report "):], file=sys.stderr)
    line = next((x for x in lines if not x.startswith("report ")), "")
    if line.startswith("ready"):
        print(line.split()[1])
        return CliExit.OK
    try:
        code = proc.wait(DETACH_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        raise CliError("the supervisor did not become ready") from None
    if line.startswith("error"):
        _, status, message = line.split(" ", 2)
        raise CliError(message, CliExit(int(status)))
    cause = last_error(root)
    raise CliError(f"the supervisor exited with code {code} before it was ready"
                   + (f": {cause}" if cause else "") + f"; see {root / 'mqstore.log'}")


def cmd_stop(args: argparse.Namespace) -> int:
    from engine.files.naming import ABORT_FILE
    from engine.files.store_dir import holder_pid, inspect_store_dir

    root = Path(args.store)
    inspect_store_dir(root)  # a file or a directory of other things is not a store to stop
    pid = holder_pid(root)
    if pid is None:
        raise CliError(f"no supervisor runs on {root}", CliExit.NOT_RUNNING)
    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + args.timeout
    while holder_pid(root) is not None:
        if time.monotonic() > deadline:
            raise CliError(f"supervisor {pid} did not stop within {args.timeout:g} s")
        time.sleep(0.05)
    if (root / ABORT_FILE).exists():
        print(f"stopped supervisor {pid}; the store was not fully caught up, so the next start "
              "runs recovery (see mqstore.log)")
    else:
        print(f"stopped supervisor {pid}")
    return CliExit.OK


def cmd_status(args: argparse.Namespace) -> int:
    from workers.status_report import collect_status, render_status

    if args.watch:
        return ops_commands.watch_status(args)
    status = collect_status(args.store)
    print(json.dumps(status, indent=2) if args.json else render_status(status))
    return CliExit.OK if status["running"] else CliExit.NOT_RUNNING


# ---------------------------------------------------------------------------------- offline
def cmd_check(args: argparse.Namespace) -> int:
    from engine.check.findings import findings_to_json
    from engine.check.fsck import check_summary

    progress = None if args.json else progress_printer("checked")
    summary = check_summary(Path(args.store), progress=progress)
    findings = list(summary.findings)
    def line(data: dict) -> str:
        return "  ".join(f"{k}={v}" for k, v in data.items() if v not in (None, ""))

    if args.json:
        print(json.dumps({"findings": findings_to_json(findings), "pending_records": summary.pending_records,
                          "pending": findings_to_json(list(summary.pending))}, indent=2))
    else:
        for data in findings_to_json(findings):
            print(line(data))
        if summary.pending_records:  # a crash's undispatched tail: the next start's work, not damage
            print(f"recovery pending: {summary.pending_records} records past the dispatched position; "
                  "a start re-dispatches them")
        print(f"{len(findings)} finding(s)" if findings else
              "no findings" if summary.pending_records else "store is consistent")
    for data in findings_to_json(list(summary.accepted)):  # known damage, kept on purpose: no finding
        print(line(data), file=sys.stderr)
    return CliExit.FAILED if findings else CliExit.OK


def cmd_recover(args: argparse.Namespace) -> int:
    from engine.files.store_dir import (
        StoreKind,
        config_for_store,
        inspect_store_dir,
        mark_clean_stop,
        refuse_foreign_store,
    )
    from engine.recovery.recover import RecoveryMode
    from engine.store_open import Dispatch, open_store
    from tools.start_settings import load_settings
    from workers.shared_state import cleanup_stale

    os.umask(0o077)
    root = Path(args.store)
    refuse_unsafe_parents(root)
    kind = inspect_store_dir(root)
    if kind is StoreKind.NEW:
        raise NotAStoreError("no store here: nothing to recover", path=str(root))
    if kind is StoreKind.ROCKETMQ:
        refuse_foreign_store(root, "recover never writes it")
    config, _ = load_settings(args)
    config = config_for_store(refuse_changes_to(root, args), config)
    # the store's own open sequence; a dead supervisor's shared memory goes with its recovery
    opened = open_store(root, config, writer="recover", dispatch=Dispatch.CHILD_PROCESSES,
                        recovery=RecoveryMode(args.mode),
                        progress=None if args.json else progress_printer("scanned"),
                        after_lock=lambda: cleanup_stale(root))
    try:
        opened.commitlog.close()
        mark_clean_stop(root)
    finally:
        opened.lock.release()
    report = opened.report
    print(json.dumps(report.to_dict(), indent=2) if args.json else "\n".join(report.summary_lines()))
    return CliExit.OK


def progress_printer(verb: str):
    """A progress callback (done, total bytes) printing to stderr at most once a second, and
    once at the end: stdout stays the command's result."""
    last_s = [0.0]

    def progress(done: int, total: int) -> None:
        if time.monotonic() - last_s[0] >= 1.0 or done >= total:
            last_s[0] = time.monotonic()
            print(f"  {verb} {done / 2**20:.1f} of {total / 2**20:.1f} MiB", file=sys.stderr, flush=True)

    return progress


# ---------------------------------------------------------------------------------- parser
def version_line() -> str:
    """`mqstore --version`: the installed package's version and the store format it writes."""
    from importlib.metadata import PackageNotFoundError, version

    from engine.formats.store_meta import FORMAT_VERSION

    try:
        package = version("mqstore")
    except PackageNotFoundError:  # run from a checkout that was never installed
        package = "(not installed)"
    return f"mqstore {package} (store format version {FORMAT_VERSION})"


def build_parser() -> argparse.ArgumentParser:
    parser = HintingParser(
        prog="mqstore", description="A durable message store for processes on one Linux host "
        "(Apache RocketMQ's storage design).", epilog=cli_epilog(),
        formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="version", version=version_line())
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def command(name: str, help_text: str, func) -> argparse.ArgumentParser:
        p = sub.add_parser(name, help=help_text, description=help_text, epilog=cli_epilog(),
                           formatter_class=argparse.RawDescriptionHelpFormatter)
        p.add_argument("--store", default=DEFAULT_STORE, help="store directory (default ./data)")
        p.add_argument("--log-level", type=str.upper, choices=LOG_LEVEL_NAMES,
                       help="log level of this command and, for start, of its children "
                       "(default INFO for start, WARNING otherwise)")
        p.set_defaults(func=func)
        return p

    p = command("start", "run the supervisor (foreground; Ctrl-C stops it)", cmd_start)
    p.add_argument("--config", help="TOML file: a [store] table of StoreConfig fields and an "
                   "optional [supervisor] table (restart_budget, restart_window_s, "
                   "restart_base_delay_s, restart_max_delay_s, restart_jitter, "
                   "restart_healthy_after_s, child_timeout_s, boot_timeout_s, catch_up_timeout_s, "
                   "child_stop_timeout_s, mailbox_slots)")
    p.add_argument("--index-shards", type=int, help="index shards of a new store (1..64)")
    p.add_argument("--flush", choices=("sync", "async"), help="flush policy (default sync)")
    p.add_argument("--detach", action="store_true", help="run in the background; print its pid once ready")
    p.add_argument("--ready-fd", type=int, help=argparse.SUPPRESS)

    p = command("stop", "stop the store's supervisor cleanly (SIGTERM) and wait for it", cmd_stop)
    p.add_argument("--timeout", type=float, default=STOP_TIMEOUT_S, help="seconds to wait")

    p = command("status", "processes, positions, lags and rates of a running store", cmd_status)
    p.add_argument("--json", action="store_true")
    p.add_argument("--watch", action="store_true", help="refresh every second until Ctrl-C "
                   "(with --json: one JSON object per line)")

    client_commands.add_parsers(command)
    retention_commands.add_parsers(command)
    ops_commands.add_parsers(command)
    topic_commands.add_parsers(command)

    p = command("check", "verify a store offline (engine.check.fsck); exit 1 on findings", cmd_check)
    p.add_argument("--json", action="store_true")

    p = command("recover", "run recovery offline and print the report (refused while running)",
                cmd_recover)
    p.add_argument("--config", help="TOML file with [store] settings")
    p.add_argument("--json", action="store_true")
    choice = p.add_mutually_exclusive_group()
    choice.add_argument("--rebuild", dest="mode", action="store_const", const="rebuild",
                        default="routine",
                        help="after a STORE_CORRUPT refusal: verify the whole log, cut it at the "
                        "first invalid record (everything from there goes to quarantine/), "
                        "rebuild consume queues and index from what is kept")
    choice.add_argument("--salvage", dest="mode", action="store_const", const="salvage",
                        help="after a STORE_CORRUPT refusal: keep every valid record in place, "
                        "accept each damaged span between them (copied to quarantine/, listed in "
                        "quarantine/accepted-damage.json; readers skip and report its record), "
                        "rebuild consume queues and index past them")

    for name, help_text in DELEGATED.items():
        sub.add_parser(name, help=help_text, add_help=False)
    return parser


# Commands with a package of their own, each exposing add_<name>_parser(subparsers) and
# run_<name>(args); imported only when that command runs, so a missing optional dependency
# (pyspark) breaks only its own command.
DELEGATED = {
    "bench": "load-test a store with producer and consumer processes (`mqstore bench --help`)",
    "torture": "kill rounds and fault injection against a ledger (`mqstore torture --help`)",
    "spark": "Spark jobs over store files (needs pyspark; `mqstore spark --help`)",
    "console": "serve a read-only web console of a store (`mqstore console --help`)",
}
DELEGATE_MODULES = {"bench": "tools.bench.cli", "torture": "tools.torture.cli", "spark": "tools.spark.cli",
                    "console": "tools.console.cli"}


def run_delegated(name: str, argv: list[str]) -> int:
    """Build the command's own parser from its package and run it."""
    import importlib

    try:
        module = importlib.import_module(DELEGATE_MODULES[name])
        add_parser = getattr(module, f"add_{name}_parser")
        run = getattr(module, f"run_{name}")
    except (ImportError, AttributeError) as exc:
        hint = " (install the [spark] extra)" if name == "spark" else ""
        raise CliError(f"`mqstore {name}` is unavailable: {exc}{hint}") from None
    parser = HintingParser(prog="mqstore", epilog=cli_epilog(),
                           formatter_class=argparse.RawDescriptionHelpFormatter)
    add_parser(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args([name, *argv])
    return int(run(args) or 0)


def permission_words(exc: PermissionError) -> str:
    """A refused file named with why: another user's store, or read-only for its owner."""
    from engine.files.owners import permission_hint

    if exc.filename is None:
        return f"{exc} ({permission_hint(Path.cwd())})"
    return f"{exc.strerror or 'permission denied'}: {exc.filename} ({permission_hint(exc.filename)})"


def take_log_level(argv: list[str]) -> list[str]:
    """A delegated command's argv without `--log-level LEVEL`, whose level goes to the
    environment (the delegated parsers do not know the option)."""
    rest, i = [], 0
    while i < len(argv):
        arg = argv[i]
        if arg == "--log-level" or arg.startswith("--log-level="):
            value = arg.partition("=")[2] if "=" in arg else (argv[i + 1] if i + 1 < len(argv) else "")
            i += 1 if "=" in arg else 2
            use_log_level(value)
            continue
        rest.append(arg)
        i += 1
    return rest


def use_log_level(name: str | None) -> None:
    """Put the asked level in the environment: this process's logging and its children read it."""
    if name is None:
        return
    if name.upper() not in LOG_LEVEL_NAMES:
        raise CliError(f"--log-level {name!r} is not one of {', '.join(LOG_LEVEL_NAMES)}",
                       CliExit.BAD_INPUT)
    os.environ[LOG_LEVEL_ENV] = name.upper()


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    try:
        if argv and argv[0] in DELEGATED:
            rest = take_log_level(argv[1:])
            setup_logging("cli", level=logging.WARNING)
            return run_delegated(argv[0], rest)
        args = build_parser().parse_args(argv)
        use_log_level(args.log_level)
        if args.command not in ("start",):
            setup_logging("cli", level=logging.WARNING)
        return int(args.func(args))
    except CliError as exc:
        print(f"mqstore: error: {exc}", file=sys.stderr)
        return int(exc.code)
    except StoreError as exc:
        print(f"mqstore: error: {exc}", file=sys.stderr)
        return int(exit_code_for(exc))
    except KeyboardInterrupt:
        return int(CliExit.INTERRUPTED)
    except BrokenPipeError:
        return int(CliExit.OK)
    except PermissionError as exc:
        print(f"mqstore: error: {permission_words(exc)}", file=sys.stderr)
        return int(CliExit.PERMISSION)
    except OSError as exc:
        print(f"mqstore: error: {exc}", file=sys.stderr)
        return int(CliExit.FAILED)


if __name__ == "__main__":
    sys.exit(main())
