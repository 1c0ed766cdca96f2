"""The benchmarks page's headline ratios are read from ``benchmarks/results.md`` (``docs/headlines.py``), not
retyped: every headline of a section results.md has is found, and each value stands in that cell of results.md
(checked on the raw lines, apart from the parser). Fast: text only, no Sphinx."""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results.md"


def _headlines():
    spec = importlib.util.spec_from_file_location("docs_headlines", ROOT / "docs" / "headlines.py")
    module = sys.modules.setdefault(spec.name, importlib.util.module_from_spec(spec))
    spec.loader.exec_module(module)   # registered first: its dataclasses look their module up
    return module


def test_every_headline_of_a_measured_section_is_found_and_stands_in_its_cell_of_results_md():
    headlines = _headlines()
    text = RESULTS.read_text()
    found, missing = headlines.extract(text)
    assert found, "no headline ratio extracted from benchmarks/results.md"
    assert missing == []
    lines = text.splitlines()
    for f in found:
        row = lines[f.line - 1]
        assert row.startswith("|") and f"| {f.value} |" in row, (f.headline.claim, row)
        assert re.search(r"\d", f.value), f"{f.headline.claim}: {f.value!r} is not a number"
        above = lines[:f.line]
        title = max(i for i, line in enumerate(above) if line.startswith("### "))
        section = max(i for i, line in enumerate(above) if line.startswith("## "))
        assert lines[title] == f"### {f.table}" and section < title, f.headline.claim
        assert lines[section] == f"## {f.headline.section}", f.headline.claim
        header = next(line for line in lines[title:f.line] if line.startswith("|"))
        column = [c.strip() for c in header.strip().strip("|").split("|")]
        cells = [c.strip() for c in row.strip().strip("|").split("|")]
        assert re.search(f.headline.column, column[cells.index(f.value)]), f.headline.claim


SAMPLE = """# Benchmark results

## speed

Machine: box | 2 CPUs | load average 0.1 | 2026-01-02T03:04:05

### ours vs theirs, n = 10

A note.

| side | run s | speed vs theirs |
|---|---|---|
| ours | 1.0 | 3.50x |
| theirs | 3.5 | 1.00x |

## other

### nothing to see

| a | b |
|---|---|
| 1 | 2 |
"""


def test_the_parser_takes_the_named_cell_skips_absent_sections_and_reports_missing_cells():
    h = _headlines()
    wanted = (h.Headline("ours vs theirs", "speed", r"ours vs theirs", r"ours", r"speed vs"),
              h.Headline("not measured yet", "absent", r".", r".", r"."),
              h.Headline("renamed row", "other", r"nothing", r"zzz", r"b"))
    found, missing = h.extract(SAMPLE, wanted)
    assert [(f.value, f.table, f.measured, f.line) for f in found] == [
        ("3.50x", "ours vs theirs, n = 10", "2026-01-02T03:04:05", 13)]
    assert len(missing) == 1 and "renamed row" in missing[0]
    table = h.markdown(found)
    assert "**3.50x**" in table and "`speed`: ours vs theirs, n = 10 | 2026-01-02 |" in table
