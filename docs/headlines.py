"""The headline ratios of ``benchmarks/results.md``, read from its tables when the site is built (not retyped).

``results.md`` is written by ``python -m benchmarks``: ``## section`` per benchmark, a ``Machine: ...`` line, then
``### title`` tables in Markdown. ``HEADLINES`` names each headline ratio by where it stands: the section, a
regular expression on the table's title, on the row's first cell and on the column's header (the first match of
each, in file order). ``extract`` returns the cells it finds, verbatim, with where they were found; a headline
whose section is absent (a benchmark not run yet) is left out, one whose section exists but whose table, row or
column does not is reported as missing (``docs/conf.py`` makes that a build warning, an error under ``-W``).
"""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path


@dataclasses.dataclass(frozen=True)
class Headline:
    claim: str     # what the ratio compares, for a reader
    section: str   # the "## " section of results.md
    table: str     # regular expression searched in the "### " title
    row: str       # regular expression matched at the start of the row's first cell
    column: str    # regular expression searched in the column's header


HEADLINES = (
    Headline("HLCR: collapsed Gibbs vs NUTS, ESS per second of the run (C1 data)", "hlcr",
             r"ESS per second", r"gibbs / nuts", r"ESS/s"),
    Headline("HLCR: block sampler vs the paper's per-event sampler, events per second (N** = 100)",
             "hlcr-idle-rerun", r"block sampler speed-up", r"100", r"block vs paper"),
    Headline("HLCR at 10^6 events: blocked vs collapsed Gibbs, sweeps per second", "hlcr_scale",
             r"issue 18 goals", r"blocked sweeps/s vs collapsed", r"measured"),
    Headline("FedHLCR: federated rounds vs centralised Gibbs sweeps, per second", "fedhlcr",
             r"FedHLCR rounds", r"fedgibbs", r"speed vs"),
    Headline("MPPCA: VB-EM vs scikit-learn's BayesianGaussianMixture to convergence (digits)", "mppca",
             r"digits", r"vbem", r"speed vs"),
    Headline("MPPCA: VB-EM vs scikit-learn's BayesianGaussianMixture to convergence (synthetic, d = 50)", "mppca",
             r"synthetic d = 50", r"vbem", r"speed vs"),
    Headline("SSGP: VB vs NUTS to a fit, run seconds (ssgp_lmm, n = 2000)", "ssgp",
             r"VB to convergence vs NUTS", r"vb", r"speed vs"),
    Headline("GP-ALPS: VB-EM vs NUTS, time to the switch decisions", "gp_alps",
             r"time to the switch decisions", r"vbem", r"speed vs"),
    Headline("GP-ALPS: collapsed Gibbs vs NUTS, time to the switch decisions", "gp_alps",
             r"time to the switch decisions", r"gibbs", r"speed vs"),
    Headline("D-MFVI: a round in process (vmap) vs a Python loop over nodes", "dmfvi",
             r"D-MFVI round", r"in-process", r"speed vs"),
    Headline("NUTS: two chains in parallel vs one after the other", "spine",
             r"parallel \(2 devices\) vs sequential", r"parallel", r"speed vs"),
    Headline("Diagnostics: joint W1 by assignment vs ArviZ's linear program", "diagnostics",
             r"joint W1", r"assignment", r"speed vs"),
    Headline("Compile seconds of the demo fits, after / before issue 18 (total)", "compile",
             r"Compile seconds per", r"total", r"compile after/before"),
    Headline("NUTS compile seconds: ours (the whole fit) / NumPyro's MCMC.run, hlcr", "compile_nuts",
             r"NUTS beside NumPyro", r"hlcr", r"ours fit / NumPyro"),
    Headline("NUTS compile seconds: ours (the whole fit) / NumPyro's MCMC.run, ppca", "compile_nuts",
             r"NUTS beside NumPyro", r"ppca", r"ours fit / NumPyro"),
)


@dataclasses.dataclass(frozen=True)
class Table:
    title: str
    header: list[str]
    rows: list[list[str]]
    line: int   # 1-based line of the title in results.md


@dataclasses.dataclass(frozen=True)
class Found:
    headline: Headline
    value: str
    table: str
    measured: str   # the section's measurement time ("Machine: ... | <time>"), or ""
    line: int       # 1-based line of the row in results.md


def _cells(line: str) -> list[str]:
    return [c.strip() for c in re.split(r"(?<!\\)\|", line.strip())[1:-1]]


def parse(text: str) -> dict[str, tuple[str, list[Table]]]:
    """``section -> (measured, tables)`` of a results.md text; each table's rows with the line they stand on."""
    sections: dict[str, tuple[str, list[Table]]] = {}
    lines = text.splitlines()
    section, measured, tables = None, "", []
    i = 0
    while i < len(lines):
        line = lines[i]
        if line.startswith("## "):
            section, measured, tables = line[3:].strip(), "", []
            sections[section] = (measured, tables)
        elif section and line.startswith("Machine:"):
            measured = line.rsplit("|", 1)[-1].strip()
            sections[section] = (measured, tables)
        elif section and line.startswith("### "):
            title, start = line[4:].strip(), i + 1
            j = i + 1
            while j < len(lines) and not lines[j].startswith("|") and not lines[j].startswith("#"):
                j += 1
            if j + 1 < len(lines) and lines[j].startswith("|") and re.match(r"\|(\s*:?-+:?\s*\|)+$", lines[j + 1]):
                header, rows, k = _cells(lines[j]), [], j + 2
                while k < len(lines) and lines[k].startswith("|"):
                    rows.append([*_cells(lines[k]), str(k + 1)])
                    k += 1
                tables.append(Table(title, header, rows, start))
                i = k
                continue
        i += 1
    return sections


def extract(text: str, headlines=HEADLINES) -> tuple[list[Found], list[str]]:
    """(the headline cells found, a message per headline whose section exists but whose cell does not)."""
    sections = parse(text)
    found, missing = [], []
    for h in headlines:
        if h.section not in sections:
            continue
        measured, tables = sections[h.section]
        table = next((t for t in tables if re.search(h.table, t.title)), None)
        column = None if table is None else next((c for c, name in enumerate(table.header)
                                                  if re.search(h.column, name)), None)
        row = None if column is None else next((r for r in table.rows if re.match(h.row, r[0])), None)
        value = "" if row is None or column >= len(row) - 1 else row[column]
        if not value:
            missing.append(f"benchmarks/results.md, section {h.section!r}: no cell for {h.claim!r} (table "
                           f"/{h.table}/, row /{h.row}/, column /{h.column}/)")
            continue
        found.append(Found(h, value, table.title, measured, int(row[-1])))
    return found, missing


def markdown(found: list[Found]) -> str:
    """The headline table as Markdown."""
    def cell(text: str) -> str:
        return re.sub(r"\s+", " ", text).replace("|", "\\|")

    lines = ["| what | ratio | benchmark (section: table) | measured |", "|---|---|---|---|"]
    lines += [f"| {cell(f.headline.claim)} | **{cell(f.value)}** | `{f.headline.section}`: {cell(f.table)} | "
              f"{cell(f.measured.split('T')[0])} |" for f in found]
    return "\n".join(lines) + "\n"


def write(results: Path, out: Path) -> list[str]:
    """The headline table of ``results`` written to ``out``; returns the messages of ``extract``'s missing
    headlines (and one if none was found at all)."""
    found, missing = extract(results.read_text())
    if not found:
        missing.append(f"{results}: no headline ratio found")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(markdown(found) if found else "No headline ratio was found in benchmarks/results.md.\n")
    return missing
