"""TreeEnsembleClassifier (ai.onnx.ml opsets 1 and 3): class scores and the top label.

Evaluated by the shared vectorised evaluator (``tree_eval``). Scores and labels
follow onnxruntime's classifier, whose two-class rules the spec leaves open:

- more than two classes: base_values are added, the label is the highest score
  among the classes some leaf (or a base value) scored, then the post transform;
- two classes whose weights all name one class (LightGBM, XGBoost binary): that
  score decides (> 0.5 when every weight is positive, else > 0) and the two
  columns are built from it (``ml_common.two_columns``);
- two classes both weighted (scikit-learn forests): label ``classlabels[1]`` when
  the positive score is > 0 (onnxruntime returns 1 or 0 there for int64 labels).
"""

from __future__ import annotations

from collections.abc import Callable
from threading import Lock
from typing import Any

import numpy as np

from onnxep.errors import NotSupported
from onnxep.providers.kernel import kernel
from onnxep.providers.node import NodeInfo

from .ml_common import (
    apply_post,
    class_labels,
    floats,
    ints,
    post_transform,
    rows_2d,
    two_columns,
)
from .tree_eval import CLASSIFY, SUMS, Forest, compare_dtype, from_attributes

_INPUTS = ["float", "double", "int64", "int32"]


def refuse_after_opset_3(node: NodeInfo) -> None:
    if node.opset >= 5:
        raise NotSupported(
            f"{node.op_type} is deprecated from ai.onnx.ml opset 5 (the model imports "
            f"{node.opset}); use TreeEnsemble there, or import ai.onnx.ml opset 3"
        )


def forest_cache(make: Callable[[Any], Forest], node: NodeInfo) -> Callable[[Any], Forest]:
    """The ensemble compiled once per comparison dtype (known at build when the input is typed)."""
    forests: dict[Any, Forest] = {}
    lock = Lock()
    known = node.input_dtype(0)
    if known is not None:
        forests[compare_dtype(known)] = make(compare_dtype(known))

    def get(dt: Any) -> Forest:
        f = forests.get(dt)
        if f is None:
            with lock:
                f = forests.get(dt) or forests.setdefault(dt, make(dt))
        return f

    return get


@kernel("TreeEnsembleClassifier", since=(1, 3, 5), domain="ai.onnx.ml", dtypes=_INPUTS)
def tree_ensemble_classifier(node: NodeInfo, xp: Any):
    refuse_after_opset_3(node)
    labels, strings = class_labels(node)
    n_classes = len(labels)
    if n_classes < 2:
        raise NotSupported(
            f"TreeEnsembleClassifier: {n_classes} class label(s); a classifier needs two or more"
        )
    post = post_transform(node)
    base = floats(node, "base_values")
    base = np.zeros(0) if base is None else base
    ids = ints(node, "class_ids")
    weights = floats(node, "class_weights")
    binary_case = n_classes == 2 and len(set(ids.tolist())) == 1
    all_positive = weights is None or bool((weights >= 0).all())

    def make(dt: Any) -> Forest:
        f = from_attributes(node, "class", dt, n_classes)
        f.run_fused = f.fused(CLASSIFY if n_classes > 2 else SUMS, post, base)
        return f

    forest = forest_cache(make, node)
    nb = min(len(base), n_classes)  # the classes with a base value (the first nb)
    base_nb = base[:nb]

    def run(x):
        x2 = rows_2d(np.asarray(x), "TreeEnsembleClassifier")
        f = forest(compare_dtype(x2.dtype))
        got = None if f.run_fused is None else f.run_fused(x2)
        if got is not None and n_classes > 2:
            # One compiled call: walk, sums, base values, argmax, transform.
            return labels[got[1]], got[0]
        if got is not None:  # two classes: the sums compiled, onnxruntime's rules below
            s, has = got[0], (got[1][:, None] >> np.arange(2)) & 1 == 1
        else:
            s, has = f.scores(f.leaves(x2))
        if n_classes > 2:
            if nb:
                s[:, :nb] += base_nb
            # Base values for every class mark every score as given: no check, no where.
            # (The array method: np.argmax's wrapper cost 0.6 us more on a few rows.)
            if nb == n_classes:
                top = s.argmax(axis=1)
            else:
                has[:, :nb] = True
                top = (s if has.all() else np.where(has, s, -np.inf)).argmax(axis=1)
            return labels[top], apply_post(s, post).astype(np.float32)
        z, top = _binary(s, has, base, post, binary_case, all_positive)
        if binary_case:
            return labels[top], z.astype(np.float32)
        # Both classes weighted: onnxruntime's label is 1 or 0 itself (an index for strings).
        return (labels[top] if strings else top.astype(np.int64)), z.astype(np.float32)

    return run


def _binary(s, has, base, post, binary_case, all_positive):
    """Two classes: the columns and the label index per row, as onnxruntime computes them."""
    s0, s1, h0, h1 = s[:, 0].copy(), s[:, 1].copy(), has[:, 0], has[:, 1].copy()
    n = s.shape[0]
    keep_two = np.ones(n, bool)
    rule = np.full(n, -1)
    if len(base) == 2:
        # onnxruntime: with a positive score, s1 = b1 + s0 and s0 = -s1 (b0 unused).
        new1 = np.where(h1, base[1] + s0, s1 + base[1])
        s0 = np.where(h1, -new1, s0 + base[0])
        s1 = np.where(h1, new1, 0.0)  # without a score, onnxruntime writes 0 there
        s0 = np.where(h0 | h1, s0, 0.0)
    elif len(base) == 1:
        s0 = s0 + base[0]
        keep_two = h1
    elif len(base) == 0:
        rule[:] = 3
        keep_two = h1
    pos = np.where(keep_two & h1, s1, np.where(h0, s0, 0.0))
    if binary_case:
        won = pos > 0.5 if all_positive else pos > 0
        rule = np.where(won, 0, 1) if all_positive else np.where(won, 2, 3)
    else:
        won = pos > 0
    # A class no leaf scored is written as 0 whatever was added to it (onnxruntime's
    # ScoreValue reads as 0 without its flag): with two base values and only class 1
    # weighted, column 0 is 0 before the transform, not -(b1 + s0).
    z = apply_post(np.stack([np.where(h0, s0, 0.0), s1], axis=1), post)
    one = ~keep_two
    if one.any():
        z[one] = two_columns(s0[one], post, rule[one])
        z[one & (rule < 0)] = np.stack([s0, np.zeros(n)], axis=1)[one & (rule < 0)]
    return z, won.astype(np.intp)
