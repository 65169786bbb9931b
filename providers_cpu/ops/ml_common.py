"""What the ai.onnx.ml kernels share: attribute readers, class labels, post transforms.

The post transforms are onnxruntime's (``ml_common.h``), which onnx.reference
follows too: LOGISTIC in its overflow-safe form, SOFTMAX_ZERO leaving entries
within 1e-7 of zero out of the sum, and PROBIT through the closed-form inverse
error function of Winitzki (a = 0.147), not the exact normal quantile: every
runtime a converted model is checked against computes PROBIT that way.
"""

from __future__ import annotations

import math
import warnings
from typing import Any

import numpy as np

from onnxep.errors import NotSupported
from onnxep.providers.node import NodeInfo

from .misc import str_list, to_str

NONE, LOGISTIC, SOFTMAX, SOFTMAX_ZERO, PROBIT = range(5)
POST_TRANSFORMS = {"NONE": 0, "LOGISTIC": 1, "SOFTMAX": 2, "SOFTMAX_ZERO": 3, "PROBIT": 4}


def enum_attr(node: NodeInfo, name: str, table: dict[str, int], default: str) -> int:
    """A string attribute that names one of ``table``'s keys, as its number."""
    value = to_str(node.attr(name, default))
    if value not in table:
        raise NotSupported(
            f"{node.op_type}: {name} {value!r} is not one of {', '.join(sorted(table))}"
        )
    return table[value]


def post_transform(node: NodeInfo) -> int:
    return enum_attr(node, "post_transform", POST_TRANSFORMS, "NONE")


def floats(node: NodeInfo, name: str, dtype: Any = np.float64) -> np.ndarray | None:
    """``name`` or ``name_as_tensor`` (the double-precision twin) as a flat array, or None."""
    t = node.attr(f"{name}_as_tensor", None)
    plain = node.attr(name, None)
    if t is not None and plain is not None:
        raise NotSupported(f"{node.op_type}: both {name} and {name}_as_tensor are set; give one")
    v = t if t is not None else plain
    if v is None:
        return None
    return np.asarray(v, dtype=dtype).reshape(-1)


def ints(node: NodeInfo, name: str, required: bool = False) -> np.ndarray:
    v = node.attr(name, None)
    if v is None:
        if required:
            raise NotSupported(f"{node.op_type} node {node.name!r}: attribute {name!r} is required")
        return np.zeros(0, np.int64)
    return np.asarray(v, dtype=np.int64).reshape(-1)


def class_labels(node: NodeInfo, ints_name: str = "classlabels_int64s") -> tuple[np.ndarray, bool]:
    """``classlabels_strings`` or the int64 labels (``classlabels_int64s``, or
    ``classlabels_ints`` for the linear and SVM classifiers) as an array, and whether strings."""
    strings = node.attr("classlabels_strings", None)
    int64s = node.attr(ints_name, None)
    if strings is not None and int64s is not None and len(strings) and len(int64s):
        raise NotSupported(
            f"{node.op_type}: both classlabels_strings and {ints_name} are set; give one"
        )
    if strings is not None and len(strings):
        return np.array(str_list(strings), dtype=object), True
    if int64s is not None:
        return np.asarray(int64s, dtype=np.int64).reshape(-1), False
    return np.zeros(0, np.int64), False


def logistic(x: np.ndarray) -> np.ndarray:
    # 1 / (1 + exp(-|x|)) in one buffer: on a classifier's few scores the temporaries cost
    # more than the arithmetic
    v = np.abs(x)
    np.negative(v, out=v)
    np.exp(v, out=v)
    v += 1.0
    np.divide(1.0, v, out=v)
    return np.where(x < 0, 1.0 - v, v)


def probit(x: np.ndarray) -> np.ndarray:
    """sqrt(2) * erfinv(2x - 1), erfinv in Winitzki's closed form (onnxruntime's ComputeProbit)."""
    y = 2.0 * np.asarray(x, dtype=np.float64) - 1.0
    with np.errstate(all="ignore"):
        t = (1.0 - y) * (1.0 + y)
        ln = np.log(t)
        v = 2.0 / (np.pi * 0.147) + 0.5 * ln
        r = np.sqrt(np.sqrt(v * v - ln / 0.147) - v)
    return 1.41421356 * np.where(y < 0, -r, r)


def softmax(x: np.ndarray) -> np.ndarray:
    # The reductions as ufunc calls and the rest in one buffer: np.max/np.sum's wrappers
    # and two temporaries were half of a few-row classifier's post transform.
    e = np.subtract(x, np.maximum.reduce(x, axis=-1, keepdims=True))
    np.exp(e, out=e)
    e /= np.add.reduce(e, axis=-1, keepdims=True)
    return e


def softmax_zero(x: np.ndarray) -> np.ndarray:
    """Softmax over the entries that are not (within 1e-7) zero; those stay near zero."""
    m = x.max(axis=-1, keepdims=True)
    nz = np.abs(x) > 1e-7
    e = np.where(nz, np.exp(x - m), x * np.exp(-m))
    s = np.where(nz, e, 0.0).sum(axis=-1, keepdims=True)
    with np.errstate(all="ignore"):
        return e / s


def apply_post(scores: np.ndarray, kind: int) -> np.ndarray:
    """A post transform over the last axis (the classes or targets of each row)."""
    if kind == LOGISTIC:
        return logistic(scores)
    if kind == SOFTMAX:
        return softmax(scores)
    if kind == SOFTMAX_ZERO:
        return softmax_zero(scores)
    if kind == PROBIT:
        return probit(scores)
    return scores


def two_columns(score: np.ndarray, kind: int, rule: np.ndarray) -> np.ndarray:
    """A binary model's one score per row as the two class columns (onnxruntime's rules).

    ``rule`` per row: 0 or 1 (weights all positive: [1 - s, s], the transform not
    applied), 2 (mixed weights, positive class won) or 3 (negative class won):
    [logistic(-s), logistic(s)] under LOGISTIC, else [-s, s] for 2 and [s, -s] for 3.
    PROBIT gives [probit(s), 0].
    """
    if kind == PROBIT:
        return np.stack([probit(score), np.zeros_like(score)], axis=-1)
    out = np.empty((score.shape[0], 2))
    pos = rule <= 1
    out[:, 0] = np.where(pos, 1.0 - score, 0.0)
    out[:, 1] = np.where(pos, score, 0.0)
    mixed = ~pos
    if kind == LOGISTIC:
        out[mixed, 0] = logistic(-score[mixed])
        out[mixed, 1] = logistic(score[mixed])
    else:
        won = rule == 2
        out[won, 0], out[won, 1] = -score[won], score[won]
        lost = rule == 3
        out[lost, 0], out[lost, 1] = score[lost], -score[lost]
    return out


def rows_2d(x: np.ndarray, op: str) -> np.ndarray:
    """The [N, C] view of a model input: a 1-D input is one row, a scalar is refused."""
    if x.ndim == 0:
        raise ValueError(f"{op}: the input is a scalar; it needs at least one dimension")
    if x.ndim == 1:
        return x.reshape(1, -1)
    if x.ndim == 2:
        return x
    # The width from the shape, not -1: a batch of 0 rows has no size to infer it from.
    return x.reshape(x.shape[0], math.prod(x.shape[1:]))


class CoefficientRows:
    """LinearClassifier's and LinearRegressor's weights as ``rows`` rows of the input's width.

    onnxruntime (1.32) multiplies by the coefficients read as a [rows, features] matrix,
    features being the input's width, and checks only that there are at least rows x
    features of them: a node holding more runs on the first rows x features (onnxruntime's
    own logreg_iris.onnx declares 2 features and holds 4 per class), so onnxep does the
    same. Fewer are refused on both, naming both counts.
    """

    def __init__(self, coefficients: np.ndarray, rows: int, op: str):
        self._flat = np.asarray(coefficients, np.float64).reshape(-1)
        self._rows = rows
        self._op = op
        self._by_width: dict[int, np.ndarray] = {}

    def __call__(self, features: int) -> np.ndarray:
        """The [features, rows] transpose, the right operand of the rows' product."""
        w = self._by_width.get(features)
        if w is None:
            need = self._rows * features
            if need > self._flat.size:
                raise ValueError(
                    f"{self._op}: the input has {features} features per row, which takes "
                    f"{need} coefficients ({self._rows} rows of {features}); the node holds "
                    f"{self._flat.size}"
                )
            if need < self._flat.size:
                # onnxruntime's reading, but rarely what the model meant: said, not silent
                warnings.warn(
                    f"{self._op}: the input has {features} features per row, so {need} of the "
                    f"node's {self._flat.size} coefficients are used ({self._rows} rows of "
                    f"{features}), as onnxruntime reads them; a model whose coefficients are "
                    f"for {self._flat.size // self._rows} features wants inputs that wide",
                    stacklevel=2,
                )
            w = np.ascontiguousarray(self._flat[:need].reshape(self._rows, features).T)
            self._by_width[features] = w
        return w


def labels_of(labels: np.ndarray, index: np.ndarray) -> np.ndarray:
    """The class labels at ``index`` (object array for strings, int64 otherwise)."""
    return labels[index]
