"""The retention line: a commitlog whose first segments are gone, and not by retention, refuses
a routine start (DESIGN §4: a store never shrinks by surprise); retention, a crash in the
middle of it, a store from before the line and an unreadable line do not."""

from __future__ import annotations

import pytest

from engine.check.findings import FindingKind
from engine.check.fsck import check
from engine.errors import BadInputError, CheckpointError, LostHeadError
from engine.files.naming import RETENTION_LINE_FILE, commitlog_dir
from engine.formats.retention_line import (
    RETENTION_LINE_SIZE,
    decode_retention_line,
    encode_retention_line,
)
from engine.message import Message
from engine.retention.expiry import remove_segments
from engine.retention.line import raise_retention_line, read_retention_line
from engine.store import MessageStore
from tests.helpers import SEGMENT_BYTES, SMALL_CONFIG, TOPIC, open_refused, rebuild


def build(root, count: int = 200) -> None:
    """A cleanly stopped store of `count` messages over several segments, each with a key."""
    with MessageStore.open(root, SMALL_CONFIG) as store:
        results = store.put_batch([Message(TOPIC, b"m%04d" % i + b"." * 90, keys=(f"k{i}",), queue_id=i % 2)
                                   for i in range(count)])
        assert all(r.ok for r in results)
        assert len(store.commitlog.segments.segments) > 3


def segments(root) -> list:
    return sorted(commitlog_dir(root).iterdir())


def test_the_line_round_trips_and_refuses_what_it_cannot_vouch_for():
    assert decode_retention_line(encode_retention_line(8192)) == 8192
    good = encode_retention_line(4096)
    assert len(good) == RETENTION_LINE_SIZE
    for bad, reason in [(good[:-1], "15 bytes"), (b"X" + good[1:], "magic"),
                        (good[:6] + bytes([good[6] ^ 1]) + good[7:], "CRC32C")]:
        with pytest.raises(CheckpointError, match=reason):
            decode_retention_line(bad)
    with pytest.raises(BadInputError, match="commit position"):
        encode_retention_line(-1)


def test_a_new_store_starts_its_line_at_zero(tmp_path):
    build(tmp_path)
    assert read_retention_line(tmp_path) == 0


def test_a_missing_first_segment_refuses_the_start_until_the_operator_accepts_it(tmp_path):
    build(tmp_path)
    segments(tmp_path)[0].unlink()
    refused = open_refused(tmp_path)  # and every file as it was
    assert isinstance(refused, LostHeadError)
    assert (refused.commit_pos, refused.log_min_pos) == (0, SEGMENT_BYTES)
    assert "recover --rebuild" in str(refused) and "segments between are missing" in str(refused)
    assert {f.kind for f in check(tmp_path)} == {FindingKind.LAYOUT}
    rebuild(tmp_path).close()  # the operator accepts the loss
    assert read_retention_line(tmp_path) == SEGMENT_BYTES
    MessageStore.open(tmp_path, SMALL_CONFIG).close()
    assert check(tmp_path) == []


def test_retention_moves_the_line_first_and_a_crash_before_the_removal_is_fine(tmp_path):
    build(tmp_path)
    with MessageStore.open(tmp_path, SMALL_CONFIG) as store:
        names = [path.name for path in segments(tmp_path)[:2]]
        assert remove_segments(store.commitlog, [0, SEGMENT_BYTES]) == names
    assert read_retention_line(tmp_path) == 2 * SEGMENT_BYTES
    MessageStore.open(tmp_path, SMALL_CONFIG).close()  # retention removed them: not refused
    raise_retention_line(tmp_path, 4 * SEGMENT_BYTES)  # a crash after the line moved, before removal
    MessageStore.open(tmp_path, SMALL_CONFIG).close()
    assert read_retention_line(tmp_path) == 2 * SEGMENT_BYTES  # settled where the log starts
    assert check(tmp_path) == []


@pytest.mark.parametrize("line_file", ["missing", "unreadable"])
def test_a_store_whose_line_cannot_vouch_is_not_refused_and_gets_one(tmp_path, line_file):
    build(tmp_path)
    path = tmp_path / RETENTION_LINE_FILE
    if line_file == "missing":  # a store from before the line
        path.unlink()
    else:
        path.write_bytes(b"garbage")
    segments(tmp_path)[0].unlink()  # cannot be told from retention without a line
    MessageStore.open(tmp_path, SMALL_CONFIG).close()
    assert read_retention_line(tmp_path) == SEGMENT_BYTES
    assert check(tmp_path) == []
