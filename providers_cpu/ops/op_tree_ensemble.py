"""TreeEnsemble (ai.onnx.ml opset 5): evaluate every tree for every row, then aggregate.

The same vectorised evaluator (``_tree_eval``) as TreeEnsembleClassifier and
TreeEnsembleRegressor: nodes and leaves are numbered into one table, and all rows
and trees advance one level per step as arrays.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from onnxep.errors import NotSupported
from onnxep.providers.kernel import kernel
from onnxep.providers.node import NodeInfo

from ._ml_common import LOGISTIC, NONE, PROBIT, SOFTMAX, SOFTMAX_ZERO, apply_post, probit, rows_2d
from ._tree_eval import MEMBER, Forest, Nodes, compare_dtype
from .op_tree_ensemble_classifier import forest_cache

# Opset 5 numbers its post transforms in another order than the older ops' names.
_POST = {0: NONE, 1: SOFTMAX, 2: LOGISTIC, 3: SOFTMAX_ZERO, 4: PROBIT}


def _arr(node: NodeInfo, name: str, dtype: Any) -> np.ndarray:
    v = node.attr(name, None)
    if v is None:
        raise NotSupported(f"TreeEnsemble: attribute {name!r} is required")
    return np.asarray(v, dtype=dtype).reshape(-1)


def _member_sets(modes: np.ndarray, values: Any) -> dict[int, list[float]]:
    """membership_values' NaN-separated sets, one per BRANCH_MEMBER node in order."""
    sets: list[list[float]] = []
    cur: list[float] = []
    for v in np.asarray(values if values is not None else [], np.float64).reshape(-1).tolist():
        if math.isnan(v):
            sets.append(cur)
            cur = []
        else:
            cur.append(v)
    if cur:
        sets.append(cur)
    nodes = np.flatnonzero(modes == MEMBER)
    if len(sets) < len(nodes):
        raise NotSupported(
            "TreeEnsemble: membership_values has fewer sets than BRANCH_MEMBER nodes"
        )
    return {int(i): s for i, s in zip(nodes.tolist(), sets, strict=False)}


def _nodes(node: NodeInfo) -> Nodes:
    feat = _arr(node, "nodes_featureids", np.int64)
    splits = _arr(node, "nodes_splits", np.float64)
    modes = _arr(node, "nodes_modes", np.int64)
    true_ids = _arr(node, "nodes_truenodeids", np.int64)
    true_leaf = _arr(node, "nodes_trueleafs", np.int64).astype(bool)
    false_ids = _arr(node, "nodes_falsenodeids", np.int64)
    false_leaf = _arr(node, "nodes_falseleafs", np.int64).astype(bool)
    roots = _arr(node, "tree_roots", np.int64)
    leaf_target = _arr(node, "leaf_targetids", np.int64)
    leaf_weight = _arr(node, "leaf_weights", np.float64)
    n = len(feat)
    lengths = {len(splits), len(modes), len(true_ids), len(true_leaf), len(false_ids)}
    if lengths | {len(false_leaf)} != {n}:
        raise NotSupported("TreeEnsemble: the nodes_* attributes must have one entry per node")
    if len(leaf_target) != len(leaf_weight):
        raise NotSupported("TreeEnsemble: leaf_targetids and leaf_weights differ in length")
    if modes.size and (modes.min() < 0 or modes.max() > MEMBER):
        raise NotSupported("TreeEnsemble: nodes_modes holds a value outside 0..6")
    tracks = node.attr("nodes_missing_value_tracks_true", None)
    nan_true = np.zeros(n, bool)
    if tracks is not None:
        t = np.asarray(tracks, np.int64).reshape(-1)[:n] != 0
        nan_true[: len(t)] = t
    n_leaf = len(leaf_weight)
    return Nodes(
        op="TreeEnsemble",
        feature=feat,
        threshold=splits,
        mode=modes,
        true_child=np.where(true_leaf, n + true_ids, true_ids),
        false_child=np.where(false_leaf, n + false_ids, false_ids),
        nan_true=nan_true,
        roots=roots,
        n_leaves=n_leaf,
        leaf=np.arange(n_leaf),
        target=leaf_target,
        weight=leaf_weight,
        n_targets=int(node.attr("n_targets")),
        members=_member_sets(modes, node.attr("membership_values", None)),
    )


@kernel("TreeEnsemble", since=5, domain="ai.onnx.ml")
def tree_ensemble(node: NodeInfo, xp: Any):
    agg = int(node.attr("aggregate_function", 1))
    code = int(node.attr("post_transform", 0))
    if agg not in (0, 1, 2, 3):
        raise NotSupported(f"TreeEnsemble: aggregate_function {agg} is not one of 0..3")
    if code not in _POST:
        raise NotSupported(f"TreeEnsemble: post_transform {code} is not one of 0..4")
    post = _POST[code]
    nodes = _nodes(node)
    forest = forest_cache(lambda dt: Forest(nodes, dt), node)

    def run(x):
        x2 = rows_2d(np.asarray(x), "TreeEnsemble")
        f = forest(compare_dtype(x2.dtype))
        s, _ = f.scores(f.leaves(x2), agg)
        # onnxruntime's TreeEnsemble: one target takes PROBIT only, as the older ops do.
        if s.shape[1] == 1:
            s = probit(s) if post == PROBIT else s
        else:
            s = apply_post(s, post)
        return (s.astype(x.dtype),)

    return run
