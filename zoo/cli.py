"""The ``zoo`` command line (typer). JAX, NumPyro and ArviZ are imported inside the commands so that
``zoo --help`` answers at once."""

from __future__ import annotations

import ast
import json
import time
from pathlib import Path
from typing import Annotated

import typer

app = typer.Typer(
    help="bayes-zoo: five papers' models, hand-written inference kernels beside NUTS/SVI, and "
         "diagnostics that compare every posterior with MCMC.",
    no_args_is_help=True, add_completion=False, pretty_exceptions_enable=False, rich_markup_mode="markdown",
)

DEFAULT_CACHE = Path.home() / ".cache" / "bayes-zoo" / "jax"


def _setup() -> None:
    """Import the packages (configures JAX) and turn on the persistent compilation cache."""
    import os

    os.environ.setdefault("BAYES_ZOO_JAX_CACHE", str(DEFAULT_CACHE))
    os.environ.setdefault("MPLBACKEND", "Agg")
    import diagnostics  # noqa: F401
    import inference  # noqa: F401


def _spec(name: str):
    import zoo

    try:
        return zoo.get(name)
    except ValueError as exc:
        raise typer.BadParameter(str(exc), param_hint="MODEL") from None


def _parse_sets(pairs: list[str]) -> dict:
    """``["K=4", "guide='mvn'", "prior=paper"]`` -> ``{"K": 4, "guide": "mvn", "prior": "paper"}``."""
    out = {}
    for pair in pairs:
        if "=" not in pair:
            raise typer.BadParameter(f"expected KEY=VALUE, got {pair!r}", param_hint="--set")
        key, raw = pair.split("=", 1)
        try:
            out[key.strip()] = ast.literal_eval(raw)
        except (ValueError, SyntaxError):
            out[key.strip()] = raw
    return out


def _load_data(path: Path | None, spec) -> dict:
    import numpy as np

    if path is None:
        return spec.default_data()[0]
    if not path.is_file():
        raise typer.BadParameter(f"no such file {str(path)!r}", param_hint="--data")
    with np.load(path) as npz:
        return {k: npz[k] for k in npz.files}


@app.command("list")
def list_models() -> None:
    """List the registered models, their papers and methods."""
    _setup()
    import zoo

    for name in zoo.list_models():
        spec = zoo.get(name)
        typer.echo(f"{name:14s} {', '.join(spec.methods)}")
        if spec.paper:
            typer.echo(f"{'':14s} {spec.paper}")


@app.command()
def show(model: Annotated[str, typer.Argument(help="Model name (see `zoo list`).")]) -> None:
    """Show a model's data contract, hyperparameters and methods with their options."""
    _setup()
    from inference._methods import COMMON_OPTIONS, get_method

    spec = _spec(model)
    typer.echo(f"{spec.name}: {spec.description or spec.paper}")
    typer.echo("\ndata (dict of arrays):")
    for f in spec.data_fields:
        shape = "(" + ", ".join(map(str, f.shape)) + ")"
        typer.echo(f"  {f.name:10s} {shape:14s} {f.kind}{' optional' if f.optional else ''}  {f.doc}")
    typer.echo("\nhyperparameters (options of fit):")
    for k, h in spec.hyperparameters.items():
        typer.echo(f"  {k:10s} default {h.default!r:10s} {h.constraint:12s} {h.doc}")
    typer.echo("\nmethods and their options (defaults):")
    for m in spec.methods:
        meth = get_method(spec, m)
        opts = {**COMMON_OPTIONS, **meth.options, **spec.method_options.get(m, {})}
        typer.echo(f"  {m} ({meth.kind}): " + ", ".join(f"{k}={v!r}" for k, v in opts.items()))


@app.command()
def fit(
    model: Annotated[str, typer.Argument(help="Model name (see `zoo list`).")],
    out: Annotated[Path, typer.Option("--out", "-o", help="Where to write the result (netCDF DataTree).")],
    method: Annotated[str, typer.Option("--method", "-m", help="nuts, svi, or a kernel the model lists.")] = "nuts",
    seed: Annotated[int, typer.Option(help="Random seed; the same seed and options give identical draws.")] = 0,
    data: Annotated[Path | None, typer.Option(
        help="An .npz file holding the model's data arrays (see `zoo show MODEL`); "
             "default: the simulator's default dataset.")] = None,
    set_: Annotated[list[str] | None, typer.Option(
        "--set", help="KEY=VALUE: an option of the method or a hyperparameter, e.g. --set num_samples=500 "
                      "--set K=4. Repeatable.")] = None,
    progress: Annotated[bool, typer.Option(help="Show a progress bar.")] = True,
) -> None:
    """Fit MODEL with one method and save the ArviZ DataTree to --out."""
    _setup()
    import inference

    spec = _spec(model)
    options = {"progress": progress, **_parse_sets(set_ or [])}
    try:
        tree = inference.fit(spec, _load_data(data, spec), method, seed=seed, **options)
    except ValueError as exc:
        raise typer.BadParameter(str(exc)) from None
    path = inference.save(tree, out)
    typer.echo(f"{model}/{method}: compile {tree.attrs['compile_seconds']:.1f} s, run "
               f"{tree.attrs['run_seconds']:.1f} s -> {path}")


def _comparison_data(spec) -> tuple[dict, str | None]:
    """(data, reference tag) for ``zoo compare``/``zoo demo``: the exact arrays stored with the model's reference
    (``default``, else its first stored tag, e.g. mppca's ``t11``), so that every comparison is scored against a
    stored, healthy NUTS run on any CPU; a model without a stored reference fits its simulator's default data."""
    from diagnostics import references

    if references.stored_tags(spec.name):
        return references.reference_data(spec.name)
    return spec.default_data()[0], None


def run_comparison(spec, methods: list[str], out: Path, seed: int = 0, fresh: bool = False,
                   progress: bool = True) -> dict:
    """Fit ``methods`` on the model's comparison data (``_comparison_data``) with the demo options, write
    every tree to ``out/<model>/<method>.nc`` (reused on a rerun when seed, options and data match, so an interrupted
    run resumes) and return ``{method: tree}``; the reference is the stored one when it matches."""
    import diagnostics
    import inference
    from diagnostics.references import data_checksum

    data, tag = _comparison_data(spec)
    checksum = data_checksum(spec, data)
    trees = {}
    for i, method in enumerate(methods, 1):
        options = dict(spec.demo_options.get(method, {}))
        path = out / spec.name / f"{method}.nc"
        stamp = json.dumps({"seed": seed, "options": options, "data": checksum}, sort_keys=True, default=str)
        if path.is_file() and not fresh:
            tree = inference.load(path)
            if tree.attrs.get("run_stamp") == stamp:
                typer.echo(f"  [{i}/{len(methods)}] {spec.name}/{method}: reusing {path}")
                trees[method] = tree
                continue
        t0 = time.time()
        tree = inference.fit(spec, data, method, seed=seed, progress=progress, **options)
        tree.attrs["run_stamp"] = stamp
        inference.save(tree, path)
        trees[method] = tree
        typer.echo(f"  [{i}/{len(methods)}] {spec.name}/{method}: {time.time() - t0:.1f} s "
                   f"(compile {tree.attrs['compile_seconds']:.1f} s) -> {path}")
    reference = diagnostics.references.load(spec.name, data, tag=tag) if tag is not None else None
    if reference is not None:
        trees = {"reference (stored NUTS)": reference, **trees}
    return trees


def _write_comparison(spec, trees: dict, out: Path) -> Path:
    import diagnostics

    return Path(diagnostics.report(spec.name, trees, out / spec.name))


@app.command()
def compare(
    model: Annotated[str, typer.Argument(help="Model name (see `zoo list`).")],
    methods: Annotated[str, typer.Option(help="Comma-separated methods; default: all the model supports.")] = "",
    out: Annotated[Path, typer.Option("--out", "-o", help="Output directory.")] = Path("zoo-compare"),
    seed: Annotated[int, typer.Option(help="Random seed for every fit.")] = 0,
    fresh: Annotated[bool, typer.Option(help="Refit even when a matching result exists in --out.")] = False,
) -> None:
    """Fit several methods on the model's reference data (its default data, or the dataset of its stored NUTS
    reference) and write the comparison (scorecard, plots,
    HTML report) against the MCMC reference to --out/MODEL/."""
    _setup()
    spec = _spec(model)
    chosen = [m.strip() for m in methods.split(",") if m.strip()] or list(spec.methods)
    bad = [m for m in chosen if m not in spec.methods]
    if bad:
        raise typer.BadParameter(f"{model!r} supports {list(spec.methods)}, got {bad}", param_hint="--methods")
    trees = run_comparison(spec, chosen, out, seed, fresh)
    typer.echo(f"comparison written to {_write_comparison(spec, trees, out)}")


@app.command()
def demo(
    out: Annotated[Path, typer.Option("--out", "-o", help="Output directory.")] = Path("zoo-demo"),
    models: Annotated[str, typer.Option(help="Comma-separated models; default: all.")] = "",
    seed: Annotated[int, typer.Option(help="Random seed for every fit.")] = 0,
    fresh: Annotated[bool, typer.Option(help="Refit even when a matching result exists in --out.")] = False,
) -> None:
    """The main job (`make demo`): every model, every method, compared with MCMC; writes an HTML
    report per model and an index page. Resumes an interrupted run unless --fresh."""
    _setup()
    import zoo

    names = [m.strip() for m in models.split(",") if m.strip()] or zoo.list_models()
    t0 = time.time()
    pages = {}
    for i, name in enumerate(names, 1):
        spec = _spec(name)
        typer.echo(f"[{i}/{len(names)}] {name}: {', '.join(spec.methods)}")
        trees = run_comparison(spec, list(spec.methods), out, seed, fresh)
        pages[name] = _write_comparison(spec, trees, out)
    import diagnostics

    index = Path(diagnostics.report_index(pages, out))
    typer.echo(f"demo finished in {time.time() - t0:.0f} s; open {index.resolve()}")


@app.command()
def references(
    models: Annotated[list[str] | None, typer.Argument(help="Models to (re)generate; default: all.")] = None,
    force: Annotated[bool, typer.Option(help="Regenerate even references that are stored, healthy and current.")
                     ] = False,
    check: Annotated[bool, typer.Option(help="Run nothing: recompute each stored reference's health from its "
                                             "stored draws and check its validation record.")] = False,
) -> None:
    """Make the stored reference posteriors in zoo/references/ (`make references`), to posteriordb's standard or
    stricter: per model and reference dataset a long NUTS run (4 chains, 4000 stored draws), a second run with
    another seed and, where the model names one, a long run of its exact Gibbs kernel. A reference is stored
    only if R-hat < 1.01 and bulk and tail ESS >= 400 on every compared quantity, there is no divergence,
    E-BFMI > 0.3, and the other runs' compared means agree within 4 combined Monte Carlo standard errors;
    otherwise nothing is stored and the failed quantities are named, with what to try (exit status 1).

    Resumable: a stored reference that is healthy and was made with the current settings on the same data is
    kept (--force regenerates it), and each finished run is checkpointed in zoo/references/.work/, so an
    interrupted run restarts only what is missing."""
    import os

    # JAX's CPU LAPACK calls go through scipy's OpenBLAS; with its default threads a 51 x 51 triangular solve took
    # 5-10 ms instead of 0.02 ms on a loaded 2-core machine (NUTS on the collapsed probit model: 39 s vs 3.5 s).
    # Read when OpenBLAS loads, so it is set before _setup imports anything.
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
    _setup()
    import json as _json

    import inference
    import zoo
    from diagnostics import references as refs

    refused = []
    for name in models or zoo.list_models():
        spec = _spec(name)
        sets = spec.reference_datasets() if spec.reference_datasets else {
            "default": (spec.default_data()[0], dict(spec.reference_options))}
        for tag, (data, options) in sets.items():
            label = f"{name}/{tag}"
            path = refs.reference_path(name, tag)
            if path.is_file():   # regenerate on the stored arrays when a re-simulation matches them (other last bits)
                stored = refs.data_of(inference.load(path))
                data = stored if refs.data_mismatch(spec, stored, data) is None else data
            if check:
                problems = refs.verify(inference.load(path)) if path.is_file() else ["not stored"]
                typer.echo(f"{label}: " + ("ok" if not problems else "; ".join(problems)))
                refused += [label] if problems else []
                continue
            why = refs.is_current(name, tag, data, options)
            if why is None and not force:
                typer.echo(f"{label}: kept (stored, healthy, made with the current settings on these data)")
                continue
            typer.echo(f"{label}: generating ({why or '--force'})")
            try:
                tree = refs.generate(name, data, tag=tag, progress=True, log=typer.echo, **options)
            except refs.UnhealthyReference as exc:
                typer.echo(f"{label}: REFUSED. {exc}", err=True)
                refused.append(label)
                continue
            record = _json.loads(tree.attrs["validation"])
            typer.echo(f"{label}: stored {refs.reference_path(name, tag)} (second seed max |z| "
                       f"{record['second_seed']['max_abs_z']:.2f}"
                       + (f", cross-check max |z| {record['crosscheck']['max_abs_z']:.2f}" if record["crosscheck"]
                          else "") + ")")
    if refused:
        typer.echo(f"{len(refused)} reference(s) {'failed the check' if check else 'not stored'}: "
                   f"{', '.join(refused)}", err=True)
        raise typer.Exit(1)


if __name__ == "__main__":
    app()
