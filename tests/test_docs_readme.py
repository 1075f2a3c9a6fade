"""README.md's Python snippets run as written and show what they claim, and its comment on
`mqstore check` quotes what the command prints.

The snippets run in a tmp directory (their `./data`), the in-process one against
engine.store.MessageStore, the producer and consumer ones against a real supervisor.
"""

from __future__ import annotations

import contextlib
import io
import re
from pathlib import Path

import pytest

from ipc.producer import Producer
from tests.workers.store_harness import assert_check_clean, start_store
from tools.cli import main

README = Path(__file__).resolve().parent.parent / "README.md"
PYTHON_BLOCK = re.compile(r"^```python\n(.*?)^```", re.MULTILINE | re.DOTALL)


def snippet(marker: str) -> str:
    """The README's Python block containing `marker`."""
    blocks = [b for b in PYTHON_BLOCK.findall(README.read_text(encoding="utf-8")) if marker in b]
    assert blocks, f"README.md has no Python block with {marker!r}"
    return blocks[0]


def run_snippet(code: str) -> list[str]:
    """The lines the snippet printed."""
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        exec(compile(code, str(README), "exec"), {"__name__": "readme"})
    return printed.getvalue().splitlines()


def test_the_in_process_snippet_prints_the_status_by_name(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    lines = run_snippet(snippet("MessageStore.open"))
    assert lines[0].split()[0] == "PUT_OK", lines
    assert "b'hello'" in lines[1], lines
    assert_check_clean(tmp_path / "data")


@pytest.mark.slow
def test_the_consumer_snippet_reads_what_round_robin_put_on_every_queue(tmp_path, monkeypatch):
    running = start_store(tmp_path / "data")
    try:
        with Producer(running.root) as producer:  # round robin: one message on each of 4 queues
            earlier = [producer.send("orders", f"earlier-{i}".encode()) for i in range(4)]
        assert len({r.queue_id for r in earlier}) == 4
        monkeypatch.chdir(tmp_path)
        sent = run_snippet(snippet("Producer("))
        assert [line.split()[0] for line in sent] == ["PUT_OK"], sent
        running.wait_caught_up()
        read = run_snippet(snippet("Consumer("))
    finally:
        assert running.stop() == 0
    where = {(int(q), int(o)) for q, o, _ in (line.split(maxsplit=2) for line in read)}
    assert where == {(r.queue_id, r.queue_offset) for r in earlier} | {(0, 1)}, read
    assert_check_clean(running.root)


def test_the_check_comment_quotes_what_check_prints_on_a_consistent_store(tmp_path, capsys):
    from engine.store import MessageStore

    with MessageStore.open(tmp_path / "data") as store:
        store.put("orders", b"hello")
    assert main(["check", "--store", str(tmp_path / "data")]) == 0
    printed = capsys.readouterr().out.strip()
    [line] = [x for x in README.read_text(encoding="utf-8").splitlines() if "mqstore check" in x]
    assert f'"{printed}"' in line, (printed, line)
