"""The second hostile-input campaign of issue 20, repeatable (``make test-all``, or
``python tests/test_campaign.py`` for the table of outcomes).

Written fresh from the issue's categories, over every (model, method) pair:

A. every invalid value of the property suite's catalogues (all hyperparameters, all options of every
   method, every data field mutation, seeds), exhaustively instead of sampled;
B. label spellings (huge ids, strings, gaps) through real, short fits of every pair: the draws must equal
   those of the plain labels (no silent regrouping);
C. extreme but finite data (one entry 1e300 / 1e-300, every float field scaled by 1e150 or 1e-150) through
   every pair: a ValueError, a NonFiniteError or a finite tree, nothing else;
D. defaults: every model's default hyperparameters with NUTS and SVI on its own simulated data;
E. the CLI: odd --set values, broken --data files, bad --seed/--out: a usage error or an error message,
   never a traceback.

A finding is any other exception type, a compile before a ValueError (A), or different draws (B).
"""

from __future__ import annotations

import os
import sys
import traceback
from pathlib import Path

import jax
import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

import inference  # noqa: E402
import zoo  # noqa: E402
from inference._timing import Stopwatch  # noqa: E402

pytestmark = pytest.mark.slow

TINY = {  # short runs: the campaign is about what happens, not about posterior quality
    "nuts": dict(num_warmup=20, num_samples=10, num_chains=1, max_tree_depth=3),
    "svi": dict(num_steps=50, num_samples=10),
    "gibbs": dict(num_warmup=5, num_samples=10, num_chains=1),
    "gibbs_blocked": dict(num_warmup=5, num_samples=10, num_chains=1),
    "vbem": dict(max_iter=5, num_samples=10),
    "vb": dict(max_iter=5, num_samples=10),
    "em": dict(max_iter=5),
    "vbgmm": dict(max_iter=5),
    "fedgibbs": dict(max_iter=3, num_samples=10),
    "fedvb": dict(max_iter=3, num_samples=10),
    "badmm": dict(max_iter=5, num_samples=10),
    "dppca": dict(max_iter=5),
    "svi_concrete": dict(num_steps=50, num_samples=10),
}
MODEL_TINY = {"mppca": dict(K=2, q=1), "bpca": dict(M=2), "ssgp_lmm": dict(m=4), "ssgp_logit": dict(m=4),
              "ssgp_probit": dict(m=4)}
ALLOWED = (ValueError, inference.NonFiniteError)
VERBOSE = __name__ == "__main__"   # as a script: print every outcome as it comes


def _models():
    """Every model, or those named in $CAMPAIGN_MODELS (comma-separated) to rerun a part."""
    from test_hostile_input import ALL_MODELS

    chosen = [m for m in os.environ.get("CAMPAIGN_MODELS", "").split(",") if m]
    return [m for m in ALL_MODELS if not chosen or m in chosen]


def _pairs():
    return [(m, meth) for m in _models() for meth in inference.methods_for(m)]


def _opts(model, method):
    return {**TINY[method], **MODEL_TINY.get(model, {})}


def _outcome(call):
    try:
        tree = call()
    except ALLOWED as exc:
        return type(exc).__name__, str(exc).splitlines()[0][:160]
    except Exception as exc:  # the finding: anything else
        return "FINDING " + type(exc).__name__, "".join(traceback.format_exception_only(exc)).strip()[:300]
    bad = [f"{g}/{k}" for g in ("posterior", "log_likelihood", "log_prior") if g in tree.children
           for k, v in tree[g].to_dataset().data_vars.items() if not np.all(np.isfinite(v.values))]
    return ("FINDING non-finite tree", str(bad)) if bad else ("finite tree", "")


# A -------------------------------------------------------------------------------------------------

def campaign_invalid():
    from test_hostile_input import small_data
    from test_properties import DATA_CASES, HYPER_CASES, OPTION_CASES

    findings, n = [], 0

    def probe(label, name, model, data, method, seed=0, **options):
        nonlocal n
        n += 1
        with Stopwatch() as sw:
            try:
                inference.fit(model, data, method, seed=seed, **options)
                findings.append((label, "accepted"))
                return
            except ValueError as exc:
                if name not in str(exc):
                    findings.append((label, f"ValueError without the argument's name: {exc}"))
            except Exception as exc:
                findings.append((label, f"{type(exc).__name__}: {exc}"))
        if sw.compile_events:
            findings.append((label, f"{sw.compile_events} compile events before the error"))

    for model, key, value in HYPER_CASES:
        for method in inference.methods_for(model):
            probe(f"{model}/{method} {key}={value!r}", key, model, small_data(model), method,
                  **{**_opts(model, method), key: value})
    for model, method, key, value in OPTION_CASES:
        probe(f"{model}/{method} {key}={value!r}", key, model, small_data(model), method,
              **{**_opts(model, method), key: value})
    rng = np.random.default_rng(0)
    for model, field, label, mutate in DATA_CASES:
        for method in inference.methods_for(model):
            data = small_data(model)
            data[field] = mutate(data[field], rng)
            probe(f"{model}/{method} data[{field!r}] {label}", f"'{field}'", model, data, method,
                  **_opts(model, method))
    for seed in (-1, 2**63, 2**64, 1.0, "1", True, None, np.float32(1)):
        for model, method in _pairs():
            probe(f"{model}/{method} seed={seed!r}", "seed", model, small_data(model), method, seed=seed,
                  **_opts(model, method))
    return n, findings


@pytest.mark.timeout(3600)
def test_campaign_invalid_inputs_are_value_errors_naming_the_argument_before_compiling():
    n, findings = campaign_invalid()
    assert not findings, f"{len(findings)} of {n} cases:\n" + "\n".join(map(str, findings[:50]))


# B -------------------------------------------------------------------------------------------------

RELABELLINGS = {
    "huge ids": lambda codes: 2**62 + 7 * codes,
    "strings": lambda codes: np.array([f"label-{c:04d}" for c in codes]),
    "gaps": lambda codes: 1000 * codes + 3,
}


def campaign_labels():
    from test_hostile_input import small_data

    rows = []
    for model, method in _pairs():
        fields = [f.name for f in zoo.get(model).data_fields if f.kind == "index"]
        if not fields:
            continue
        data = small_data(model)
        opts = _opts(model, method)
        try:
            plain = inference.fit(model, data, method, seed=3, progress=False, **opts)
        except ALLOWED as exc:
            rows.append((model, method, "plain labels", type(exc).__name__, str(exc)[:120]))
            continue
        for spelling, relabel in RELABELLINGS.items():
            variant = {**data, **{f: relabel(np.unique(data[f], return_inverse=True)[1]) for f in fields}}
            try:
                tree = inference.fit(model, variant, method, seed=3, progress=False, **opts)
            except Exception as exc:
                rows.append((model, method, spelling, "FINDING " + type(exc).__name__, str(exc)[:200]))
                continue
            same = all(np.array_equal(tree["posterior"][k].values, v.values, equal_nan=True)
                       for k, v in plain["posterior"].to_dataset().data_vars.items())
            rows.append((model, method, spelling, "same draws" if same else "FINDING different draws", ""))
    return rows


@pytest.mark.timeout(3600)
def test_campaign_label_spellings_never_change_a_fit():
    rows = campaign_labels()
    bad = [r for r in rows if r[3].startswith("FINDING")]
    assert not bad, "\n".join(map(str, bad))


# C -------------------------------------------------------------------------------------------------

def _extreme_variants(model, data):
    for f in zoo.get(model).data_fields:
        if f.kind != "float" or f.name not in data:
            continue
        for label, value in (("one entry 1e300", 1e300), ("one entry 1e-300", 1e-300)):
            d = {k: v.copy() for k, v in data.items()}
            d[f.name].flat[0] = value
            yield f"data[{f.name!r}] {label}", d
        for scale in (1e150, 1e-150):
            d = {k: v.copy() for k, v in data.items()}
            d[f.name] = d[f.name] * scale
            yield f"data[{f.name!r}] x {scale:g}", d


def _fit_row(model, method, label, data, **options):
    kind, detail = _outcome(lambda: inference.fit(model, data, method, seed=0, progress=False, **options))
    jax.clear_caches()  # hundreds of compiled kernels in one process exhaust the JIT's memory maps otherwise
    if VERBOSE:
        print("   ", model, method, label, kind, detail[:120], sep=" | ", flush=True)
    return model, method, label, kind, detail


def campaign_extremes():
    from test_hostile_input import small_data

    return [_fit_row(model, method, label, d, **_opts(model, method))
            for model, method in _pairs() for label, d in _extreme_variants(model, small_data(model))]


@pytest.mark.timeout(7200)
def test_campaign_extreme_data_gives_an_error_of_ours_or_a_finite_tree():
    rows = campaign_extremes()
    bad = [r for r in rows if r[3].startswith("FINDING")]
    assert not bad, "\n".join(map(str, bad))


# D -------------------------------------------------------------------------------------------------

def campaign_defaults():
    return [_fit_row(model, method, "defaults on simulate(0)", zoo.get(model).simulate(0)[0], **TINY[method])
            for model in _models() for method in ("nuts", "svi")]


@pytest.mark.timeout(3600)
def test_campaign_default_hyperparameters_fit_with_nuts_and_svi():
    rows = campaign_defaults()
    bad = [r for r in rows if r[3] != "finite tree"]
    assert not bad, "\n".join(map(str, bad))


# E -------------------------------------------------------------------------------------------------

def campaign_cli(tmp: Path):
    from typer.testing import CliRunner

    from zoo_cli import app

    runner = CliRunner()
    (tmp / "text.npz").write_text("hello")
    np.savez(tmp / "objects.npz", Y=np.array([object(), 1], dtype=object))
    np.savez(tmp / "wrong_keys.npz", nope=np.ones(3))
    np.savez(tmp / "good.npz", Y=np.random.default_rng(0).normal(size=(30, 3)))
    (tmp / "truncated.npz").write_bytes((tmp / "good.npz").read_bytes()[:200])
    (tmp / "adir").mkdir(exist_ok=True)
    out = str(tmp / "x.nc")
    cases = [["fit", "mppca", "-m", "em", "--out", out, "--set", s] for s in
             ("K=[1]", "K=", "=3", "K=1e999", "q=None", "max_iter=-1", "seed=1", "method=em", "tol=nan",
              "K=2", "K=2")]
    cases += [["fit", "mppca", "-m", "em", "--out", out, "--data", str(tmp / f)] for f in
              ("text.npz", "objects.npz", "wrong_keys.npz", "truncated.npz", "missing.npz", "adir")]
    cases += [["fit", "mppca", "-m", "em", "--out", str(tmp / "adir"), "--set", "K=2", "--set", "q=1",
               "--data", str(tmp / "good.npz")],
              ["fit", "mppca", "-m", "em", "--out", out, "--seed", "-1"],
              ["fit", "mppca", "-m", "em", "--out", out, "--seed", str(2**64)],
              ["fit", "mppca", "-m", "nope", "--out", out],
              ["show", "nope"]]
    rows = []
    for args in cases:
        result = runner.invoke(app, args)
        crashed = result.exception is not None and not isinstance(result.exception, SystemExit)
        kind = f"FINDING {type(result.exception).__name__}" if crashed else f"exit {result.exit_code}"
        rows.append(("cli", " ".join(args[1:4]), " ".join(args[4:]), kind, " ".join(result.output.split())[-160:]))
    return rows


def test_campaign_cli_never_shows_a_traceback(tmp_path):
    rows = campaign_cli(tmp_path)
    bad = [r for r in rows if r[3].startswith("FINDING")]
    assert not bad, "\n".join(map(str, bad))


if __name__ == "__main__":
    import tempfile

    which = sys.argv[1:] or ["invalid", "labels", "extremes", "defaults", "cli"]
    if "invalid" in which:
        n, findings = campaign_invalid()
        print(f"A. invalid inputs: {n} cases, {len(findings)} findings")
        for f in findings:
            print("   ", f)
    runs = {"labels": campaign_labels, "extremes": campaign_extremes, "defaults": campaign_defaults,
            "cli": lambda: campaign_cli(Path(tempfile.mkdtemp()))}
    for key in ("labels", "extremes", "defaults", "cli"):
        if key in which:
            rows = runs[key]()
            print(f"{key}: {len(rows)} cases, {sum(r[3].startswith('FINDING') for r in rows)} findings")
            for r in rows:
                print("   ", " | ".join(map(str, r)))
