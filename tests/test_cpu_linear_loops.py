"""LinearClassifier's and Normalizer's compiled runs (providers_cpu/ops/linear_loops.py)
against the NumPy path they replace and against onnxruntime."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper

import onnxep
from onnxep.providers_cpu import jit
from onnxep.testing import compare_output

pytest.importorskip("numba")
if not jit.ENABLED:
    pytest.skip("compiled loops off here (ONNXEP_CPU_JIT=0)", allow_module_level=True)
ort = pytest.importorskip("onnxruntime")
ML = "ai.onnx.ml"
POSTS = ["NONE", "LOGISTIC", "SOFTMAX", "SOFTMAX_ZERO", "PROBIT"]


def _model(op, inputs, outputs, **attrs):
    node = helper.make_node(
        op, [i.name for i in inputs], [o.name for o in outputs], domain=ML, **attrs
    )
    graph = helper.make_graph([node], "g", inputs, outputs)
    m = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid(ML, 1)]
    )
    m.ir_version = 8
    return m.SerializeToString()


def _classifier(n_feat, n_cls, post, strings=False, seed=0):
    rng = np.random.default_rng(seed)
    labels = (
        {"classlabels_strings": [f"c{i}" for i in range(n_cls)]}
        if strings
        else {"classlabels_ints": [10 + i for i in range(n_cls)]}
    )
    y = TensorProto.STRING if strings else TensorProto.INT64
    return _model(
        "LinearClassifier",
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, [None, n_feat])],
        [
            helper.make_tensor_value_info("Y", y, [None]),
            helper.make_tensor_value_info("Z", TensorProto.FLOAT, None),
        ],
        coefficients=list(rng.normal(size=n_feat * n_cls)),
        intercepts=list(rng.normal(size=n_cls)),
        post_transform=post,
        **labels,
    )


def _runs(data, feeds, monkeypatch):
    """(compiled, NumPy path) outputs of one model."""
    fast = onnxep.InferenceSession(data, providers=["cpu"]).run(None, feeds)
    with monkeypatch.context() as m:
        m.setattr(jit, "ENABLED", False)
        slow = onnxep.InferenceSession(data, providers=["cpu"]).run(None, feeds)
    return fast, slow


def _rows(n, width, seed, special=True):
    x = np.random.default_rng(seed).normal(scale=2.0, size=(n, width)).astype(np.float32)
    if special and n >= 4:
        x[1] = np.nan
        x[2, 0] = np.inf
        x[3] = 0.0
    return x


@pytest.mark.parametrize("post", POSTS)
@pytest.mark.parametrize("n", [0, 1, 4, 37])
@pytest.mark.parametrize("n_feat, n_cls", [(2, 3), (4, 2), (7, 5)])
def test_classifier_compiled_matches_numpy_and_onnxruntime(post, n, n_feat, n_cls, monkeypatch):
    data = _classifier(n_feat, n_cls, post, seed=n_feat * 10 + n_cls)
    x = _rows(n, n_feat, seed=n)
    fast, slow = _runs(data, {"X": x}, monkeypatch)
    np.testing.assert_array_equal(fast[0], slow[0])
    assert fast[1].dtype == np.float32 and fast[1].shape == (n, n_cls)
    # the float64 sums may differ from BLAS's in their last bit; float32 hides it
    np.testing.assert_allclose(fast[1], slow[1], rtol=1e-6, atol=1e-7, equal_nan=True)
    so = ort.SessionOptions()
    so.log_severity_level = 3
    want = ort.InferenceSession(data, so, providers=["CPUExecutionProvider"]).run(None, {"X": x})
    finite = np.isfinite(x).all(axis=1)  # onnxruntime's NaN/inf handling is its compiler's
    np.testing.assert_array_equal(fast[0][finite], want[0][finite])
    if post == "PROBIT":
        return  # onnxruntime's erfinv is in float32: off by 1e-3 relative near 0 and 1
    keep = np.isfinite(want[1]) & finite[:, None]
    for r in compare_output("Z", fast[1][keep], want[1][keep], "cpu", "onnxruntime"):
        assert r.ok, r.describe()


def test_classifier_string_labels_and_ties(monkeypatch):
    # equal scores: the first class wins, as np.argmax picks it
    data = _model(
        "LinearClassifier",
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, [None, 2])],
        [
            helper.make_tensor_value_info("Y", TensorProto.STRING, [None]),
            helper.make_tensor_value_info("Z", TensorProto.FLOAT, None),
        ],
        coefficients=[1.0, 0.0, 1.0, 0.0, 0.0, 1.0],
        intercepts=[0.0, 0.0, 0.0],
        classlabels_strings=["a", "b", "c"],
        post_transform="SOFTMAX",
    )
    x = np.array([[1.0, 0.0], [0.0, 2.0], [np.nan, 0.0], [0.0, np.nan]], np.float32)
    fast, slow = _runs(data, {"X": x}, monkeypatch)
    assert list(fast[0]) == list(slow[0]) == ["a", "c", "a", "a"]  # 0 * NaN is NaN: every score
    np.testing.assert_array_equal(fast[1], slow[1])


@pytest.mark.parametrize("post", POSTS)
def test_classifier_large_work_blas_product_compiled_finish(post, monkeypatch):
    """Past MAX_WORK the product is BLAS's and only the intercepts, argmax and transform are
    compiled (``finish``): the NumPy path's values and labels, and onnxruntime's."""
    from onnxep.providers_cpu.ops import linear_loops

    calls = {"classify": 0, "finish": 0}
    for name in calls:
        real = getattr(linear_loops, name)
        monkeypatch.setattr(
            linear_loops,
            name,
            lambda *a, _n=name, _f=real: calls.__setitem__(_n, calls[_n] + 1) or _f(*a),
        )
    data = _classifier(64, 4, post, seed=3)
    sess = onnxep.InferenceSession(data, providers=["cpu"])
    sess.run(None, {"X": _rows(4, 64, 0)})
    assert calls == {"classify": 1, "finish": 0}
    big = _rows(linear_loops.MAX_WORK // (64 * 4) + 1, 64, 1)
    fast, slow = _runs(data, {"X": big}, monkeypatch)
    assert calls["finish"] >= 1 and calls["classify"] == 1
    np.testing.assert_array_equal(fast[0], slow[0])
    np.testing.assert_allclose(fast[1], slow[1], rtol=1e-6, atol=1e-7, equal_nan=True)
    so = ort.SessionOptions()
    so.log_severity_level = 3
    want = ort.InferenceSession(data, so, providers=["CPUExecutionProvider"]).run(None, {"X": big})
    finite = np.isfinite(big).all(axis=1)
    np.testing.assert_array_equal(fast[0][finite], want[0][finite])
    if post != "PROBIT":
        keep = np.isfinite(want[1]) & finite[:, None]
        for r in compare_output("Z", fast[1][keep], want[1][keep], "cpu", "onnxruntime"):
            assert r.ok, r.describe()


@pytest.mark.parametrize("norm", ["MAX", "L1", "L2"])
@pytest.mark.parametrize("width", [1, 2, 3, 7, 8, 12])
def test_normalizer_compiled_bit_for_bit(norm, width, monkeypatch):
    data = _model(
        "Normalizer",
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, [None, width])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, None)],
        norm=norm,
    )
    x = _rows(9, width, seed=width)
    x[4] = -0.0
    x[5, 0] = -np.inf
    x[6] = np.float32(1e-30)  # L2's squares underflow in float32: a zero norm, row unchanged
    x[7] = np.abs(x[7])
    fast, slow = _runs(data, {"X": x}, monkeypatch)
    assert fast[0].dtype == np.float32
    np.testing.assert_array_equal(fast[0], slow[0])
    so = ort.SessionOptions()
    so.log_severity_level = 3
    want = ort.InferenceSession(data, so, providers=["CPUExecutionProvider"]).run(None, {"X": x})
    np.testing.assert_allclose(fast[0], want[0], rtol=1e-6, equal_nan=True)
    empty = np.zeros((0, width), np.float32)
    assert onnxep.InferenceSession(data, providers=["cpu"]).run(None, {"X": empty})[0].shape == (
        0,
        width,
    )
