"""tools.bench.probes.stalls: the freeze rule on given samples, and a short probe of a running store."""

from __future__ import annotations

import json

import numpy as np
import pytest

from engine.errors import ServiceNotAvailableError
from tests.workers.store_harness import start_store
from tools.bench.probes import stalls

MS = 0.001


def test_a_stage_that_stands_still_while_owed_work_is_a_freeze_and_an_idle_one_is_not():
    t = np.arange(0, 200) * MS  # 200 samples, 1 ms apart
    upstream = np.full(200, 100.0)
    own = np.concatenate([np.arange(10, 60), np.full(60, 60), np.arange(60, 150)]).astype(float)
    own = np.minimum(own, 100)  # caught up at 100 from sample ~150 on: idle, owed nothing
    spans = stalls.freezes(t, upstream, own, 30 * MS)
    assert len(spans) == 1
    at_s, length_s = spans[0]
    assert at_s == pytest.approx(50 * MS) and length_s == pytest.approx(61 * MS)
    assert stalls.freezes(t, upstream, own, 70 * MS) == []  # under the threshold
    assert stalls.freezes(t[:1], upstream[:1], own[:1], MS) == []


def test_a_short_probe_of_a_running_store_reports_every_stage(tmp_path):
    store = start_store(tmp_path / "store", store={"index_shards": 2})
    try:
        out_path = tmp_path / "stalls.json"
        out = stalls.main(["--store", str(store.root), "--seconds", "0.3", "--json", str(out_path)])
    finally:
        assert store.stop() == 0
    assert out["samples"] > 10 and out["seconds"] > 0.2
    assert set(out["stages"]) == {"supervisor", "dispatcher", "index[0]", "index[1]"}
    assert all(row["freezes"] == 0 for row in out["stages"].values())  # an idle store owes nothing
    assert json.loads(out_path.read_text()) == out


def test_no_store_is_a_clear_error_and_writes_nothing(tmp_path):
    with pytest.raises(ServiceNotAvailableError, match="no supervisor runs"):
        stalls.main(["--store", str(tmp_path / "none"), "--seconds", "1", "--wait-s", "0",
                           "--json", str(tmp_path / "out.json")])
    assert not (tmp_path / "out.json").exists()


def test_under_async_flush_the_dispatcher_is_owed_what_is_written_not_what_is_flushed(tmp_path):
    store = start_store(tmp_path / "store", store={"flush": "async"})
    try:
        with stalls.attach(store.root, 0.0) as ctl:
            columns = stalls.sample(ctl, 0.05, 0.001)
    finally:
        assert store.stop() == 0
    assert columns["dispatchable"] is columns["written"]
