"""DataFrames in, named coordinates out (issue 19, part 1): ``inference.fit`` reads a pandas DataFrame through
the model's data contract, and the labels (store names, subjects, row index, column names) become the tree's
coordinates, for every model and every kind of method.

Oracle for "the labels land on the right numbers": the same data given as a dict of integer codes, numbered
independently of our code by ``pandas.factorize(sort=True)``, fitted with the same seed gives identical draws;
the labelled tree's ``sel(agent="north")`` must equal the coded tree's entry at north's code. A label attached
to the wrong index would pick another agent's draws (different numbers), so exact equality catches it.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from test_contract import tiny_options
from test_properties import assert_rejected_before_compiling

import inference
import zoo
from inference.api import read_data

STORES = ["north", "south", "east"]
PRODUCTS = ["apples", "beer", "cheese", "dates"]


def hlcr_frame(seed: int = 0, events: int = 3) -> pd.DataFrame:
    """3 stores x 4 products, ``events`` sales per pair, rows shuffled; two clusters of price/promo effects."""
    rng = np.random.default_rng(seed)
    rows = []
    for i, store in enumerate(STORES):
        for j, product in enumerate(PRODUCTS):
            w = np.array([1.0, -1.0]) if (i + j) % 2 else np.array([-0.5, 0.8])
            for _ in range(events):
                x = rng.normal(size=2)
                rows.append({"store": store, "product": product, "price": x[0], "promo": x[1],
                             "sales": x @ w + 0.5 * rng.normal()})
    return pd.DataFrame(rows).sample(frac=1.0, random_state=seed).reset_index(drop=True)


HLCR_COLUMNS = {"X": ["price", "promo"], "y": "sales", "agent": "store", "entity": "product"}


def coded(frame: pd.DataFrame) -> dict:
    """The hlcr frame as a dict of integer codes, numbered by pandas (sorted labels), not by our code."""
    return {"X": frame[["price", "promo"]].to_numpy(), "y": frame["sales"].to_numpy(),
            "agent": pd.factorize(frame["store"], sort=True)[0],
            "entity": pd.factorize(frame["product"], sort=True)[0]}


@pytest.mark.parametrize("method", ["gibbs", pytest.param("vbem", marks=pytest.mark.slow)])
def test_hlcr_stores_and_products_become_the_coordinates_of_every_method(method, tmp_path):
    frame = hlcr_frame()
    options = tiny_options("hlcr", method)
    tree = inference.fit("hlcr", frame, method, seed=1, columns=HLCR_COLUMNS, **options)
    post = tree["posterior"].to_dataset()
    assert list(post["agent"].values) == sorted(STORES)
    assert list(post["feature"].values) == ["price", "promo"]
    pairs = [f"{s}:{p}" for s in sorted(STORES) for p in sorted(PRODUCTS)]
    ll = tree["log_likelihood"].to_dataset()
    assert list(ll["pair"].values) == pairs
    assert list(ll["pair_agent"].values) == [p.split(":")[0] for p in pairs]
    assert list(ll["pair_entity"].values) == [p.split(":")[1] for p in pairs]
    # the labels sit on the right numbers: the same data as pandas-numbered integer codes, same seed
    plain = inference.fit("hlcr", coded(frame), method, seed=1, **options)
    for k, store in enumerate(sorted(STORES)):
        np.testing.assert_array_equal(post["theta"].sel(agent=store).values,
                                      plain["posterior"]["theta"].isel(agent=k).values)
    by_pair = ll.set_xindex(["pair_agent", "pair_entity"])["y_pair"].sel(pair_agent="south", pair_entity="beer")
    plain_ll = plain["log_likelihood"]["y_pair"]
    np.testing.assert_array_equal(by_pair.values.ravel(), plain_ll.isel(pair=pairs.index("south:beer")).values.ravel())
    # the labels and how the table was read survive a save/load round trip
    back = inference.load(inference.save(tree, tmp_path / "t.nc"))
    assert list(back["posterior"]["agent"].values) == sorted(STORES)
    assert '"agent": "store"' in back.attrs["data_columns"] and back.attrs["dropped_rows"] == 0


def test_hlcr_gapped_integer_ids_are_labels_not_positions():
    frame = hlcr_frame().assign(store=lambda f: f["store"].map({"north": 7, "south": 1000, "east": 42}))
    tree = inference.fit("hlcr", frame, "gibbs", seed=0, columns=HLCR_COLUMNS, **tiny_options("hlcr", "gibbs"))
    assert list(tree["posterior"]["agent"].values) == [7, 42, 1000]
    assert tree["posterior"]["agent"].dtype.kind == "i"


def test_ssgp_subjects_label_the_random_effects_and_columns_the_inputs():
    data, _ = zoo.get("ssgp_lmm").tiny_data()
    codes = pd.factorize(data["group"], sort=True)[0]
    subjects = np.array(["s308", "s309", "s330", "s331"])[codes]     # sleepstudy-like subject names
    frame = pd.DataFrame({"days": data["X"][:, 0], "reaction": data["y"], "subject": subjects})
    options = tiny_options("ssgp_lmm", "vb")
    tree = inference.fit("ssgp_lmm", frame, "vb", seed=2, columns={"y": "reaction", "group": "subject"}, **options)
    post = tree["posterior"].to_dataset()
    assert list(post["group"].values) == ["s308", "s309", "s330", "s331"]
    assert list(post["input"].values) == ["days"]                    # X took the one column left
    plain = inference.fit("ssgp_lmm", {"X": data["X"], "y": data["y"], "group": codes}, "vb", seed=2, **options)
    np.testing.assert_array_equal(post["b_raw"].sel(group="s330").values,
                                  plain["posterior"]["b_raw"].isel(group=2).values)


def test_bpca_keeps_missing_cells_and_labels_rows_and_features():
    data, _ = zoo.get("bpca").simulate(0, N=30, D=5, M=2, scales=(2.0, 1.0), missing=0.1)
    n_missing = int(np.isnan(data["Y"]).sum())
    assert n_missing > 0
    names = [f"sensor_{c}" for c in "abcde"]
    rows = [f"frame{i:02d}" for i in range(30)]
    frame = pd.DataFrame(data["Y"], columns=names, index=rows)
    options = {**tiny_options("bpca", "vbem"), "M": 2}
    tree = inference.fit("bpca", frame, "vbem", seed=0, dropna=True, **options)   # NaN is data here: nothing dropped
    assert tree.attrs["dropped_rows"] == 0
    observed = tree["observed_data"]["Y"]
    assert int(np.isnan(observed.values).sum()) == n_missing
    assert list(observed["n"].values) == rows and list(observed["D"].values) == names
    post = tree["posterior"].to_dataset()
    assert list(post["feature"].values) == names
    assert list(post["mu"].sel(feature="sensor_c").dims) == ["chain", "draw"]
    if "z" in post:
        assert list(post["row"].values) == rows


def test_gp_alps_and_mppca_default_mappings_read_the_right_columns_before_any_fit():
    """The default mapping alone (no fit): gp_alps finds ``t`` by its name wherever it is and gives every other
    column to ``Y``; mppca gives every column to ``Y``; the column names label their axes."""
    data, _ = zoo.get("gp_alps").tiny_data()
    outputs = [f"out_{k}" for k in range(data["Y"].shape[1])]
    table = read_data(zoo.get("gp_alps"), pd.DataFrame(data["Y"], columns=outputs).assign(t=data["t"][:, 0]))
    assert table.columns == {"t": ["t"], "Y": outputs}
    np.testing.assert_array_equal(table.data["Y"], data["Y"])
    np.testing.assert_array_equal(table.data["t"], data["t"])
    assert list(table.axis_labels["p"]) == outputs and zoo.get("gp_alps").axis_dims["p"] == "output"
    data, _ = zoo.get("mppca").tiny_data()
    names = [f"m{k}" for k in range(data["Y"].shape[1])]
    table = read_data(zoo.get("mppca"), pd.DataFrame(data["Y"], columns=names))
    assert table.columns == {"Y": names} and list(table.axis_labels["d"]) == names
    np.testing.assert_array_equal(table.data["Y"], data["Y"])


@pytest.mark.slow
def test_gp_alps_default_mapping_t_column_then_every_output():
    data, _ = zoo.get("gp_alps").tiny_data()
    outputs = [f"out_{k}" for k in range(data["Y"].shape[1])]
    frame = pd.DataFrame(data["Y"], columns=outputs).assign(t=data["t"][:, 0])   # t last: found by its name
    tree = inference.fit("gp_alps", frame, "vbem", seed=0, **tiny_options("gp_alps", "vbem"))
    assert list(tree["posterior"]["output"].values) == outputs
    np.testing.assert_array_equal(tree["observed_data"]["Y"].values, data["Y"])
    np.testing.assert_array_equal(tree["constant_data"]["t"].values, data["t"])


@pytest.mark.slow
def test_mppca_default_mapping_reads_every_column_as_y():
    data, _ = zoo.get("mppca").tiny_data()
    names = [f"m{k}" for k in range(data["Y"].shape[1])]
    tree = inference.fit("mppca", pd.DataFrame(data["Y"], columns=names), "vbem", seed=0,
                         **tiny_options("mppca", "vbem"))
    assert list(tree["posterior"]["feature"].values) == names
    np.testing.assert_array_equal(tree["observed_data"]["Y"].values, data["Y"])


# --------------------------------------------------------------------------------------------------
# bad tables: a ValueError naming the column, before anything compiles
# --------------------------------------------------------------------------------------------------

def _with_nan(frame, column, rows):
    out = frame.copy()
    out.loc[out.index[:rows], column] = np.nan
    return out


BAD_TABLES = [
    ("unknown column", lambda f: f, {**HLCR_COLUMNS, "y": "revenue"}, r"columns\['y'\]: column 'revenue' is not in"),
    ("unknown field", lambda f: f, {**HLCR_COLUMNS, "z": "sales"}, r"columns: 'z' is not a data field"),
    ("text for a float", lambda f: f.assign(price=f["price"].astype(str).where(f.index != 4, "n/a")),
     HLCR_COLUMNS, r"column 'price' \(data\['X'\]\): expected numbers \(float\), got text: 'n/a' \(row 4\) is not a "
                   r"number \(1 of 36 rows"),
    ("NaN where forbidden", lambda f: _with_nan(f, "sales", 5), HLCR_COLUMNS,
     r"column 'sales' \(data\['y'\]\): 5 of 36 rows have missing values.*dropna=True"),
    ("NaN in a label", lambda f: _with_nan(f, "store", 2), HLCR_COLUMNS,
     r"column 'store' \(data\['agent'\]\): 2 of 36 rows have missing values"),
    ("column used twice", lambda f: f, {**HLCR_COLUMNS, "y": "price"}, r"column 'price' is already used"),
    ("two columns for y", lambda f: f, {**HLCR_COLUMNS, "y": ["sales", "price"]}, r"columns\['y'\]: field 'y' is one"),
    ("no rows", lambda f: f.iloc[:0], HLCR_COLUMNS, r"data: the table has no rows"),
    ("fractional label", lambda f: f.assign(store=np.linspace(0, 3, len(f))), HLCR_COLUMNS,
     r"column 'store' \(data\['agent'\]\): labels must be integers or text"),
    ("required field missing", lambda f: f.drop(columns="sales"), {k: v for k, v in HLCR_COLUMNS.items() if k != "y"},
     r"no column for the required field 'y'"),
]


@pytest.mark.parametrize(("what", "mutate", "columns", "match"), BAD_TABLES, ids=[b[0] for b in BAD_TABLES])
def test_a_bad_table_is_rejected_naming_the_column_before_compiling(what, mutate, columns, match):
    frame = mutate(hlcr_frame())
    assert_rejected_before_compiling(lambda: inference.fit("hlcr", frame, "gibbs", seed=0, columns=columns), match)


def test_a_later_check_names_the_column_too():
    frame = pd.DataFrame({"dose": np.ones(8), "reaction": np.arange(8.0)})     # ssgp rejects a constant input
    assert_rejected_before_compiling(lambda: inference.fit("ssgp_lmm", frame, "vb", seed=0, columns={"y": "reaction"}),
                                     r"data\['X'\] \(column 'dose'\): column\(s\) \[0\] are constant")


def test_dropna_drops_exactly_the_rows_with_missing_values_and_says_how_many():
    frame = _with_nan(hlcr_frame(), "promo", 3)
    prepared = inference.prepare("hlcr", frame, "vbem", seed=0, columns=HLCR_COLUMNS, dropna=True)
    assert len(prepared.context.data["y"]) == 36 - 3 and prepared.provenance["dropped_rows"] == 3
    np.testing.assert_array_equal(prepared.axis_labels["n"], frame.index[3:])


@pytest.mark.parametrize(("kwargs", "match"), [({"columns": {"y": "y"}}, r"^columns: only for data given as a pandas"),
                                               ({"dropna": True}, r"^dropna: only for data given as a pandas")])
def test_table_options_with_dict_data_are_an_error(kwargs, match):
    data, _ = zoo.get("hlcr").tiny_data()
    assert_rejected_before_compiling(lambda: inference.fit("hlcr", data, "vbem", seed=0, **kwargs), match)


def test_example_header_is_what_the_default_mapping_reads():
    from zoo._frames import example_header, resolve_columns

    for name in zoo.list_models():
        spec = zoo.get(name)
        header = example_header(spec).split(",")
        mapping = resolve_columns(spec, header)
        required = [f.name for f in spec.data_fields if not f.optional]
        assert set(required) <= set(mapping), (name, header, mapping)
        assert sorted(c for cols in mapping.values() for c in cols) == sorted(header), (name, header, mapping)
    assert example_header(zoo.get("hlcr")) == "y,agent,entity,x1,x2,x3"
