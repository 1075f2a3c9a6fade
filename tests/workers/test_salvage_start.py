"""`mqstore recover --salvage` with real processes (issue 19 item 2): a crashed sync store with
a flipped byte in a middle record below the checkpoint's flushed position (its consume queues
and index durable only before it, as when they lag). `mqstore start`
refuses; the salvage keeps the whole log in place and accepts the damaged record; `mqstore
start` then serves, and `mqstore consume` prints every other record and reports the damaged one.
"""

from __future__ import annotations

import json
from pathlib import Path

from engine.check.fsck import check_summary
from engine.formats.record import BODY_OFFSET
from engine.recovery.checkpoint import load_checkpoint
from tests.engine.recovery.test_durable_line import lag_derived_positions
from tests.workers.store_harness import assert_check_clean, cli, start_store, wait_for
from tests.workers.test_durable_line_start import crash, data_files, log_bytes, send, start_detached
from tools.torture.faults import flip_byte, record_spans
from tools.torture.verify import store_config

TOPIC = "durable"
COUNT = 40


def recover(root: Path, config: Path, *flags: str):
    return cli("recover", "--store", str(root), "--config", str(config), *flags)


def test_salvage_after_a_refused_start_keeps_every_valid_record_and_start_serves(tmp_path):
    root = tmp_path / "store"
    store = start_store(root)
    config = root.parent / f"{root.name}.toml"
    send(root, COUNT)
    locked = recover(root, config, "--salvage")
    assert locked.returncode != 0 and b"already in use by pid" in locked.stderr, locked.stderr
    wait_for(lambda: load_checkpoint(root).checkpoint.commitlog_flushed_pos == len(
        log_bytes(root).rstrip(b"\0")), "a checkpoint of every record")
    crash(store)
    spans = record_spans(root, store_config(root))
    path, file_pos, size, commit_pos = spans[COUNT // 2]
    lag_derived_positions(root, spans[COUNT // 4][3])  # the restart scans across the damage
    flip_byte(path, file_pos + BODY_OFFSET, 0x04)
    damaged = log_bytes(root)
    before = data_files(root)
    started = start_detached(root, config)
    assert started.returncode == 1 and b"recover --salvage" in started.stderr, started.stderr
    both = recover(root, config, "--salvage", "--rebuild")
    assert both.returncode == 2 and b"not allowed with" in both.stderr, both.stderr
    assert data_files(root) == before
    salvaged = recover(root, config, "--salvage", "--json")
    assert salvaged.returncode == 0, salvaged.stderr
    report = json.loads(salvaged.stdout)
    assert report["mode"] == "salvage" and report["quarantine_path"] is None
    assert [(d["start_pos"], d["end_pos"]) for d in report["damage_accepted"]] == \
        [(commit_pos, commit_pos + size)]
    assert log_bytes(root).rstrip(b"\0") == damaged.rstrip(b"\0")  # every byte in place
    assert Path(report["damage_accepted"][0]["copy_path"]).read_bytes() == \
        damaged[commit_pos:commit_pos + size]
    assert_check_clean(root)
    assert [f.pos for f in check_summary(root).accepted] == [commit_pos]
    again = recover(root, config, "--salvage")
    assert again.returncode == 2 and b"nothing to salvage" in again.stderr, again.stderr
    store = start_store(root)
    consumed = cli("consume", "--store", str(root), "--topic", TOPIC, "--queue-id", "0",
                   "--offset", "0", "--json")
    send(root, 1)
    assert store.stop() == 0
    assert consumed.returncode == 1, consumed.stderr  # one record was passed over
    offsets = [json.loads(line)["queue_offset"] for line in consumed.stdout.splitlines()]
    assert offsets == [i for i in range(COUNT) if i != COUNT // 2]
    assert f"commit position {commit_pos}".encode() in consumed.stderr
    assert_check_clean(root)
