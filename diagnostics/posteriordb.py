"""Our stored references in posteriordb's layout (stan-dev/posteriordb), and posteriordb references as ours.

**Export** (``export_posteriordb(root)``, ``zoo references --export-posteriordb DIR``): every stored reference
``zoo/references/<model>__<tag>.nc`` becomes one posterior ``{data}-{model}`` of a posterior database at
``root``, in the layout of the database's files (which ``posteriordb`` 0.2's ``PosteriorDatabase`` reads; where its
``doc/DATABASE_CONTENT.md`` differs, the files win: the draws live in ``reference_posteriors/draws/draws/``):

* ``posteriors/{posterior}.json``: model, data and reference names, the dimension of each compared quantity;
* ``data/data/{data}.json.zip`` (one ``{data}.json`` inside: the data arrays as nested lists, matrices as lists of
  rows, missing values as ``NaN``, and the hyperparameters the reference was made with, beside them) and
  ``data/info/{data}.info.json`` (which keys are hyperparameters, each field's axes);
* ``models/info/{model}.info.json`` with a ``"numpyro"`` entry in ``model_implementations`` pointing at
  ``models/numpyro/{model}.py``: ``model(data)`` is the NumPyro model on posteriordb's data dict (it imports the
  model from the ``bayes-zoo`` package, which the info says);
* ``reference_posteriors/draws/draws/{posterior}.json.zip``: a list with one ``{name: [draws]}`` per chain, names
  1-based as posteriordb's (``w[1,2]``), in C order;
* ``reference_posteriors/draws/info/{posterior}.info.json``: the sampler and its settings, the diagnostics
  (bulk and tail ESS, R-hat, divergences and E-BFMI per chain, mean lag-1 autocorrelation), ``checks_made``
  (posteriordb's checks, answered honestly, and ours), the package versions, and our whole validation record;
* ``reference_posteriors/summary_statistics/{mean_value,mean_squared_value}/...``: means and mean squares with
  their Monte Carlo standard errors.

The draws are the **compared quantities** (``diagnostics.view.compared_posterior``): for models without label
symmetry the posterior variables themselves; for models with one (``ModelSpec.summaries``: the mixtures hlcr and
mppca, gp_alps's switched latent processes) the label-invariant summaries the comparison judges (sorted components,
co-clustering and inclusion probabilities, predictive means), because the raw parameters are defined only up to a
relabelling and no two runs need agree on them. The model's info text says which quantities they are and how they
are computed.

**Import** (``reference_from_posteriordb(root, name)``; ``zoo compare MODEL --reference-posteriordb ROOT/NAME``):
a posterior's reference draws from a local copy of a posterior database (no network) as a reference DataTree:
variables with named dims (ours: the dims and labels the export wrote; others: ``<name>_dim_<i>``), chains x
draws, the divergences and E-BFMI of each chain as ``sample_stats.divergences_run``/``ebfmi_run`` (what the health
rule reads), the data and hyperparameters when the model is one of ours, and the validation record in
``attrs["validation"]``. Its posterior holds the compared quantities already (``attrs["compared_posterior"]``),
so ``diagnostics.scorecard`` and ``method_scores`` judge any method's tree against it under the usual health rule.
"""

from __future__ import annotations

import datetime
import json
import re
import textwrap
import zipfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import xarray as xr

import zoo
from diagnostics import references
from diagnostics.health import mcmc_health
from diagnostics.quantities import COMPARED_ATTR, SAMPLE_DIMS, compared_posterior, component_labels
from diagnostics.view import scalar_stats
from inference import load as load_tree
from inference.trees import problem_of

ADDED_BY = "bayes-zoo"
IMPLEMENTATION = "numpyro"
_NAME = re.compile(r"^([A-Za-z_][\w.]*?)(?:\[(\d+(?:,\d+)*)\])?$")


def data_name(model: str, tag: str) -> str:
    """posteriordb's data name of the stored reference ``model``/``tag``: ``{model}_{tag}`` (unique: the data
    file holds the reference's hyperparameters too)."""
    return f"{model}_{tag}"


def posterior_name(model: str, tag: str) -> str:
    """posteriordb's posterior (and reference) name of the stored reference ``model``/``tag``:
    ``{data}-{model}``."""
    return f"{data_name(model, tag)}-{model}"


def _jsonable(value: Any) -> Any:
    """Nested lists of Python numbers/strings (NaN kept as NaN: posteriordb's Python reader and Stan's JSON
    reader accept it)."""
    arr = np.asarray(value)
    if arr.dtype.kind == "b":
        arr = arr.astype(int)
    return arr.tolist()


def _finite_or_none(values) -> list:
    return [float(v) if np.isfinite(v) else None for v in np.asarray(values, dtype=float).ravel()]


def _write_json(path: Path, obj: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(obj, indent=1) + "\n")


def _write_zip(path: Path, inner: str, obj: Any) -> None:
    """``path`` (a zip archive) holding one file ``inner`` with ``obj`` as JSON (deflated)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_DEFLATED) as z:
        z.writestr(inner, json.dumps(obj))


def posteriordb_draws(ds: xr.Dataset) -> tuple[list[dict[str, list[float]]], dict[str, dict]]:
    """(one ``{name: [draws]}`` per chain with 1-based names ``w[1,2]`` in C order, and per variable its
    ``dims``, ``shape`` and the ``coords`` of its labelled dims) of the float variables of ``ds``."""
    chains = [dict() for _ in range(ds.sizes["chain"])]
    variables = {}
    for name, da in ds.data_vars.items():
        if not np.issubdtype(da.dtype, np.floating):
            continue
        da = da.transpose(*SAMPLE_DIMS, ...)
        dims = [d for d in da.dims if d not in SAMPLE_DIMS]
        shape = tuple(da.sizes[d] for d in dims)
        values = np.asarray(da.values, dtype=float).reshape(da.sizes["chain"], da.sizes["draw"], -1)
        one_based = [_one_based(lab, str(name)) for lab in component_labels(str(name), shape)]
        for c, chain in enumerate(chains):
            for j, lab in enumerate(one_based):
                chain[lab] = values[c, :, j].tolist()
        variables[str(name)] = {"dims": dims, "shape": list(shape),
                                "coords": {d: _jsonable(ds[d].values) for d in dims if d in ds.coords}}
    return chains, variables


def _one_based(label: str, name: str) -> str:
    """``w[0,1]`` -> ``w[1,2]`` (positions as ``component_labels`` writes them without entries)."""
    if label == name:
        return label
    idx = label[len(name) + 1:-1].split(",")
    return f"{name}[{','.join(str(int(i) + 1) for i in idx)}]"


def _lag1_autocorrelation(draws: np.ndarray) -> np.ndarray:
    """Mean over chains of the lag-1 autocorrelation of each (label, chain, draw) row (0 for a constant chain)."""
    x = draws - draws.mean(axis=2, keepdims=True)
    den = np.sum(x * x, axis=2)
    num = np.sum(x[:, :, 1:] * x[:, :, :-1], axis=2)
    with np.errstate(invalid="ignore", divide="ignore"):
        ac = np.where(den > 0, num / den, 0.0)
    return ac.mean(axis=1)


def _compared_text(spec: zoo.ModelSpec) -> str:
    if spec.summaries is None:
        return ("The reference draws are the model's own parameters (the NumPyro sample sites), which the "
                "comparison judges directly.")
    doc = " ".join((spec.summaries.__doc__ or "").split())
    return ("The posterior has a label symmetry (a relabelling of mixture components or latent processes, a sign "
            "flip) that leaves the density unchanged, so its raw parameters are identified only up to it and two "
            "exact runs need not agree on them. The reference draws are therefore NOT the raw parameters "
            "but the label-invariant summaries that bayes-zoo compares, computed at every posterior draw of the "
            f"model's parameters by zoo.get({spec.name!r}).summaries(posterior, data, hyperparameters)"
            + (f": {doc}" if doc else ".") + " Any method's draws of the parameters are compared through the same "
            "function (diagnostics.compared_posterior).")


MODEL_CODE = '''"""NumPyro implementation of the bayes-zoo model {name!r}, for posteriordb's data dict.

{paper}

It imports the model from the bayes-zoo package (pip install bayes-zoo; the code is zoo/{module}.py), so the
density is exactly the one the reference was computed with. The data dict holds the data arrays and, beside them,
the hyperparameters (HYPERPARAMETERS below) the reference was made with.

    import jax, numpyro
    from numpyro.infer import MCMC, NUTS
    mcmc = MCMC(NUTS(model), num_warmup=500, num_samples=500)
    mcmc.run(jax.random.key(0), data)          # data = posteriordb's posterior(...).data.values()
"""

import numpy as np

import zoo

MODEL = {name!r}
HYPERPARAMETERS = {hyper!r}


def inputs(data):
    """The keyword arguments of the model for posteriordb's data dict (arrays validated by the data contract)."""
    from zoo._validation import validate_data

    spec = zoo.get(MODEL)
    hyper = {{k: data[k] for k in HYPERPARAMETERS if k in data}}
    arrays = validate_data(spec, {{k: np.asarray(v) for k, v in data.items() if k not in HYPERPARAMETERS}})
    return spec.inputs(arrays, {{**spec.default_hyper, **hyper}})


def model(data):
    """The NumPyro model conditioned on posteriordb's data dict (its observed sites observe the data)."""
    return zoo.get(MODEL).model(**inputs(data))
'''


def _created(tree: xr.DataTree) -> str:
    stamp = str(tree["posterior"].attrs.get("created_at", tree.attrs.get("created_at", "")))
    return stamp[:10] or datetime.date.today().isoformat()


def export_reference(tree: xr.DataTree, root: str | Path, tag: str) -> str:
    """Write the stored reference ``tree`` (tag ``tag``) into the posterior database at ``root`` (module
    docstring); returns its posterior name."""
    root = Path(root)
    spec, data, hyper = problem_of(tree)
    model, dname, pname = spec.name, data_name(spec.name, tag), posterior_name(spec.name, tag)
    record = json.loads(tree.attrs.get("validation", "{}"))
    date = _created(tree)
    ds = compared_posterior(tree, spec)
    chains, variables = posteriordb_draws(ds)
    names = list(chains[0])

    # ---- data
    clash = sorted(set(data) & set(hyper))
    if clash:
        raise ValueError(f"tree: data fields {clash} share names with hyperparameters; cannot write one data dict")
    fields = {f.name: f for f in spec.data_fields}
    _write_zip(root / "data" / "data" / f"{dname}.json.zip", f"{dname}.json",
               {**{k: _jsonable(v) for k, v in data.items()}, **{k: _jsonable(v) for k, v in hyper.items()}})
    real = spec.real_datasets.get(tag.removeprefix("real_")) if tag.startswith("real_") else None
    _write_json(root / "data" / "info" / f"{dname}.info.json", {
        "name": dname, "data_file": f"data/data/{dname}.json",
        "title": f"{model}: {real.description if real else f'simulated data set {tag!r} of bayes-zoo'}",
        "description": (f"The exact arrays the bayes-zoo reference {model}/{tag} was computed on"
                        + (f"; {real.description} Source: {real.source}; licence: {real.licence}." if real else
                           f" (simulated by zoo.get({model!r}).simulate).")
                        + " Besides the data fields it holds the hyperparameters of the reference (keys listed "
                          "under 'hyperparameters'). Matrices are lists of rows; NaN marks a missing value."),
        "hyperparameters": sorted(hyper),
        "fields": {k: {"axes": [str(s) for s in fields[k].shape], "kind": fields[k].kind, "doc": fields[k].doc}
                   for k in data if k in fields},
        "keywords": ["bayes-zoo"] + (["real data"] if real else ["simulated"]),
        "urls": [real.source] if real and str(real.source).startswith("http") else [],
        "references": [], "added_by": ADDED_BY, "added_date": date,
    })

    # ---- model
    module = spec.model.__module__.rsplit(".", 1)[-1]
    code = root / "models" / IMPLEMENTATION / f"{model}.py"
    code.parent.mkdir(parents=True, exist_ok=True)
    code.write_text(MODEL_CODE.format(name=model, paper=textwrap.fill(spec.paper or spec.description, 110),
                                      module=module, hyper=sorted(spec.hyperparameters)))
    _write_json(root / "models" / "info" / f"{model}.info.json", {
        "name": model, "title": spec.paper or model,
        "description": f"{spec.description} {_compared_text(spec)}".strip(),
        "keywords": ["bayes-zoo"] + (["multimodal", "label-invariant summaries"] if spec.summaries else []),
        "references": [], "urls": [], "prior": {"keywords": []},
        "model_implementations": {IMPLEMENTATION: {
            "model_code": f"models/{IMPLEMENTATION}/{model}.py",
            "requires": "bayes-zoo (imports its zoo package), numpyro, jax",
            "entry_point": "model(data): the NumPyro model on posteriordb's data dict"}},
        "compared_quantities": {"kind": "label-invariant summaries" if spec.summaries else "parameters",
                                "computed_by": f"zoo.get({model!r}).summaries" if spec.summaries else None},
        "added_by": ADDED_BY, "added_date": date, "licence": "see bayes-zoo",
    })

    # ---- posterior
    _write_json(root / "posteriors" / f"{pname}.json", {
        "name": pname, "model_name": model, "data_name": dname, "reference_posterior_name": pname,
        "dimensions": {k: int(np.prod(v["shape"], dtype=int)) for k, v in variables.items()},
        "keywords": ["bayes-zoo"], "references": [], "added_by": ADDED_BY, "added_date": date,
    })

    # ---- reference draws, their info, summary statistics
    _write_zip(root / "reference_posteriors" / "draws" / "draws" / f"{pname}.json.zip", f"{pname}.json", chains)
    arr = np.stack([np.asarray([chain[n] for chain in chains]) for n in names])        # (label, chain, draw)
    stats = scalar_stats(dict(zip(names, arr, strict=True)))
    health = mcmc_health(tree, ds)
    lag1 = _lag1_autocorrelation(arr)
    divergences = np.asarray(tree["sample_stats"]["divergences_run"].values).tolist() \
        if "divergences_run" in tree["sample_stats"] else None
    ebfmi = np.asarray(tree["sample_stats"]["ebfmi_run"].values).tolist() \
        if "ebfmi_run" in tree["sample_stats"] else None
    ess_ok = bool(np.all(np.nan_to_num(stats[["ess_bulk", "ess_tail"]].to_numpy(), nan=np.inf) >= 400))
    second, cross = record.get("second_seed") or {}, record.get("crosscheck") or {}
    info = {
        "name": pname,
        "inference": {"method": f"{IMPLEMENTATION}_{record.get('method', tree.attrs.get('method', 'nuts'))}",
                      "method_arguments": {**record.get("settings", {}), "seed": record.get("seeds", {}).get(
                          "reference", int(tree.attrs.get("seed", 0))),
                          "thinning": f"the run thinned evenly to {references.stored_draws(record.get('settings', {}))}"
                                      " stored draws (divergences and E-BFMI counted over the whole run)",
                          "nuts_reformulation": record.get("nuts_reformulation", "")}},
        "diagnostics": {
            "diagnostic_information": {"names": names},
            "ndraws": int(arr.shape[1] * arr.shape[2]), "nchains": int(arr.shape[1]),
            "effective_sample_size_bulk": _finite_or_none(stats["ess_bulk"]),
            "effective_sample_size_tail": _finite_or_none(stats["ess_tail"]),
            "r_hat": _finite_or_none(stats["rhat"]),
            "divergent_transitions": divergences,
            "expected_fraction_of_missing_information": ebfmi,
            "mean_lag1_ac": _finite_or_none(lag1),
        },
        "checks_made": {
            "ndraws_is_10k": bool(arr.shape[1] * arr.shape[2] >= 10000),
            "nchains_is_gte_4": bool(arr.shape[1] >= 4),
            "ess_within_bounds": ess_ok,
            "r_hat_below_1_01": bool(np.all(np.nan_to_num(stats["rhat"].to_numpy(), nan=1.0) < 1.01)),
            "efmi_above_0_2": None if ebfmi is None else bool(min(ebfmi) > 0.2),
            "abs_mean_lag1_ac_below_0_05": bool(np.all(np.abs(lag1) < 0.05)),
            "bayes_zoo_health_rule": bool(health["reliable"]),
            "second_seed_agrees": bool(second.get("max_abs_z", np.inf) < record.get("standard", {}).get("z_max", 4)),
            "exact_crosscheck_agrees": (bool(cross.get("max_abs_z", np.inf) < record.get("standard", {}).get(
                "z_max", 4)) if cross else None),
        },
        "comments": ("bayes-zoo reference: " + "; ".join(references.provenance(record)) + ". The checks "
                     "ndraws_is_10k and abs_mean_lag1_ac_below_0_05 are posteriordb's and answered as they are: "
                     "our standard asks 4 chains and 4000 stored draws with bulk and tail ESS >= 400 and R-hat < "
                     "1.01 on every quantity, no divergence, E-BFMI > 0.3, and a second seed (and an exact Gibbs "
                     "cross-check where the model has one) agreeing within 4 combined MCSE; the draws are "
                     "autocorrelated, their ESS is given. The draws are the compared quantities: "
                     + _compared_text(spec)),
        "added_by": ADDED_BY, "added_date": date,
        "versions": record.get("package_versions") or json.loads(tree.attrs.get("package_versions", "{}")),
        "variables": variables,
        "bayes_zoo": {"model": model, "tag": tag, "compared_posterior": True, "validation": record},
    }
    _write_json(root / "reference_posteriors" / "draws" / "info" / f"{pname}.info.json", info)
    summary_info = {k: v for k, v in info.items() if k not in ("variables", "bayes_zoo")}
    from arviz_stats.base import array_stats

    squares = arr ** 2
    with np.errstate(all="ignore"):
        mcse_sq = np.asarray(array_stats.mcse(squares, method="mean"), dtype=float)
    for kind, values, mcse in (("mean_value", arr.mean(axis=(1, 2)), stats["mcse_mean"].to_numpy()),
                               ("mean_squared_value", squares.mean(axis=(1, 2)), np.nan_to_num(mcse_sq))):
        base = root / "reference_posteriors" / "summary_statistics" / kind
        _write_json(base / kind / f"{pname}.json", {"names": names, kind: np.asarray(values).tolist(),
                                                    "mcse_mean": _finite_or_none(mcse)})
        _write_json(base / "info" / f"{pname}.info.json", summary_info)
    return pname


def export_posteriordb(root: str | Path, models: Sequence[str] | None = None, log=None) -> list[str]:
    """Write every stored reference (of ``models``; None: all) into a posterior database at ``root`` (created
    if needed; files of other posteriors are left alone); returns the posterior names written."""
    log = log or (lambda line: None)
    root = Path(root)
    if root.exists() and not root.is_dir():
        raise ValueError(f"root: {str(root)!r} exists and is not a directory")
    names = list(models) if models else zoo.list_models()
    for m in names:
        zoo.get(m)                                   # an unknown model fails before anything is written
    out = []
    for m in names:
        for tag in references.stored_tags(m):
            tree = load_tree(references.reference_path(m, tag))
            out.append(export_reference(tree, root, tag))
            log(f"{m}/{tag}: {root / 'posteriors' / (out[-1] + '.json')}")
    return out


# --------------------------------------------------------------------------------------------------
# Import
# --------------------------------------------------------------------------------------------------

def _read_json(path: Path, what: str) -> Any:
    if not path.is_file():
        raise ValueError(f"{what}: no such file {str(path)!r}")
    return json.loads(path.read_text())


def _read_zip(path: Path, what: str) -> Any:
    if not path.is_file():
        raise ValueError(f"{what}: no such file {str(path)!r}")
    with zipfile.ZipFile(path) as z:
        members = z.namelist()
        if len(members) != 1:
            raise ValueError(f"{what}: {str(path)!r} holds {len(members)} files, expected one JSON file")
        with z.open(members[0]) as f:
            return json.load(f)


def _parse_name(label: str) -> tuple[str, tuple[int, ...]]:
    found = _NAME.match(label)
    if found is None:
        raise ValueError(f"posterior_name: draw name {label!r} is not NAME or NAME[i,j,...] with 1-based indices")
    idx = tuple(int(i) - 1 for i in found[2].split(",")) if found[2] else ()
    if any(i < 0 for i in idx):
        raise ValueError(f"posterior_name: draw name {label!r} has an index below 1 (posteriordb's are 1-based)")
    return found[1], idx


def _arrays_of(chains: list[dict[str, list]]) -> dict[str, np.ndarray]:
    """name -> (chain, draw, *shape) array from posteriordb's list of per-chain dicts of 1-based names."""
    if not isinstance(chains, list) or not chains or not all(isinstance(c, dict) for c in chains):
        raise ValueError("posterior_name: its reference draws are not a list of per-chain {name: draws} dicts")
    keys = list(chains[0])
    if any(list(c) != keys and set(c) != set(keys) for c in chains):
        raise ValueError("posterior_name: the chains of its reference draws name different quantities")
    n_draw = len(chains[0][keys[0]])
    if any(len(c[k]) != n_draw for c in chains for k in keys):
        raise ValueError("posterior_name: its reference draws have chains or quantities of different lengths")
    parsed = {k: _parse_name(k) for k in keys}
    shapes: dict[str, tuple[int, ...]] = {}
    for name, idx in parsed.values():
        old = shapes.get(name)
        if old is not None and len(old) != len(idx):
            raise ValueError(f"posterior_name: quantity {name!r} has draw names with different numbers of indices")
        shapes[name] = tuple(max(a, b + 1) for a, b in zip(old, idx, strict=True)) if old else tuple(i + 1 for i in idx)
    out = {name: np.full((len(chains), n_draw, *shape), np.nan) for name, shape in shapes.items()}
    seen = {name: 0 for name in shapes}
    for k, (name, idx) in parsed.items():
        out[name][(slice(None), slice(None), *idx)] = np.asarray([c[k] for c in chains], dtype=float)
        seen[name] += 1
    for name, shape in shapes.items():
        if seen[name] != int(np.prod(shape, dtype=int)):
            raise ValueError(f"posterior_name: quantity {name!r} of shape {shape} has {seen[name]} draw names; "
                             f"some components are missing")
    return out


def _own_labels(values: np.ndarray) -> np.ndarray:
    """Exported coordinate values as the import keeps them: integers other than the positions 0, 1, ... (the grid
    points a summary indexes its own entries by) as floats, so that, as in the stored tree, they name no label
    (``diagnostics.view.with_user_labels`` carries integer labels of the posterior's own dims, not a grid's)."""
    if values.dtype.kind in "iu" and not np.array_equal(values, np.arange(len(values))):
        return values.astype(float)
    return values


def reference_from_posteriordb(root: str | Path, posterior_name: str) -> xr.DataTree:
    """The reference draws of posterior ``posterior_name`` of the local posterior database at ``root`` (no network)
    as a reference DataTree (module docstring). Raises ``ValueError`` naming the argument when ``root`` is not a
    posterior database, the posterior is not in it, or it has no reference draws."""
    root = Path(root)
    if not (root / "posteriors").is_dir():
        raise ValueError(f"root: {str(root)!r} is not a posterior database (no posteriors/ folder)")
    if not isinstance(posterior_name, str) or not (root / "posteriors" / f"{posterior_name}.json").is_file():
        known = sorted(p.name[:-5] for p in (root / "posteriors").glob("*.json"))
        raise ValueError(f"posterior_name: {posterior_name!r} is not a posterior of {str(root)!r} (it has "
                         f"{', '.join(known[:10]) or 'none'}{', ...' if len(known) > 10 else ''})")
    post_info = _read_json(root / "posteriors" / f"{posterior_name}.json", "posterior_name")
    ref_name = post_info.get("reference_posterior_name")
    if not ref_name:
        raise ValueError(f"posterior_name: {posterior_name!r} has no reference posterior "
                         f"(reference_posterior_name is null)")
    base = root / "reference_posteriors" / "draws"
    info = _read_json(base / "info" / f"{ref_name}.info.json", "posterior_name")
    arrays = _arrays_of(_read_zip(base / "draws" / f"{ref_name}.json.zip", "posterior_name"))
    n_chain, n_draw = next(iter(arrays.values())).shape[:2]

    variables = info.get("variables") or {}
    ours = info.get("bayes_zoo") or {}
    data_vars, coords = {}, {"chain": np.arange(n_chain), "draw": np.arange(n_draw)}
    for name, arr in arrays.items():
        meta = variables.get(name, {})
        dims = list(meta.get("dims") or [f"{name}_dim_{i}" for i in range(arr.ndim - 2)])
        if len(dims) != arr.ndim - 2 or (meta.get("shape") and list(arr.shape[2:]) != list(meta["shape"])):
            raise ValueError(f"posterior_name: quantity {name!r} has shape {arr.shape[2:]}, its info says "
                             f"{meta.get('shape')} with dims {dims}")
        data_vars[name] = (list(SAMPLE_DIMS) + dims, arr)
        for d, values in (meta.get("coords") or {}).items():
            coords[d] = _own_labels(np.asarray(values))
    ds = xr.Dataset(data_vars, coords={k: v for k, v in coords.items()})

    stats = {}
    diag = info.get("diagnostics") or {}
    div, efmi = diag.get("divergent_transitions"), diag.get("expected_fraction_of_missing_information")
    if isinstance(div, list) and len(div) == n_chain:
        stats["divergences_run"] = (("chain",), np.asarray(div, dtype=np.int64))
    if isinstance(efmi, list) and len(efmi) == n_chain and all(v is not None for v in efmi):
        stats["ebfmi_run"] = (("chain",), np.asarray(efmi, dtype=float))
    groups = {"posterior": ds, "sample_stats": xr.Dataset(stats, coords={"chain": np.arange(n_chain)})}

    attrs: dict[str, Any] = {"method": str((info.get("inference") or {}).get("method", "reference")),
                             "inference_library": "posteriordb", "posteriordb_name": posterior_name,
                             COMPARED_ATTR: 1}
    model = ours.get("model")
    if model in zoo.list_models():
        spec = zoo.get(model)
        data_info = _read_json(root / "data" / "info" / f"{post_info['data_name']}.info.json", "posterior_name")
        values = _read_zip(root / f"{data_info['data_file']}.zip", "posterior_name")
        hyper_names = set(data_info.get("hyperparameters", []))
        hyper = {k: v for k, v in values.items() if k in hyper_names}
        from zoo._validation import validate_data

        data = validate_data(spec, {k: np.asarray(v) for k, v in values.items() if k not in hyper_names})
        observed = spec.observed_fields if spec.observed_fields is not None else tuple(
            k for k in spec.likelihood_sites if k in data)
        fields = {f.name: f for f in spec.data_fields}

        def group(keys):
            return xr.Dataset({k: ([str(s) for s in fields[k].shape], data[k]) for k in keys})

        groups["observed_data"] = group([k for k in data if k in observed])
        groups["constant_data"] = group([k for k in data if k not in observed])
        attrs.update({"model": model, "hyperparameters": json.dumps(hyper, sort_keys=True),
                      "reference_tag": str(ours.get("tag", ""))})
    tree = xr.DataTree.from_dict({f"/{k}": v for k, v in groups.items()})
    record = dict(ours.get("validation") or {})
    health = mcmc_health(tree, ds)
    if not record:
        record = {**health, "method": attrs["method"], "settings": (info.get("inference") or {}).get(
            "method_arguments", {}), "package_versions": info.get("versions", {})}
    record["posteriordb"] = {"root": str(root), "name": posterior_name, "checks_made": info.get("checks_made", {}),
                             "inference": info.get("inference", {}), "health_on_import": health}
    attrs["validation"] = json.dumps(record, default=repr)
    tree.attrs.update(attrs)
    tree["posterior"].attrs.update(attrs)
    return tree


def posteriordb_data(tree: xr.DataTree) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """(data arrays, hyperparameters) of an imported reference of one of our models, what its methods are fitted
    with; ``ValueError`` for a posterior whose model is not one of ours."""
    if "model" not in tree.attrs:
        raise ValueError(f"tree: posterior {tree.attrs.get('posteriordb_name')!r} is not a bayes-zoo model's; there "
                         f"is no model to fit its methods with")
    spec, data, hyper = problem_of(tree)
    return data, {k: v for k, v in hyper.items()}


def split_reference_argument(value: str) -> tuple[Path, str]:
    """``ROOT/NAME`` (``zoo compare --reference-posteriordb``) -> (root, posterior name)."""
    path = Path(value)
    if not path.name or str(path.parent) in ("", "."):
        raise ValueError(f"reference_posteriordb: expected ROOT/NAME (a posterior database folder and a posterior "
                         f"name), got {value!r}")
    return path.parent, path.name


def compare_with_posteriordb(model: str | zoo.ModelSpec, reference: str, methods: Sequence[str] | None,
                             out: str | Path, *, seed: int = 0, fresh: bool = False, log=print) -> Path:
    """``zoo compare MODEL --reference-posteriordb ROOT/NAME``: fit ``methods`` on the posterior's data with its
    hyperparameters and write the report judging them against the imported reference (label
    ``reference (posteriordb NAME)``); returns the report page's path. The prior-sensitivity section reads the
    first method's fit (the imported draws carry no log densities)."""
    import inference
    from diagnostics.comparison import fit_prepared_methods
    from diagnostics.planning import method_options
    from diagnostics.report_pages import SUMMARY, report, verdict_lines

    spec = zoo.get(model)
    root, name = split_reference_argument(reference)
    ref = reference_from_posteriordb(root, name)
    if "model" not in ref.attrs:
        raise ValueError(f"reference_posteriordb: posterior {name!r} is not of a bayes-zoo model, so there is no model "
                         f"to fit the methods with")
    if ref.attrs["model"] != spec.name:
        raise ValueError(f"reference_posteriordb: posterior {name!r} is of model {ref.attrs['model']!r}, not "
                         f"{spec.name!r}")
    data, hyper = posteriordb_data(ref)
    chosen = list(methods) if methods else inference.methods_for(spec)
    options = {m: method_options(spec, m, hyper) for m in chosen}
    prepared = {m: inference.prepare(spec, data, m, seed=seed, **options[m]) for m in chosen}
    folder = Path(out) / spec.name / "posteriordb"
    trees = fit_prepared_methods(spec, prepared, options, folder, seed=seed, fresh=fresh, log=log)
    label = f"reference (posteriordb {name})"
    page = Path(report(spec.name, {label: ref, **trees}, folder, reference=label, sensitivity_of=chosen[0],
                       data_note=f"data and reference draws of posteriordb posterior {name} in {root}"))
    summary = json.loads((page.parent / SUMMARY).read_text())
    for line in verdict_lines(summary.get("methods", {}), summary.get("reference_health"), where=spec.name):
        log(f"  {line}")
    return page


__all__ = ["compare_with_posteriordb", "data_name", "export_posteriordb", "export_reference", "posterior_name",
           "posteriordb_data", "posteriordb_draws", "reference_from_posteriordb"]
