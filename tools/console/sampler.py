"""The overview's data: `mqstore status` (workers.status_report) sampled once a second by one
background thread, with a short history for the live charts.

One sampler per console, however many browsers poll it, so the store sees one reader; each
sample's rates are measured over its own one-second window. It samples only while someone
looks: after IDLE_AFTER_S without a snapshot asked for it sleeps until the next one, so an
open console nobody watches costs the store nothing.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from pathlib import Path

from engine.errors import StoreError
from workers.status_report import collect_status

SAMPLE_S = 1.0
HISTORY_POINTS = 120  # two minutes of one-second samples
IDLE_AFTER_S = 10.0

log = logging.getLogger(__name__)


def chart_point(status: dict) -> dict:
    """The numbers the overview charts: rates and lags of one status sample."""
    now_ms = int(time.time() * 1000)
    if not status.get("running"):
        return {"at_ms": now_ms, "append_msgs_per_s": 0.0, "dispatch_msgs_per_s": 0.0,
                "flush_lag_bytes": 0, "dispatch_lag_bytes": 0, "index_lag_bytes": 0,
                "dispatch_lag_ms": None}
    rates, lag_bytes = status["rates"], status["lag_bytes"]
    return {"at_ms": now_ms,
            "append_msgs_per_s": round(rates["append_msgs_per_s"], 1),
            "dispatch_msgs_per_s": round(rates["dispatch_msgs_per_s"], 1),
            "flush_lag_bytes": lag_bytes["flush"],
            "dispatch_lag_bytes": lag_bytes["dispatch"],
            "index_lag_bytes": max(lag_bytes["index"], default=0),
            "dispatch_lag_ms": status["lag_ms"]["dispatch"]}


class StatusSampler:
    """Keeps the latest status and the last HISTORY_POINTS chart points."""

    def __init__(self, store_dir: Path, sample_s: float = SAMPLE_S, idle_after_s: float = IDLE_AFTER_S):
        self.store_dir = store_dir
        self.sample_s = sample_s
        self.idle_after_s = idle_after_s
        self._asked_at = time.monotonic()
        self._asked = threading.Event()
        self.idle = threading.Event()  # set while it sleeps for want of a viewer
        self._lock = threading.Lock()
        self._latest: dict | None = None
        self._history: deque[dict] = deque(maxlen=HISTORY_POINTS)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="console-sampler", daemon=True)

    def start(self) -> StatusSampler:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._asked.set()
        self._thread.join(self.sample_s * 4)

    def snapshot(self) -> dict:
        """{"status": latest status or None before the first sample, "history": [points]}."""
        self._asked_at = time.monotonic()
        self._asked.set()
        with self._lock:
            return {"status": self._latest, "history": list(self._history)}

    def sample_once(self) -> None:
        started = time.monotonic()
        try:
            status = collect_status(self.store_dir, sample_s=self.sample_s)
        except (StoreError, OSError) as exc:  # a store removed or unreadable: say so, keep going
            status = {"store": str(self.store_dir), "state": "UNREADABLE", "running": False,
                      "detail": str(exc)}
        with self._lock:
            self._latest = status
            self._history.append(chart_point(status))
        if not status.get("running"):  # no sample window was spent: pace the loop here
            self._stop.wait(max(self.sample_s - (time.monotonic() - started), 0.0))

    def _run(self) -> None:
        while not self._stop.is_set():
            if time.monotonic() - self._asked_at > self.idle_after_s:
                self._asked.clear()
                if time.monotonic() - self._asked_at > self.idle_after_s:  # none came meanwhile
                    self.idle.set()
                    self._asked.wait()  # until a snapshot is asked for (or stop)
                    self.idle.clear()
                continue
            try:
                self.sample_once()
            except Exception:  # a bug in one sample must not end the overview
                log.exception("status sample failed")
                self._stop.wait(self.sample_s)
