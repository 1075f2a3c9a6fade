"""docs/GUIDE.md's configuration reference lists every setting with the default the code has.

The settings come from the code (StoreConfig's fields for [store]; tools.start_settings'
table of SupervisorSettings and restart_* keys for [supervisor]), so a new setting fails this
test until the guide documents it, and a changed default fails until the guide says so.
"""

from __future__ import annotations

import dataclasses
import re
from enum import Enum
from pathlib import Path

import pytest

from engine.config import StoreConfig
from tools.start_settings import RESTART_PREFIX, supervisor_setting_types
from workers.restart_policy import RestartSettings
from workers.supervisor import SupervisorSettings

GUIDE = Path(__file__).resolve().parents[2] / "docs" / "GUIDE.md"
REFERENCE_HEADING = "## Configuration reference"
UNITS = {"KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30}
ROW = re.compile(r"^\|\s*`(?P<name>[a-z_0-9]+)`\s*\|(?P<unit>[^|]*)\|(?P<default>[^|]*)"
                 r"\|(?P<effect>[^|]*)\|\s*$")


def store_defaults() -> dict[str, object]:
    return {f.name: f.default for f in dataclasses.fields(StoreConfig)}


def supervisor_defaults() -> dict[str, object]:
    own, restart = SupervisorSettings(), RestartSettings()
    defaults = {}
    for name in supervisor_setting_types():
        if name.startswith(RESTART_PREFIX):
            defaults[name] = getattr(restart, name[len(RESTART_PREFIX):])
        else:
            defaults[name] = getattr(own, name)
    return defaults


def reference_tables(text: str) -> dict[str, dict[str, dict[str, str]]]:
    """{"[store]": {name: {"unit", "default", "effect"}}, "[supervisor]": {...}} from the
    reference section's `### [table]` subsections."""
    start = text.find(REFERENCE_HEADING)
    assert start != -1, f"docs/GUIDE.md has no {REFERENCE_HEADING!r} section"
    end = text.find("\n## ", start + len(REFERENCE_HEADING))
    tables: dict[str, dict[str, dict[str, str]]] = {}
    current = None
    for line in text[start:end if end != -1 else len(text)].splitlines():
        heading = re.match(r"^### .*?`(\[[a-z]+\])`", line)
        if heading:
            current = tables.setdefault(heading[1], {})
            continue
        row = ROW.match(line)
        if row and current is not None:
            current[row["name"]] = {k: row[k].strip() for k in ("unit", "default", "effect")}
    return tables


def documented_value(text: str) -> object:
    """A default cell as a value: `true`/`false`, a number with an optional KiB/MiB/GiB unit
    (digits may be grouped with _ or ,), else the text without backticks or quotes."""
    text = text.strip().strip("`").strip('"')
    if text in ("true", "false"):
        return text == "true"
    match = re.fullmatch(r"(?P<number>[0-9][0-9_,]*(\.[0-9]+)?)\s*(?P<unit>KiB|MiB|GiB)?", text)
    if match is None:
        return text
    number = match["number"].replace("_", "").replace(",", "")
    value = float(number) if "." in number else int(number)
    return value * UNITS[match["unit"]] if match["unit"] else value


def same_default(documented: str, actual: object) -> bool:
    value = documented_value(documented)
    if isinstance(actual, Enum):
        return value == actual.value
    if isinstance(actual, bool) or isinstance(value, str):
        return value == actual
    return float(value) == float(actual)


@pytest.fixture(scope="module")
def tables():
    return reference_tables(GUIDE.read_text())


@pytest.mark.parametrize(("table", "defaults"), [("[store]", store_defaults),
                                                  ("[supervisor]", supervisor_defaults)])
def test_every_setting_is_in_the_guide_with_the_code_default(tables, table, defaults):
    documented = tables.get(table, {})
    actual = defaults()
    missing = sorted(set(actual) - set(documented))
    assert not missing, f"docs/GUIDE.md's {table} reference lacks the settings {missing}"
    unknown = sorted(set(documented) - set(actual))
    assert not unknown, f"docs/GUIDE.md's {table} reference lists settings the code lacks: {unknown}"
    wrong = {name: (row["default"], actual[name]) for name, row in documented.items()
             if not same_default(row["default"], actual[name])}
    assert not wrong, f"docs/GUIDE.md's {table} defaults differ from the code (guide, code): {wrong}"
    empty = sorted(name for name, row in documented.items() if not row["unit"] or not row["effect"])
    assert not empty, f"docs/GUIDE.md's {table} rows without a unit or an effect: {empty}"


def test_a_setting_missing_from_the_guide_is_named():
    text = GUIDE.read_text()
    first = next(iter(store_defaults()))
    trimmed = "\n".join(line for line in text.splitlines() if not line.startswith(f"| `{first}`"))
    assert first not in reference_tables(trimmed)["[store]"]
    assert first in reference_tables(text)["[store]"]


@pytest.mark.parametrize(("cell", "value"), [("`1 GiB`", 1 << 30), ("300_000", 300_000),
                                              ("0.75", 0.75), ("`sync`", "sync"), ("`true`", True),
                                              ('"127.0.0.1:10911"', "127.0.0.1:10911")])
def test_documented_defaults_parse_as_the_guide_writes_them(cell, value):
    assert documented_value(cell) == value
