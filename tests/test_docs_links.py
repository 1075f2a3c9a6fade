"""Every relative link in README.md, CHANGELOG.md and docs/ names a file (and anchor) in the repository."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")
HEADING = re.compile(r"^#{1,6} (.*)$", re.MULTILINE)
ANCHOR = re.compile(r'<a id="([^"]+)"></a>')


def documents() -> list[Path]:
    return [ROOT / "README.md", ROOT / "CHANGELOG.md", *sorted((ROOT / "docs").rglob("*.md"))]


def anchors(path: Path) -> set[str]:
    """The ids a link may name in `path`: explicit `<a id>` tags and GitHub's heading slugs."""
    text = path.read_text(encoding="utf-8")
    found = set(ANCHOR.findall(text))
    for heading in HEADING.findall(text):
        plain = ANCHOR.sub("", heading).strip().lower()
        found.add(re.sub(r"[^\w\- ]", "", plain).replace(" ", "-"))
    return found


def broken_links(path: Path, root: Path = ROOT) -> list[str]:
    broken = []
    for target in LINK.findall(path.read_text(encoding="utf-8")):
        if re.match(r"[a-z]+:", target):
            continue  # http(s), mailto: outside the repository, not checked offline
        file_part, _, anchor = target.partition("#")
        linked = (path.parent / file_part).resolve() if file_part else path
        if not linked.is_relative_to(root) or not linked.exists():
            broken.append(f"{target}: no such file in the repository")
        elif anchor and linked.suffix == ".md" and anchor not in anchors(linked):
            broken.append(f"{target}: no such anchor")
    return broken


@pytest.mark.parametrize("path", documents(), ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_resolves(path):
    assert broken_links(path) == []


def test_a_broken_link_is_found(tmp_path):
    root = tmp_path / "repo"
    root.mkdir()
    (tmp_path / "outside.md").write_text("# Outside\n", encoding="utf-8")
    (root / "there.md").write_text("## <a id=\"kept\"></a>Kept\n## Plain heading\n", encoding="utf-8")
    doc = root / "page.md"
    doc.write_text("[a](there.md#kept) [b](there.md#plain-heading) [c](gone.md) [d](there.md#nope) "
                   "[e](../outside.md)\n", encoding="utf-8")
    assert broken_links(doc, root) == ["gone.md: no such file in the repository",
                                       "there.md#nope: no such anchor",
                                       "../outside.md: no such file in the repository"]


@pytest.mark.parametrize("path", documents(), ids=lambda p: str(p.relative_to(ROOT)))
def test_no_document_names_a_path_outside_the_repository(path):
    """Links or not, `../shared/...` names files a reader of the repository does not have."""
    assert "../" not in re.sub(r"\]\(\.\./[^)]*\)", "", path.read_text(encoding="utf-8"))


def test_every_decision_code_cites_has_its_anchor():
    decisions = anchors(ROOT / "docs" / "DECISIONS.md")
    cited = {(str(path.relative_to(ROOT)), anchor)
             for package in ("engine", "ipc", "workers", "tools")
             for path in (ROOT / package).rglob("*.py")
             for anchor in re.findall(r"docs/DECISIONS\.md#([\w-]+)", path.read_text(encoding="utf-8"))}
    assert cited, "no code cites docs/DECISIONS.md"
    assert sorted((path, anchor) for path, anchor in cited if anchor not in decisions) == []
