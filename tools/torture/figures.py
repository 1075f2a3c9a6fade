"""The figures a torture run prints and writes as JSON: rounds, kills, acks, losses, recovery times."""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, field


def percentile(values: list[float], q: float) -> float | None:
    """Nearest-rank percentile (q in 0..100) of `values`; None when empty."""
    if not values:
        return None
    ordered = sorted(values)
    rank = max(1, math.ceil(q / 100.0 * len(ordered)))
    return ordered[rank - 1]


@dataclass
class RoundRecord:
    """One round: what was killed, how long the store took to come back, what verify found."""

    number: int
    target: str
    fault: str
    kills: int = 0
    recovery_ms: list[float] = field(default_factory=list)
    engine_recovery_ms: list[float] = field(default_factory=list)
    acked_total: int = 0
    lost: int = 0
    lost_unflushed: int = 0
    duplicated: int = 0
    problems: list[str] = field(default_factory=list)
    power_loss: str | None = None
    damage: str | None = None  # the offsets fault: what was damaged while the store was down
    duration_s: float = 0.0


@dataclass
class Figures:
    """Totals over every round of a run."""

    seed: int
    flush: str
    fault: str
    target: str
    rounds: list[RoundRecord] = field(default_factory=list)
    kills: Counter = field(default_factory=Counter)
    restarts: Counter = field(default_factory=Counter)
    producer_statuses: Counter = field(default_factory=Counter)
    hostile_statuses: Counter = field(default_factory=Counter)  # tools.torture.hostile's answers
    acked: int = 0
    timed_out: int = 0
    lost: int = 0
    lost_unflushed: int = 0
    lost_to_rebuild: int = 0
    rebuilds: int = 0  # damage below the durable line: start refused, the operator rebuilt
    lost_to_salvage: int = 0
    salvages: int = 0  # damage below the durable line: start refused, the operator salvaged
    duplicated: int = 0
    mismatched: int = 0
    index_missing: int = 0
    check_findings: int = 0
    unclean_stops: int = 0
    offset_damages: int = 0  # the offsets fault: consumerOffset.json files torn
    offset_fallbacks: int = 0  # ... and replaced by their backup, each with its WARNING
    offsets_moved_back: int = 0  # queues whose backup offset lay below the torn primary's
    segments_backdated: int = 0  # segment mtimes set to 1970
    consumer_runs: int = 0
    stores: int = 1
    duration_s: float = 0.0
    failure: str | None = None

    def add_round(self, record: RoundRecord) -> None:
        self.rounds.append(record)
        self.kills[record.target] += record.kills

    @property
    def recovery_ms(self) -> list[float]:
        return [ms for r in self.rounds for ms in r.recovery_ms]

    @property
    def engine_recovery_ms(self) -> list[float]:
        return [ms for r in self.rounds for ms in r.engine_recovery_ms]

    @property
    def passed(self) -> bool:
        return self.failure is None and not (self.lost or self.duplicated or self.mismatched
                                             or self.index_missing or self.check_findings)

    def latency_summary(self, values: list[float]) -> dict:
        return {"p50": percentile(values, 50), "p99": percentile(values, 99),
                "max": max(values) if values else None, "count": len(values)}

    def per_target_recovery(self) -> dict:
        out = {}
        for target in sorted({r.target for r in self.rounds}):
            values = [ms for r in self.rounds if r.target == target for ms in r.recovery_ms]
            out[target] = self.latency_summary(values)
        return out

    def to_dict(self) -> dict:
        return {
            "passed": self.passed, "failure": self.failure, "seed": self.seed, "flush": self.flush,
            "fault": self.fault, "target": self.target, "rounds": len(self.rounds),
            "stores": self.stores, "kills": dict(self.kills), "restarts": dict(self.restarts),
            "acked": self.acked, "timed_out": self.timed_out, "lost": self.lost,
            "lost_unflushed": self.lost_unflushed, "lost_to_rebuild": self.lost_to_rebuild,
            "rebuilds": self.rebuilds, "salvages": self.salvages,
            "lost_to_salvage": self.lost_to_salvage, "duplicated": self.duplicated,
            "mismatched": self.mismatched, "index_missing": self.index_missing,
            "check_findings": self.check_findings, "unclean_stops": self.unclean_stops,
            "offset_damages": self.offset_damages, "offset_fallbacks": self.offset_fallbacks,
            "offsets_moved_back": self.offsets_moved_back,
            "segments_backdated": self.segments_backdated, "consumer_runs": self.consumer_runs,
            "recovery_ms": self.latency_summary(self.recovery_ms),
            "recovery_ms_by_target": self.per_target_recovery(),
            "engine_recovery_ms": self.latency_summary(self.engine_recovery_ms),
            "producer_statuses": dict(self.producer_statuses),
            "hostile_statuses": dict(self.hostile_statuses),
            "duration_s": round(self.duration_s, 1),
            "round_log": [vars(r) for r in self.rounds],
        }

    def lines(self) -> list[str]:
        def ms(summary: dict) -> str:
            if not summary["count"]:
                return "n/a"
            return (f"p50 {summary['p50']:.0f} ms, p99 {summary['p99']:.0f} ms, "
                    f"max {summary['max']:.0f} ms (n={summary['count']})")

        kills = ", ".join(f"{t} {n}" for t, n in sorted(self.kills.items())) or "none"
        restarts = ", ".join(f"{t} {n}" for t, n in sorted(self.restarts.items())) or "none"
        out = [
            f"torture: {'PASSED' if self.passed else 'FAILED'} -- seed {self.seed}, flush {self.flush}, "
            f"fault {self.fault}, target {self.target}",
            f"  rounds {len(self.rounds)} (stores {self.stores}), {self.duration_s:.0f} s",
            f"  kills: {kills}",
            f"  restarts: {restarts}",
            f"  messages acknowledged {self.acked}, lost {self.lost}, duplicated {self.duplicated}, "
            f"lost unflushed (async, power loss) {self.lost_unflushed}, "
            f"flush timeouts {self.timed_out}",
        ]
        if self.rebuilds:
            out.append(f"  damage below the durable line: {self.rebuilds} refused start(s), each "
                       f"then rebuilt; acknowledged messages cut by the rebuilds {self.lost_to_rebuild}")
        if self.salvages:
            out.append(f"  damage below the durable line: {self.salvages} refused start(s), each "
                       f"then salvaged; acknowledged messages in the accepted damage "
                       f"{self.lost_to_salvage}")
        if self.consumer_runs:
            out.append(f"  offsets: {self.consumer_runs} consumer runs, {self.offset_damages} offset "
                       f"files torn, {self.offset_fallbacks} fallbacks to the backup (each logged), "
                       f"{self.offsets_moved_back} queue offsets moved back by them, "
                       f"{self.segments_backdated} segment mtimes set to 1970")
        out += [
            f"  mismatched {self.mismatched}, index misses {self.index_missing}, check findings "
            f"{self.check_findings}, unclean stops {self.unclean_stops}",
            f"  recovery (kill -> serving again): {ms(self.latency_summary(self.recovery_ms))}",
        ]
        out += [f"    {target}: {ms(s)}" for target, s in self.per_target_recovery().items()]
        out.append(f"  engine recovery (supervisor restarts): "
                   f"{ms(self.latency_summary(self.engine_recovery_ms))}")
        if self.hostile_statuses:
            answered = ", ".join(f"{k} {n}" for k, n in sorted(self.hostile_statuses.items()))
            out.append(f"  hostile client: {answered}")
        if self.failure:
            out.append(f"  FAILURE: {self.failure}")
        return out
