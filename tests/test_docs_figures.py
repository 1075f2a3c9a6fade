"""Every throughput figure docs/GUIDE.md quotes is a figure of docs/BENCHMARKS.md.

Figures copied by hand drift from the benchmark that measured them. A GUIDE paragraph that
quotes a rate (msg/s, acks/s) links to BENCHMARKS.md, and each figure in it (`6,324`, or a
rounding like `2.1k`) must appear verbatim in one of BENCHMARKS.md's table rows, so a figure
BENCHMARKS.md replaces fails this test until the GUIDE quotes the new one.
"""

from __future__ import annotations

import re
from pathlib import Path

DOCS = Path(__file__).resolve().parent.parent / "docs"
RATE = re.compile(r"\b(?:msg|acks|records)/s\b")
FIGURE = re.compile(r"(?<![\w.,])(?:\d{1,3}(?:,\d{3})+|\d+(?:\.\d+)?k)(?![\w,]|\.\d)")


def rate_paragraphs(text: str) -> list[str]:
    """The paragraphs of a page that quote a rate."""
    return [p for p in re.split(r"\n\s*\n", text) if RATE.search(p)]


def table_rows(text: str) -> str:
    """Every table row of a page, joined: the figures a page stands behind."""
    return "\n".join(line for line in text.splitlines() if line.startswith("|"))


def unbacked_figures(guide: str, benchmarks: str) -> list[str]:
    """Figures of the guide's rate paragraphs that no table row of the benchmarks holds, and
    rate paragraphs that do not link to BENCHMARKS.md."""
    rows = table_rows(benchmarks)
    problems = []
    for paragraph in rate_paragraphs(guide):
        if "BENCHMARKS.md" not in paragraph:
            problems.append(f"a paragraph quoting rates without a link to BENCHMARKS.md: "
                            f"{paragraph[:60]!r}...")
        problems += [f"{figure} (not in BENCHMARKS.md's tables)" for figure in FIGURE.findall(paragraph)
                     if not re.search(rf"(?<![\d,.]){re.escape(figure)}(?![\d,]|\.\d)", rows)]
    return problems


def test_every_rate_the_guide_quotes_is_a_current_benchmarks_figure():
    guide = (DOCS / "GUIDE.md").read_text(encoding="utf-8")
    assert rate_paragraphs(guide), "docs/GUIDE.md quotes no rate: the check would pass vacuously"
    assert unbacked_figures(guide, (DOCS / "BENCHMARKS.md").read_text(encoding="utf-8")) == []


def test_a_drifted_or_rounded_figure_is_named():
    benchmarks = "| `--batch 1` | 6,324 msg/s | 6,674 msg/s |\n"
    good = "Measured ([BENCHMARKS.md](BENCHMARKS.md)): 6,324 msg/s against 6,674 msg/s.\n"
    assert unbacked_figures(good, benchmarks) == []
    drifted = "Measured ([BENCHMARKS.md](BENCHMARKS.md)): 1.6-2.1k msg/s against 6,674 msg/s.\n"
    assert unbacked_figures(drifted, benchmarks) == ["2.1k (not in BENCHMARKS.md's tables)"]
    unlinked = "mqstore did 16,324 msg/s.\n"
    assert unbacked_figures(unlinked, benchmarks) == [
        "a paragraph quoting rates without a link to BENCHMARKS.md: 'mqstore did 16,324 msg/s.\\n'...",
        "16,324 (not in BENCHMARKS.md's tables)"]
