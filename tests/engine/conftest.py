"""Fixtures for the engine tests: a small store layout and a fake clock for the store's time."""

from __future__ import annotations

import pytest

from engine import store as store_module
from engine.config import StoreConfig
from tests.helpers import SMALL_CONFIG, FakeClock


@pytest.fixture
def small_config() -> StoreConfig:
    """4 KiB segments, 10-entry consume-queue files, 64-slot/256-entry index files, 2 shards."""
    return SMALL_CONFIG


@pytest.fixture
def clock(monkeypatch, request) -> FakeClock:
    """The store's clock (born and store timestamps, checkpoint and disk-check timing); it starts
    at the test module's `CLOCK_START_MS` where one is set (retention compares with the wall clock)."""
    fake = FakeClock(getattr(request.module, "CLOCK_START_MS", FakeClock().now_ms))
    monkeypatch.setattr(store_module, "_now_ms", fake)
    return fake
