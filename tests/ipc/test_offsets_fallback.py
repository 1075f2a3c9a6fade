"""A torn consumerOffset.json is replaced by its backup loudly: a WARNING in the consumer's
process and in mqstore.log, the bad file kept aside, the fallback counted for status/exporter."""

from __future__ import annotations

import json
import logging
import os
import subprocess

import pytest

from engine.errors import StoreError
from ipc.consumer_offsets import ConsumerOffsets
from ipc.offsets_fallbacks import OffsetFallbacks, fallbacks_path, read_fallbacks
from tools.console.events import recent_events
from workers.status_report import describe_offset_fallbacks, render_offset_fallbacks

DAMAGES = {"truncated": lambda text: text[: len(text) // 2], "garbage": lambda text: "\x00garbage{"}


def _two_commits(root) -> ConsumerOffsets:
    offsets = ConsumerOffsets(root)
    offsets.commit_many("g", {("T1", 0): 5, ("T1", 1): 3})
    offsets.commit_many("g", {("T1", 0): 9, ("T1", 1): 4})
    return offsets


@pytest.mark.parametrize("damage", sorted(DAMAGES))
def test_a_torn_primary_is_replaced_by_its_backup_with_a_warning_and_a_count(tmp_path, caplog, damage):
    offsets = _two_commits(tmp_path)
    bad_text = DAMAGES[damage](offsets.path.read_text())
    offsets.path.write_text(bad_text)
    with caplog.at_level(logging.WARNING, logger="ipc.consumer_offsets"):
        assert offsets.get("T1", "g", 0) == 5  # the backup, one commit older
    assert [r.levelno for r in caplog.records] == [logging.WARNING]
    warning = caplog.records[0].getMessage()
    assert "consumerOffset.json unreadable" in warning and "consumerOffset.json.bak" in warning
    log_lines = (tmp_path / "mqstore.log").read_text().splitlines()
    assert len(log_lines) == 1 and " WARNING " in log_lines[0] and "consumer[" in log_lines[0]
    assert "reads again what it consumed" in log_lines[0]
    [event] = recent_events(tmp_path)  # the console's event view reads the line as a warning
    assert event.kind == "warning" and "consumerOffset.json.bak" in event.message
    record = read_fallbacks(tmp_path)
    assert record.count == 1 and record.last_kept_as.startswith("consumerOffset.json.torn-")
    assert (offsets.path.parent / record.last_kept_as).read_text() == bad_text  # the evidence
    assert offsets.load() == {"T1@g": {0: 5, 1: 3}}  # the primary is sound again: no new fallback
    assert read_fallbacks(tmp_path).count == 1 and len(caplog.records) == 1
    assert "replaced by their backup 1 time(s)" in render_offset_fallbacks(
        describe_offset_fallbacks(tmp_path))


def test_a_commit_after_a_torn_primary_keeps_a_sound_backup(tmp_path):
    """The commit's read restores first, so the torn file never becomes the next `.bak`."""
    offsets = _two_commits(tmp_path)
    offsets.path.write_text('{"offsetTable": {"T1@g": {"0": ')
    offsets.commit("T1", "g", 1, 8)
    assert offsets.load() == {"T1@g": {0: 5, 1: 8}}
    assert ConsumerOffsets(tmp_path)._read_backup("-")[0] == {"T1@g": {0: 5, 1: 3}}
    assert read_fallbacks(tmp_path).count == 1


def test_a_removed_primary_beside_its_backup_is_a_fallback_too(tmp_path):
    offsets = _two_commits(tmp_path)
    offsets.path.unlink()
    assert offsets.load() == {"T1@g": {0: 5, 1: 3}}
    record = read_fallbacks(tmp_path)
    assert record.count == 1 and record.last_kept_as is None and "missing" in record.last_reason


def test_read_only_tools_read_past_a_torn_primary_and_change_nothing(tmp_path, caplog):
    offsets = _two_commits(tmp_path)
    offsets.path.write_text("garbage")
    before = sorted(os.listdir(offsets.path.parent))
    with caplog.at_level(logging.WARNING, logger="ipc.consumer_offsets"):
        assert offsets.peek_with_times()[0] == {"T1@g": {0: 5, 1: 3}}
    assert "until a consumer puts it back" in caplog.records[0].getMessage()
    assert sorted(os.listdir(offsets.path.parent)) == before and offsets.path.read_text() == "garbage"
    assert read_fallbacks(tmp_path) == OffsetFallbacks()


def test_both_files_bad_is_an_error_that_changes_nothing(tmp_path):
    offsets = _two_commits(tmp_path)
    offsets.path.write_text("garbage")
    offsets.backup_path.write_text("also garbage")
    before = {p.name: p.read_bytes() for p in offsets.path.parent.iterdir()}
    with pytest.raises(StoreError, match="consumer offsets unreadable") as caught:
        offsets.load()
    assert "consumerOffset.json.bak" in str(caught.value) and caught.value.hint
    assert {p.name: p.read_bytes() for p in offsets.path.parent.iterdir()} == before
    assert not fallbacks_path(tmp_path).exists()


def test_a_garbled_fallback_record_is_reported_not_fatal(tmp_path):
    fallbacks_path(tmp_path).parent.mkdir(parents=True)
    fallbacks_path(tmp_path).write_text("{nope")
    with pytest.raises(StoreError, match="fallback record unreadable"):
        read_fallbacks(tmp_path)
    assert describe_offset_fallbacks(tmp_path)["count"] is None
    offsets = _two_commits(tmp_path)
    offsets.path.write_text("garbage")
    offsets.load()
    assert read_fallbacks(tmp_path).count == 1  # starts over rather than block the fallback


@pytest.mark.slow
def test_a_consumer_process_falls_back_loudly_and_status_and_exporter_count_it(tmp_path):
    """Real processes: `mqstore consume` commits twice, the primary is truncated between runs;
    the next run reads again from the backup's offset and says so on its stderr and in
    mqstore.log, and `mqstore status` and the exporter's counter show the fallback."""
    from ipc.producer import Producer
    from tests.workers.store_harness import checked_store, cli
    from tools.exporter import StoreCollector

    def consume(count: int) -> subprocess.CompletedProcess:
        result = cli("consume", "--store", str(store.root), "--topic", "Torn", "--group", "g",
                     "--queue-id", "0", "--max", str(count), "--timeout-ms", "0", "--json")
        assert result.returncode == 0, result.stderr.decode()
        return result

    def counter() -> float:
        [family] = [f for f in StoreCollector(store.root).collect()
                    if f.name == "mqstore_consumer_offset_fallbacks"]
        return family.samples[0].value

    with checked_store(tmp_path / "store") as store:
        with Producer(store.root) as producer:
            for i in range(10):
                assert producer.send("Torn", f"m{i}".encode(), queue_id=0).ok
        store.wait_caught_up()
        consume(4)
        consume(3)  # the primary says 7, the backup 4
        assert counter() == 0
        offsets = ConsumerOffsets(store.root)
        offsets.path.write_bytes(offsets.path.read_bytes()[:20])
        again = consume(10)
        bodies = [json.loads(line)["body"] for line in again.stdout.decode().splitlines()]
        assert bodies == [f"m{i}" for i in range(4, 10)]  # 4..6 again: the backup's offset
        stderr = again.stderr.decode()
        assert "WARNING" in stderr and "consumerOffset.json unreadable" in stderr
        logged = [line for line in (store.root / "mqstore.log").read_text().splitlines()
                  if "consumerOffset.json unreadable" in line]
        assert len(logged) == 1 and " WARNING " in logged[0] and " consumer[" in logged[0]
        status = cli("status", "--store", str(store.root), "--json")
        assert json.loads(status.stdout)["offset_fallbacks"]["count"] == 1
        text = cli("status", "--store", str(store.root)).stdout.decode()
        assert "consumer offsets: replaced by their backup 1 time(s)" in text
        assert counter() == 1


@pytest.mark.parametrize("stored", ["null", "7.9", "true", '"7"'])
def test_a_non_integer_offset_falls_back_to_the_backup(tmp_path, stored):
    """null crashed the reader (TypeError), true read as 1 and 7.9 as 7: each is garbage."""
    offsets = _two_commits(tmp_path)
    offsets.path.write_text('{"offsetTable": {"T1@g": {"0": ' + stored + ', "1": 4}}}')
    assert offsets.peek_with_times()[0] == {"T1@g": {0: 5, 1: 3}}  # read past, not replaced
    assert read_fallbacks(tmp_path).count == 0
    assert offsets.load() == {"T1@g": {0: 5, 1: 3}}
    assert read_fallbacks(tmp_path).count == 1


def test_a_garbled_fallback_record_keeps_the_count_it_still_holds(tmp_path):
    """The count only grows: a record whose other fields are bad still gives its count."""
    fallbacks_path(tmp_path).parent.mkdir(parents=True)
    fallbacks_path(tmp_path).write_text('{"count": 4, "last_reason": null, "junk": 1}')
    offsets = _two_commits(tmp_path)
    offsets.path.write_text("garbage")
    offsets.load()
    assert read_fallbacks(tmp_path).count == 5
