"""engine/tuning.py is the one home of the hot paths' size crossovers: no other module defines one."""

from __future__ import annotations

import ast
from pathlib import Path

import engine.tuning

ROOT = Path(__file__).resolve().parent.parent.parent
CROSSOVERS = {name for name in vars(engine.tuning) if name.isupper()}


def top_level_names(path: Path) -> set[str]:
    """Names a module assigns at its top level."""
    names: set[str] = set()
    for node in ast.parse(path.read_text()).body:
        targets = node.targets if isinstance(node, ast.Assign) else [getattr(node, "target", None)]
        names |= {t.id for t in targets if isinstance(t, ast.Name)}
    return names


def test_every_crossover_is_defined_in_tuning_only():
    assert {"STRUCT_PATH_MAX_RECORDS", "FEW_INDEX_KEYS", "FEW_RECORDS_BYTES", "FEW_QUEUE_ENTRIES"} \
        <= CROSSOVERS
    redefined = {str(path.relative_to(ROOT)): sorted(top_level_names(path) & CROSSOVERS)
                 for folder in ("engine", "ipc", "workers", "tools") for path in (ROOT / folder).rglob("*.py")
                 if path.name != "tuning.py" and top_level_names(path) & CROSSOVERS}
    assert redefined == {}


def test_the_checker_sees_a_redefinition(tmp_path):
    module = tmp_path / "m.py"
    module.write_text("FEW_INDEX_KEYS = 8\nother: int = 1\n")
    assert top_level_names(module) == {"FEW_INDEX_KEYS", "other"}
