"""tools.bench.loadgen: schedules, coordinated-omission accounting, interval windows, bodies.

A fake clock and a fake sender stand in for the store, so a stall happens exactly where the
test puts it."""

from __future__ import annotations

import numpy as np
import pytest

from engine.errors import BadInputError
from tools.bench.bench_body import BODY_HEADER, BODY_MAGIC, BatchBuilder, build_batch, intended_times
from tools.bench.cli import bench_parser, plan_from_args
from tools.bench.harness import SCHEDULE_ALIGNED, SCHEDULE_SPREAD, BenchPlan
from tools.bench.histogram import LatencyHistogram, merged
from tools.bench.interval_recorder import IntervalRecorder
from tools.bench.loadgen import run_producer
from tools.bench.worker_records import Pending, WorkerSpec

START_NS = 10**12
MS = 1_000_000


class FakeClock:
    def __init__(self) -> None:
        self.now_ns = START_NS

    def __call__(self) -> int:
        return self.now_ns

    def sleep(self, seconds: float) -> None:
        self.now_ns += int(seconds * 1e9)


class StallingSender:
    """Answers every batch after `service_ns`; the first send at or after `stall_at_ns`
    takes `stall_ns` longer (a long fsync, a descheduled supervisor)."""

    def __init__(self, clock: FakeClock, *, service_ns: int, stall_at_ns: int, stall_ns: int):
        self.clock, self.service_ns = clock, service_ns
        self.stall_at_ns, self.stall_ns = stall_at_ns, stall_ns
        self.stalled = False
        self.sent = 0

    def submit(self, batch) -> Pending:
        start = self.clock.now_ns
        self.clock.now_ns += self.service_ns
        if not self.stalled and start >= self.stall_at_ns:
            self.clock.now_ns += self.stall_ns
            self.stalled = True
        pending = Pending(len(batch.bodies))
        pending.done_ns, pending.statuses = self.clock.now_ns, {"OK": len(batch.bodies)}
        self.sent += len(batch.bodies)
        return pending

    def result(self, pending: Pending) -> dict[str, int]:
        return dict(pending.statuses)


def _run(rate: float | None, *, seconds: float = 2.0, stall_at_s: float = 0.5, stall_s: float = 0.5,
         phase: float = 0.0):
    spec = WorkerSpec(role="producer", backend="fake", worker_id=0, target="-",
                      streams=(("t", 0),), size_bytes=64, batch=1, rate_msgs_per_s=rate,
                      seconds=seconds, interval_s=1.0, phase=phase)
    clock, events = FakeClock(), []
    sender = StallingSender(clock, service_ns=100_000, stall_at_ns=START_NS + int(stall_at_s * 1e9),
                            stall_ns=int(stall_s * 1e9))
    recorder = IntervalRecorder(START_NS, int(spec.interval_s * 1e9), spec.interval_count, events.append)
    run_producer(spec, sender, recorder, start_ns=START_NS, clock=clock, sleep=clock.sleep)
    latency = merged(LatencyHistogram.from_sparse(e["lat"]) for e in events)
    delay = merged(LatencyHistogram.from_sparse(e["delay"]) for e in events)
    return events, latency, delay, recorder, sender


def test_fixed_rate_latency_counts_the_stall_for_every_message_behind_it():
    events, latency, delay, recorder, sender = _run(1000.0)
    # every one of the 2000 scheduled messages was sent and measured from its intended time
    assert latency.count == sender.sent == recorder.total_msgs == 2000
    # ~500 messages were due during the 500 ms stall: their latencies run from 500 ms down to 0
    assert latency.percentile_ns(99) >= 480 * MS
    assert 250 * MS <= latency.percentile_ns(90) <= 350 * MS
    assert latency.percentile_ns(50) < 1 * MS
    # the rate limiter's lateness shows the same stall (OMB's publish delay)
    assert delay.percentile_ns(90) >= 250 * MS
    assert [e["k"] for e in events] == [0, 1]


def test_closed_loop_would_hide_the_same_stall():
    """The contrast: without a schedule only the one stalled send is slow."""
    _, latency, _, _, sender = _run(None)
    assert latency.count == sender.sent > 10_000
    assert latency.percentile_ns(99.9) < 1 * MS
    assert latency.max_ns >= 500 * MS


def test_sends_never_made_before_the_end_are_counted_not_dropped():
    events, latency, _, recorder, sender = _run(1000.0, stall_at_s=1.5, stall_s=3.0)
    not_sent = sum(e["errors"].get("NOT_SENT", 0) for e in events)
    assert sender.sent + not_sent == 2000
    assert not_sent > 400
    assert recorder.total_errors["NOT_SENT"] == not_sent
    assert latency.count == 2000  # the unsent ones are recorded as at least this late
    assert latency.percentile_ns(90) >= 1000 * MS


class RecordingSender(StallingSender):
    """A StallingSender that never stalls and notes when each batch was submitted."""

    def __init__(self, clock: FakeClock):
        super().__init__(clock, service_ns=10_000, stall_at_ns=2**62, stall_ns=0)
        self.submitted_ns: list[int] = []

    def submit(self, batch) -> Pending:
        self.submitted_ns.append(self.clock.now_ns)
        return super().submit(batch)


def test_a_phase_shifts_the_whole_schedule_and_latency_runs_from_it():
    spec = WorkerSpec(role="producer", backend="fake", worker_id=1, target="-", streams=(("t", 0),),
                      size_bytes=64, batch=4, rate_msgs_per_s=1000.0, seconds=0.1, interval_s=1.0,
                      phase=0.25)
    clock, events = FakeClock(), []
    sender = RecordingSender(clock)
    recorder = IntervalRecorder(START_NS, int(spec.interval_s * 1e9), spec.interval_count, events.append)
    run_producer(spec, sender, recorder, start_ns=START_NS, clock=clock, sleep=clock.sleep)
    gap_ns = 4 * MS  # 4 messages at 1000 msg/s
    # batch j is due at start + (j + 0.25) gaps: the first 1 ms in, then every 4 ms, 25 in 100 ms
    assert sender.submitted_ns == [START_NS + MS + j * gap_ns for j in range(25)]
    latency = merged(LatencyHistogram.from_sparse(e["lat"]) for e in events)
    assert latency.count == 100
    assert latency.max_ns <= 10_000 * 1.01  # from the shifted intended time, not the common start


def test_with_a_phase_sends_never_made_are_still_counted():
    events, latency, _, recorder, sender = _run(1000.0, stall_at_s=1.5, stall_s=3.0, phase=0.5)
    not_sent = sum(e["errors"].get("NOT_SENT", 0) for e in events)
    assert sender.sent + not_sent == 2000  # batch j due at (j + 0.5) ms: 2000 of them before 2 s
    assert not_sent > 400 and recorder.total_errors["NOT_SENT"] == not_sent
    assert latency.count == 2000


@pytest.mark.parametrize(("schedule", "phases"), [(SCHEDULE_SPREAD, [0.0, 0.25, 0.5, 0.75]),
                                                  (SCHEDULE_ALIGNED, [0.0, 0.0, 0.0, 0.0])])
def test_plan_spreads_or_aligns_its_producers(schedule, phases):
    plan = BenchPlan(producers=4, consumers=1, rate_msgs_per_s=4000.0, schedule=schedule)
    specs = plan.worker_specs("mqstore", "/store")
    assert [spec.phase for spec in specs if spec.role == "producer"] == phases
    assert [spec.phase for spec in specs if spec.role == "consumer"] == [0.0]


def test_plan_refuses_an_unknown_schedule():
    with pytest.raises(BadInputError, match="schedule"):
        BenchPlan(producers=1, consumers=0, schedule="bursty")


def test_cli_schedule_is_aligned_unless_spread_is_asked_for(capsys):
    parser = bench_parser("mqstore")
    plan = plan_from_args(parser.parse_args(["bench", "--start", "--producers", "2", "--rate", "1000"]))
    assert plan.schedule == SCHEDULE_ALIGNED  # what every earlier pass measured the bars with
    plan = plan_from_args(parser.parse_args(["bench", "--start", "--producers", "2", "--rate", "1000",
                                             "--schedule", "spread"]))
    assert [spec.phase for spec in plan.worker_specs("mqstore", "/store")] == [0.0, 0.5, 0.0]
    with pytest.raises(SystemExit):
        parser.parse_args(["bench", "--start", "--schedule", "bursty"])
    assert "invalid choice: 'bursty'" in capsys.readouterr().err


def test_recorder_puts_warmup_aside_and_late_events_in_the_open_window():
    events = []
    recorder = IntervalRecorder(START_NS, 1_000 * MS, 3, events.append)
    common = {"ok_count": 4, "answered_count": 4, "body_bytes": 100, "errors": {}}
    recorder.add_batch(done_ns=START_NS - 1, intended_ns=START_NS - 5 * MS, sent_ns=START_NS - 5 * MS,
                       **common)
    recorder.add_batch(done_ns=START_NS + 10 * MS, intended_ns=START_NS, sent_ns=START_NS, **common)
    recorder.maybe_emit(START_NS + 2_500 * MS)  # windows 0 and 1 are closed
    recorder.add_batch(done_ns=START_NS + 500 * MS, intended_ns=START_NS + 400 * MS,
                       sent_ns=START_NS + 400 * MS, **common)  # late: lands in window 2
    recorder.add_batch(done_ns=START_NS + 9_000 * MS, intended_ns=START_NS + 8_000 * MS,
                       sent_ns=START_NS + 8_000 * MS, **{**common, "ok_count": 3,
                                                          "errors": {"FLUSH_DISK_TIMEOUT": 1}})
    recorder.finish()
    assert [e["k"] for e in events] == [0, 1, 2]
    assert [e["msgs"] for e in events] == [4, 0, 7]
    assert events[2]["errors"] == {"FLUSH_DISK_TIMEOUT": 1}
    assert events[-1]["cum_msgs"] == recorder.total_msgs == 15
    assert LatencyHistogram.from_sparse(events[2]["lat"]).max_ns == 1_000 * MS


def test_received_messages_are_timed_from_their_own_arrival_when_given():
    events = []
    recorder = IntervalRecorder(START_NS, 1_000 * MS, 1, events.append)
    intended = np.array([START_NS - MS, START_NS, START_NS], dtype=np.int64)  # the first: warm-up
    arrived = np.array([START_NS, START_NS + 2 * MS, START_NS + 7 * MS], dtype=np.int64)
    recorder.add_received(START_NS + 9 * MS, intended, 100, arrived)
    recorder.add_received(START_NS + 9 * MS, intended[1:], 100)  # no arrivals: all at done_ns
    recorder.finish()
    latency = LatencyHistogram.from_sparse(events[0]["lat"])
    assert events[0]["msgs"] == 4 and latency.count == 4
    assert latency.min_ns == 2 * MS and latency.max_ns == 9 * MS
    assert latency.percentile_ns(50) == pytest.approx(7 * MS, rel=0.01)


def test_bodies_carry_the_intended_time_and_keys_are_unique():
    spec = WorkerSpec(role="producer", backend="mqstore", worker_id=3, target="-",
                      streams=(("a", 0), ("a", 1), ("b", 0)), size_bytes=64, batch=5, keys=True)
    batch = build_batch(spec, 10, 123_456_789, bytes(64 - BODY_HEADER.size))
    assert all(len(body) == 64 for body in batch.bodies)
    assert BODY_HEADER.unpack_from(batch.bodies[0]) == (BODY_MAGIC, 3, 123_456_789, 10)
    assert batch.streams[:3] == [("a", 1), ("b", 0), ("a", 0)]
    assert len(set(batch.keys)) == 5
    stamps = intended_times([*batch.bodies, b"not a bench body at all........"])
    assert stamps.tolist() == [123_456_789] * 5


def test_batch_builder_reuses_its_template_without_touching_earlier_batches():
    spec = WorkerSpec(role="producer", backend="mqstore", worker_id=1, target="-",
                      streams=(("a", 0), ("a", 1)), size_bytes=40, batch=3)
    tail = bytes(range(40 - BODY_HEADER.size))
    builder = BatchBuilder(spec, tail)
    first = builder.build(0, 111)
    second = builder.build(3, 222)
    for batch, seq, intended in ((first, 0, 111), (second, 3, 222)):
        assert batch.bodies == [BODY_HEADER.pack(BODY_MAGIC, 1, intended, seq + i) + tail for i in range(3)]
        assert batch.keys == [None] * 3 and batch.key_column is None
    assert first.streams == [("a", 1), ("a", 0), ("a", 1)]
    assert second.streams == [("a", 0), ("a", 1), ("a", 0)]
    assert first.first_stream == 1 and second.first_stream == 0


def test_spec_round_trips_through_json():
    spec = WorkerSpec(role="consumer", backend="redis", worker_id=1, target="127.0.0.1:1",
                      streams=(("t", 2),), rate_msgs_per_s=5.0, seconds=7.0, interval_s=5.0)
    assert WorkerSpec.from_json(spec.to_json()) == spec
    assert spec.interval_count == 2


@pytest.mark.parametrize("seconds, interval_s, count", [(2, 5, 1), (10, 5, 2), (10.5, 5, 3)])
def test_interval_count(seconds, interval_s, count):
    spec = WorkerSpec(role="producer", backend="x", worker_id=0, target="-", streams=(("t", 0),),
                      seconds=seconds, interval_s=interval_s)
    assert spec.interval_count == count


def test_intended_times_is_int64():
    assert intended_times([]).dtype == np.int64


def test_batch_of_one_is_the_same_body_as_the_first_of_a_larger_batch():
    """build() of a batch of one packs the header itself; the bytes are the template path's."""
    tail = bytes(range(40 - BODY_HEADER.size))
    spec_of = {batch: WorkerSpec(role="producer", backend="mqstore", worker_id=4, target="-",
                                 streams=(("a", 0), ("a", 1), ("b", 0)), size_bytes=40, batch=batch,
                                 keys=True) for batch in (1, 2)}
    one = BatchBuilder(spec_of[1], tail).build(7, 555)
    two = BatchBuilder(spec_of[2], tail).build(7, 555)
    assert one.bodies == [BODY_HEADER.pack(BODY_MAGIC, 4, 555, 7) + tail] == two.bodies[:1]
    assert one.key_column == ["p4-7"] == two.key_column[:1]
    assert one.first_stream == two.first_stream == (4 + 7) % 3 and one.streams == [("b", 0)]
    assert intended_times(one.bodies).tolist() == [555]
