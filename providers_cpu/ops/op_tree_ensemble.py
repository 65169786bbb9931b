"""TreeEnsemble (ai.onnx.ml opset 5): evaluate every tree for every row, then aggregate.

All rows and trees advance one level per step as arrays, so the Python loop
runs once per tree level, not once per row or node.
"""

from __future__ import annotations

import math
from statistics import NormalDist
from typing import Any

import numpy as np

from onnxep.errors import NotSupported
from onnxep.providers.kernel import kernel
from onnxep.providers.node import NodeInfo

_LEQ, _LT, _GTE, _GT, _EQ, _NEQ, _MEMBER = range(7)


def _arr(node: NodeInfo, name: str, dtype: Any, default: Any = None) -> np.ndarray:
    v = node.attr(name, default)
    if v is None:
        raise NotSupported(f"TreeEnsemble: attribute {name!r} is required")
    return np.asarray(v, dtype=dtype).reshape(-1)


def _member_table(modes: np.ndarray, values: np.ndarray | None) -> np.ndarray:
    """One row per node with its NaN-padded member set (only BRANCH_MEMBER rows filled)."""
    sets: list[list[float]] = []
    if values is not None and values.size:
        cur: list[float] = []
        for v in values.tolist():
            if math.isnan(v):
                sets.append(cur)
                cur = []
            else:
                cur.append(v)
        if cur:
            sets.append(cur)
    member_nodes = np.flatnonzero(modes == _MEMBER)
    if len(sets) < len(member_nodes):
        raise NotSupported(
            "TreeEnsemble: membership_values has fewer sets than BRANCH_MEMBER nodes"
        )
    width = max((len(s) for s in sets), default=1) or 1
    table = np.full((len(modes), width), np.nan)
    for node_id, members in zip(member_nodes, sets, strict=False):
        table[node_id, : len(members)] = members
    return table


def _inv_cdf(p: float) -> float:
    if math.isnan(p) or p < 0 or p > 1:
        return math.nan
    if p == 0:
        return -math.inf
    if p == 1:
        return math.inf
    return _NORMAL.inv_cdf(p)


_NORMAL = NormalDist()
_probit = np.frompyfunc(_inv_cdf, 1, 1)


def _post(scores: np.ndarray, kind: int) -> np.ndarray:
    if kind == 0:
        return scores
    if kind == 1:
        e = np.exp(scores - scores.max(axis=1, keepdims=True))
        return e / e.sum(axis=1, keepdims=True)
    if kind == 2:
        return 1.0 / (1.0 + np.exp(-scores))
    if kind == 3:
        # Softmax that leaves exact zeros at zero.
        nz = scores != 0
        m = np.where(nz, scores, -np.inf).max(axis=1, keepdims=True)
        m = np.where(np.isfinite(m), m, 0)
        e = np.where(nz, np.exp(scores - m), 0)
        s = e.sum(axis=1, keepdims=True)
        return np.where(s > 0, e / np.where(s > 0, s, 1), 0)
    if kind == 4:
        return _probit(scores).astype(np.float64)
    raise NotSupported(f"TreeEnsemble: post_transform {kind} is not one of 0..4")


@kernel("TreeEnsemble", since=5, domain="ai.onnx.ml")
def tree_ensemble(node: NodeInfo, xp: Any):
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
    n_targets = int(node.attr("n_targets"))
    agg = int(node.attr("aggregate_function", 1))
    post = int(node.attr("post_transform", 0))
    if agg not in (0, 1, 2, 3):
        raise NotSupported(f"TreeEnsemble: aggregate_function {agg} is not one of 0..3")
    if post not in (0, 1, 2, 3, 4):
        raise NotSupported(f"TreeEnsemble: post_transform {post} is not one of 0..4")
    if modes.size and (modes.min() < 0 or modes.max() > _MEMBER):
        raise NotSupported("TreeEnsemble: nodes_modes holds a value outside 0..6")
    mv = node.attr("nodes_missing_value_tracks_true", None)
    nan_true = (
        np.zeros(len(modes), bool) if mv is None else np.asarray(mv, np.int64).reshape(-1) != 0
    )
    mvals = node.attr("membership_values", None)
    members = _member_table(
        modes, None if mvals is None else np.asarray(mvals, np.float64).reshape(-1)
    )
    has_member = bool((modes == _MEMBER).any())
    max_steps = len(modes) + 1

    def run(x):
        out_dt = x.dtype
        xf = np.asarray(x, dtype=np.float64)
        xf = xf.reshape(xf.shape[0], -1) if xf.ndim > 1 else xf.reshape(1, -1)
        n_rows, n_trees = xf.shape[0], len(roots)
        cur = np.broadcast_to(roots, (n_rows, n_trees)).copy()
        leaf = np.full((n_rows, n_trees), -1, np.int64)
        rows = np.arange(n_rows)[:, None]
        active = np.ones((n_rows, n_trees), bool)
        for _ in range(max_steps):
            if not active.any():
                break
            r_idx, t_idx = np.nonzero(active)
            nd = cur[r_idx, t_idx]
            v = xf[rows[r_idx, 0], feat[nd]]
            s = splits[nd]
            m = modes[nd]
            cond = np.select(
                [m == _LEQ, m == _LT, m == _GTE, m == _GT, m == _EQ, m == _NEQ],
                [v <= s, v < s, v >= s, v > s, v == s, v != s],
                default=False,
            )
            if has_member:
                in_set = (members[nd] == v[:, None]).any(axis=1)
                cond = np.where(m == _MEMBER, in_set, cond)
            # A missing (NaN) feature follows the branch the node names for it.
            nan = np.isnan(v)
            cond = np.where(nan, nan_true[nd], cond)
            nxt = np.where(cond, true_ids[nd], false_ids[nd])
            is_leaf = np.where(cond, true_leaf[nd], false_leaf[nd])
            leaf[r_idx[is_leaf], t_idx[is_leaf]] = nxt[is_leaf]
            active[r_idx[is_leaf], t_idx[is_leaf]] = False
            cur[r_idx[~is_leaf], t_idx[~is_leaf]] = nxt[~is_leaf]
        if active.any():
            raise ValueError("TreeEnsemble: a tree has a cycle (no leaf reached)")
        tgt = leaf_target[leaf]
        w = leaf_weight[leaf]
        rr = np.broadcast_to(rows, tgt.shape)
        if agg in (0, 1):
            scores = np.zeros((n_rows, n_targets))
            np.add.at(scores, (rr, tgt), w)
            if agg == 0:
                scores /= max(n_trees, 1)
        else:
            fill = np.inf if agg == 2 else -np.inf
            scores = np.full((n_rows, n_targets), fill)
            (np.minimum if agg == 2 else np.maximum).at(scores, (rr, tgt), w)
            # Targets no tree reached score 0, as with SUM.
            scores[np.isinf(scores) & (scores == fill)] = 0
        return (_post(scores, post).astype(out_dt),)

    return run
