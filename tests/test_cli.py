"""The `zoo` command line, driven through typer's CliRunner with a toy model registered here."""

from __future__ import annotations

import numpy as np
import pytest
from test_spine import SPEC  # the conjugate toy model (registered only in tests)
from typer.testing import CliRunner

import inference
import zoo
from zoo_cli import app

runner = CliRunner()


@pytest.fixture(autouse=True)
def toy():
    zoo.register(SPEC, replace=True)
    yield
    zoo.unregister(SPEC.name)


def test_help_lists_every_command_and_explains_options():
    result = runner.invoke(app, ["--help"])
    assert result.exit_code == 0
    for cmd in ("list", "show", "fit", "compare", "demo", "references"):
        assert cmd in result.output
    fit_help = runner.invoke(app, ["fit", "--help"]).output
    for opt in ("--method", "--seed", "--out", "--data", "--set", "--progress"):
        assert opt in fit_help


def test_list_and_show_describe_the_model():
    assert "toy_normal" in runner.invoke(app, ["list"]).output
    out = runner.invoke(app, ["show", "toy_normal"]).output
    assert "tau0" in out and "num_warmup" in out and "y" in out


def test_fit_writes_a_loadable_tree_with_options_from_set(tmp_path):
    y = np.linspace(-1, 1, 7)
    np.savez(tmp_path / "d.npz", y=y)
    out = tmp_path / "fit.nc"
    result = runner.invoke(app, ["fit", "toy_normal", "--method", "exact", "--seed", "3", "--out", str(out),
                                 "--data", str(tmp_path / "d.npz"), "--set", "num_samples=50", "--set",
                                 "tau0=0.5", "--no-progress"])
    assert result.exit_code == 0, result.output
    tree = inference.load(out)
    assert tree["posterior"].sizes["draw"] == 50 and tree.attrs["seed"] == 3
    np.testing.assert_array_equal(tree["observed_data"]["y"].values, y)
    assert '"tau0": 0.5' in tree.attrs["hyperparameters"]


@pytest.mark.parametrize("args,needle", [
    (["fit", "nope", "--out", "x.nc"], "unknown model 'nope'"),
    (["fit", "toy_normal", "--out", "x.nc", "--method", "gibbs"], "supports methods"),
    (["fit", "toy_normal", "--out", "x.nc", "--set", "tau0=-1"], "tau0: expected a positive number"),
    (["fit", "toy_normal", "--out", "x.nc", "--set", "oops"], "expected KEY=VALUE"),
    (["compare", "toy_normal", "--methods", "nuts,gibbs"], "supports"),
])
def test_bad_cli_input_is_a_usage_error_naming_the_problem(args, needle, tmp_path):
    result = runner.invoke(app, args)
    assert result.exit_code == 2
    assert needle in " ".join(result.output.split()).replace("│", "")


def test_compare_writes_trees_and_resumes_without_refitting(tmp_path):
    args = ["compare", "toy_normal", "--methods", "exact", "--out", str(tmp_path)]
    first = runner.invoke(app, args)
    assert first.exit_code == 0, first.output
    assert (tmp_path / "toy_normal" / "exact.nc").is_file()
    second = runner.invoke(app, args)
    assert second.exit_code == 0 and "reusing" in second.output


def test_compare_refits_a_result_file_corrupted_on_disk(tmp_path):
    args = ["compare", "toy_normal", "--methods", "exact", "--out", str(tmp_path)]
    assert runner.invoke(app, args).exit_code == 0
    path = tmp_path / "toy_normal" / "exact.nc"
    raw = bytearray(path.read_bytes())
    raw[len(raw) // 2: len(raw) // 2 + 2000] = bytes(2000)          # a crash or a bad disk mid-file
    path.write_bytes(bytes(raw))
    again = runner.invoke(app, args)
    assert again.exit_code == 0, again.output
    assert "unreadable" in again.output and "refitting" in again.output and "reusing" not in again.output
    inference.load(path)                                              # rewritten, checksum valid again
