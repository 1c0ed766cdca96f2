"""Predict by labels (issue 19): an ssgp tree fitted from a DataFrame with string subject labels predicts new rows
whose subjects are given by those labels, as a dict or as a DataFrame read through the tree's own columns; an
unknown label is a ``ValueError`` naming the field (and the column).

Oracles, independent of the code under test: (1) the same data as integer codes numbered by
``pandas.factorize(sort=True)`` and fitted with the same seed gives identical draws, so predicting with the
labels must equal predicting with the codes; (2) the factorisation by hand: a subject's prediction minus the
population-level one is that subject's random effect tau * b_raw at the position ``sorted(SUBJECTS).index``,
averaged over the draws (the linear predictor is linear in it), read from the coded tree by position.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from test_contract import tiny_options

import inference
import zoo

SUBJECTS = np.array(["s331", "s308", "s330", "s309"])      # sleepstudy-like names, not in sorted order
X_NEW = np.linspace(0.05, 0.95, 6)[:, None]
NEW_LABELS = ["s330", "s308", "s331", "s330", "s309", "s308"]


@pytest.fixture(scope="module")
def fits():
    """(labelled tree, coded tree, gapped-integer tree, codes numbered by pandas) on ssgp_lmm's tiny data."""
    data, _ = zoo.get("ssgp_lmm").tiny_data()
    labels = SUBJECTS[data["group"]]
    codes = pd.factorize(labels, sort=True)[0]
    options = tiny_options("ssgp_lmm", "vb")
    frame = pd.DataFrame({"days": data["X"][:, 0], "reaction": data["y"], "subject": labels})
    labelled = inference.fit("ssgp_lmm", frame, "vb", seed=2, columns={"y": "reaction", "group": "subject"},
                             **options)
    coded = inference.fit("ssgp_lmm", {"X": data["X"], "y": data["y"], "group": codes}, "vb", seed=2, **options)
    gapped = inference.fit("ssgp_lmm", {"X": data["X"], "y": data["y"], "group": np.array([308, 309, 330, 331])[codes]},
                           "vb", seed=2, **options)
    return labelled, coded, gapped


def _assert_same(a, b):
    assert set(a) == set(b)
    for k in a:
        np.testing.assert_allclose(a[k], b[k], rtol=1e-12, atol=1e-12, err_msg=k)


def test_predict_with_subject_labels_equals_predict_with_pandas_codes(fits):
    labelled, coded, _ = fits
    codes = [sorted(SUBJECTS).index(s) for s in NEW_LABELS]
    np.testing.assert_array_equal(labelled["posterior"]["b_raw"].values, coded["posterior"]["b_raw"].values)
    _assert_same(inference.predict(labelled, {"X": X_NEW, "group": NEW_LABELS}),
                 inference.predict(coded, {"X": X_NEW, "group": codes}))


def test_a_subjects_prediction_adds_its_own_random_effect_by_hand_factorisation(fits):
    labelled, coded, _ = fits
    population = inference.predict(labelled, {"X": X_NEW})
    post = coded["posterior"]
    effect = post["b_raw"].values[..., 0] * post["tau"].values[..., 0][..., None]     # (chain, draw, group)
    for subject in sorted(set(SUBJECTS)):
        by_label = inference.predict(labelled, {"X": X_NEW, "group": [subject] * len(X_NEW)})
        expected = effect[..., sorted(SUBJECTS).index(subject)].mean()
        np.testing.assert_allclose(by_label["mean"] - population["mean"], expected, rtol=0, atol=1e-10)
        np.testing.assert_allclose(by_label["f_mean"], population["f_mean"], rtol=0, atol=1e-12)  # f has no group
        # and the labelled tree's own coordinate holds that subject's draws
        np.testing.assert_array_equal(labelled["posterior"]["b_raw"].sel(group=subject).values[..., 0],
                                      post["b_raw"].values[..., sorted(SUBJECTS).index(subject), 0])


def test_a_dataframe_of_new_rows_is_read_through_the_trees_own_columns(fits):
    labelled, _, _ = fits
    rows = pd.DataFrame({"subject": NEW_LABELS, "days": X_NEW[:, 0]})
    _assert_same(inference.predict(labelled, rows), inference.predict(labelled, {"X": X_NEW, "group": NEW_LABELS}))
    # without the subject column: population level, as a dict without "group"
    _assert_same(inference.predict(labelled, rows[["days"]]), inference.predict(labelled, {"X": X_NEW}))
    # columns= overrides the recorded mapping
    renamed = rows.rename(columns={"subject": "who"})
    _assert_same(inference.predict(labelled, renamed, columns={"group": "who"}),
                 inference.predict(labelled, rows))


def test_gapped_integer_ids_are_labels_not_positions(fits):
    _, coded, gapped = fits
    _assert_same(inference.predict(gapped, {"X": X_NEW, "group": [330, 308, 331, 330, 309, 308]}),
                 inference.predict(coded, {"X": X_NEW, "group": [2, 0, 3, 2, 1, 0]}))
    with pytest.raises(ValueError, match=r"new_data\['group'\]: unknown label 2 \(row 0\); the tree was fitted "
                                         r"with 4 labels \(integers\): 308, 309, 330, 331"):
        inference.predict(gapped, {"X": X_NEW[:1], "group": [2]})


def test_unknown_labels_are_value_errors_naming_the_field_and_the_column(fits):
    labelled, coded, _ = fits
    with pytest.raises(ValueError, match=r"new_data\['group'\]: unknown label 'nobody' \(row 1\); the tree was "
                                         r"fitted with 4 labels \(text\): 's308', 's309', 's330', 's331'"):
        inference.predict(labelled, {"X": X_NEW[:2], "group": ["s308", "nobody"]})
    rows = pd.DataFrame({"subject": ["s308", "s999"], "days": [0.1, 0.2]})
    with pytest.raises(ValueError, match=r"new_data\['group'\] \(column 'subject'\): unknown label 's999'"):
        inference.predict(labelled, rows)
    with pytest.raises(ValueError, match=r"unknown label '2'.*\(integers\)"):              # no silent conversion
        inference.predict(coded, {"X": X_NEW[:1], "group": ["2"]})
    with pytest.raises(ValueError, match=r"columns\['X'\]: column 'hours' is not in the data"):
        inference.predict(labelled, rows, columns={"X": ["hours"]})
    with pytest.raises(ValueError, match=r"^columns: only for new_data given as a pandas DataFrame"):
        inference.predict(labelled, {"X": X_NEW}, columns={"group": "subject"})
    # -1 / None: a row without a known subject predicts at population level
    population = inference.predict(labelled, {"X": X_NEW[:2]})
    _assert_same(inference.predict(labelled, {"X": X_NEW[:2], "group": [None, -1]}), population)


# hlcr: stores and products -----------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def hlcr_fits():
    """(tree fitted from a DataFrame with store/product names, the same data coded by ``pandas.factorize``)."""
    from test_frames import HLCR_COLUMNS, coded, hlcr_frame

    frame = hlcr_frame()
    options = tiny_options("hlcr", "vbem")
    return (inference.fit("hlcr", frame, "vbem", seed=4, columns=HLCR_COLUMNS, **options),
            inference.fit("hlcr", coded(frame), "vbem", seed=4, **options))


def test_hlcr_predicts_new_sales_by_store_and_product_names_as_the_coded_tree_does(hlcr_fits):
    """Known pairs, a new product of a known store and a new store, by name, predict exactly as the same data
    coded by ``pandas.factorize(sort=True)`` predicts by codes (oracle: pandas' numbering; the labelled and coded
    fits give identical label draws)."""
    from test_frames import PRODUCTS, STORES

    labelled, plain = hlcr_fits
    np.testing.assert_array_equal(labelled["posterior"]["z"].values, plain["posterior"]["z"].values)
    stores = ["south", "east", "north", "west"]                  # west: a new store (cold start)
    products = ["beer", "figs", "apples", "dates"]               # figs: a new product of a known store
    X = np.array([[0.3, -1.0], [1.2, 0.4], [-0.7, 0.1], [0.0, 2.0]])
    by_name = inference.predict(labelled, {"X": X, "agent": stores, "entity": products})
    store_code = {s: i for i, s in enumerate(sorted(STORES))}
    product_code = {p: i for i, p in enumerate(sorted(PRODUCTS))}
    by_code = inference.predict(plain, {"X": X, "agent": [store_code.get(s, 99) for s in stores],
                                        "entity": [product_code.get(p, 99) for p in products]})
    np.testing.assert_array_equal(by_name["known_pair"], [True, False, True, False])
    _assert_same(by_name, by_code)


def test_hlcr_labels_of_the_wrong_kind_are_named_not_silently_a_cold_start(hlcr_fits):
    labelled, plain = hlcr_fits
    X = np.zeros((1, 2))
    with pytest.raises(ValueError, match=r"new_data\['agent'\]: label 0 .*text labels"):
        inference.predict(labelled, {"X": X, "agent": [0], "entity": ["beer"]})
    with pytest.raises(ValueError, match=r"new_data\['entity'\]: label 1.5 .*text labels"):
        inference.predict(labelled, {"X": X, "agent": ["north"], "entity": [1.5]})
    with pytest.raises(ValueError, match=r"new_data\['agent'\]: label 'north' .*integer labels"):
        inference.predict(plain, {"X": X, "agent": ["north"], "entity": [0]})
