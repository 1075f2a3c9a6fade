"""The results of a batch of puts as numpy columns; a PutResult is built only when asked for.

The supervisor answers each request with one mailbox result row per record (mailbox.RESULT_DTYPE:
status, queue_id, commit_pos, queue_offset, store_ts_ms). A `BatchResult` keeps those rows for
a whole batch, so a producer sending thousands of messages per second makes no Python object
per message: `status_counts()` and the column properties are numpy work, and
`result[i]` / iteration / `msg_ids()` build PutResults and msgId strings on demand.
`BatchResultBuilder` collects the rows of the requests a batch was split into.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Sequence

import numpy as np

from engine.refusal import Refusal, describe_refusal
from engine.status import PUT_OK_CODE, PutResult, PutStatus
from engine.tuning import BATCH_RESULT_FEW_ROWS
from ipc.mailbox import REFUSAL_DTYPE, RESULT_DTYPE

_STATUSES = tuple(PutStatus)
assert [int(s) for s in _STATUSES] == list(range(len(_STATUSES)))
_STORED = np.array([status.is_stored for status in _STATUSES])
_DEFAULT_REASONS = {PutStatus.SERVICE_NOT_AVAILABLE: "the store is stopping",
                    PutStatus.DISK_FULL: "the disk is full"}


class BatchResult(Sequence[PutResult]):
    """One result per message of a batch, in send order. The position columns (`commit_pos`,
    `queue_offset`, `store_ts_ms`) hold meaning only where `stored` is True."""

    __slots__ = ("_msg_id_prefix", "_reasons", "rows")

    def __init__(self, rows: np.ndarray, reasons: dict[int, str], msg_id_prefix: str):
        self.rows = rows  # RESULT_DTYPE, one per message
        self._reasons = reasons  # why, for messages that got a status without a supervisor row
        self._msg_id_prefix = msg_id_prefix  # make_msg_id(store_host, 0) less its 16 position digits

    @property
    def status(self) -> np.ndarray:
        """PutStatus values (int32)."""
        return self.rows["status"]

    @property
    def queue_id(self) -> np.ndarray:
        return self.rows["queue_id"]

    @property
    def commit_pos(self) -> np.ndarray:
        return self.rows["commit_pos"]

    @property
    def queue_offset(self) -> np.ndarray:
        return self.rows["queue_offset"]

    @property
    def store_ts_ms(self) -> np.ndarray:
        return self.rows["store_ts_ms"]

    @property
    def stored(self) -> np.ndarray:
        """True where the message is in the log (PUT_OK, FLUSH_DISK_TIMEOUT)."""
        return _STORED[self.status]

    @property
    def ok(self) -> bool:
        """True when every message got PUT_OK."""
        statuses = self.rows["status"]
        if len(statuses) > BATCH_RESULT_FEW_ROWS:
            return bool((statuses == PUT_OK_CODE).all())
        return statuses.tolist().count(PUT_OK_CODE) == len(statuses)

    def status_counts(self) -> dict[PutStatus, int]:
        """How many messages got each status (statuses that occur only), in status order."""
        statuses = self.rows["status"]
        if len(statuses) > BATCH_RESULT_FEW_ROWS:
            counts = np.bincount(statuses, minlength=len(_STATUSES)).tolist()
            return {_STATUSES[s]: count for s, count in enumerate(counts) if count}
        few: dict[int, int] = {}
        for status in statuses.tolist():  # no numpy call for a send-and-wait's row or few
            few[status] = few.get(status, 0) + 1
        return {_STATUSES[s]: few[s] for s in sorted(few)}

    def reason(self, index: int) -> str | None:
        """Why message `index` was not stored (None when it was)."""
        index = range(len(self))[index]
        status = _STATUSES[self.status[index]]
        if status.is_stored:
            return None
        return self._reason_unstored(index, status)

    def _reason_unstored(self, index: int, status: PutStatus) -> str | None:
        """The sender's reason for the message, else the supervisor's refusal (its row says
        which), else what the status means."""
        if index in self._reasons:
            return self._reasons[index]
        refusal = self.rows[index:index + 1].view(REFUSAL_DTYPE)[0]
        # a row the supervisor refused for the store's sake (topics.json not written) says so
        # under its SERVICE_NOT_AVAILABLE or DISK_FULL; other such rows carry no code (zeros)
        if status is PutStatus.MESSAGE_ILLEGAL or refusal["refusal"] == Refusal.TOPIC_NOT_WRITTEN:
            return describe_refusal(int(refusal["refusal"]), int(refusal["limit"]), int(refusal["found"]))
        return _DEFAULT_REASONS.get(status)

    def msg_id(self, index: int) -> str | None:
        """RocketMQ's offset msgId of message `index` (None when it was not stored)."""
        row = self.rows[index]
        if not _STORED[row["status"]]:
            return None
        return f"{self._msg_id_prefix}{int(row['commit_pos']):016X}"

    def msg_ids(self) -> list[str | None]:
        """msg_id of every message."""
        prefix = self._msg_id_prefix
        return [f"{prefix}{pos:016X}" if stored else None
                for stored, pos in zip(self.stored.tolist(), self.commit_pos.tolist(), strict=True)]

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, index):
        if isinstance(index, slice):
            return [self._result(i, row) for i, row in zip(range(len(self))[index],
                                                           self.rows[index].tolist(), strict=True)]
        index = range(len(self))[index]  # IndexError past either end
        return self._result(index, self.rows[index].tolist())

    def __iter__(self) -> Iterator[PutResult]:
        return map(self._result, range(len(self)), self.rows.tolist())

    def _result(self, index: int, row: tuple) -> PutResult:
        status, queue_id, commit_pos, queue_offset, store_ts_ms = row
        status = _STATUSES[status]
        if not status.is_stored:
            return PutResult(status, reason=self._reason_unstored(index, status))
        return PutResult(status, commit_pos=commit_pos, queue_id=queue_id, queue_offset=queue_offset,
                         msg_id=f"{self._msg_id_prefix}{commit_pos:016X}", store_ts_ms=store_ts_ms)

    def __repr__(self) -> str:
        counts = ", ".join(f"{s.name}={c}" for s, c in self.status_counts().items())
        return f"BatchResult({len(self)} messages: {counts or 'none'})"


class BatchResultBuilder:
    """Fills one BatchResult as the answers of its requests arrive (from the sender thread);
    calls `done(result)` once every message has its row."""

    def __init__(self, count: int, msg_id_prefix: str, done: Callable[[BatchResult], None]):
        self._count = count
        self._rows: np.ndarray | None = None  # made at the first answer that is not the whole batch
        self._reasons: dict[int, str] = {}
        self._msg_id_prefix = msg_id_prefix
        self._done = done
        self._missing = count
        self._lock = threading.Lock()

    def fail(self, index: int, status: PutStatus, reason: str) -> None:
        """Message `index` gets `status` without being sent (it failed validation)."""
        self._own_rows()["status"][index] = status
        self._reasons[index] = reason
        self._arrived(1)

    def put(self, where: slice | np.ndarray, rows: np.ndarray, reason: str | None) -> None:
        """The answer rows of the messages at `where`; `reason` applies to all of them (an answer
        made in this process: the supervisor gone, a timeout)."""
        if self._rows is None and len(rows) == self._count and _whole(where, self._count):
            self._rows = rows  # one answer for the whole batch (send and wait): taken as it is
        else:
            self._own_rows()[where] = rows
        if reason is not None:
            self._reasons.update(dict.fromkeys(np.arange(self._count)[where].tolist(), reason))
        self._arrived(len(rows))

    def _own_rows(self) -> np.ndarray:
        if self._rows is None:
            self._rows = np.zeros(self._count, dtype=RESULT_DTYPE)
        return self._rows

    def finish_if_complete(self) -> None:
        """Call `done` now if nothing is expected (an empty batch, or every message failed)."""
        self._arrived(0)

    def _arrived(self, count: int) -> None:
        with self._lock:
            self._missing -= count
            done = self._missing == 0
            if done:
                self._missing = -1  # call done once
        if done:
            self._done(BatchResult(self._own_rows(), self._reasons, self._msg_id_prefix))


def _whole(where: slice | np.ndarray, count: int) -> bool:
    """`where` is the slice of all `count` messages in order."""
    return type(where) is slice and where.start in (0, None) and where.stop == count \
        and where.step in (1, None)


def failed_rows(count: int, status: PutStatus) -> np.ndarray:
    """`count` answer rows with `status` and no position (made in this process)."""
    rows = np.zeros(count, dtype=RESULT_DTYPE)
    rows["status"] = status
    return rows
