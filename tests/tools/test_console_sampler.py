"""The console's status sampler on a real stopped store: it samples while asked and sleeps
once nobody asks, waking on the next request."""

from __future__ import annotations

from tests.workers.store_harness import assert_check_clean, start_store, wait_for
from tools.console.sampler import StatusSampler


def test_the_sampler_sleeps_without_viewers_and_wakes_on_the_next_request(tmp_path):
    store = start_store(tmp_path / "store")
    assert store.stop() == 0
    sampler = StatusSampler(store.root, sample_s=0.05, idle_after_s=0.3).start()
    try:
        first = wait_for(lambda: sampler.snapshot()["status"], "a first sample")
        assert first["state"] == "STOPPED" and first["running"] is False
        wait_for(sampler.idle.is_set, "the sampler to go idle without requests")
        points = len(sampler.snapshot()["history"])  # a request: it samples again
        wait_for(lambda: len(sampler.snapshot()["history"]) > points, "a sample after waking")
        assert not sampler.idle.is_set()
    finally:
        sampler.stop()
    assert_check_clean(store.root)
