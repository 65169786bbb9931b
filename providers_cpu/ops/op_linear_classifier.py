"""LinearClassifier (ai.onnx.ml): X @ coefficients^T + intercepts, the top class, then the
post transform. One score with two class labels gives the two columns [1 - s, s] and the
label ``classlabels[1]`` when s > 0, as onnxruntime does (its post transform is not
applied to such a binary score, save PROBIT). The coefficients are read as rows of the
input's width, as onnxruntime reads them (``ml_common.CoefficientRows``)."""

from __future__ import annotations

from typing import Any

import numpy as np

from onnxep.errors import NotSupported
from onnxep.providers.kernel import kernel
from onnxep.providers.node import NodeInfo

from .. import jit
from .ml_common import (
    PROBIT,
    CoefficientRows,
    apply_post,
    class_labels,
    floats,
    post_transform,
    probit,
    rows_2d,
)


@kernel(
    "LinearClassifier", since=1, domain="ai.onnx.ml", dtypes=["float", "double", "int64", "int32"]
)
def linear_classifier(node: NodeInfo, xp: Any):
    coef = floats(node, "coefficients", np.float32)
    if coef is None or not coef.size:
        raise NotSupported("LinearClassifier: attribute 'coefficients' is required")
    b = floats(node, "intercepts", np.float32)
    b64 = b.astype(np.float64) if b is not None else None
    labels, strings = class_labels(node, "classlabels_ints")
    n_out = len(b) if b is not None else 0
    if n_out == 0 or coef.size % n_out:
        # onnxruntime refuses these at session creation too (a whole row count per class)
        raise NotSupported(
            f"LinearClassifier: {coef.size} coefficients do not split into {n_out} rows "
            "(one per intercept)"
        )
    weights = CoefficientRows(coef, n_out, "LinearClassifier")
    post = post_transform(node)
    if n_out > 1 and len(labels) < n_out:
        raise NotSupported(
            f"LinearClassifier: {n_out} scores per row but only {len(labels)} class labels"
        )
    if n_out == 1:
        two = len(labels) == 2
        pos = labels[1] if two else ("1" if strings else np.int64(1))
        neg = labels[0] if two else ("0" if strings else np.int64(0))
        label_dt = object if strings else np.int64
    compiled = _compiled() if n_out > 1 else None

    def run(x):
        x2 = rows_2d(np.asarray(x), "LinearClassifier")
        if x2.dtype != np.float32:  # onnxruntime's product is in float32: its input too
            x2 = x2.astype(np.float32)
        if compiled is not None and x2.size * n_out <= compiled.MAX_WORK:
            w = weights(x2.shape[1])
            z = np.empty((x2.shape[0], n_out), np.float32)
            top = np.empty(x2.shape[0], np.intp)
            compiled.classify(np.ascontiguousarray(x2), w, b64, post, z, top)
            return labels.take(top), z
        s = x2.astype(np.float64) @ weights(x2.shape[1])
        if compiled is not None:
            z = np.empty((x2.shape[0], n_out), np.float32)
            top = np.empty(x2.shape[0], np.intp)
            compiled.finish(s, b64, post, z, top)
            return labels.take(top), z
        s += b64
        if n_out == 1:
            score = s[:, 0]
            y = np.where(score > 0, pos, neg).astype(label_dt)
            if post == PROBIT:
                z = probit(s)
            elif two:
                z = np.stack([1.0 - score, score], axis=1)
            else:
                z = s
            return y, z.astype(np.float32)
        y = labels.take(s.argmax(axis=1))
        return y, apply_post(s, post).astype(np.float32)

    return run


def _compiled():
    """The compiled run (``linear_loops``), or None without numba."""
    if not jit.ENABLED:
        return None
    from . import linear_loops

    return linear_loops
