"""TreeEnsembleRegressor (ai.onnx.ml opsets 1 and 3): aggregate leaf weights per target.

Evaluated by the shared vectorised evaluator (``tree_eval``). The scores follow
onnxruntime: with one target only PROBIT transforms the score (the other post
transforms are left out, as onnxruntime's single-target path does), base_values
apply only when there is one per target (or a single one for a single target),
and a target no leaf reached scores 0.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from onnxep.errors import NotSupported
from onnxep.providers.kernel import kernel
from onnxep.providers.node import NodeInfo

from .ml_common import PROBIT, apply_post, enum_attr, floats, post_transform, probit, rows_2d
from .op_tree_ensemble_classifier import forest_cache, refuse_after_opset_3
from .tree_eval import AGGREGATES, REGRESS, Forest, compare_dtype, from_attributes

_INPUTS = ["float", "double", "int64", "int32"]


@kernel("TreeEnsembleRegressor", since=(1, 3, 5), domain="ai.onnx.ml", dtypes=_INPUTS)
def tree_ensemble_regressor(node: NodeInfo, xp: Any):
    refuse_after_opset_3(node)
    n_targets = int(node.attr("n_targets", 0))
    if n_targets <= 0:
        raise NotSupported("TreeEnsembleRegressor: n_targets must be set to a positive count")
    agg = enum_attr(node, "aggregate_function", AGGREGATES, "SUM")
    post = post_transform(node)
    base = floats(node, "base_values")
    base = np.zeros(0) if base is None else base

    def make(dt: Any) -> Forest:
        f = from_attributes(node, "target", dt, n_targets)
        f.run_fused = f.fused(REGRESS, post, base, agg)
        return f

    forest = forest_cache(make, node)
    one = n_targets == 1

    def run(x):
        x2 = rows_2d(np.asarray(x), "TreeEnsembleRegressor")
        f = forest(compare_dtype(x2.dtype))
        if f.run_fused is not None:
            got = f.run_fused(x2)  # a few rows: one compiled call
            if got is not None:
                return (got[0],)
        s, has = f.scores(f.leaves(x2), agg, first_only=one)
        if one:
            origin = base[0] if len(base) == 1 else 0.0
            s = s + origin
            return ((probit(s) if post == PROBIT else s).astype(np.float32),)
        if len(base) == n_targets:
            s = s + base
        # onnxruntime writes 0 for a target no leaf reached, base value or not.
        s = np.where(has, s, 0.0)
        return (apply_post(s, post).astype(np.float32),)

    return run
