"""tools.bench.report: the interval line, the summary and the JSON document's schema."""

from __future__ import annotations

import re
from types import SimpleNamespace

import numpy as np
import pytest

from tools.bench import report
from tools.bench.harness import BenchPlan, _Run
from tools.bench.histogram import LatencyHistogram

MS = 1_000_000

LINE_RE = re.compile(
    r"^mqstore +\[ +5\.0s\] pub +(?P<pub>\d+) msg/s +(?P<mib>[\d.]+) MiB/s \| "
    r"pub ms avg [\d.]+ p50 (?P<p50>[\d.]+) p99 [\d.]+ p99\.9 [\d.]+ max (?P<max>[\d.]+) \| "
    r"cons +(?P<cons>\d+) msg/s \| backlog (?P<backlog>-?\d+) \| "
    r"e2e ms avg [\d.]+ p50 [\d.]+ p99 [\d.]+ p99\.9 [\d.]+ max [\d.]+ \| "
    r"err (?P<err>.+?) \| lag ms disp 3 idx 7 \| load 1\.50$")


def _event(latencies_ms: list[float], msgs: int, cum: int, errors: dict | None = None) -> dict:
    hist = LatencyHistogram()
    hist.record_many(np.asarray(latencies_ms) * MS)
    return {"event": "interval", "k": 0, "msgs": msgs, "bytes": msgs * 256, "cum_msgs": cum,
            "lat": hist.to_sparse(), "delay": LatencyHistogram().to_sparse(), "errors": errors or {}}


def _interval():
    producers = [_event([1.0] * 98 + [4.0, 9.0], 50_000, 60_000, {"FLUSH_DISK_TIMEOUT": 2}),
                 _event([2.0] * 100, 50_000, 60_000)]
    consumers = [_event([3.0] * 100, 99_000, 119_000)]
    return report.interval_figures(0, 5.0, 5.0, producers, consumers, load_1m=1.5,
                                   store={"dispatch_lag_ms": 3.2, "index_lag_ms": 7.0})


def test_interval_line_has_every_figure_in_order():
    figures, hists = _interval()
    line = report.interval_line("mqstore", figures)
    match = LINE_RE.match(line)
    assert match, line
    assert match["pub"] == "20000" and match["cons"] == "19800" and match["backlog"] == "1000"
    assert match["mib"] == f"{100_000 * 256 / 5 / 2**20:.2f}"
    assert match["err"] == "FLUSH_DISK_TIMEOUT=2"
    assert float(match["max"]) == 9.0
    # 200 samples: 98 x 1 ms, 100 x 2 ms, 4 ms, 9 ms (percentiles within 1/128, max exact)
    assert hists["pub"].count == 200
    assert figures["pub_latency"]["p50_ms"] == pytest.approx(2.0, rel=1 / 128)


def test_interval_line_without_store_or_errors():
    figures, _ = _interval()
    figures.update(errors={}, store=None, load_1m=None)
    line = report.interval_line("redis", figures)
    assert "| err 0" in line and "lag" not in line and "load" not in line


def test_summary_merges_intervals_and_counts_messages():
    figures, hists = _interval()
    workers = [{"role": "producer", "msgs_total": 120_000, "errors_total": {"FLUSH_DISK_TIMEOUT": 2}},
               {"role": "consumer", "msgs_total": 120_000, "errors_total": {}}]
    summary = report.run_summary([figures], [hists], workers, 5.0)
    assert summary["pub_msgs_per_s"] == 20_000 and summary["cons_msgs_per_s"] == 19_800
    assert summary["pub_latency"]["p99_ms"] == pytest.approx(2.0, rel=1 / 128)
    assert summary["pub_latency"]["p99_9_ms"] == summary["pub_latency"]["max_ms"] == 9.0
    assert summary["sent_total"] == summary["received_total"] == 120_000
    run = {"backend": "mqstore", "warmup_s": 1.0, "intervals": [figures], "summary": summary,
           "workers": workers, "load_before": [1.0, 1, 1], "load_after": [2.0, 1, 1], "store": None}
    lines = report.summary_lines("mqstore", run)
    assert "(equal: yes)" in lines[4] and "FLUSH_DISK_TIMEOUT=2" in lines[4]
    doc = {"schema": report.SCHEMA, "command": "mqstore bench", "machine": report.machine_info(),
           "config": {}, "runs": {"mqstore": run}}
    assert report.check_document(doc) == []


def test_backlog_counts_what_the_consumers_found_at_start():
    producers = [_event([1.0], 0, 0)]
    consumers = [_event([], 4_000, 9_000)]  # read 9,000 of a 10,000-message backlog so far
    figures, _ = report.interval_figures(1, 10.0, 5.0, producers, consumers, backlog_at_start_msgs=10_000)
    assert figures["backlog_msgs"] == 1_000
    figures, _ = report.interval_figures(1, 10.0, 5.0, producers, consumers)  # consumed from the end
    assert figures["backlog_msgs"] == -9_000


def _backlog_summary(caught_up_s: float | None, sent: int = 0) -> dict:
    figures, hists = report.interval_figures(0, 5.0, 5.0, [], [_event([], 8_000, 10_000)],
                                             backlog_at_start_msgs=10_000)
    workers = [{"role": "consumer", "msgs_total": 10_000, "errors_total": {}},
               {"role": "producer", "msgs_total": sent, "errors_total": {}}]
    return report.run_summary([figures], [hists], workers, 5.0, backlog_at_start_msgs=10_000,
                              caught_up_s=caught_up_s)


def test_a_backlog_read_to_its_end_reports_the_rate_until_then():
    summary = _backlog_summary(2.0)
    assert summary["cons_msgs_per_s"] == 1_600  # over all 5 s: a lower bound
    assert summary["cons_msgs_per_s_until_caught_up"] == 4_000
    run = {"backend": "mqstore", "warmup_s": 1.0, "intervals": [], "summary": summary,
           "workers": [{"role": "consumer"}], "load_before": [1.0], "load_after": [1.0]}
    assert report.summary_lines("mqstore", run)[5] == (
        "  backlog   10000 at start; read to its end 2 s into the measurement, at 4000 msg/s "
        "until then (the consume rate over the whole run is a lower bound)")
    for caught_up_s, text in ((None, "not read to its end in the 5 s measured"),
                              (5.2, "not read to its end in the 5 s measured"),  # while draining
                              (-0.5, "read to its end before the measurement began "
                                     "(nothing of it was measured)")):
        summary = _backlog_summary(caught_up_s)
        assert summary["cons_msgs_per_s_until_caught_up"] is None
        assert report.summary_lines("mqstore", {**run, "summary": summary})[5].endswith(text)
    # with producers, what was read after catching up is new messages: no backlog rate
    assert _backlog_summary(2.0, sent=500)["cons_msgs_per_s_until_caught_up"] is None


def test_check_document_names_what_is_wrong():
    problems = report.check_document({"schema": "x", "runs": {"mqstore": {"summary": {}}}})
    assert "$.schema: expected 'mqstore-bench/1'" in problems
    assert any(p.startswith("$.runs.mqstore.summary.pub_msgs_per_s") for p in problems)
    assert any(p.startswith("$.machine") for p in problems)


def test_samples_summary_reports_lag_growth_and_rss():
    samples = [{"t_s": t, "dispatch_lag_ms": 2.0 * t, "index_lag_ms": 1.0,
                "rss_bytes": {"supervisor": 100 * 2**20 + t}} for t in range(0, 60, 5)]
    summary = report.summarize_samples([*samples, {"t_s": 60, "error": "gone"}])
    assert summary["samples"] == 13
    assert summary["dispatch_lag_ms"]["growth_ms_per_min"] == 120.0
    assert summary["index_lag_ms"]["growth_ms_per_min"] == 0.0
    assert summary["rss_mib"]["supervisor"]["first"] == 100.0


def test_the_run_caught_up_when_its_last_consumer_did():
    plan = BenchPlan(producers=0, consumers=2, warmup_s=1.0)
    run = _Run(plan, "mqstore", lambda line: None)
    run.start_ns = 10**12

    def consumer(backlog_msgs: int, caught_up_ns: int | None) -> SimpleNamespace:
        return SimpleNamespace(spec=SimpleNamespace(role="consumer"), backlog_at_start_msgs=backlog_msgs,
                               done={"caught_up_ns": caught_up_ns})

    run.workers = [consumer(300, 10**12 + 1_500_000_000), consumer(100, 10**12 + 3_250_000_000)]
    assert run.backlog_at_start_msgs == 400 and run.caught_up_s == 2.25  # after the 1 s warm-up
    run.workers[1] = consumer(100, None)  # one never ran out
    assert run.caught_up_s is None
    run.workers = [consumer(0, 10**12)]  # nothing to read at start: nothing to catch up with
    assert run.caught_up_s is None
    run.workers = []
    assert run.backlog_at_start_msgs == 0 and run.caught_up_s is None
