"""DESIGN §7 for the engine: every bad input gets a clear, specific error or status and changes
nothing on disk (every file's bytes and the directory listing are compared before and after)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from engine import store as store_module
from engine.errors import (
    BadInputError,
    FormatVersionError,
    NotAStoreError,
    ReadOnlyStoreError,
    StoreLockedError,
)
from engine.files.naming import STORE_META_FILE
from engine.formats.record import MAX_PROPERTIES_BYTES, MAX_TOPIC_BYTES
from engine.message import Message
from engine.status import PutStatus
from engine.store import MessageStore
from tests.conftest import ROCKETMQ_SAMPLES
from tests.helpers import SMALL_CONFIG, TOPIC, snapshot
from workers.child_env import REPO_ROOT, child_env

CONFIG = SMALL_CONFIG.replace(max_body_bytes=1000)  # queue_count 4
NOBODY = 65534


@pytest.fixture
def store(tmp_path):
    with MessageStore.open(tmp_path / "store", CONFIG) as opened:
        assert opened.put(TOPIC, b"first", keys=("k0",)).ok
        yield opened


def assert_refused_and_unchanged(store: MessageStore, messages: list[Message], status: PutStatus,
                                 field: str) -> None:
    before = snapshot(store.root)
    results = store.put_batch(messages)
    assert [r.status for r in results] == [status] * len(messages)
    for r in results:
        assert r.commit_pos is None and r.queue_offset is None
        assert field in r.reason, r.reason
    assert snapshot(store.root) == before
    assert store.put(TOPIC, b"next").queue_offset == 1  # no offset was used up


# ------------------------------------------------------------------------------ puts

BAD_PUTS = {
    # name: (message, status, the field the reason names)
    "body_too_large": (Message(TOPIC, b"x" * 1001), PutStatus.MESSAGE_ILLEGAL, "body"),
    "body_larger_than_a_segment": (Message(TOPIC, b"x" * 999, properties={"p": "v" * 3500}),
                                   PutStatus.MESSAGE_ILLEGAL, "segment"),
    "body_not_bytes": (Message(TOPIC, "text"), PutStatus.MESSAGE_ILLEGAL, "body"),
    "properties_too_large": (Message(TOPIC, b"x", properties={"p": "v" * MAX_PROPERTIES_BYTES}),
                             PutStatus.PROPERTIES_SIZE_EXCEEDED, "properties"),
    "topic_empty": (Message("", b"x"), PutStatus.MESSAGE_ILLEGAL, "topic"),
    "topic_too_long": (Message("t" * (MAX_TOPIC_BYTES + 1), b"x"), PutStatus.MESSAGE_ILLEGAL, "topic"),
    "topic_multibyte_too_long": (Message("é" * 64, b"x"), PutStatus.MESSAGE_ILLEGAL, "topic"),
    "topic_slash": (Message("a/b", b"x"), PutStatus.MESSAGE_ILLEGAL, "topic"),
    "topic_dotdot": (Message("..", b"x"), PutStatus.MESSAGE_ILLEGAL, "topic"),
    "topic_dot": (Message(".", b"x"), PutStatus.MESSAGE_ILLEGAL, "topic"),
    "topic_space": (Message("a b", b"x"), PutStatus.MESSAGE_ILLEGAL, "topic"),
    "topic_nul": (Message("a\0b", b"x"), PutStatus.MESSAGE_ILLEGAL, "topic"),
    "topic_not_str": (Message(42, b"x"), PutStatus.MESSAGE_ILLEGAL, "topic"),
    "topic_lone_surrogate": (Message("t\udcff", b"x"), PutStatus.MESSAGE_ILLEGAL, "topic"),
    "queue_id_too_big": (Message(TOPIC, b"x", queue_id=CONFIG.queue_count), PutStatus.MESSAGE_ILLEGAL,
                         "queue_id"),
    "queue_id_negative": (Message(TOPIC, b"x", queue_id=-1), PutStatus.MESSAGE_ILLEGAL, "queue_id"),
    "queue_id_str": (Message(TOPIC, b"x", queue_id="1"), PutStatus.MESSAGE_ILLEGAL, "queue_id"),
    "queue_id_float": (Message(TOPIC, b"x", queue_id=1.0), PutStatus.MESSAGE_ILLEGAL, "queue_id"),
    "queue_id_bool": (Message(TOPIC, b"x", queue_id=True), PutStatus.MESSAGE_ILLEGAL, "queue_id"),
    "key_lone_surrogate": (Message(TOPIC, b"x", keys=("\udcff",)), PutStatus.MESSAGE_ILLEGAL, "keys"),
    "key_with_space": (Message(TOPIC, b"x", keys=("a b",)), PutStatus.MESSAGE_ILLEGAL, "keys"),
    "key_empty": (Message(TOPIC, b"x", keys=("",)), PutStatus.MESSAGE_ILLEGAL, "keys"),
    "key_separator": (Message(TOPIC, b"x", keys=("a\x01",)), PutStatus.MESSAGE_ILLEGAL, "keys"),
    "keys_bytes": (Message(TOPIC, b"x", keys=b"k"), PutStatus.MESSAGE_ILLEGAL, "keys"),
    "keys_int": (Message(TOPIC, b"x", keys=7), PutStatus.MESSAGE_ILLEGAL, "keys"),
    "tags_lone_surrogate": (Message(TOPIC, b"x", tags="\udcff"), PutStatus.MESSAGE_ILLEGAL, "tags"),
    "tags_empty": (Message(TOPIC, b"x", tags=""), PutStatus.MESSAGE_ILLEGAL, "tags"),
    "property_value_surrogate": (Message(TOPIC, b"x", properties={"p": "\ud800"}),
                                 PutStatus.MESSAGE_ILLEGAL, "property"),
    "property_name_surrogate": (Message(TOPIC, b"x", properties={"\udcff": "v"}),
                                PutStatus.MESSAGE_ILLEGAL, "property"),
    "property_reserved": (Message(TOPIC, b"x", properties={"UNIQ_KEY": "mine"}),
                          PutStatus.MESSAGE_ILLEGAL, "properties"),
}


def with_marks(names, marked: dict) -> list:
    return [pytest.param(name, marks=marked[name], id=name) if name in marked else
            pytest.param(name, id=name) for name in sorted(names)]


@pytest.mark.parametrize("name", with_marks(BAD_PUTS, {}))
def test_bad_put_gets_a_status_and_changes_nothing(store, name):
    message, status, field = BAD_PUTS[name]
    assert_refused_and_unchanged(store, [message], status, field)


def test_limits_themselves_are_accepted(store):
    ok = store.put_batch([Message("t" * MAX_TOPIC_BYTES, b"x" * 1000),
                          Message("A-b_c%d|e", b"x", queue_id=CONFIG.queue_count - 1, keys=("ключ",),
                                  tags="タグ")])
    assert all(r.ok for r in ok)
    assert store.query_by_key("A-b_c%d|e", "ключ")[0].tags == "タグ"


BAD_READS = {
    "get_topic_traversal": lambda s: s.get_messages("../evil", 0, 0),
    "get_topic_empty": lambda s: s.get_messages("", 0, 0),
    "get_topic_lone_surrogate": lambda s: s.get_messages("t\udcff", 0, 0),
    "get_queue_negative": lambda s: s.get_messages(TOPIC, -1, 0),
    "get_queue_str": lambda s: s.get_messages(TOPIC, "0", 0),
    "query_key_surrogate": lambda s: s.query_by_key(TOPIC, "\udcff"),
    "query_key_not_str": lambda s: s.query_by_key(TOPIC, 7),
    "query_topic_slash": lambda s: s.query_by_key("a/b", "k0"),
    "read_at_negative": lambda s: s.read_at(-5),
    "read_at_past_end": lambda s: s.read_at(1 << 40),
    "offset_for_time_dotdot": lambda s: s.offset_for_time("..", 0, 0),
    "max_offset_topic_slash": lambda s: s.max_offset("x/..", 0),
}


@pytest.mark.parametrize("name", with_marks(BAD_READS, {}))
def test_bad_read_raises_bad_input_and_changes_nothing(store, name):
    before = snapshot(store.root)
    with pytest.raises(BadInputError):
        BAD_READS[name](store)
    assert snapshot(store.root) == before
    assert not (store.root.parent / "evil").exists()


def test_disk_full_refuses_puts_and_writes_resume_when_space_returns(tmp_path, monkeypatch, clock):
    usage = [0.95]
    monkeypatch.setattr(store_module, "disk_usage_ratio", lambda path: usage[0])
    with MessageStore.open(tmp_path, CONFIG) as store:
        before = snapshot(tmp_path)
        results = store.put_batch([Message(TOPIC, b"a"), Message(TOPIC, b"b")])
        assert [r.status for r in results] == [PutStatus.DISK_FULL] * 2
        assert "disk" in results[0].reason and results[0].commit_pos is None
        assert snapshot(tmp_path) == before
        usage[0] = 0.5
        assert store.put(TOPIC, b"c").status is PutStatus.DISK_FULL  # until the next disk check
        clock.advance(store_module.DISK_CHECK_INTERVAL_MS)
        resumed = store.put(TOPIC, b"c")
        assert resumed.ok and resumed.queue_offset == 0


# ------------------------------------------------------------------------------ directories


def open_refused(root: Path, error: type[Exception], config=CONFIG) -> Exception:
    before = snapshot(root) if root.exists() else None
    with pytest.raises(error) as exc:
        MessageStore.open(root, config)
    after = snapshot(root) if root.exists() else None
    assert after == before
    assert str(root) in str(exc.value)
    return exc.value


def test_directory_that_is_not_a_store(tmp_path):
    (tmp_path / "notes.txt").write_text("mine")
    (tmp_path / "photos").mkdir()
    err = open_refused(tmp_path, NotAStoreError)
    assert err.hint


def test_a_regular_file_is_not_a_store(tmp_path):
    path = tmp_path / "file"
    path.write_bytes(b"x")
    open_refused(path, NotAStoreError)
    assert path.read_bytes() == b"x"


def _edit_meta(root: Path, **changes) -> None:
    meta = json.loads((root / STORE_META_FILE).read_text())
    meta.update(changes)
    (root / STORE_META_FILE).write_text(json.dumps(meta))


def test_newer_format_version_is_refused(tmp_path):
    MessageStore.open(tmp_path, CONFIG).close()
    _edit_meta(tmp_path, format_version=999)
    err = open_refused(tmp_path, FormatVersionError)
    assert "999" in str(err) and err.hint


@pytest.mark.parametrize("content", [b"{not json", b"[]", b'{"format_version": 1}'])
def test_malformed_store_json_is_not_a_store(tmp_path, content):
    MessageStore.open(tmp_path, CONFIG).close()
    (tmp_path / STORE_META_FILE).write_bytes(content)
    open_refused(tmp_path, NotAStoreError)


@pytest.mark.parametrize("sample", ["store-2019", "store-2021"])
def test_rocketmq_written_store_is_never_opened_for_writing(tmp_path, sample):
    root = shutil.copytree(ROCKETMQ_SAMPLES / sample, tmp_path / sample)
    err = open_refused(root, ReadOnlyStoreError)
    assert "RocketMQ" in str(err) and err.hint


def test_second_writer_in_this_process_is_refused(store):
    open_refused(store.root, StoreLockedError)


CHILD_OPEN = r"""
import os, sys
from engine.store import MessageStore  # imported first: the interpreter is not readable by nobody
from engine.errors import StoreError
if len(sys.argv) > 2:
    os.setgid(int(sys.argv[2])); os.setgroups([]); os.setuid(int(sys.argv[2]))
try:
    MessageStore.open(sys.argv[1])
except StoreError as exc:
    print(type(exc).__name__, exc)
else:
    print("opened")
"""


def open_in_child(root: Path, *uid: int) -> str:
    proc = subprocess.run([sys.executable, "-c", CHILD_OPEN, str(root), *map(str, uid)],
                          cwd=REPO_ROOT, capture_output=True, text=True, timeout=60,
                          env=child_env())
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.strip()


def test_second_writer_in_another_process_is_refused(store):
    before = snapshot(store.root)
    out = open_in_child(store.root)
    assert out.startswith("StoreLockedError") and f"pid {os.getpid()}" in out
    assert snapshot(store.root) == before


@pytest.fixture
def foreign_store():
    """A store created by root under a directory everybody may traverse (tmp_path's parents are
    root-only, so another user could not even reach it)."""
    if os.geteuid() != 0:
        pytest.skip("needs root to create a store another user cannot open")
    parent = Path(tempfile.mkdtemp(prefix="mqstore-perm-"))
    parent.chmod(0o755)
    root = parent / "store"
    with MessageStore.open(root, CONFIG) as store:
        store.put(TOPIC, b"root's", keys=("k",))
    try:
        yield root
    finally:
        shutil.rmtree(parent)


@pytest.mark.parametrize("layout", ["store_dir_owner_only", "files_owner_only", "parent_closed"])
def test_store_of_another_user_is_a_permission_error_and_nothing_changes(foreign_store, layout):
    root = foreign_store
    assert root.stat().st_mode & 0o777 == 0o700  # as the store creates it
    if layout == "files_owner_only":
        root.chmod(0o755)
    elif layout == "parent_closed":
        root.parent.chmod(0o700)
    before = snapshot(root)
    out = open_in_child(root, NOBODY)
    assert out.startswith("StorePermissionError"), out
    assert "another user" in out
    assert snapshot(root) == before  # no partial attach: no lock, no abort, no recovery
    MessageStore.open(root, CONFIG).close()  # and the owner is not locked out
