"""SVMClassifier (ai.onnx.ml): libsvm's one-vs-one (support vectors) or liblinear's
one-vs-rest (coefficients only), with Platt probabilities when prob_a/prob_b are given.

Follows onnxruntime: the label comes from the one-vs-one votes (first class with the most),
probabilities from libsvm's pairwise coupling (Wu, Lin and Weng's iteration, run for all
rows at once, each row stopping when it converges), and a two-class model without
probabilities reports its one decision value as [-s, s] (post_transform NONE) or [1 - s, s].
"""

from __future__ import annotations

from typing import Any

import numpy as np

from onnxep.errors import NotSupported
from onnxep.providers.kernel import kernel
from onnxep.providers.node import NodeInfo

from ._ml_common import (
    NONE,
    PROBIT,
    apply_post,
    class_labels,
    floats,
    ints,
    logistic,
    post_transform,
    probit,
    rows_2d,
)
from ._svm import SvmKernel


@kernel("SVMClassifier", since=1, domain="ai.onnx.ml", dtypes=["float", "double", "int64", "int32"])
def svm_classifier(node: NodeInfo, xp: Any):
    kern = SvmKernel(node)
    labels, strings = class_labels(node, "classlabels_ints")
    n_cls = len(labels) or 1
    coef = floats(node, "coefficients", np.float32)
    if coef is None or not coef.size:
        raise NotSupported("SVMClassifier: attribute 'coefficients' is required")
    coef = coef.astype(np.float64)
    sv = floats(node, "support_vectors", np.float32)
    per_class = ints(node, "vectors_per_class")
    rho = floats(node, "rho", np.float32)
    rho = np.zeros(1) if rho is None or not rho.size else rho.astype(np.float64)
    pa, pb = floats(node, "prob_a", np.float32), floats(node, "prob_b", np.float32)
    pa = np.zeros(0) if pa is None else pa.astype(np.float64)
    pb = np.zeros(0) if pb is None else pb.astype(np.float64)
    if len(pa) != len(pb):
        raise NotSupported("SVMClassifier: prob_a and prob_b must have the same length")
    post = post_transform(node)
    all_positive = bool((coef >= 0).all())
    n_vec = int(per_class.sum()) if per_class.size else 0
    n_pairs = n_cls * (n_cls - 1) // 2
    have_proba = len(pa) > 0
    if n_vec:
        if len(per_class) != n_cls or sv is None or sv.size % n_vec:
            raise NotSupported(
                "SVMClassifier: vectors_per_class needs one count per class label and "
                "support_vectors a whole number of vectors"
            )
        sv = sv.reshape(n_vec, -1).astype(np.float64)
        if coef.size != (n_cls - 1) * n_vec or len(rho) < n_pairs:
            raise NotSupported(
                f"SVMClassifier: {n_cls} classes and {n_vec} support vectors need "
                f"{(n_cls - 1) * n_vec} coefficients and {n_pairs} rho values"
            )
        if have_proba and len(pa) < n_pairs:
            raise NotSupported(f"SVMClassifier: prob_a needs {n_pairs} values, one per pair")
        coef = coef.reshape(n_cls - 1, n_vec)
        start = np.concatenate([[0], np.cumsum(per_class)[:-1]])
        pairs = [(i, j) for i in range(n_cls - 1) for j in range(i + 1, n_cls)]
    else:
        if coef.size % n_cls:
            raise NotSupported(
                f"SVMClassifier: {coef.size} coefficients do not split into {n_cls} classes"
            )
        coef = coef.reshape(n_cls, -1)
    width = sv.shape[1] if n_vec else coef.shape[1]

    def label_of(index: np.ndarray) -> np.ndarray:
        return labels[index]

    def run(x):
        x2 = rows_2d(np.asarray(x), "SVMClassifier").astype(np.float32).astype(np.float64)
        if x2.shape[1] != width:
            raise ValueError(
                f"SVMClassifier: the input has {x2.shape[1]} features per row, the model {width}"
            )
        n = x2.shape[0]
        if not n_vec:  # liblinear: one score per class
            s = x2 @ coef.T + rho[0]  # onnxruntime uses the linear kernel here
            top = np.argmax(s, axis=1)
            best = s[np.arange(n), top]
            if n_pairs == 1 and len(labels) == 2:
                won = (best >= 0.5) if all_positive else (best > 0)
                y = np.where(won, labels[1], labels[top])
            else:
                y = label_of(top)
            return y, apply_post(s, post).astype(np.float32)
        k = kern(x2, sv)
        scores = np.empty((n, n_pairs))
        votes = np.zeros((n, n_cls), np.int64)
        rows = np.arange(n)
        for p, (i, j) in enumerate(pairs):
            si, sj = (
                slice(start[i], start[i] + per_class[i]),
                slice(start[j], start[j] + per_class[j]),
            )
            s = k[:, si] @ coef[j - 1, si] + k[:, sj] @ coef[i, sj] + rho[p]
            scores[:, p] = s
            np.add.at(votes, (rows, np.where(s > 0, i, j)), 1)
        y = label_of(np.argmax(votes, axis=1))
        if have_proba:
            z = _coupled(scores, pa, pb, pairs, n_cls)
            return y, apply_post(z, post).astype(np.float32)
        if n_pairs == 1:
            s = scores[:, 0]
            if post == PROBIT:
                z = np.stack([probit(s), np.zeros(n)], axis=1)
            elif post == NONE:
                z = np.stack([-s, s], axis=1)
            else:
                z = np.stack([1.0 - s, s], axis=1)
            return y, z.astype(np.float32)
        return y, apply_post(scores, post).astype(np.float32)

    return run


def _coupled(scores, pa, pb, pairs, k):
    """Per-row class probabilities from pairwise Platt probabilities (libsvm, onnxruntime)."""
    n = scores.shape[0]
    r = np.zeros((n, k, k))
    for p, (i, j) in enumerate(pairs):
        v = 1.0 - logistic(scores[:, p] * pa[p] + pb[p])
        v = np.clip(v, 1e-7, 1 - 1e-7)
        r[:, i, j] = v
        r[:, j, i] = 1 - v
    q = np.zeros((n, k, k))
    for i in range(k):
        for j in range(k):
            if j != i:
                q[:, i, i] += r[:, j, i] ** 2
                q[:, i, j] = -r[:, j, i] * r[:, i, j]
    p = np.full((n, k), 1.0 / k)
    eps = 0.005 / k
    active = np.ones(n, bool)
    for _ in range(100):
        qp = np.einsum("nij,nj->ni", q, p)
        pqp = (p * qp).sum(1)
        err = np.abs(qp - pqp[:, None]).max(1)
        active &= err >= eps
        if not active.any():
            break
        a = active
        for i in range(k):
            diff = (-qp[a, i] + pqp[a]) / q[a, i, i]
            p_a = p[a]
            p_a[:, i] += diff
            pqp_a = (pqp[a] + diff * (diff * q[a, i, i] + 2 * qp[a, i])) / (1 + diff) / (1 + diff)
            qp[a] = (qp[a] + diff[:, None] * q[a, i, :]) / (1 + diff)[:, None]
            p[a] = p_a / (1 + diff)[:, None]
            pqp[a] = pqp_a
    return p
