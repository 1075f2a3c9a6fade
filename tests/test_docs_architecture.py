"""docs/ARCHITECTURE.md names every module of the code, and every module it names exists.

The map is the reader's way into the code, so a module added without a row, or a row left for a
module that moved, fails here. A section headed by a folder (`## engine/: ...`) names modules by
file name relative to that folder (`record/layout.py` under `engine/formats/`); a name that is
not in the folder is looked for from the repository root (`pyspark_mqstore.py`,
`ipc/retention_block.py` in prose). A package's `__init__.py` holds its docstring only and needs
no row. A dotted name in the text (`workers.appender`, `tools.store_process.StoreProcess`) names
a module, or a class, function or constant its module defines. The last test runs the checkers
over a tiny tree in tmp_path, so a checker that caught nothing fails.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CODE_FOLDERS = ("engine", "ipc", "workers", "tools")
TOP_MODULES = ("pyspark_mqstore.py",)
SECTION = re.compile(r"^#{2,6} `?([\w/]+/)`?:", re.MULTILINE)
HEADING = re.compile(r"^#{1,6} ", re.MULTILINE)
MODULE_NAME = re.compile(r"`([\w/]+\.py)`")
DOTTED_NAME = re.compile(r"`((?:engine|ipc|workers|tools)(?:\.[A-Za-z_]\w*)+)`")


def code_modules(root: Path) -> set[str]:
    """Every module of the code as a path from the root, `__init__.py` left out."""
    found = {name for name in TOP_MODULES if (root / name).exists()}
    for folder in CODE_FOLDERS:
        found |= {p.relative_to(root).as_posix() for p in (root / folder).rglob("*.py")
                  if p.name != "__init__.py"}
    return found


def sections(text: str) -> list[tuple[str, str]]:
    """(folder or "", text) of each section of the page, split at every heading."""
    starts = [m.start() for m in HEADING.finditer(text)]
    parts = [text[a:b] for a, b in zip([0, *starts], [*starts, len(text)], strict=True)]
    result = []
    for part in parts:
        folder = SECTION.match(part)
        result.append((folder.group(1) if folder else "", part))
    return result


def named_modules(text: str, root: Path) -> tuple[set[str], set[str]]:
    """(modules the page names that exist, names it gives that match no file)."""
    named, missing = set(), set()
    for folder, part in sections(text):
        for name in MODULE_NAME.findall(part):
            if name.rsplit("/", 1)[-1] == "__init__.py":
                continue  # packages are named by folder; their __init__ is a docstring
            candidates = [folder + name, name] if folder else [name]
            found = next((c for c in candidates if (root / c).is_file()), None)
            if found is None:
                missing.add(f"{name} (in section {folder or 'without a folder'})")
            else:
                named.add(found)
    return named, missing


def architecture_gaps(root: Path, page: Path) -> tuple[list[str], list[str]]:
    """(modules the page never names, names on the page that match no module)."""
    named, missing = named_modules(page.read_text(encoding="utf-8"), root)
    return sorted(code_modules(root) - named), sorted(missing)


def unresolved_dotted(text: str, root: Path) -> list[str]:
    """Dotted names on the page (`workers.appender`, `tools.store_process.StoreProcess`) whose
    module does not exist, or whose last part the module does not define at its top level."""
    unresolved = []
    for dotted in sorted(set(DOTTED_NAME.findall(text))):
        parts = dotted.split(".")
        if parts[-1] == "py":
            continue  # a file name such as `engine.py`, checked as a module name
        if (root.joinpath(*parts).with_suffix(".py")).is_file() or root.joinpath(*parts).is_dir():
            continue
        module = root.joinpath(*parts[:-1]).with_suffix(".py")
        defined = re.compile(rf"^(?:class|def) {re.escape(parts[-1])}\b|^{re.escape(parts[-1])} =", re.M)
        if not (module.is_file() and defined.search(module.read_text(encoding="utf-8"))):
            unresolved.append(dotted)
    return unresolved


def test_architecture_names_every_module_and_only_modules_that_exist():
    unnamed, stale = architecture_gaps(ROOT, ROOT / "docs" / "ARCHITECTURE.md")
    assert unnamed == [], "modules without a row in docs/ARCHITECTURE.md"
    assert stale == [], "docs/ARCHITECTURE.md names modules that do not exist"


def test_every_dotted_name_on_architecture_resolves():
    text = (ROOT / "docs" / "ARCHITECTURE.md").read_text(encoding="utf-8")
    assert unresolved_dotted(text, ROOT) == []


def test_the_checker_finds_an_unnamed_and_a_stale_module(tmp_path):
    for path in ("engine/__init__.py", "engine/kept.py", "engine/formats/codec.py",
                 "engine/forgotten.py", "ipc/shm.py", "pyspark_mqstore.py"):
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / path).write_text('"""x"""\n', encoding="utf-8")
    page = tmp_path / "ARCHITECTURE.md"
    page.write_text("# Map\n\nA package's `__init__.py` is its docstring.\n\n"
                    "## engine/: files\n\n| `kept.py`, `formats/codec.py` | x |\n| `moved.py` | y |\n\n"
                    "### ipc/: memory\n\n`shm.py`; `pyspark_mqstore.py` sits at the top.\n\n"
                    "## Flow\n\n`engine/kept.py` again, and `gone/old.py`.\n", encoding="utf-8")
    unnamed, stale = architecture_gaps(tmp_path, page)
    assert unnamed == ["engine/forgotten.py"]
    assert stale == ["gone/old.py (in section without a folder)", "moved.py (in section engine/)"]
    (tmp_path / "engine" / "kept.py").write_text("class Kept:\n    pass\n", encoding="utf-8")
    dotted = ("`engine.kept`, `engine.kept.Kept`, `engine.formats`, `engine.kept.Gone`, "
              "`ipc.gone`, `engine.formats.codec.Nothing`")
    assert unresolved_dotted(dotted, tmp_path) == ["engine.formats.codec.Nothing", "engine.kept.Gone",
                                                   "ipc.gone"]
