"""The README is for a person meeting the project: short, without lab notes, and everything it shows runs.

Its Python blocks are executed as written (they make their own small table); its shell blocks name only `make`
targets of the Makefile and `zoo` subcommands and options that exist, and the cheap commands among them run."""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from zoo_cli import app

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
TEXT = README.read_text(encoding="utf-8")
runner = CliRunner()

# Commands the test runs (seconds, nothing fitted); the others are checked against `zoo SUB --help` only.
CHEAP = {"--version", "list", "show"}


def blocks(language: str) -> list[str]:
    return re.findall(rf"^```{language}\n(.*?)^```", TEXT, flags=re.S | re.M)


def shell_commands() -> list[str]:
    lines = [line.split(" #")[0].strip() for block in blocks("bash") for line in block.splitlines()]
    return [line for line in lines if line]


def test_readme_is_at_most_250_lines_without_dates_issue_numbers_or_load_averages():
    assert len(TEXT.splitlines()) <= 250
    dates = re.findall(r"\b(?:19|20)\d\d-\d\d-\d\d\b|\b\d{1,2} (?:Jan|Feb|Mar|Apr|May|Jun|Jul|Aug|Sep|Oct|Nov|Dec)"
                       r"[a-z]* (?:19|20)\d\d\b", TEXT)
    assert dates == []
    assert re.findall(r"(?i)\bissues? ?#?\d+|(?<![\w/])#\d+\b", TEXT) == []
    assert re.findall(r"(?i)load average|\bload ~|\bunder load\b|\bloaded box\b", TEXT) == []


def test_every_relative_link_and_image_of_the_readme_exists():
    targets = re.findall(r"\]\(([^)\s]+)\)", TEXT)
    local = [t.split("#")[0] for t in targets if "://" not in t and not t.startswith("#")]
    assert local, "the README links its guide pages, CHANGELOG, CITATION and LICENSE"
    assert [t for t in local if not (ROOT / t).is_file()] == []
    assert "docs/_static/readme_report.png" in local


def test_the_python_quickstart_runs_as_written(tmp_path, monkeypatch, capsys):
    code = blocks("python")
    assert code, "the README has a Python quickstart"
    monkeypatch.chdir(tmp_path)   # it saves a tree to the working directory
    for block in code:
        exec(compile(block, str(README), "exec"), {"__name__": "__readme__"})
    out = capsys.readouterr().out
    assert "north:" in out                         # the pairs are labelled by the table's store names
    assert re.search(r"vbem: (PASS|FAIL|NOT CONVERGED|NOT JUDGED)", out)
    assert (tmp_path / "sales_vbem.nc").is_file()


def test_every_shell_command_is_a_make_target_or_a_zoo_command_with_real_options(tmp_path, monkeypatch):
    commands = shell_commands()
    assert any(c.startswith("make ") for c in commands) and any(c.startswith("zoo ") for c in commands)
    targets = set(re.findall(r"^([\w-]+):", (ROOT / "Makefile").read_text(), flags=re.M))
    subcommands = set(re.findall(r"│ (\w+) ", runner.invoke(app, ["--help"], terminal_width=200).output))
    monkeypatch.chdir(tmp_path)
    for command in commands:
        words = shlex.split(command)
        if words[0] == "make":
            assert words[1] in targets, command
        elif words[0] == "zoo":
            if words[1].startswith("-"):
                assert words[1] == "--version", command
            else:
                assert words[1] in subcommands, command
                help_text = runner.invoke(app, [words[1], "--help"], terminal_width=200).output
                for option in (w.split("=")[0] for w in words[2:] if w.startswith("-")):
                    assert option in help_text, f"{command}: {option} is not an option of zoo {words[1]}"
            if words[1] in CHEAP:
                result = runner.invoke(app, words[1:])
                assert result.exit_code == 0, f"{command}: {result.output}"
                if words[1] == "--version":
                    assert re.fullmatch(r"bayes-zoo \d+\.\d+\S*\n", result.output)
        elif words[0] == "python":    # the command that makes the table of the CLI quickstart
            subprocess.run([sys.executable, *words[1:]], check=True, timeout=120)
        else:
            pytest.fail(f"the README's shell block runs {command!r}, neither make, zoo nor python")
    assert (tmp_path / "wine.csv").is_file()


def test_zoo_version_is_the_package_version():
    import zoo

    assert re.fullmatch(r"\d+\.\d+\.\d+\S*", zoo.__version__)
    assert runner.invoke(app, ["--version"]).output == f"bayes-zoo {zoo.__version__}\n"
