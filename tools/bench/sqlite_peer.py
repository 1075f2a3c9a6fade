"""The SQLite peer for `mqstore bench --peer sqlite`: what a Python user reaches for first.

The standard library's sqlite3 on one database file in a fresh temp directory (removed after
the run), in WAL mode, `synchronous=FULL` for --flush sync (every COMMIT fsyncs the WAL) and
`NORMAL` for async (the WAL is fsynced at checkpoints only). One table
`messages(id INTEGER PRIMARY KEY, topic, queue_id, key, body)` with an index on key and one on
(topic, queue_id), which the consumers' per-queue reads need, so both are there in every run.

A producer inserts each batch in one `BEGIN IMMEDIATE ... COMMIT` (one row per transaction at
batch 1); waiting for the write lock is SQLite's busy handler (busy_timeout), and a BEGIN that
still finds the database busy is retried and counted. A consumer polls each of its (topic,
queue) pairs for rows past the last rowid it read, and sleeps POLL_INTERVAL_S when none has any
(SQLite has no way to wait for a row).
"""

from __future__ import annotations

import shutil
import sqlite3
import tempfile
import time
from pathlib import Path

from tools.bench.bench_body import intended_times
from tools.bench.peers import PeerUnavailableError
from tools.bench.worker_records import Pending, Received, SendBatch, WorkerSpec

SYNCHRONOUS = {"sync": "FULL", "async": "NORMAL"}
BUSY_TIMEOUT_MS = 5000  # the sqlite3 module's own default (timeout=5.0)
MAX_BUSY_RETRIES = 10  # BEGINs that found the database busy after busy_timeout, per batch
POLL_INTERVAL_S = 0.001
DATABASE_NAME = "bench.db"
MIN_SQLITE_VERSION = (3, 7, 0)  # WAL
SCHEMA = (
    "CREATE TABLE messages (id INTEGER PRIMARY KEY, topic TEXT NOT NULL, queue_id INTEGER NOT NULL, "
    "key TEXT, body BLOB NOT NULL)",
    "CREATE INDEX messages_key ON messages (key)",
    "CREATE INDEX messages_queue ON messages (topic, queue_id)",
)
INSERT = "INSERT INTO messages (topic, queue_id, key, body) VALUES (?, ?, ?, ?)"
# rowids grow in commit order (one writer at a time), so no row can appear below `id > ?` later
SELECT_AFTER = ("SELECT id, body FROM messages WHERE topic = ? AND queue_id = ? AND id > ? "
                "ORDER BY id LIMIT ?")


def require_sqlite() -> None:
    """Raise PeerUnavailableError if the linked SQLite library has no WAL."""
    if sqlite3.sqlite_version_info < MIN_SQLITE_VERSION:
        raise PeerUnavailableError(f"--peer sqlite needs SQLite >= 3.7 (WAL); this Python links "
                                   f"{sqlite3.sqlite_version}")


def connect(path: str, flush: str) -> sqlite3.Connection:
    """A connection with the peer's durability settings (synchronous is per connection)."""
    db = sqlite3.connect(path, isolation_level=None, timeout=BUSY_TIMEOUT_MS / 1000)
    db.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
    db.execute(f"PRAGMA synchronous = {SYNCHRONOUS[flush]}")
    mode = db.execute("PRAGMA journal_mode").fetchone()[0]
    if mode != "wal":  # set once by SqliteDatabase; persistent in the file
        db.close()
        raise PeerUnavailableError(f"{path}: journal_mode is {mode}, not wal")
    return db


class SqliteDatabase:
    """The run's database in a fresh temp directory; use as a context manager."""

    pid = None  # no server: the workers do all the work, and the sampler reports their CPU

    def __init__(self, flush: str, *, workdir: str | None = None):
        require_sqlite()
        self.flush = flush
        self.directory = Path(tempfile.mkdtemp(prefix="mqstore-bench-sqlite-", dir=workdir))
        self.path = self.directory / DATABASE_NAME

    @property
    def target(self) -> str:
        return str(self.path)

    @property
    def setting(self) -> str:
        return f"WAL, synchronous {SYNCHRONOUS[self.flush]}"

    @property
    def started_line(self) -> str:
        return f"created sqlite database {self.path} (SQLite {sqlite3.sqlite_version}, {self.setting})"

    def create(self) -> SqliteDatabase:
        db = sqlite3.connect(self.path, isolation_level=None)
        try:
            db.execute("PRAGMA journal_mode = WAL")
            for statement in SCHEMA:
                db.execute(statement)
        finally:
            db.close()
        return self

    def remove(self) -> None:
        shutil.rmtree(self.directory, ignore_errors=True)

    def __enter__(self) -> SqliteDatabase:
        try:
            return self.create()
        except BaseException:
            self.remove()
            raise

    def __exit__(self, *exc_info) -> None:
        self.remove()


class SqliteSender:
    """One transaction per batch. Synchronous: the COMMIT's return is the acknowledgement."""

    def __init__(self, spec: WorkerSpec):
        self.db = connect(spec.target, spec.flush)
        self.busy_retries = 0

    def submit(self, batch: SendBatch) -> Pending:
        pending = Pending(len(batch.bodies))
        rows = [(topic, queue_id, key, body) for (topic, queue_id), key, body
                in zip(batch.streams, batch.keys, batch.bodies, strict=True)]
        try:
            self._insert(rows)
            pending.statuses = {"OK": len(rows)}
        except sqlite3.Error as exc:  # the transaction rolled back: every row of it failed
            pending.statuses = {_status_name(exc): len(rows)}
        pending.stamp()
        return pending

    def _insert(self, rows: list[tuple]) -> None:
        self._begin_immediate()
        try:
            self.db.executemany(INSERT, rows)
            self.db.execute("COMMIT")
        except BaseException:
            if self.db.in_transaction:
                self.db.execute("ROLLBACK")
            raise

    def _begin_immediate(self) -> None:
        """Take the write lock; a BEGIN still busy after busy_timeout is retried (and counted)."""
        for _ in range(MAX_BUSY_RETRIES):
            try:
                self.db.execute("BEGIN IMMEDIATE")
                return
            except sqlite3.OperationalError as exc:
                if getattr(exc, "sqlite_errorcode", None) != sqlite3.SQLITE_BUSY:
                    raise
                self.busy_retries += 1
        self.db.execute("BEGIN IMMEDIATE")  # the last try: busy again raises to the caller

    def result(self, pending: Pending) -> dict[str, int]:
        return dict(pending.statuses)

    def counters(self) -> dict[str, int]:
        """Figures for the worker's done event."""
        return {"busy_retries": self.busy_retries}

    def close(self) -> None:
        self.db.close()


def _status_name(exc: sqlite3.Error) -> str:
    name = getattr(exc, "sqlite_errorname", None)  # e.g. SQLITE_BUSY, SQLITE_FULL
    return name or type(exc).__name__


class SqliteReceiver:
    """Reads each of its (topic, queue_id) pairs past the last rowid it read, in rowid order."""

    def __init__(self, spec: WorkerSpec):
        self.db = connect(spec.target, spec.flush)
        self.pull_count = spec.pull_count
        self.last_ids = {stream: 0 for stream in spec.streams}
        self.backlog_at_start_msgs = 0  # what its queues held that it reads first (--consume-from start)
        for topic, queue_id in spec.streams:
            count, last_id = self.db.execute(
                "SELECT count(*), coalesce(max(id), 0) FROM messages WHERE topic = ? AND queue_id = ?",
                (topic, queue_id)).fetchone()
            if spec.consume_from == "start":
                self.backlog_at_start_msgs += count
            else:
                self.last_ids[(topic, queue_id)] = last_id

    def poll(self, timeout_s: float) -> Received:
        """What its queues have past what it read; with nothing there, polls again every
        POLL_INTERVAL_S until timeout_s has passed."""
        deadline = time.monotonic() + timeout_s
        while True:
            bodies = self._sweep()
            if bodies or time.monotonic() >= deadline:
                return Received(len(bodies), intended_times(bodies))
            time.sleep(POLL_INTERVAL_S)

    def _sweep(self) -> list[bytes]:
        bodies: list[bytes] = []
        for (topic, queue_id), last_id in self.last_ids.items():
            rows = self.db.execute(SELECT_AFTER, (topic, queue_id, last_id, self.pull_count)).fetchall()
            if rows:
                self.last_ids[(topic, queue_id)] = rows[-1][0]
                bodies.extend(body for _, body in rows)
        return bodies

    def close(self) -> None:
        self.db.close()
