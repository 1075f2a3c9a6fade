"""tools.start_settings.fit_body_limit: the body limit `mqstore start` runs with fits a segment."""

from __future__ import annotations

import logging

import pytest

from engine.config import StoreConfig, max_body_room_bytes
from engine.errors import BadInputError
from tools.start_settings import fit_body_limit

SEGMENT_BYTES = 64 * 1024


def test_an_asked_body_limit_past_the_segment_is_refused_naming_both():
    config = StoreConfig(max_body_bytes=SEGMENT_BYTES)
    with pytest.raises(BadInputError, match=f"{SEGMENT_BYTES} does not fit a commitlog segment of "
                                            f"{SEGMENT_BYTES} bytes") as refused:
        fit_body_limit(config, SEGMENT_BYTES, {"max_body_bytes": (SEGMENT_BYTES, "store.toml")})
    assert refused.value.field == "max_body_bytes"


def test_an_asked_body_limit_that_fits_is_kept():
    room_bytes = max_body_room_bytes(SEGMENT_BYTES)
    config = StoreConfig(max_body_bytes=room_bytes)
    assert fit_body_limit(config, SEGMENT_BYTES, {"max_body_bytes": (room_bytes, "store.toml")}) == config


def test_the_default_body_limit_is_lowered_to_what_fits_and_said(caplog):
    with caplog.at_level(logging.WARNING):
        fitted = fit_body_limit(StoreConfig(), SEGMENT_BYTES, {})
    assert fitted.max_body_bytes == max_body_room_bytes(SEGMENT_BYTES) < StoreConfig().max_body_bytes
    assert f"{fitted.max_body_bytes} is used" in caplog.text
    assert fit_body_limit(StoreConfig(), 1 << 30, {}) == StoreConfig()  # the default fits 1 GiB
