"""The ``zoo`` command line (typer): it parses arguments and calls ``zoo``, ``inference`` and ``diagnostics``
(the comparison pipeline is ``diagnostics.comparison``). JAX, NumPyro and ArviZ are imported inside the commands
so that ``zoo --help`` answers at once."""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Annotated

import typer

app = typer.Typer(
    help="bayes-zoo: five papers' models, hand-written inference kernels beside NUTS/SVI, and "
         "diagnostics that compare every posterior with MCMC.",
    no_args_is_help=True, add_completion=False, pretty_exceptions_enable=False, rich_markup_mode="markdown",
)

DEFAULT_CACHE = Path.home() / ".cache" / "bayes-zoo" / "jax"


def _print_version(value: bool) -> None:
    if value:
        from zoo import __version__

        typer.echo(f"bayes-zoo {__version__}")
        raise typer.Exit()


@app.callback()
def _main(version: Annotated[bool, typer.Option(
        "--version", callback=_print_version, is_eager=True, help="Print the version and exit.")] = False) -> None:
    """bayes-zoo: five papers' models, hand-written inference kernels beside NUTS/SVI, and diagnostics that
    compare every posterior with MCMC."""


def _setup(device: str | None = None) -> None:
    """Import the packages (configures JAX), turn on the persistent compilation cache, and select ``device``
    (``--device``; None: ``$BAYES_ZOO_DEVICE``, else the CPU) before JAX computes anything."""
    import os

    os.environ.setdefault("BAYES_ZOO_JAX_CACHE", str(DEFAULT_CACHE))
    os.environ.setdefault("MPLBACKEND", "Agg")
    try:
        from zoo import _runtime
    except ValueError as exc:   # a set-up variable that cannot be read (e.g. BAYES_ZOO_JAX_CACHE_MIN_SECONDS)
        raise typer.BadParameter(str(exc)) from None

    try:
        if device is not None:
            _runtime.set_device(device.strip().lower(), "device")
        elif (requested := _runtime.requested_device()) is not None:
            _runtime.set_device(requested, _runtime.DEVICE_ENV)
    except ValueError as exc:
        raise typer.BadParameter(str(exc).removeprefix("device: "),
                                 param_hint="--device" if device is not None else None) from None
    import diagnostics  # noqa: F401
    import inference  # noqa: F401


def _spec(name: str):
    import zoo

    try:
        return zoo.get(name)
    except ValueError as exc:
        raise typer.BadParameter(str(exc), param_hint="MODEL") from None


# Arguments of ``inference.fit`` that have their own command-line option, never a --set.
_OWN_OPTIONS = {"seed": "--seed", "method": "--method", "model": "MODEL", "data": "--data", "columns": "--column",
                "dropna": "--dropna", "device": "--device"}


def _parse_sets(pairs: list[str]) -> dict:
    """``["K=4", "guide='mvn'", "prior=paper"]`` -> ``{"K": 4, "guide": "mvn", "prior": "paper"}``."""
    out = {}
    for pair in pairs:
        if "=" not in pair:
            raise typer.BadParameter(f"expected KEY=VALUE, got {pair!r}", param_hint="--set")
        key, raw = pair.split("=", 1)
        key = key.strip()
        if not key.isidentifier():
            raise typer.BadParameter(f"expected KEY=VALUE with KEY an option or hyperparameter name, got {pair!r}",
                                     param_hint="--set")
        if key in _OWN_OPTIONS:
            raise typer.BadParameter(f"{key} is not set with --set; use {_OWN_OPTIONS[key]}", param_hint="--set")
        if key in out:
            raise typer.BadParameter(f"{key} is given twice", param_hint="--set")
        try:
            out[key] = ast.literal_eval(raw)
        except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
            out[key] = raw
    return out


DataOption = Annotated[Path | None, typer.Option(
    "--data", help="A data file: .csv or .parquet (a table, one row per observation; its columns feed the model's "
                   "fields, see `zoo show MODEL` and --column) or .npz (the model's arrays by field name).")]
ColumnOption = Annotated[list[str] | None, typer.Option(
    "--column", help="FIELD=COL or FIELD=COL1,COL2,...: the column(s) of a .csv/.parquet file that feed a field "
                     "of the model, e.g. --column y=sales --column X=price,promo --column agent=store. Fields "
                     "not named take the column of their own name, the model's remaining matrix field every "
                     "other column. Repeatable.")]
DeviceOption = Annotated[str | None, typer.Option(
    "--device", help="cpu or gpu: where JAX computes (default: $BAYES_ZOO_DEVICE, else cpu; JAX picks it once per "
                     "process). The CPU is the default: zoo-sized fits are latency-bound and ran faster on 2 CPU "
                     "cores than on an H100 (docs/guide/cli_details.md, Devices). gpu needs CUDA JAX (pip install -U "
                     "'jax[cuda13]'); asking for it where JAX finds no GPU is an error saying what was found.",
    metavar="cpu|gpu")]
DropnaOption = Annotated[bool, typer.Option(
    "--dropna", help="Drop the rows of a .csv/.parquet file with a missing value where the model allows none "
                     "(default: such rows are an error naming the column and the number of rows).")]


def _load_data(path: Path | None, spec, columns: list[str] | None = None, dropna: bool = False
               ) -> tuple[object, dict]:
    """(data, table options for ``inference.fit``): a .csv/.parquet file as a DataFrame with its ``columns``
    and ``dropna``; an .npz file as a dict of arrays; no file: the simulator's default dataset."""
    from zoo._frames import parse_column_options, read_table, unnamed_columns

    try:
        mapping = parse_column_options(columns or [])
    except ValueError as exc:
        raise typer.BadParameter(str(exc).removeprefix("--column: "), param_hint="--column") from None
    if path is None:
        if mapping or dropna:
            raise typer.BadParameter("--column and --dropna read a .csv/.parquet file given with --data",
                                     param_hint="--column" if mapping else "--dropna")
        return spec.default_data()[0], {}
    try:
        data = read_table(path)
    except ValueError as exc:
        hint = f" (see `zoo show {spec.name}` for the columns or arrays it needs)" if "npz" in str(exc) else ""
        raise typer.BadParameter(str(exc).removeprefix("path: ") + hint, param_hint="--data") from None
    for name in unnamed_columns(getattr(data, "columns", [])):
        typer.echo(f"warning: {str(path)!r}: column {name!r} has no name in the header; it is probably the row "
                   f"index DataFrame.to_csv writes, and it is read as data (save the file with index=False, or "
                   f"name the columns with --column)", err=True)
    if isinstance(data, dict):
        if mapping or dropna:
            raise typer.BadParameter(f"{str(path)!r} is an .npz archive of arrays named by field; --column and "
                                     f"--dropna are for .csv/.parquet tables", param_hint="--column" if mapping
                                     else "--dropna")
        return data, {}
    return data, {"columns": mapping or None, "dropna": dropna}


def _check_out(out: Path, *, directory: bool) -> None:
    """Refuse ``--out`` before anything runs (a long fit's result would otherwise be lost at the end): a file
    path that is a directory, a directory path that is a file, or a place where no file can be created (the
    nearest existing folder above it is a file, or is not writable: a test file is created there and removed)."""
    import tempfile

    if directory and out.exists() and not out.is_dir():
        raise typer.BadParameter(f"{str(out)!r} is a file, not a directory", param_hint="--out")
    if not directory and out.is_dir():
        raise typer.BadParameter(f"{str(out)!r} is a directory; give a file name such as {str(out / 'fit.nc')!r}",
                                 param_hint="--out")
    folder = out if directory else out.parent
    existing = next(p for p in (folder, *folder.parents) if p.exists())
    if not existing.is_dir():
        raise typer.BadParameter(f"cannot write {str(out)!r}: {str(existing)!r} is a file, not a directory",
                                 param_hint="--out")
    try:
        with tempfile.TemporaryFile(dir=existing):
            pass
    except OSError as exc:
        raise typer.BadParameter(f"cannot write {str(out)!r}: {str(existing)!r} is not writable ({exc.strerror})",
                                 param_hint="--out") from None


@app.command("list")
def list_models() -> None:
    """List the registered models, their papers, methods and real datasets."""
    _setup()
    import inference
    import zoo

    for name in zoo.list_models():
        spec = zoo.get(name)
        typer.echo(f"{name:14s} {', '.join(inference.methods_for(spec))}")
        if spec.paper:
            typer.echo(f"{'':14s} {spec.paper}")
        for ds_name, ds in spec.real_datasets.items():
            typer.echo(f"{'':14s} real data: {ds_name} ({ds.source}; {ds.size_text()})")


@app.command()
def show(model: Annotated[str, typer.Argument(help="Model name (see `zoo list`).")]) -> None:
    """Show a model's data contract, real datasets, hyperparameters and methods with their options."""
    _setup()
    from inference import methods_for
    from inference._methods import get_method
    from zoo._frames import describe_mapping, example_header

    spec = _spec(model)
    typer.echo(f"{spec.name}: {spec.description or spec.paper}")
    typer.echo("\ndata as a table (--data FILE.csv / .parquet; a pandas DataFrame for inference.fit), e.g. the "
               "header")
    typer.echo(f"  {example_header(spec)}")
    for line in describe_mapping(spec):
        typer.echo(f"  {line}")
    typer.echo("\ndata as arrays (--data FILE.npz; a dict of arrays for inference.fit):")
    for f in spec.data_fields:
        shape = "(" + ", ".join(map(str, f.shape)) + ")"
        typer.echo(f"  {f.name:10s} {shape:14s} {f.kind}{' optional' if f.optional else ''}  {f.doc}")
    if spec.real_datasets:
        typer.echo("\nreal datasets (shipped in installed packages; Python: zoo.get(MODEL).real_data(NAME) -> "
                   "(data, hyperparameters)):")
        for ds_name, ds in spec.real_datasets.items():
            typer.echo(f"  {ds_name:10s} {ds.source}; {ds.size_text()}")
            typer.echo(f"  {'':10s} {ds.description}")
            typer.echo(f"  {'':10s} hyperparameters: {dict(ds.hyper)}; licence: {ds.licence}")
    typer.echo("\nhyperparameters (the prior; the same defaults for fit, compare --data and sensitivity, changed "
               "with --set NAME=VALUE, in Python a keyword of fit or hyper={NAME: VALUE}; a default of None is "
               "derived from the data as its meaning says, the same way in every command):")
    for k, h in spec.hyperparameters.items():
        typer.echo(f"  {k:10s} default {h.default!r:10s} {h.constraint:12s} {h.doc}")
    own = {k: v for k, v in spec.settings.reference_options.items()
           if k in spec.hyperparameters and v != spec.hyperparameters[k].default}
    if own:
        typer.echo(f"  (zoo compare {spec.name} without --data and zoo demo fit the stored reference's data with its "
                   f"own hyperparameters: {', '.join(f'{k}={v!r}' for k, v in own.items())})")
    typer.echo("\nmethods and their options (default, constraint, meaning):")
    for m in methods_for(spec):
        meth = get_method(spec, m)
        overrides = spec.settings.method_options.get(m, {})
        typer.echo(f"  {m} ({meth.kind})")
        for k, o in meth.declared.items():
            allowed = f"one of {list(o.choices)}" if o.choices else o.constraint
            typer.echo(f"    {k:18s} {overrides.get(k, o.default)!r:14s} {allowed:18s} {o.doc}")


@app.command()
def fit(
    model: Annotated[str, typer.Argument(help="Model name (see `zoo list`).")],
    out: Annotated[Path, typer.Option("--out", "-o", help="Where to write the result (netCDF DataTree); "
                                                                              "checked before fitting.")],
    method: Annotated[str, typer.Option("--method", "-m", help="nuts, svi, or a kernel of the model (`zoo show`).")
                      ] = "nuts",
    seed: Annotated[int, typer.Option(help="Random seed; the same seed and options give identical draws.")] = 0,
    data: DataOption = None,
    column: ColumnOption = None,
    dropna: DropnaOption = False,
    set_: Annotated[list[str] | None, typer.Option(
        "--set", help="KEY=VALUE: an option of the method or a hyperparameter, e.g. --set num_samples=500 "
                      "--set K=4. Repeatable.")] = None,
    progress: Annotated[bool | None, typer.Option(
        "--progress/--no-progress", help="Show a progress bar (default: only when stderr is a terminal).")] = None,
    device: DeviceOption = None,
) -> None:
    """Fit MODEL with one method and save the ArviZ DataTree to --out (without --data: the simulator's default
    dataset). A table's labels (store names, subjects, its row index, its column names) become the tree's
    coordinates."""
    _check_out(out, directory=False)
    _setup(device)
    import inference
    from inference.progress import explained_warnings

    spec = _spec(model)
    options = {"progress": progress, **_parse_sets(set_ or [])}
    values, table = _load_data(data, spec, column, dropna)
    try:
        with explained_warnings(typer.echo):
            tree = inference.fit(spec, values, method, seed=seed, **table, **options)
    except ValueError as exc:
        raise typer.BadParameter(str(exc)) from None
    except inference.NonFiniteError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(1) from None
    try:
        path = inference.save(tree, out)
    except OSError as exc:
        raise typer.BadParameter(f"could not write {str(out)!r}: {exc}", param_hint="--out") from None
    typer.echo(f"{model}/{method}: compile {tree.attrs['compile_seconds']:.1f} s, run "
               f"{tree.attrs['run_seconds']:.1f} s -> {path}")


@app.command()
def compare(
    model: Annotated[str, typer.Argument(help="Model name (see `zoo list`).")],
    methods: Annotated[str, typer.Option(
        help="Comma-separated methods; default: every method of the model (`zoo show MODEL`).")] = "",
    out: Annotated[Path, typer.Option("--out", "-o", help="Output directory (checked before anything runs).")
                   ] = Path("zoo-compare"),
    seed: Annotated[int, typer.Option(help="Random seed for every fit.")] = 0,
    fresh: Annotated[bool, typer.Option(help="Refit even when a matching result exists in --out.")] = False,
    data: DataOption = None,
    column: ColumnOption = None,
    dropna: DropnaOption = False,
    set_: Annotated[list[str] | None, typer.Option(
        "--set", help="With --data: KEY=VALUE, a hyperparameter shared by the reference and every method, e.g. "
                      "--set K=2 --set sigma=1.0; unset ones are the model's defaults, as for `zoo fit` (`zoo show "
                      "MODEL`). Repeatable.")] = None,
    reference: Annotated[list[str] | None, typer.Option(
        "--reference", help="With --data: KEY=VALUE, a NUTS option of the reference made on your data, e.g. "
                            "--reference num_samples=4000 --reference dense_mass=True. Repeatable.")] = None,
    reference_method: Annotated[str | None, typer.Option(
        help="With --data: the exact sampler that makes the reference (e.g. gibbs, nuts), instead of the model's "
             "reference samplers tried in order; the others still cross-check it.")] = None,
    reference_budget: Annotated[float, typer.Option(
        help="With --data: seconds each reference sampler may run while a run short of the health rule only for "
             "want of draws is run longer; 0: judged once at its length.")] = 600.0,
    cache_dir: Annotated[Path | None, typer.Option(
        help="With --data: where references made on your data are cached (default: "
             "$BAYES_ZOO_CACHE/references or ~/.cache/bayes-zoo/references).")] = None,
    fresh_reference: Annotated[bool, typer.Option(help="With --data: remake the cached reference.")] = False,
    reference_posteriordb: Annotated[str | None, typer.Option(
        help="ROOT/NAME: judge the methods against the reference draws of posterior NAME of the local posterior "
             "database ROOT (posteriordb's layout, e.g. written by `zoo references --export-posteriordb ROOT`), "
             "fitted on its data with its hyperparameters.", metavar="ROOT/NAME")] = None,
    ladder: Annotated[bool, typer.Option(
        "--ladder", help="Also run every method on a ladder of about 6 budgets (draws per chain, SVI steps, VB/EM "
                         "iterations, ADMM rounds; stopping rules off) from too short to twice its setting, scored "
                         "against the same reference: --out/MODEL/cost_accuracy.csv, the plot of error against "
                         "run seconds and the page's table 'time to reach the rule'. Costs several fits per "
                         "method.")] = False,
    device: DeviceOption = None,
) -> None:
    """Fit several methods and write the comparison with an MCMC reference (scorecard, verdicts, plots, HTML
    report) to --out/MODEL/: on the data of the model's stored NUTS reference, or with --data on your own
    data. With --ladder, also accuracy against compute: every method on a ladder of budgets.

    **Your own data** (--data FILE.csv/.parquet/.npz, columns as for `zoo fit`): a reference is made on it by
    the model's best exact sampler (hlcr, gp_alps: the collapsed Gibbs kernel; the others: NUTS), to the stored
    references' standard (the health rule below and a second seed), cross-checked against the model's other
    exact samplers where they are healthy; the next sampler is tried when one fails, and a run short only for
    want of draws is run longer within --reference-budget seconds. --reference-method picks the sampler. It is
    cached by the data, model, hyperparameters and settings (--cache-dir): a second run reuses it, an
    interrupted one resumes from the runs already finished. If no exact sampler is healthy, nothing is judged
    against it (NOT JUDGED; the report lists the samplers tried, why each failed, and what to try).

    Every method gets one of four verdicts:

    * **PASS**: every compared quantity of the reference was compared and meets the method's rule.

    * **FAIL**: it disagrees with the reference, or lacks some of its quantities; the reason names the
      quantity, the number and the rule.

    * **NOT CONVERGED**: a sampler whose own chains have not mixed (R-hat >= 1.01 or bulk/tail ESS < 400 on a
      compared quantity); the reason says how much longer to run (e.g. num_samples 1000 -> 4000).

    * **NOT JUDGED**: the reference fails the MCMC health rule (>= 4 chains, >= 4000 draws, R-hat < 1.01 and
      ESS >= 400 on every compared quantity, no divergences, E-BFMI > 0.3): nothing is judged against it (a
      sampler that has not mixed is NOT CONVERGED all the same).

    Two kinds of rule. **Samplers** (nuts, gibbs): z-tests of the mean and sd differences in combined Monte
    Carlo standard errors, Bonferroni-corrected over the method's tests at family-wise error 0.01.
    **Approximations** (variational methods, point estimates): mean within 0.2 reference sd, sd ratio 0.8-1.25,
    PSIS k-hat <= 0.7. Bounded quantities (probabilities) never fail on a difference below 1 % of their range.
    """
    _check_out(out, directory=True)
    _setup(device)
    from diagnostics.comparison import compare as compare_on_data
    from diagnostics.comparison import ladder_of, run_comparison, write_comparison
    from inference import methods_for
    from inference.progress import explained_warnings

    spec = _spec(model)
    chosen = [m.strip() for m in methods.split(",") if m.strip()] or methods_for(spec)
    if reference_posteriordb is not None:
        if data is not None or column or dropna or set_ or reference or reference_method or cache_dir or \
                fresh_reference or ladder:
            raise typer.BadParameter("--reference-posteriordb brings its own data and hyperparameters; it does not "
                                     "go with --data, --column, --dropna, --set, --ladder or the --reference "
                                     "options",
                                     param_hint="--reference-posteriordb")
        from diagnostics.posteriordb import compare_with_posteriordb

        try:
            with explained_warnings(typer.echo):
                page = compare_with_posteriordb(spec, reference_posteriordb, chosen, out, seed=seed, fresh=fresh,
                                                log=typer.echo)
        except ValueError as exc:
            raise typer.BadParameter(str(exc).split(": ", 1)[-1] if str(exc).startswith("reference_posteriordb")
                                     else str(exc), param_hint="--reference-posteriordb") from None
        typer.echo(f"comparison written to {page}")
        return
    if data is not None:
        values, table = _load_data(data, spec, column, dropna)
        try:
            result = compare_on_data(spec, values, chosen, out=out, seed=seed, hyper=_parse_sets(set_ or []),
                                     reference=_parse_sets(reference or []), reference_method=reference_method,
                                     reference_budget=reference_budget or None, cache_dir=cache_dir, fresh=fresh,
                                     fresh_reference=fresh_reference, ladder=ladder, log=typer.echo, **table)
        except ValueError as exc:
            raise typer.BadParameter(str(exc)) from None
        ref = result.reference
        source = (f"the stored reference {ref.stored!r}" if ref.stored else "reused from the cache" if ref.reused
                  else f"made in {ref.seconds:.0f} s")
        typer.echo(f"reference: {source} ({'healthy' if ref.healthy else 'NOT healthy'}) in {ref.folder}; made by "
                   f"{ref.method}")
        typer.echo(f"comparison written to {result.page} ({result.seconds['total']:.0f} s)")
        return
    if column or dropna or set_ or reference or cache_dir or fresh_reference or reference_method:
        raise typer.BadParameter("--column, --dropna, --set, --reference, --reference-method, --cache-dir and "
                                 "--fresh-reference go with --data (your own data)", param_hint="--data")
    with explained_warnings(typer.echo):
        try:  # every method and option is validated before the first fit
            trees = run_comparison(spec, chosen, out, seed=seed, fresh=fresh, log=typer.echo)
            frame = ladder_of(spec, chosen, out / spec.name, fresh=fresh, log=typer.echo) if ladder else None
        except ValueError as exc:
            raise typer.BadParameter(str(exc), param_hint="--methods" if str(exc).startswith("method:") else None
                                     ) from None
        typer.echo(f"comparison written to {write_comparison(spec, trees, out, ladder=frame, log=typer.echo)}")


@app.command()
def sensitivity(
    model: Annotated[str, typer.Argument(help="Model name (see `zoo list`).")],
    data: DataOption = None,
    method: Annotated[str, typer.Option("--method", "-m", help="The fit whose draws are power-scaled: nuts, svi or "
                                                               "a kernel of the model (`zoo show`).")] = "nuts",
    prior_sites: Annotated[str, typer.Option(
        help="Comma-separated prior sites to power-scale (selective scaling), e.g. w,psi; default: every prior "
             "site.")] = "",
    column: ColumnOption = None,
    dropna: DropnaOption = False,
    set_: Annotated[list[str] | None, typer.Option(
        "--set", help="KEY=VALUE: an option of the method or a hyperparameter (unset ones are the model's defaults, "
                      "as for `zoo fit`; `zoo show MODEL`). Repeatable.")] = None,
    out: Annotated[Path, typer.Option("--out", "-o", help="Output directory (checked before anything runs).")
                   ] = Path("zoo-sensitivity"),
    seed: Annotated[int, typer.Option(help="Random seed of the fit.")] = 0,
    fresh: Annotated[bool, typer.Option(help="Refit even when a matching fit exists in --out.")] = False,
    device: DeviceOption = None,
) -> None:
    """Prior sensitivity of MODEL on your data (--data; default: the simulator's default dataset): fit --method,
    power-scale the prior and the likelihood (Kallioinen et al. 2024: the draws are re-weighted, nothing is
    refitted), and write --out/MODEL/sensitivity/sensitivity.html with the table, the plots and the Pareto k-hat
    flags (k-hat > 0.7: the re-weighting cannot be trusted, the sensitivity is probably higher than it
    appears).

    Each quantity gets **prior** and **likelihood** sensitivities (how fast its distribution moves per log2 of
    the power): both >= 0.05 reads *prior-data conflict*, the prior alone *strong prior / weak likelihood*."""
    _check_out(out, directory=True)
    _setup(device)
    from diagnostics.comparison import sensitivity_report

    spec = _spec(model)
    values, table = _load_data(data, spec, column, dropna)
    sites = [p.strip() for p in prior_sites.split(",") if p.strip()] or None
    try:
        page = sensitivity_report(spec, values, method, out=out, prior_sites=sites, seed=seed, fresh=fresh,
                                  options=_parse_sets(set_ or []), log=typer.echo, **table)
    except ValueError as exc:
        raise typer.BadParameter(str(exc)) from None
    typer.echo(f"prior sensitivity written to {page}")


@app.command()
def demo(
    out: Annotated[Path, typer.Option("--out", "-o", help="Output directory (checked before anything runs).")
                   ] = Path("zoo-demo"),
    models: Annotated[str, typer.Option(help="Comma-separated models; default: all.")] = "",
    seed: Annotated[int, typer.Option(help="Random seed for every fit.")] = 0,
    fresh: Annotated[bool, typer.Option(help="Refit even when a matching result exists in --out.")] = False,
    workers: Annotated[int, typer.Option(help="Worker processes that run the fits side by side (they share the "
                                              "compilation cache, and each gets its share of the cores: with one "
                                              "per core, one thread and one device each); 0: one per core.")] = 0,
    ladders: Annotated[str, typer.Option(
        help="Which models' pages also show accuracy against compute (every method on a ladder of budgets, as `zoo "
             "compare --ladder`): 'cheap' (the models whose ladders fit the demo's time budget; the index page "
             "names the others), 'all', 'none', or comma-separated models.")] = "cheap",
    device: DeviceOption = None,
) -> None:
    """The main job (`make demo`): every model, every method, compared with MCMC; writes an HTML
    report per model, a real-data report per model (its own kernels on its real dataset, against the stored NUTS
    reference of those data; `zoo list` names the datasets) and an index page counting the four verdicts (PASS,
    FAIL, NOT CONVERGED, NOT JUDGED; see `zoo compare --help`). The fits run in --workers processes, slowest
    first; each model's pages are written there as soon as its fits are done. Resumes an interrupted run unless
    --fresh."""
    if workers < 0:
        raise typer.BadParameter(f"expected 0 (one per core) or a number of processes >= 1, got {workers}",
                                 param_hint="--workers")
    _check_out(out, directory=True)
    _setup(device)
    from diagnostics.demo import run_demo
    from diagnostics.workers import default_workers

    names = [_spec(m.strip()).name for m in models.split(",") if m.strip()] or None
    import zoo
    from diagnostics.demo import demo_ladders

    chosen = {"cheap": None, "all": True, "none": False}.get(ladders.strip().lower())
    if chosen is None and ladders.strip().lower() != "cheap":
        chosen = [_spec(m.strip()).name for m in ladders.split(",") if m.strip()]
    try:
        demo_ladders(names or zoo.list_models(), chosen)
    except ValueError as exc:
        raise typer.BadParameter(str(exc).removeprefix("ladders: "), param_hint="--ladders") from None
    run_demo(out, names, seed=seed, fresh=fresh, workers=workers or default_workers(), ladders=chosen,
             log=typer.echo)


@app.command()
def references(
    models: Annotated[list[str] | None, typer.Argument(help="Models to (re)generate; default: all.")] = None,
    force: Annotated[bool, typer.Option(help="Regenerate even references that are stored, healthy and current.")
                     ] = False,
    check: Annotated[bool, typer.Option(help="Run nothing: recompute each stored reference's health from its "
                                             "stored draws and check its validation record.")] = False,
    export_posteriordb: Annotated[Path | None, typer.Option(
        help="Run nothing: write every stored reference (of MODELS) into a posterior database at this folder, in "
             "posteriordb's layout (posteriors/, data/, models/ with runnable NumPyro code, reference_posteriors/).")
    ] = None,
    device: DeviceOption = None,
) -> None:
    """Make the stored reference posteriors in zoo/references/ (`make references`), to posteriordb's standard or
    stricter: per model and reference dataset (the simulated ones and each real dataset of the demo, tag
    real_<dataset>) a long NUTS run (4 chains, 4000 stored draws or the more its model asks for), a second run
    with another seed and, where the model names one, a long run of its exact Gibbs kernel. A reference is stored
    only if R-hat < 1.01 and bulk and tail ESS >= 400 on every compared quantity, there is no divergence,
    E-BFMI > 0.3, and the other runs' compared means agree within 4 combined Monte Carlo standard errors;
    otherwise nothing is stored and the failed quantities are named, with what to try (exit status 1).

    Resumable: a stored reference that is healthy and was made with the current settings on the same data is
    kept (--force regenerates it), and each finished run is checkpointed in zoo/references/.work/, so an
    interrupted run restarts only what is missing.

    --export-posteriordb DIR writes them for posteriordb's readers instead (its Python package:
    `PosteriorDatabase(DIR).posterior("hlcr_b2-hlcr").reference_draws()`); the draws are the compared quantities
    (label-invariant summaries for mixtures, as each model's info says)."""
    import os

    # JAX's CPU LAPACK calls go through scipy's OpenBLAS; with its default threads a 51 x 51 triangular solve took
    # 5-10 ms instead of 0.02 ms on a loaded 2-core machine (NUTS on the collapsed probit model: 39 s vs 3.5 s).
    # Read when OpenBLAS loads, so it is set before _setup imports anything.
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
    _setup(device)
    import json

    import inference
    import zoo
    from diagnostics import references as refs

    if export_posteriordb is not None:
        if check or force:
            raise typer.BadParameter("--export-posteriordb runs nothing; it does not go with --check or --force",
                                     param_hint="--export-posteriordb")
        from diagnostics.posteriordb import export_posteriordb as export

        for name in models or []:
            _spec(name)
        try:
            written = export(export_posteriordb, models or None, log=typer.echo)
        except (ValueError, OSError) as exc:
            raise typer.BadParameter(str(exc), param_hint="--export-posteriordb") from None
        typer.echo(f"{len(written)} posterior(s) written to {export_posteriordb}")
        return
    refused = []
    for name in models or zoo.list_models():
        spec = _spec(name)
        for tag, (data, options) in spec.reference_sets().items():
            label = f"{name}/{tag}"
            path = refs.reference_path(name, tag)
            if path.is_file():   # regenerate on the stored arrays when a re-simulation matches them (other last bits)
                stored = inference.trees.data_of(inference.load(path))
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
                tree = refs.generate(name, data, tag=tag, progress=None, log=typer.echo, **options)
            except refs.UnhealthyReference as exc:
                typer.echo(f"{label}: REFUSED. {exc}", err=True)
                refused.append(label)
                continue
            record = json.loads(tree.attrs["validation"])
            typer.echo(f"{label}: stored {refs.reference_path(name, tag)} (second seed max |z| "
                       f"{record['second_seed']['max_abs_z']:.2f}"
                       + (f", cross-check max |z| {record['crosscheck']['max_abs_z']:.2f}" if record["crosscheck"]
                          else "") + ")")
    if refused:
        typer.echo(f"{len(refused)} reference(s) {'failed the check' if check else 'not stored'}: "
                   f"{', '.join(refused)}", err=True)
        raise typer.Exit(1)

