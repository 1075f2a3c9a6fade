"""Per-interval counts and latency histograms of one bench worker, emitted as JSON events.

Producers record each answered batch (and the batches their schedule wanted but never sent),
consumers each body they received; interval k is emitted once the clock passes its end, the
last one (late completions included) at finish().
"""

from __future__ import annotations

import collections
import time
from collections.abc import Callable

import numpy as np

from tools.bench.histogram import LatencyHistogram


class _Window:
    __slots__ = ("delay", "errors", "latency", "msg_bytes", "msgs")

    def __init__(self) -> None:
        self.msgs = 0
        self.msg_bytes = 0
        self.latency = LatencyHistogram()
        self.delay = LatencyHistogram()
        self.errors: collections.Counter = collections.Counter()


class IntervalRecorder:
    """Per-interval counts and histograms; emits interval k once the clock passes its end.

    An event belongs to the measurement if its *intended* time is at or after the warm-up,
    and to the interval of its *completion* time (clipped to the last interval)."""

    def __init__(self, measure_start_ns: int, interval_ns: int, interval_count: int,
                 emit: Callable[[dict], None]):
        self.measure_start_ns = measure_start_ns
        self.interval_ns = interval_ns
        self.interval_count = interval_count
        self.emit = emit
        self.next_k = 0
        self.windows: dict[int, _Window] = {}
        self.total_msgs = 0
        self.total_errors: collections.Counter = collections.Counter()

    def _window(self, done_ns: int) -> _Window:
        k = (done_ns - self.measure_start_ns) // self.interval_ns
        k = min(max(k, self.next_k), self.interval_count - 1)
        window = self.windows.get(k)
        if window is None:
            window = self.windows[k] = _Window()
        return window

    def add_batch(self, *, done_ns: int, intended_ns: int, sent_ns: int, ok_count: int,
                  answered_count: int, body_bytes: int, errors: dict[str, int]) -> None:
        """A producer batch: `answered_count` messages answered, `ok_count` of them stored OK."""
        self.total_msgs += ok_count
        if errors:  # an update with nothing costs ~0.5 us, twice per answered send
            self.total_errors.update(errors)
        if intended_ns < self.measure_start_ns:
            return
        window = self._window(done_ns)
        window.msgs += ok_count
        window.msg_bytes += ok_count * body_bytes
        if errors:
            window.errors.update(errors)
        window.latency.record(done_ns - intended_ns, answered_count)
        window.delay.record(sent_ns - intended_ns, answered_count)

    def add_received(self, done_ns: int, intended_ns: np.ndarray, body_bytes: int,
                     received_ns: np.ndarray | None = None) -> None:
        """Bodies a consumer received, by their intended send times: each at received_ns[i] (its
        pull's return) if given, else all at `done_ns`; counted in the window of `done_ns`."""
        self.total_msgs += len(intended_ns)
        sent_in_run = intended_ns >= self.measure_start_ns
        measured = intended_ns[sent_in_run]
        if measured.size == 0:
            return
        window = self._window(done_ns)
        window.msgs += int(measured.size)
        window.msg_bytes += int(measured.size) * body_bytes
        arrived_ns = done_ns if received_ns is None else received_ns[sent_in_run]
        window.latency.record_many(arrived_ns - measured)

    def add_backlog_read(self, done_ns: int, intended_ns: np.ndarray, count: int, body_bytes: int) -> None:
        """Messages read from a backlog (--consume-from start): counted by receive time, since
        they were sent before the run; latency only for those sent during the measurement."""
        self.total_msgs += count
        if done_ns < self.measure_start_ns:
            return
        window = self._window(done_ns)
        window.msgs += count
        window.msg_bytes += count * body_bytes
        window.latency.record_many(done_ns - intended_ns[intended_ns >= self.measure_start_ns])

    def add_unsent(self, now_ns: int, intended_ns: np.ndarray, batch: int) -> None:
        """Batches due before the end that were never sent (the sender fell behind): their
        latency is at least `now - intended`, recorded as such and counted as NOT_SENT."""
        measured = intended_ns[intended_ns >= self.measure_start_ns]
        if intended_ns.size:
            self.total_errors["NOT_SENT"] += int(intended_ns.size) * batch
        if measured.size:
            window = self._window(now_ns)
            window.errors["NOT_SENT"] += int(measured.size) * batch
            window.latency.record_many(now_ns - measured, np.full(measured.size, batch))

    def add_error(self, name: str) -> None:
        self.total_errors[name] += 1
        self._window(time.monotonic_ns()).errors[name] += 1

    def maybe_emit(self, now_ns: int) -> None:
        while (self.next_k < self.interval_count - 1 and
               now_ns >= self.measure_start_ns + (self.next_k + 1) * self.interval_ns):
            self._emit(self.next_k)
            self.next_k += 1

    def finish(self) -> None:
        """Emit every interval not yet emitted (the last one holds late completions)."""
        while self.next_k < self.interval_count:
            self._emit(self.next_k)
            self.next_k += 1

    def _emit(self, k: int) -> None:
        window = self.windows.pop(k, None) or _Window()
        self.emit({"event": "interval", "k": k, "msgs": window.msgs, "bytes": window.msg_bytes,
                   "cum_msgs": self.total_msgs, "lat": window.latency.to_sparse(),
                   "delay": window.delay.to_sparse(), "errors": dict(window.errors)})
