"""`mqstore exporter`: the store's metrics for Prometheus, served by a process of its own.

As node_exporter and redis_exporter do, it reads on each scrape what the store already
publishes: the control block in shared memory (attached read-only, as `mqstore status` does,
through workers.status_report) and the files (tools.inventory, retention's disk use). The
supervisor's hot path gains nothing. A stopped store still has its files: their metrics are
served with `mqstore_up 0`.

The control block publishes totals: puts (by PutStatus), dispatches and flushes are counters
(rates are Prometheus's `rate()`), the last flush's duration and size are gauges, and the put
latency is a histogram of fixed buckets the supervisor counts in (ipc/put_latency.py).
Loopback by default: the metrics name topics and groups, so another address needs --allow-remote.
"""

from __future__ import annotations

import ipaddress
import logging
import os
import signal
import socket
from collections.abc import Iterator
from pathlib import Path

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import CollectorRegistry

from engine.errors import BadInputError, StoreError
from engine.files.disk_use import store_disk_use
from engine.files.mapped_file import Access
from engine.files.store_dir import read_meta
from engine.log.commitlog import CommitLog
from ipc.offsets_fallbacks import read_fallbacks
from tools.inventory import lag_table, require_store, topic_table
from workers.exit_codes import CliExit
from workers.status_report import collect_status

log = logging.getLogger(__name__)


# ---------------------------------------------------------------------------------- listen
def parse_listen(text: str) -> tuple[str, int]:
    """HOST:PORT (an IPv6 host in brackets, `[::1]:9460`); port 0 takes a free one."""
    host, sep, port_text = text.rpartition(":")
    if not sep or not host or not port_text.isdigit() or not 0 <= int(port_text) <= 65535:
        raise BadInputError("--listen", f"{text!r} is not HOST:PORT with a port in 0..65535")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    elif ":" in host:
        raise BadInputError("--listen", f"{text!r}: put an IPv6 address in brackets, [::1]:9460")
    return host, int(port_text)


def require_loopback(host: str) -> None:
    """Refuse a host that resolves to anything but loopback addresses."""
    try:
        infos = socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)
    except socket.gaierror as exc:
        raise BadInputError("--listen", f"cannot resolve {host!r}: {exc.strerror}") from None
    for info in infos:
        address = ipaddress.ip_address(info[4][0].split("%")[0])
        if not address.is_loopback:
            raise BadInputError("--listen", f"{host} ({address}) is not a loopback address; the "
                                "metrics name topics and groups, so serving them beyond this host "
                                "needs --allow-remote")


# ---------------------------------------------------------------------------------- serve
def serve(store_dir: str | Path, host: str, port: int) -> int:
    """Serve /metrics until SIGTERM or Ctrl-C; print the address once listening."""
    from prometheus_client import start_http_server

    root = Path(store_dir)
    require_store(root)
    registry = CollectorRegistry()
    registry.register(StoreCollector(root))
    try:
        server, thread = start_http_server(port, addr=host, registry=registry)
    except OSError as exc:
        raise StoreError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None
    bound_port = server.server_address[1]
    shown = f"[{host}]" if ":" in host else host
    print(f"mqstore exporter: serving http://{shown}:{bound_port}/metrics for {root.resolve()}",
          flush=True)
    stopping = []
    signal.signal(signal.SIGTERM, lambda *_: stopping.append(True))
    try:
        while not stopping:
            signal.pause()
    except KeyboardInterrupt:
        pass
    server.shutdown()
    server.server_close()
    thread.join()
    return CliExit.OK


# ---------------------------------------------------------------------------------- collector
class StoreCollector:
    """A custom collector: every scrape reads the store afresh (nothing cached, nothing pushed)."""

    def __init__(self, root: Path):
        self.root = root

    def collect(self) -> Iterator[Metric]:
        errors = GaugeMetricFamily("mqstore_scrape_error", "1 when a part of this scrape could not "
                                   "be read (see the exporter's log)", labels=["part"])
        for part, produce in (("status", self._status), ("disk", self._disk),
                              ("queues", self._queues), ("groups", self._groups)):
            try:
                yield from produce()
                errors.add_metric([part], 0)
            except (StoreError, OSError) as exc:
                log.warning("scrape of %s failed: %s", part, exc)
                errors.add_metric([part], 1)
        yield errors

    # -- shared memory ----------------------------------------------------------------------
    def _status(self) -> Iterator[Metric]:
        status = collect_status(self.root, sample_s=0.0)
        yield _gauge("mqstore_up", "1 when a supervisor runs the store and its control block is "
                     "attached, else 0", int(status["running"]))
        if not status["running"]:
            return
        yield _gauge("mqstore_generation", "The supervisor's generation (grows with each start)",
                     status["generation"])
        totals, flush = status["totals"], status["flush_stats"]
        yield _counter("mqstore_put_messages", "Messages appended to the commitlog since the "
                       "supervisor started", totals["appended_msgs"])
        yield _counter("mqstore_dispatched_messages", "Messages dispatched into consume queues "
                       "since the supervisor started", totals["dispatched_msgs"])
        yield _counter("mqstore_flushes", "Group-commit flushes (fsync of the commitlog) since "
                       "the supervisor started", flush["count"])
        answers = CounterMetricFamily("mqstore_put_results", "Put answers by PutStatus since the "
                                      "supervisor started", labels=["status"])
        for name, count in status["put_statuses"].items():
            answers.add_metric([name], count)
        yield answers
        yield _put_latency(status["put_latency"])
        yield _gauge("mqstore_last_flush_duration_seconds", "Duration of the last flush",
                     flush["last_latency_ms"] / 1000)
        yield _gauge("mqstore_last_flush_bytes", "Bytes made durable by the last flush",
                     flush["last_bytes"])
        yield from _positions(status)
        yield from _processes(status["processes"])

    # -- files ------------------------------------------------------------------------------
    def _disk(self) -> Iterator[Metric]:
        allocated = GaugeMetricFamily("mqstore_disk_allocated_bytes", "Allocated bytes (disk blocks, "
                                      "as du counts) of each part of the store", labels=["part"])
        used = GaugeMetricFamily("mqstore_disk_used_bytes", "Bytes holding data of each part of the "
                                 "store (the rest of what is allocated is reserved ahead)", labels=["part"])
        for part, use in store_disk_use(self.root).items():
            allocated.add_metric([part], use.allocated_bytes)
            used.add_metric([part], use.used_bytes)
        yield allocated
        yield used
        fs = os.statvfs(self.root)
        yield _gauge("mqstore_filesystem_free_bytes", "Bytes available to the store's user on its "
                     "filesystem", fs.f_bavail * fs.f_frsize)
        commitlog = CommitLog.open(self.root, read_meta(self.root).commitlog_file_size, Access.READ_ONLY)
        try:
            min_pos = commitlog.min_pos
        finally:
            commitlog.close()
        yield _gauge("mqstore_commitlog_min_position_bytes", "First commit position still on "
                     "disk: retention deleted everything below it", min_pos)

    def _queues(self) -> Iterator[Metric]:
        rows = topic_table(self.root)
        labels = ["topic", "queue"]
        families = {
            "min_offset": GaugeMetricFamily("mqstore_queue_min_offset", "First queue offset whose "
                                            "message still exists", labels=labels),
            "max_offset": GaugeMetricFamily("mqstore_queue_max_offset", "Next queue offset to "
                                            "be written (dispatched messages only)", labels=labels),
            "messages": GaugeMetricFamily("mqstore_queue_messages", "Messages retained in the "
                                          "queue", labels=labels),
            "stored_bytes": GaugeMetricFamily("mqstore_queue_stored_bytes", "Commitlog bytes of the "
                                              "queue's retained messages", labels=labels),
            "cq_allocated_bytes": GaugeMetricFamily("mqstore_queue_allocated_bytes", "Allocated bytes "
                                                    "of the queue's consume-queue files", labels=labels),
            "cq_used_bytes": GaugeMetricFamily("mqstore_queue_used_bytes", "Bytes of the queue's "
                                               "consume-queue files holding entries", labels=labels),
        }
        for row in rows:
            for field, family in families.items():
                family.add_metric([row.topic, str(row.queue_id)], getattr(row, field))
        yield from families.values()
        oldest = [r.oldest_store_time_ms for r in rows if r.oldest_store_time_ms is not None]
        if oldest:
            yield _gauge("mqstore_oldest_message_timestamp_seconds", "Store time of the oldest "
                         "retained message (the retention horizon), Unix seconds", min(oldest) / 1000)

    def _groups(self) -> Iterator[Metric]:
        labels = ["group", "topic", "queue"]
        committed = GaugeMetricFamily("mqstore_group_committed_offset", "Next queue offset the group "
                                      "will read (its committed offset)", labels=labels)
        lag = GaugeMetricFamily("mqstore_group_lag_messages", "Messages the group has still to read "
                                "in the queue", labels=labels)
        lag_s = GaugeMetricFamily("mqstore_group_lag_seconds", "Age of the oldest message the group "
                                  "has not read (0 when caught up)", labels=labels)
        last = GaugeMetricFamily("mqstore_group_last_commit_timestamp_seconds", "When the group last "
                                 "committed the queue, Unix seconds", labels=labels)
        yield _counter("mqstore_consumer_offset_fallbacks", "Times a torn or garbled "
                       "consumerOffset.json was replaced by its backup (one commit older: groups "
                       "read again what they consumed since)", read_fallbacks(self.root).count)
        for row in lag_table(self.root):
            key = [row.group, row.topic, str(row.queue_id)]
            _add_known(committed, key, row.committed_offset)
            lag.add_metric(key, row.lag_messages)
            lag_s.add_metric(key, row.lag_ms / 1000)
            _add_known(last, key, _seconds(row.last_commit_time_ms))
        yield from (committed, lag, lag_s, last)


def _gauge(name: str, help_text: str, value: float) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, help_text, value=value)


def _counter(name: str, help_text: str, value: float) -> CounterMetricFamily:
    return CounterMetricFamily(name, help_text, value=value)


def _add_known(family: Metric, key: list[str], value: float | None) -> None:
    """Add one sample unless its value is unknown (None): a missing series, never a made-up 0."""
    if value is not None:
        family.add_metric(key, value)


def _seconds(value_ms: float | None) -> float | None:
    """Milliseconds as seconds, an unknown (None) staying unknown."""
    return None if value_ms is None else value_ms / 1000


def _put_latency(latency: dict) -> HistogramMetricFamily:
    """The supervisor's put latency counters as a Prometheus histogram."""
    buckets = [(_le(row["le_s"]), row["count"]) for row in latency["buckets"]]
    return HistogramMetricFamily(
        "mqstore_put_latency_seconds", "Time from the supervisor taking a put request out of its "
        "mailbox slot to answering it (after the fsync under flush=sync)",
        buckets=[*buckets, ("+Inf", latency["count"])], sum_value=latency["sum_s"])


def _le(bound_s: float) -> str:
    """A bucket bound as its `le` label, without float noise (0.0001, not 0.00010000000000000002)."""
    return repr(round(bound_s, 9))


def _positions(status: dict) -> Iterator[Metric]:
    """Positions of the commitlog pipeline and how far each stage is behind, in bytes and time."""
    pos, lag_b, lag_ms = status["positions"], status["lag_bytes"], status["lag_ms"]
    position = GaugeMetricFamily("mqstore_position_bytes", "Commit position each stage has reached",
                                 labels=["stage"])
    for stage in ("written", "flushed", "dispatched", "cq_durable"):
        position.add_metric([stage], pos[stage])
    lag = GaugeMetricFamily("mqstore_lag_bytes", "Bytes a stage is behind the one it follows",
                            labels=["stage"])
    lag_s = GaugeMetricFamily("mqstore_lag_seconds", "Age of the oldest record a stage has not "
                              "processed (0 when caught up)", labels=["stage"])
    for stage in ("flush", "dispatch"):
        lag.add_metric([stage], lag_b[stage])
        _add_known(lag_s, [stage], _seconds(lag_ms[stage]))
    indexed = GaugeMetricFamily("mqstore_index_position_bytes", "Commit position each index shard "
                                "has processed and made durable", labels=["shard", "stage"])
    index_lag = GaugeMetricFamily("mqstore_index_lag_bytes", "Bytes an index shard is behind",
                                  labels=["shard"])
    index_lag_s = GaugeMetricFamily("mqstore_index_lag_seconds", "Age of the oldest record an index "
                                    "shard has not processed", labels=["shard"])
    for shard, processed in enumerate(pos["indexed"]):
        indexed.add_metric([str(shard), "processed"], processed)
        indexed.add_metric([str(shard), "durable"], pos["index_durable"][shard])
        index_lag.add_metric([str(shard)], lag_b["index"][shard])
        _add_known(index_lag_s, [str(shard)], _seconds(lag_ms["index"][shard]))
    yield from (position, lag, lag_s, indexed, index_lag, index_lag_s)


def _processes(processes: list[dict]) -> Iterator[Metric]:
    """CPU, memory, restarts and liveness of the supervisor and each child."""
    labels = ["role", "shard"]
    up = GaugeMetricFamily("mqstore_process_up", "1 when the process of the slot is alive",
                           labels=labels)
    cpu = CounterMetricFamily("mqstore_process_cpu_seconds", "User and system CPU time of the "
                              "process", labels=labels)
    rss = GaugeMetricFamily("mqstore_process_resident_memory_bytes", "Resident memory of the "
                            "process (mapped store pages included)", labels=labels)
    anon = GaugeMetricFamily("mqstore_process_anonymous_memory_bytes", "Private resident memory "
                             "of the process (RssAnon)", labels=labels)
    restarts = CounterMetricFamily("mqstore_process_restarts", "Restarts of the slot's process "
                                   "by the supervisor", labels=labels)
    for proc in processes:
        key = [proc["role"], str(proc["shard"])]
        up.add_metric(key, int(proc["state"] != "gone"))
        restarts.add_metric(key, proc["restarts"])
        _add_known(cpu, key, proc["cpu_seconds"])
        _add_known(rss, key, proc["rss_bytes"])
        _add_known(anon, key, proc["rss_anon_bytes"])
    yield from (up, cpu, rss, anon, restarts)
