"""store.json codec: stable JSON, version gate, malformed files."""

from __future__ import annotations

import json

import pytest

from engine.config import StoreConfig
from engine.errors import FormatVersionError, NotAStoreError
from engine.formats.store_meta import (
    FORMAT_VERSION,
    StoreMeta,
    decode_store_meta,
    encode_store_meta,
    from_config,
)

META = StoreMeta(format_version=1, commitlog_file_size=1 << 20, consume_queue_entries=1000,
                 index_slot_count=64, index_entry_count=256, index_shards=2, checksum="crc32c",
                 store_host="127.0.0.1:10911")


def meta_dict(**changes) -> dict:
    data = json.loads(encode_store_meta(META))
    data.update(changes)
    return data


def test_encode_is_sorted_indented_json_with_newline():
    raw = encode_store_meta(META)
    assert raw.endswith(b"}\n")
    text = raw.decode()
    assert text == json.dumps(json.loads(text), sort_keys=True, indent=2) + "\n"
    assert list(json.loads(text)) == sorted(json.loads(text))


def test_round_trip():
    assert decode_store_meta(encode_store_meta(META)) == META
    assert decode_store_meta(encode_store_meta(META).decode()) == META


def test_from_config_copies_layout_sizes():
    config = StoreConfig(commitlog_file_size=8192, consume_queue_entries=10, index_slot_count=5,
                         index_entry_count=9, index_shards=3, store_host="10.0.0.1:1234", queue_count=6,
                         message_delay_level="100ms 2s")
    meta = from_config(config)
    assert meta == StoreMeta(format_version=FORMAT_VERSION, commitlog_file_size=8192,
                             consume_queue_entries=10, index_slot_count=5, index_entry_count=9,
                             index_shards=3, checksum="crc32c", store_host="10.0.0.1:1234",
                             queue_count=6, message_delay_level="100ms 2s")
    assert json.loads(encode_store_meta(meta))["queue_count"] == 6


def test_queue_count_is_optional_for_stores_made_before_it_was_recorded():
    assert "queue_count" not in json.loads(encode_store_meta(META))
    assert decode_store_meta(encode_store_meta(META)).queue_count is None
    assert decode_store_meta(json.dumps(meta_dict(queue_count=16))).queue_count == 16


def test_newer_format_version_is_refused():
    raw = json.dumps(meta_dict(format_version=FORMAT_VERSION + 1))
    with pytest.raises(FormatVersionError) as info:
        decode_store_meta(raw, path="/x/store.json")
    assert info.value.path == "/x/store.json"


def test_unknown_keys_are_ignored():
    assert decode_store_meta(json.dumps(meta_dict(future_field=1))) == META


@pytest.mark.parametrize("raw", [
    b"",
    b"{not json",
    b"[1, 2]",
    b"\xff\xfe",
    json.dumps({k: v for k, v in meta_dict().items() if k != "index_shards"}),
    json.dumps(meta_dict(commitlog_file_size="big")),
    json.dumps(meta_dict(index_shards=0)),
    json.dumps(meta_dict(index_shards=65)),
    json.dumps(meta_dict(queue_count=0)),
    json.dumps(meta_dict(queue_count="8")),
    json.dumps(meta_dict(queue_count=1025)),
    json.dumps(meta_dict(index_slot_count=True)),
    json.dumps(meta_dict(checksum="md5")),
    json.dumps(meta_dict(store_host="nohost")),
    json.dumps(meta_dict(store_host=5)),
])
def test_malformed_store_json_is_not_a_store(raw):
    with pytest.raises(NotAStoreError):
        decode_store_meta(raw)
