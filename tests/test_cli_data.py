"""Files from the command line (issue 19, part 2): ``--data`` reads .csv, .parquet and .npz, ``--column FIELD=COL``
maps columns to fields, ``zoo show`` prints the header a table needs, and every bad file is a usage error naming
the problem before anything compiles."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from test_cli import toy  # noqa: F401  (autouse fixture: registers the toy model of test_spine)
from test_frames import HLCR_COLUMNS, hlcr_frame
from typer.testing import CliRunner

import inference
from inference._timing import Stopwatch
from zoo_cli import app

runner = CliRunner()



def column_args(skip: tuple[str, ...] = ()) -> list[str]:
    """``--column FIELD=COL,...`` for every field of ``HLCR_COLUMNS`` but ``skip``."""
    return [a for field, cols in HLCR_COLUMNS.items() if field not in skip
            for a in ("--column", f"{field}={cols if isinstance(cols, str) else ','.join(cols)}")]


COLUMN_ARGS = column_args()


def _text(result) -> str:
    return " ".join(result.output.split()).replace("│", "").replace(" ", "")


def test_show_prints_the_csv_header_the_default_mapping_reads():
    assert "sensitivity" in runner.invoke(app, ["--help"]).output
    for command in ("fit", "compare", "sensitivity"):
        assert all(opt in runner.invoke(app, [command, "--help"]).output for opt in ("--data", "--column", "--dropna"))
    out = runner.invoke(app, ["show", "hlcr"]).output
    assert "y,agent,entity,x1,x2,x3" in out and "every other column" in out
    assert "Y" in runner.invoke(app, ["show", "bpca"]).output and "NaN = missing entry" in \
        runner.invoke(app, ["show", "bpca"]).output


def test_fit_reads_a_parquet_table_and_its_row_index_labels_the_data(tmp_path):
    y = np.linspace(-1.0, 1.0, 7)
    frame = pd.DataFrame({"y": y}, index=pd.Index([f"day{i}" for i in range(7)], name="day"))
    frame.to_parquet(tmp_path / "d.parquet")
    out = tmp_path / "fit.nc"
    result = runner.invoke(app, ["fit", "toy_normal", "-m", "exact", "--data", str(tmp_path / "d.parquet"),
                                 "--set", "num_samples=50", "--out", str(out), "--no-progress"])
    assert result.exit_code == 0, result.output
    tree = inference.load(out)
    np.testing.assert_array_equal(tree["observed_data"]["y"].values, y)
    assert list(tree["observed_data"]["n"].values) == list(frame.index)
    assert list(tree["log_likelihood"]["n"].values) == list(frame.index)


def _csv(tmp_path, text: str | bytes | None = None, frame: pd.DataFrame | None = None):
    path = tmp_path / "d.csv"
    if frame is not None:
        frame.to_csv(path, index=False)
    else:
        path.write_bytes(text if isinstance(text, bytes) else text.encode())
    return path


BAD_FILES = [
    ("unknown column", lambda f: f, ["--column", "y=revenue"], "column'revenue'isnotinthedata"),
    ("text where a float is expected", lambda f: f.assign(price=f["price"].astype(str).where(f.index != 2, "abc")),
     [], "column'price'(data['X']):expectednumbers(float),gottext:'abc'(row2)isnotanumber"),
    ("NaN where the model forbids it", lambda f: f.assign(sales=f["sales"].where(f.index > 3)), [],
     "column'sales'(data['y']):4of36rowshavemissingvalues"),
    ("empty file", b"", [], "isempty(0bytes)"),
    ("only a header", b"store,product,price,promo,sales\n", [], "hasnorows(onlyaheader"),
    ("--column on an npz file", None, ["--column", "y=sales"], "--columnand--dropnaarefor.csv/.parquet"),
    ("malformed --column", lambda f: f, ["--column", "y"], "expectedFIELD=COL"),
    ("unknown suffix", b"a,b\n1,2\n", [], "expecteda.csv,.parquet,.npzfile"),
]


@pytest.mark.parametrize(("what", "content", "extra", "needle"), BAD_FILES, ids=[b[0] for b in BAD_FILES])
def test_a_bad_data_file_is_a_usage_error_before_compiling(what, content, extra, needle, tmp_path):
    if content is None:
        path = tmp_path / "d.npz"
        np.savez(path, **{k: np.asarray(v) for k, v in {"y": [1.0]}.items()})
    elif isinstance(content, bytes):
        path = _csv(tmp_path, content)
        if what == "unknown suffix":
            path = path.rename(tmp_path / "d.tsv")
    else:
        path = _csv(tmp_path, frame=content(hlcr_frame()))
    mapping = column_args(skip=tuple(e.split("=")[0] for e in extra[1::2]))
    with Stopwatch() as sw:
        result = runner.invoke(app, ["fit", "hlcr", "-m", "gibbs", "--data", str(path), *mapping, *extra,
                                     "--out", str(tmp_path / "x.nc")])
    assert result.exit_code == 2, result.output
    assert needle.replace(" ", "") in _text(result), result.output
    assert sw.compile_events == 0
