"""engine/tuning.py is the one home of the hot paths' size crossovers: no other module defines one."""

from __future__ import annotations

import re
from pathlib import Path

import engine.tuning

ROOT = Path(__file__).resolve().parent.parent.parent
CROSSOVERS = sorted(name for name in vars(engine.tuning) if name.isupper())
# a top-level assignment of a crossover's name, annotated or not
DEFINITION = re.compile(rf"^({'|'.join(CROSSOVERS)})\s*(?::[^=\n]*)?=", re.MULTILINE)


def defined_crossovers(text: str) -> list[str]:
    """The crossover names a module's text assigns at its top level."""
    return [match.group(1) for match in DEFINITION.finditer(text)]


def test_every_crossover_is_defined_in_tuning_only():
    assert {"STRUCT_PATH_MAX_RECORDS", "FEW_INDEX_KEYS", "FEW_RECORDS_BYTES", "FEW_QUEUE_ENTRIES"} \
        <= set(CROSSOVERS)
    redefined = {}
    for folder in ("engine", "ipc", "workers", "tools"):
        for path in (ROOT / folder).rglob("*.py"):
            if path.name != "tuning.py" and (names := defined_crossovers(path.read_text())):
                redefined[str(path.relative_to(ROOT))] = names
    assert redefined == {}


def test_the_checker_sees_a_redefinition():
    text = "FEW_INDEX_KEYS = 8\nFEW_RECORDS_BYTES: int = 1\nx = FEW_QUEUE_ENTRIES\n"
    assert defined_crossovers(text) == ["FEW_INDEX_KEYS", "FEW_RECORDS_BYTES"]
