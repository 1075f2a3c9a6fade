"""ipc.topic_requests against hostile files in run/topic-requests: whatever is named `*.json`
(a directory, a FIFO, a link, deep or huge JSON) is answered with why and renamed `.bad`,
never raised out of the supervisor's loop or blocking it; a flood is taken a few per look."""

from __future__ import annotations

import json
import os
import threading
import time

import pytest

from engine.errors import BadInputError
from engine.topics.table import TopicChange
from ipc.topic_requests import (
    MAX_REQUEST_BYTES,
    MAX_REQUESTS_PER_TICK,
    STALE_S,
    pending_requests,
    post_request,
    remove_stale_answers,
    requests_dir,
)

GOOD = {"op": "create", "topic": "T", "queues": 2, "perm": None}


def answer_of(directory, stem: str) -> dict:
    return json.loads((directory / f"{stem}.answer").read_text())


def served_after(tmp_path, make_bad) -> tuple[list, object]:
    """pending_requests over one bad entry `1-bad.json` and then a good request."""
    directory = requests_dir(tmp_path)
    directory.mkdir(parents=True)
    make_bad(directory / "1-bad.json")
    good = post_request(tmp_path, GOOD)
    return pending_requests(tmp_path), good


@pytest.mark.parametrize("make_bad, why", [
    (lambda path: path.mkdir(), "not a regular file"),
    (lambda path: path.write_text("[" * 200_000 + "]" * 200_000), "unreadable request"),
    (lambda path: path.write_bytes(b" " * (MAX_REQUEST_BYTES + 1)), f"more than {MAX_REQUEST_BYTES}"),
    (lambda path: path.write_bytes(b"\xff{}"), "unreadable request"),
    (lambda path: path.write_text("[1, 2]"), "a request is a JSON object, not list"),
], ids=["directory", "deep-json", "too-large", "not-utf8", "not-an-object"])
def test_a_bad_request_is_answered_and_moved_aside_and_the_next_is_served(tmp_path, make_bad, why):
    served, good = served_after(tmp_path, make_bad)
    directory = requests_dir(tmp_path)
    assert [request.path for request in served] == [good]
    assert why in answer_of(directory, "1-bad")["error"]
    assert not (directory / "1-bad.json").exists() and (directory / "1-bad.bad").exists()
    assert pending_requests(tmp_path)[0].path == good  # never looked at again


def test_a_link_named_like_a_request_is_not_followed(tmp_path):
    target = tmp_path / "elsewhere.json"
    target.write_text(json.dumps(GOOD))
    served, good = served_after(tmp_path, lambda path: path.symlink_to(target))
    assert [request.path for request in served] == [good]
    assert "unreadable request" in answer_of(requests_dir(tmp_path), "1-bad")["error"]
    assert target.read_text() == json.dumps(GOOD)  # what it pointed at is untouched


def test_a_fifo_named_like_a_request_does_not_block_the_look(tmp_path):
    results: list = []
    looking = threading.Thread(target=lambda: results.append(served_after(tmp_path, os.mkfifo)),
                               daemon=True)
    looking.start()
    looking.join(timeout=30)  # a blocking open() of the FIFO never returns: this is the deadline
    assert not looking.is_alive(), "pending_requests blocked on the FIFO"
    served, good = results[0]
    assert [request.path for request in served] == [good]
    assert "not a regular file" in answer_of(requests_dir(tmp_path), "1-bad")["error"]


def test_a_flood_of_requests_is_taken_a_few_per_look(tmp_path):
    directory = requests_dir(tmp_path)
    directory.mkdir(parents=True)
    for i in range(MAX_REQUESTS_PER_TICK + 5):
        (directory / f"{i:03d}-garbage.json").write_text("not json")
    assert pending_requests(tmp_path) == []
    assert len(list(directory.glob("*.bad"))) == MAX_REQUESTS_PER_TICK
    assert len(list(directory.glob("*.json"))) == 5


def test_stale_answers_are_removed_and_fresh_ones_kept(tmp_path):
    directory = requests_dir(tmp_path)
    directory.mkdir(parents=True)
    old, fresh = directory / "1-old.answer", directory / "2-fresh.answer"
    old.write_text("{}")
    fresh.write_text("{}")
    stale_s = time.time() - STALE_S - 1
    os.utime(old, (stale_s, stale_s))
    remove_stale_answers(tmp_path)
    assert not old.exists() and fresh.exists()


def test_a_change_whose_perm_is_not_an_integer_is_refused():
    with pytest.raises(BadInputError, match=r"perm 6\.9 is not an integer"):
        TopicChange.from_dict({**GOOD, "perm": 6.9})
    with pytest.raises(BadInputError, match="perm True is not an integer"):
        TopicChange.from_dict({**GOOD, "perm": True})
