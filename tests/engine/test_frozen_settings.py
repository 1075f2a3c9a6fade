"""The settings store.json freezes: what a later start may not change, and what it may."""

from __future__ import annotations

import dataclasses

import pytest

from engine.errors import FrozenSettingError
from engine.formats.store_meta import StoreMeta
from engine.frozen_settings import refuse_changed_settings

META = StoreMeta(format_version=1, commitlog_file_size=4096, consume_queue_entries=10,
                 index_slot_count=64, index_entry_count=256, index_shards=2, queue_count=4)


def test_every_differing_frozen_setting_is_named_with_both_values(tmp_path):
    asked = {"queue_count": (8, "a.toml"), "index_shards": (3, "--index-shards"),
             "commitlog_file_size": (4096, "a.toml"), "max_body_bytes": (1, "a.toml")}
    with pytest.raises(FrozenSettingError) as caught:
        refuse_changed_settings(META, asked, tmp_path)
    assert caught.value.conflicts == [("index_shards", 2, 3, "--index-shards"),
                                      ("queue_count", 4, 8, "a.toml")]
    assert "index_shards: the store has 2, --index-shards asks for 3" in str(caught.value)


def test_equal_values_unfrozen_settings_and_an_unrecorded_queue_count_pass(tmp_path):
    refuse_changed_settings(META, {"index_shards": (2, "x"), "flush": ("async", "x")}, tmp_path)
    legacy = dataclasses.replace(META, queue_count=None)
    refuse_changed_settings(legacy, {"queue_count": (8, "x")}, tmp_path)  # older store: not frozen
