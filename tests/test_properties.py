"""Property-based hostile-input suite (issue 20), run by ``make test`` with bounded examples.

For every model's data contract, every hyperparameter and every method's options it generates invalid
inputs (one thing wrong in an otherwise valid fit) and valid variants (labels of any size or kind, NumPy
scalars, lists, masked arrays hiding nothing), and asserts:

* invalid -> ``ValueError`` naming the argument, before JAX traces or compiles anything (counted with
  ``jax.monitoring`` through ``Stopwatch.compile_events``);
* valid -> the same model inputs as the plain data (no silent change), and for a bounded set of real fits a
  finite tree whose draws do not depend on how the labels were spelled; same seed -> identical draws;
* faults: a stored tree with overwritten or missing bytes never loads as different numbers; an interrupted
  ``zoo compare`` resumes, reusing what was written, leaving no temporary file (kill-during-save itself is
  reproducer 5 in ``test_hostile_input.py``).

The invalid values per constraint are written out by hand below (not derived from ``check_value``), so the
oracle is independent of the validation code.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_hostile_input import ALL_MODELS, ROOT, _tree, small_data, temporaries

import inference
import zoo
from inference._methods import get_method
from inference._timing import Stopwatch

FAST = settings(max_examples=300, deadline=None, derandomize=True, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
FITS = settings(max_examples=3, deadline=None, derandomize=True, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])

# Values that violate each constraint word, chosen by hand (the oracle): lists for scalars, bools and
# strings for numbers, None where it means nothing, NaN/inf, out-of-range numbers, complex numbers.
COMMON_BAD = [[1, 2], "2", b"2", 1j, {"a": 1}]
BAD = {
    "positive": [0, -1.5, np.nan, np.inf, -np.inf, True, None, np.float64("nan")],
    "nonnegative": [-1e-9, -3, np.nan, np.inf, False, None],
    "real": [np.nan, np.inf, True, None],
    "positive_int": [0, -2, 1.5, 2.0, np.inf, np.nan, True, None, np.float64(3.0), 10**30 + 0.5],
    "nonnegative_int": [-1, 0.5, 1.0, False, None, np.nan],
    "unit_interval": [0, -0.1, 1.01, np.nan, True, None],
    "open_unit_interval": [0, 1, 1.5, -0.2, np.nan, np.inf, True, None],
    "probability": [-0.01, 1.01, np.nan, True, None],
    "bool": [1, 0, "yes", "True", None, 1.0, np.nan],
    "string": [1, None, True, 2.5],
}


def bad_values(constraint: str) -> list:
    """Values no alternative of ``constraint`` accepts (``a|b`` and ``[]`` suffixes understood)."""
    alts = constraint.split("|")
    if "any" in alts:
        return []
    out = list(BAD[alts[0].removesuffix("[]")]) + COMMON_BAD
    allowed_none = "None" in alts
    vectors = any(a.endswith("[]") for a in alts)
    keep = []
    for v in out:
        if v is None and allowed_none:
            continue
        if vectors and isinstance(v, list):  # a list of valid entries is valid for "x[]"
            continue
        keep.append(v)
    return keep


def assert_rejected_before_compiling(call, match):
    with Stopwatch() as sw:
        with pytest.raises(ValueError, match=match):
            call()
    assert sw.compile_events == 0, f"{sw.compile_events} JAX compile events before the ValueError"


METHODS = [(m, meth) for m in ALL_MODELS for meth in inference.methods_for(m)]


# --------------------------------------------------------------------------------------------------
# invalid -> ValueError naming the argument, before compilation
# --------------------------------------------------------------------------------------------------

HYPER_CASES = [(m, k, v) for m in ALL_MODELS for k, h in zoo.get(m).hyperparameters.items()
               for v in bad_values(h.constraint)]
OPTION_CASES = [(m, meth, k, v) for m, meth in METHODS
                for k, option in get_method(zoo.get(m), meth).declared.items()
                for v in bad_values(option.constraint)]


@FAST
@given(case=st.sampled_from(HYPER_CASES), method_index=st.integers(0, 10))
def test_an_invalid_hyperparameter_is_rejected_by_name_before_compiling(case, method_index):
    name, key, value = case
    methods = inference.methods_for(name)
    data = small_data(name)
    assert_rejected_before_compiling(
        lambda: inference.fit(name, data, methods[method_index % len(methods)], seed=0, **{key: value}),
        rf"^{key}: expected")


@FAST
@given(case=st.sampled_from(OPTION_CASES))
def test_an_invalid_method_option_is_rejected_by_name_before_compiling(case):
    name, method, key, value = case
    data = small_data(name)
    assert_rejected_before_compiling(lambda: inference.fit(name, data, method, seed=0, **{key: value}),
                                     rf"^{key}: expected")


@FAST
@given(model_method=st.sampled_from(METHODS),
       seed=st.one_of(st.integers(max_value=-1), st.integers(min_value=2**63), st.floats(), st.text(max_size=3),
                      st.booleans(), st.none(), st.just(np.float64(1.0))))
def test_an_invalid_seed_is_rejected_before_compiling(model_method, seed):
    name, method = model_method
    data = small_data(name)
    assert_rejected_before_compiling(lambda: inference.fit(name, data, method, seed=seed), r"^seed: expected")


def _mutations(field, shares_axis):
    """(label, function(array, rng) -> bad value) for one data field: every way its contract can break."""
    out = [("complex", lambda a, r: np.asarray(a).astype(complex) * (1 + 1j)),
           ("extra axis", lambda a, r: np.asarray(a)[..., None]),
           ("ragged", lambda a, r: [list(np.atleast_1d(a[0])), []]),
           ("objects", lambda a, r: np.array([object()] * len(a))),
           ("dict", lambda a, r: {"values": a})]
    if shares_axis:   # a size that disagrees with another field's
        out.append(("one entry short", lambda a, r: np.asarray(a)[:-1]))
    if field.kind == "float":
        out += [("inf", lambda a, r: _put(a, r, np.inf)), ("strings", lambda a, r: np.asarray(a).astype(str))]
        if not field.allow_nan:
            out += [("nan", lambda a, r: _put(a, r, np.nan)), ("masked", _masked)]
    if field.kind == "index":
        out += [("negative", lambda a, r: _put(a, r, -1)), ("fraction", lambda a, r: _put(a, r, 0.5)),
                ("nan", lambda a, r: _put(np.asarray(a, float), r, np.nan)), ("masked", _masked),
                ("inexact float", lambda a, r: _put(np.asarray(a, float), r, 2.0**60 + 1)),
                ("mixed", lambda a, r: np.array([1, "a", None] * len(a), dtype=object)[:len(a)])]
    if field.kind == "binary":
        out += [("two", lambda a, r: _put(a, r, 2)), ("half", lambda a, r: _put(np.asarray(a, float), r, 0.5)),
                ("masked", _masked)]
    return out


def _put(a, rng, value):
    a = np.array(a, dtype=np.float64 if isinstance(value, float) else np.asarray(a).dtype)
    a[tuple(rng.integers(0, s) for s in a.shape)] = value
    return a


def _masked(a, rng):
    m = np.ma.masked_array(np.asarray(a))
    m[tuple(rng.integers(0, s) for s in m.shape)] = np.ma.masked
    return m


def _shares_axis(spec, field):
    return any(g.name != field.name and g.shape[0] == field.shape[0] for g in spec.data_fields)


DATA_CASES = [(m, f.name, label, fn) for m in ALL_MODELS for f in zoo.get(m).data_fields
              for label, fn in _mutations(f, _shares_axis(zoo.get(m), f))]


@FAST
@given(case=st.sampled_from(DATA_CASES), method_index=st.integers(0, 10), salt=st.integers(0, 2**32 - 1))
def test_an_invalid_data_field_is_rejected_by_name_before_compiling(case, method_index, salt):
    name, field, _, mutate = case
    data = small_data(name)
    if field not in data:
        data[field] = np.zeros(len(next(iter(data.values()))), np.int64)   # optional field: add a valid one first
    data[field] = mutate(data[field], np.random.default_rng(salt))
    methods = inference.methods_for(name)
    assert_rejected_before_compiling(
        lambda: inference.fit(name, data, methods[method_index % len(methods)], seed=0),
        rf"^data.*'{field}'")


@FAST
@given(name=st.sampled_from(ALL_MODELS),
       data=st.one_of(st.none(), st.lists(st.floats(), max_size=3), st.just(np.ones(3)), st.text(max_size=3),
                      st.dictionaries(st.text(min_size=1, max_size=4), st.just(np.ones(3)), min_size=1, max_size=2)))
def test_data_that_is_not_the_models_dict_is_rejected_before_compiling(name, data):
    if isinstance(data, dict) and not (set(data) - {f.name for f in zoo.get(name).data_fields}):
        data = {**data, "not_a_field": np.ones(3)}
    assert_rejected_before_compiling(lambda: inference.fit(name, data, inference.methods_for(name)[0], seed=0),
                                     r"^data(\[.*\])?: ")


# --------------------------------------------------------------------------------------------------
# valid variants -> the same model inputs (no silent change), and bounded real fits
# --------------------------------------------------------------------------------------------------

INDEX_FIELDS = [(m, f.name) for m in ALL_MODELS for f in zoo.get(m).data_fields if f.kind == "index"]


@st.composite
def monotone_relabelling(draw):
    """An order-preserving map of 0..J-1 to other labels: huge integers with random gaps, or padded strings."""
    kind = draw(st.sampled_from(["huge", "gaps", "strings", "int32", "float"]))
    gaps = draw(st.lists(st.integers(1, 2**54), min_size=64, max_size=64))
    if kind == "huge":   # up to 2**61 + 64 * 2**54 < 2**63
        return lambda ids: (2**61 + np.cumsum(gaps, dtype=object)[ids]).astype(np.int64)
    if kind == "gaps":
        return lambda ids: np.cumsum(np.asarray(gaps) % 1000 + 1)[ids]
    if kind == "strings":
        prefix = draw(st.text(alphabet="abcXYZ_", max_size=3))
        return lambda ids: np.array([f"{prefix}{i:08d}" for i in ids])
    if kind == "int32":
        return lambda ids: np.asarray(ids, np.int32)
    return lambda ids: np.asarray(ids, np.float64)          # whole numbers as floats (exact below 2**53)


def _same_inputs(a, b):
    assert a.keys() == b.keys()
    for k in a:
        if isinstance(a[k], np.ndarray) or isinstance(b[k], np.ndarray):
            np.testing.assert_array_equal(np.asarray(a[k]), np.asarray(b[k]), err_msg=k)
        else:
            assert a[k] == b[k], k


@FAST
@given(case=st.sampled_from(INDEX_FIELDS), relabel=monotone_relabelling())
def test_index_labels_of_any_size_or_kind_give_the_same_model_inputs(case, relabel):
    name, field = case
    spec = zoo.get(name)
    data = small_data(name)
    codes = np.unique(data[field], return_inverse=True)[1]
    hyper = zoo.validate_hyper(spec, {})
    relabelled = {**data, field: relabel(codes)}
    plain = {**data, field: codes}
    _same_inputs(spec.inputs(zoo.validate_data(spec, relabelled), hyper), spec.inputs(zoo.validate_data(spec, plain),
                                                                                      hyper))


@FAST
@given(name=st.sampled_from(ALL_MODELS), as_list=st.booleans(), masked=st.booleans(), numpy_hyper=st.booleans())
def test_lists_unmasked_arrays_and_numpy_scalars_are_the_plain_values(name, as_list, masked, numpy_hyper):
    spec = zoo.get(name)
    data = small_data(name)
    variant = {}
    for k, v in data.items():
        v = np.ma.masked_array(v, mask=False) if masked else v
        variant[k] = np.asarray(v).tolist() if as_list else v
    given_hyper = {k: (np.float64(h.default) if isinstance(h.default, float) else np.int64(h.default))
                   for k, h in spec.hyperparameters.items()
                   if numpy_hyper and isinstance(h.default, int | float) and not isinstance(h.default, bool)}
    hyper = zoo.validate_hyper(spec, given_hyper)
    assert all(type(hyper[k]) in (int, float) for k in given_hyper)      # NumPy scalars became Python scalars
    _same_inputs(spec.inputs(zoo.validate_data(spec, variant), hyper),
                 spec.inputs(zoo.validate_data(spec, data), zoo.validate_hyper(spec, {})))


# One cheap method per model; shapes fixed so each compiles once per session (bounded examples).
CHEAP_FITS = {
    "hlcr": ("vbem", dict(max_iter=20, num_restarts=1, num_samples=20)),
    "ssgp_lmm": ("vb", dict(max_iter=20, num_samples=20, m=4)),
    "bpca": ("vbem", dict(max_iter=20, num_samples=20, M=2)),
    "gp_alps": ("vbem", dict(max_iter=10, num_samples=20, num_restarts=1, kernels="square_wave")),
    "mppca": ("em", dict(max_iter=20, K=2, q=1)),
}


def _draws(tree):
    return {k: v.values for k, v in tree["posterior"].to_dataset().data_vars.items()}


@FITS
@given(name=st.sampled_from(sorted(CHEAP_FITS)), seed=st.integers(0, 2**63 - 1), relabel=monotone_relabelling())
def test_valid_input_gives_a_finite_tree_reproducible_and_independent_of_label_spelling(name, seed, relabel):
    method, options = CHEAP_FITS[name]
    data = small_data(name)
    variant = dict(data)
    for f in zoo.get(name).data_fields:
        if f.kind == "index" and f.name in data:
            variant[f.name] = relabel(np.unique(data[f.name], return_inverse=True)[1])
    first = inference.fit(name, data, method, seed=seed, progress=False, **options)
    again = inference.fit(name, variant, method, seed=np.uint64(seed), progress=False,
                          **{k: (np.int64(v) if isinstance(v, int) else v) for k, v in options.items()})
    for group in ("posterior", "log_likelihood", "log_prior"):
        for v in first[group].to_dataset().data_vars.values():
            assert np.all(np.isfinite(v.values)), (group, v.name)
    a, b = _draws(first), _draws(again)
    assert a.keys() == b.keys()
    for k in a:
        np.testing.assert_array_equal(a[k], b[k], err_msg=k)


# --------------------------------------------------------------------------------------------------
# issue 33's families: labels of mixed kinds, ids at the 64-bit edges, durations, duplicate CSV headers
# --------------------------------------------------------------------------------------------------

ROUND2 = settings(FAST, max_examples=30)
TIMED_FIELDS = [(m, f.name) for m in ALL_MODELS for f in zoo.get(m).data_fields if f.kind in ("float", "index")]


@ROUND2
@given(case=st.sampled_from(INDEX_FIELDS), as_list=st.booleans(), where=st.integers(0, 2**16),
       spell=st.sampled_from([str, lambda i: f" {i}", lambda i: np.str_(i)]))
def test_labels_mixing_integers_and_text_are_rejected_naming_the_field(case, as_list, where, spell):
    name, field = case
    data = small_data(name)
    labels = np.unique(data[field], return_inverse=True)[1].astype(object)
    labels[where % len(labels)] = spell(int(labels[where % len(labels)]))    # one label as text, the rest integers
    data[field] = labels.tolist() if as_list else labels
    assert_rejected_before_compiling(lambda: inference.prepare(name, data, inference.methods_for(name)[0], seed=0),
                                     rf"^data\['{field}'\]: labels mix kinds")


EDGES = {"uint64": [2**63 - 2, 2**63, 2**64 - 40], "python int": [2**64, 10**22, -(2**63) - 40],
         "int64": [-(2**63), 2**63 - 40, 2**62], "float": [2.0**53 - 20, 2.0**53 + 2, 1e19, -1e19]}


def _frame_of(name, data):
    """(DataFrame, columns=) holding ``data`` (every two-axis field as columns FIELD0, FIELD1, ...)."""
    import pandas as pd

    cols, mapping = {}, {}
    for f in zoo.get(name).data_fields:
        if f.name not in data:
            continue
        arr = np.asarray(data[f.name])
        if arr.ndim == 2:
            mapping[f.name] = [f"{f.name}{j}" for j in range(arr.shape[1])]
            cols.update({c: arr[:, j] for j, c in enumerate(mapping[f.name])})
        else:
            cols[f.name] = arr
            mapping[f.name] = f.name
    return pd.DataFrame(cols), mapping


@ROUND2
@given(case=st.sampled_from(INDEX_FIELDS), family=st.sampled_from(sorted(EDGES)), edge=st.integers(0, 3),
       step=st.sampled_from([1, 2, 7]))
def test_ids_at_the_64_bit_edges_keep_every_id_apart_or_are_refused_by_column(case, family, edge, step):
    import pandas as pd

    from zoo._frames import from_frame

    name, field = case
    data = small_data(name)
    codes = np.unique(data[field], return_inverse=True)[1]
    base = EDGES[family][edge % len(EDGES[family])]
    ids = [base + step * k for k in range(codes.max() + 1)]            # distinct as Python numbers (the oracle)
    frame, mapping = _frame_of(name, data)
    frame[field] = {"uint64": lambda: np.array(ids, dtype=np.uint64)[codes],
                    "int64": lambda: np.array(ids, dtype=np.int64)[codes],
                    "float": lambda: np.array(ids, dtype=np.float64)[codes],
                    "python int": lambda: pd.Series([ids[c] for c in codes], dtype=object)}[family]()
    if family == "float" and max(abs(i) for i in ids) > 2.0**53:      # float64 may round ids together: refused
        assert_rejected_before_compiling(lambda: from_frame(zoo.get(name), frame, mapping),
                                         rf"^column '{field}' \(data\['{field}'\]\): ids stored as floats")
        return
    labels = from_frame(zoo.get(name), frame, mapping).data[field]
    assert len(np.unique(labels)) == len(ids)                          # no two ids merged
    first = {}
    for c, label in zip(codes.tolist(), labels.tolist(), strict=True):  # one label per id, one id per label
        assert first.setdefault(c, label) == label
    assert len(set(first.values())) == len(first)
    if family != "float":
        assert sorted(map(str, first.values())) == sorted(str(i) for i in ids)   # the exact ids, never wrapped


@ROUND2
@given(case=st.sampled_from(TIMED_FIELDS), unit=st.sampled_from(["ns", "us", "ms", "s", "m", "h", "D"]),
       method_index=st.integers(0, 10))
def test_durations_are_refused_in_every_number_and_label_field(case, unit, method_index):
    name, field = case
    data = small_data(name)
    if field not in data:
        data[field] = np.zeros(len(next(iter(data.values()))), np.int64)
    data[field] = np.asarray(np.round(np.asarray(data[field], dtype=np.float64))).astype(np.int64).astype(
        f"timedelta64[{unit}]")
    methods = inference.methods_for(name)
    assert_rejected_before_compiling(
        lambda: inference.prepare(name, data, methods[method_index % len(methods)], seed=0),
        rf"^data\['{field}'\]: expected .*, got durations \(dtype timedelta64\[{unit}\]\)")


@ROUND2
@given(names=st.lists(st.text(alphabet="abxy_019.", min_size=1, max_size=4), min_size=1, max_size=6, unique=True),
       which=st.integers(0, 5), at=st.integers(0, 6), rows=st.integers(1, 3))
def test_a_csv_header_naming_a_column_twice_is_refused(tmp_path_factory, names, which, at, rows):
    import csv

    from zoo._frames import read_table

    dup = names[which % len(names)]
    header = names[:at] + [dup] + names[at:]
    path = tmp_path_factory.mktemp("csv") / "d.csv"
    with open(path, "w", newline="") as fh:
        writer = csv.writer(fh)
        writer.writerow(header)
        writer.writerows([[str(r + c) for c in range(len(header))] for r in range(rows)])
    with pytest.raises(ValueError, match=r"^path: .*d.csv': column name\(s\) \[" + re.escape(repr(dup)) +
                       r"\] appear more than once"):
        read_table(path)


# --------------------------------------------------------------------------------------------------
# faults: corrupted files, an interrupted comparison
# --------------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def stored(tmp_path_factory):
    tree = _tree(4000, seed=5)
    path = inference.save(tree, tmp_path_factory.mktemp("stored") / "tree.nc")
    return tree, path.read_bytes()


@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")  # h5netcdf's __del__ on a bad file
@settings(FAST, max_examples=60)
@given(where=st.floats(0, 1, exclude_max=True), size=st.integers(1, 4096), salt=st.integers(0, 2**32 - 1),
       mode=st.sampled_from(["overwrite", "truncate", "zero"]))
def test_a_damaged_file_never_loads_as_different_numbers(stored, tmp_path, where, size, salt, mode):
    tree, good = stored
    at = int(where * len(good))
    if mode == "truncate":
        bad = good[:at]
    else:
        fill = bytes(size) if mode == "zero" else np.random.default_rng(salt).integers(0, 256, size, np.uint8).tobytes()
        bad = good[:at] + fill[: len(good) - at] + good[at + size:]
    path = tmp_path / f"damaged_{salt}.nc"
    path.write_bytes(bad)
    try:
        back = inference.load(path)
    except ValueError as exc:
        assert str(path.name) in str(exc)
        return
    for group in ("posterior", "sample_stats"):      # loaded: then it is exactly the stored tree
        for k, v in tree[group].to_dataset().data_vars.items():
            np.testing.assert_array_equal(back[group][k].values, v.values)
    assert {k: v for k, v in back.attrs.items()} == dict(tree.attrs)


INTERRUPTED_COMPARE = """
import os, sys, time
sys.path.insert(0, "tests")
import jax.numpy as jnp
import test_spine, zoo
from inference import Draws, register_method
from zoo_cli import app

@register_method("slow", kind="sampler", models=("toy_normal",), options={"num_samples": 10})
def slow(ctx):
    if os.environ.get("BLOCK") == "1":
        print("slow method running", flush=True)
        time.sleep(300)
    return Draws(posterior={"mu": jnp.zeros((1, ctx.options["num_samples"]))})

zoo.register(test_spine.SPEC, replace=True)
app(["compare", "toy_normal", "--methods", "exact,slow", "--out", sys.argv[1]])
"""


def test_an_interrupted_comparison_resumes_reusing_what_was_written(tmp_path):
    out = tmp_path / "demo"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "BLOCK": "1"}
    proc = subprocess.Popen([sys.executable, "-c", INTERRUPTED_COMPARE, str(out)], cwd=ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        lines = []
        for line in proc.stdout:                       # until the second fit is under way
            lines.append(line)
            if "slow method running" in line:
                break
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(60)
    assert any("toy_normal/exact" in line for line in lines), lines
    first = inference.load(out / "toy_normal" / "exact.nc")
    assert not (out / "toy_normal" / "slow.nc").exists() and temporaries(out / "toy_normal") == []
    again = subprocess.run([sys.executable, "-c", INTERRUPTED_COMPARE, str(out)], cwd=ROOT, capture_output=True,
                           text=True, env={**env, "BLOCK": "0"}, timeout=600)
    assert again.returncode == 0, again.stdout + again.stderr
    assert "toy_normal/exact: reusing" in again.stdout
    np.testing.assert_array_equal(inference.load(out / "toy_normal" / "exact.nc")["posterior"]["mu"].values,
                                  first["posterior"]["mu"].values)
    assert (out / "toy_normal" / "slow.nc").is_file() and temporaries(out / "toy_normal") == []


# --------------------------------------------------------------------------------------------------
# sizes near the bounds (issue 33, item 8): accepted up to the limit, refused by name one past it
# --------------------------------------------------------------------------------------------------

BOUNDS = settings(FAST, max_examples=60)
SIZE_CASES = [(m, meth, k) for m, meth in METHODS
              for k in ("num_samples", "num_chains", "num_particles", "num_restarts")
              if k in get_method(zoo.get(m), meth).declared]
STEP_CASES = [(m, meth, k) for m, meth in METHODS for k in ("max_iter", "num_steps", "num_samples", "thinning")
              if k in get_method(zoo.get(m), meth).declared
              and (k not in ("num_samples", "thinning") or "num_warmup" in get_method(zoo.get(m), meth).declared)]


def _default(model, method, name):
    spec = zoo.get(model)
    return {**get_method(spec, method).options, **spec.settings.method_options.get(method, {})}[name]


def _estimate(model, method, data, **options):
    from inference import limits

    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("BAYES_ZOO_MEMORY_LIMIT", "off")
        ctx = inference.prepare(model, data, method, seed=0, **options).context
    return limits.estimate_memory(ctx.spec, ctx.data, ctx.hyper, ctx.options).nbytes


@BOUNDS
@given(case=st.sampled_from(SIZE_CASES), value=st.integers(1, 10**5), slack=st.integers(-2, 2))
def test_a_size_near_the_memory_limit_is_accepted_up_to_it_and_refused_by_name_past_it(case, value, slack):
    """The limit set to the estimate plus ``slack`` bytes: accepted for slack >= 0 (nothing runs: ``prepare``),
    refused for slack < 0, naming the option when it is above its default (else the data); and every extra
    draw, chain, particle or restart costs memory (the estimate grows strictly with the option)."""
    model, method, name = case
    data = small_data(model)
    estimate = _estimate(model, method, data, **{name: value})
    assert _estimate(model, method, data, **{name: value + 1}) > estimate
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("BAYES_ZOO_MEMORY_LIMIT", str(estimate + slack))
        if slack >= 0:
            inference.prepare(model, data, method, seed=0, **{name: value})
            return
        with pytest.raises(ValueError) as info:
            inference.prepare(model, data, method, seed=0, **{name: value})
    named = f"{name}: {name}={value} " if value > _default(model, method, name) else "data["
    assert str(info.value).startswith(named), str(info.value)
    assert "above the limit of " in str(info.value), str(info.value)
    assert f"(BAYES_ZOO_MEMORY_LIMIT={estimate + slack})" in str(info.value), str(info.value)


@BOUNDS
@given(case=st.sampled_from(STEP_CASES), offset=st.integers(-3, 3))
def test_a_count_near_the_step_limit_is_accepted_up_to_10_to_the_7_and_refused_by_name_past_it(case, offset):
    """Sequential steps counted by hand: max_iter, num_steps, or a sampler's num_warmup + num_samples x
    thinning (warm-up and the other at their defaults); the limit is the documented 10**7 (memory unbounded here,
    so only the step count decides)."""
    model, method, name = case
    limit = 10**7
    if name in ("max_iter", "num_steps"):   # badmm's kl_inner multiplies only with penalty="kl", not the default
        value = steps = limit + offset
    elif name == "num_samples":
        warmup = _default(model, method, "num_warmup")
        value, steps = limit - warmup + offset, limit + offset
    else:
        warmup, draws = _default(model, method, "num_warmup"), _default(model, method, "num_samples")
        value = (limit - warmup) // draws + offset
        steps = warmup + draws * value
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("BAYES_ZOO_MEMORY_LIMIT", "off")
        mp.delenv("BAYES_ZOO_MAX_STEPS", raising=False)
        if steps <= limit:
            inference.prepare(model, small_data(model), method, seed=0, **{name: value})
            return
        with pytest.raises(ValueError, match=rf"^{name}: {name}={value} asks for {steps:,} .*above the limit of "
                                             rf"10,000,000 "):
            inference.prepare(model, small_data(model), method, seed=0, **{name: value})
