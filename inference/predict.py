"""``inference.predict(tree, new_data)``: one prediction API for every model that predicts, from any method's tree.

A model's predictor is registered by the paper package that implements it
(``@register_predictor("ssgp_lmm", "ssgp_logit", ...)``) as ``predictor(tree, new_data, **options) -> dict``.
It works from the tree's **posterior draws** (plus the training data and hyperparameters that
``inference.trees.problem_of`` recovers), so a Gibbs, VB, NUTS or SVI tree of the same model predicts the
same way. ``new_data`` is a dict following the model's data contract for the new points (the observed field
left out).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import xarray as xr

Predictor = Callable[..., dict]
_PREDICTORS: dict[str, Predictor] = {}


def register_predictor(*models: str):
    """Decorator registering ``predictor(tree, new_data, **options) -> dict`` for ``models``."""

    def deco(fn: Predictor) -> Predictor:
        for model in models:
            _PREDICTORS[model] = fn
        return fn

    return deco


def predict(tree: xr.DataTree, new_data: Mapping[str, Any], **options: Any) -> dict:
    """Posterior predictive summaries of ``tree``'s model at ``new_data`` (see the model's predictor)."""
    from inference._methods import _load_kernels

    _load_kernels()
    model = tree.attrs.get("model") if isinstance(tree, xr.DataTree) else None
    if model is None:
        raise ValueError("tree: expected a DataTree made by inference.fit (with a 'model' attribute)")
    if model not in _PREDICTORS:
        raise ValueError(f"tree: model {model!r} has no predictor; models that predict: {sorted(_PREDICTORS)}")
    if not isinstance(new_data, Mapping):
        raise ValueError(f"new_data: expected a dict of arrays, got {type(new_data).__name__}")
    return _PREDICTORS[model](tree, dict(new_data), **options)
