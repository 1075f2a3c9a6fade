"""docs/GUIDE.md's metrics table lists every family the exporter serves, and only those.

The families come from the exporter's collector scraping a real running store (one with
messages and a committed group, so every conditional family is there). In the table a cell
may shorten later names of one family group as `..._suffix`: it continues the first name of the
cell cut after its second word (`mqstore_queue_min_offset`, `..._max_offset` names
`mqstore_queue_max_offset`). Counters are written with their `_total` sample suffix.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from ipc.consumer import Consumer
from ipc.producer import Producer
from tests.workers.store_harness import assert_check_clean, start_store
from tools.exporter import StoreCollector

GUIDE = Path(__file__).resolve().parents[2] / "docs" / "GUIDE.md"
METRICS_HEADING = "### Prometheus metrics"
NAME = re.compile(r"`((?:mqstore|\.\.\.)_[a-z_]+)`")


def documented_families(text: str) -> set[str]:
    """The family names of the metrics table's first column, `..._x` expanded and `_total` cut."""
    start = text.find(METRICS_HEADING)
    assert start != -1, f"docs/GUIDE.md has no {METRICS_HEADING!r} section"
    end = text.find("\n#", start + len(METRICS_HEADING))
    names = set()
    for line in text[start:end].splitlines():
        cells = line.split("|")
        if len(cells) < 3 or not cells[1].strip().startswith("`mqstore_"):
            continue
        found = NAME.findall(cells[1])
        group = "_".join(found[0].split("_")[:2])  # mqstore_<part>
        for name in found:
            full = group + name[3:] if name.startswith("...") else name
            names.add(full.removesuffix("_total"))
    return names


def undocumented(exported: set[str], documented: set[str]) -> str:
    """The failure message naming each family the table lacks ("" when none)."""
    missing = sorted(exported - documented)
    return "" if not missing else (f"docs/GUIDE.md's metrics table ({METRICS_HEADING}) does not "
                                   f"list the exported families: {', '.join(missing)}")


@pytest.fixture(scope="module")
def exported(tmp_path_factory) -> set[str]:
    running = start_store(tmp_path_factory.mktemp("metrics") / "store")
    try:
        with Producer(running.root) as producer:
            producer.send("orders", b"hello", keys=("order-42",))
        running.wait_caught_up()
        with Consumer(running.root, "audit") as consumer:
            consumer.commit("orders", 0, 1)
        families = {family.name for family in StoreCollector(running.root).collect()}
    finally:
        assert running.stop() == 0
    assert_check_clean(running.root)
    return families


@pytest.mark.slow
def test_every_exported_family_is_in_the_guide(exported):
    assert "mqstore_up" in exported and "mqstore_generation" in exported  # the store was running
    message = undocumented(exported, documented_families(GUIDE.read_text(encoding="utf-8")))
    assert not message, message


@pytest.mark.slow
def test_the_guide_lists_no_family_the_exporter_lacks(exported):
    stale = sorted(documented_families(GUIDE.read_text(encoding="utf-8")) - exported)
    assert not stale, f"docs/GUIDE.md's metrics table lists families the exporter does not serve: {stale}"


def test_the_table_is_read_with_its_shortened_names_and_a_missing_family_is_named():
    text = (f"{METRICS_HEADING}\n\n| metric | labels | meaning |\n|---|---|---|\n"
            "| `mqstore_up` | | up |\n"
            "| `mqstore_queue_min_offset`, `..._max_offset` | `topic` | offsets |\n"
            "| `mqstore_flushes_total` | | flushes |\n\nUse `rate()` over `mqstore_x`.\n")
    documented = documented_families(text)
    assert documented == {"mqstore_up", "mqstore_queue_min_offset", "mqstore_queue_max_offset",
                          "mqstore_flushes"}
    assert undocumented({"mqstore_up", "mqstore_flushes", "mqstore_index_lag_bytes"}, documented) == (
        "docs/GUIDE.md's metrics table (### Prometheus metrics) does not list the exported "
        "families: mqstore_index_lag_bytes")
