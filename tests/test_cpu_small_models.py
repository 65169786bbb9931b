"""The CPU provider's per-run savings on small models (issue 23, docs/cpu_kernels.md,
"Small models"): work on constant weights done once, views and buffers kept per shape.

Each saving must leave the result bit for bit what the per-run path computes: every
case runs the model as exported (weights are initializers, so constants) and again with
the weights declared as graph inputs too (overridable initializers, never constants:
the kernels' per-run path), and compares the two byte for byte, and both against
onnxruntime.
"""

from __future__ import annotations

import io
import warnings

import numpy as np
import onnx
import pytest
from onnx import helper

import onnxep
from onnxep.testing import compare_output

ort = pytest.importorskip("onnxruntime")
torch = pytest.importorskip("torch")

from test_cpu_recurrent import TorchRecurrent  # noqa: E402  (needs torch, skipped above)


def _export(net, args: tuple, names: list[str], dynamic: dict | None = None) -> onnx.ModelProto:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        buf = io.BytesIO()
        torch.onnx.export(
            net, args, buf, dynamo=False, opset_version=17, input_names=names,
            dynamic_axes=dynamic,
        )  # fmt: skip
    return onnx.load_from_string(buf.getvalue())


def _weights_as_inputs(model: onnx.ModelProto) -> onnx.ModelProto:
    """The same model with every initializer also a graph input (so not a constant)."""
    m = onnx.ModelProto()
    m.CopyFrom(model)
    have = {i.name for i in m.graph.input}
    for init in m.graph.initializer:
        if init.name not in have:
            m.graph.input.append(
                helper.make_tensor_value_info(init.name, init.data_type, list(init.dims))
            )
    return m


def _sessions(model: onnx.ModelProto):
    ours = onnxep.InferenceSession(model.SerializeToString(), providers=["cpu"])
    plain = onnxep.InferenceSession(
        _weights_as_inputs(model).SerializeToString(), providers=["cpu"]
    )
    peer = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return ours, plain, peer


def _check(model: onnx.ModelProto, feeds_list: list[dict], fresh: bool = False) -> None:
    """``fresh``: the reference is a new session per feed (its first and only run), for
    kernels whose constant-weight path computes otherwise than their per-run one."""
    ours, plain, peer = _sessions(model)
    for feeds in feeds_list:
        for _ in range(2):  # the second run reads what the first one cached
            got = ours.run(None, feeds)
        if fresh:
            plain = onnxep.InferenceSession(model.SerializeToString(), providers=["cpu"])
        want = plain.run(None, feeds)
        for g, w in zip(got, want):
            assert g.dtype == w.dtype and g.shape == w.shape
            assert g.tobytes() == w.tobytes()
        bad = []
        for i, (g, w) in enumerate(zip(got, peer.run(None, feeds))):
            bad += [r.describe() for r in compare_output(str(i), g, w, "cpu", "ort") if not r.ok]
        assert not bad, "\n".join(bad)


def _ops(model: onnx.ModelProto) -> set[str]:
    return {n.op_type for n in model.graph.node}


# -- Gemm with a constant B under transB (every exported nn.Linear) ---------------------


class _Mlp(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = torch.nn.Linear(256, 768)
        self.b = torch.nn.Linear(768, 160)

    def forward(self, x):
        return torch.log_softmax(self.b(torch.tanh(self.a(x))), dim=-1)


def test_linear_gemm_constant_transposed_weight():
    torch.manual_seed(0)
    x = torch.randn(2, 256)
    model = _export(_Mlp().eval(), (x,), ["x"], {"x": {0: "batch"}})
    assert "Gemm" in _ops(model)
    rng = np.random.default_rng(0)
    _check(model, [{"x": rng.standard_normal((n, 256)).astype(np.float32)} for n in (2, 1, 7, 2)])


@pytest.mark.parametrize(("n", "k"), [(48, 32), (300, 200)])  # the second: one GEMV a row
def test_gemm_alpha_beta_and_broadcast_bias(n, k):
    """alpha, beta, a [1, N] C and transA, beside the exporter's plain form."""
    rng = np.random.default_rng(1)
    b = rng.standard_normal((n, k)).astype(np.float32)
    c = rng.standard_normal((1, n)).astype(np.float32)
    node = helper.make_node("Gemm", ["a", "b", "c"], ["y"], alpha=0.5, beta=2.0, transA=1, transB=1)
    graph = helper.make_graph(
        [node], "g",
        [helper.make_tensor_value_info("a", onnx.TensorProto.FLOAT, [k, None])],
        [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, None)],
        [onnx.numpy_helper.from_array(b, "b"), onnx.numpy_helper.from_array(c, "c")],
    )  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8)
    feeds = [{"a": rng.standard_normal((k, m)).astype(np.float32)} for m in (1, 2, 3, 5)]
    _check(model, feeds)


@pytest.mark.parametrize("k", [32, 256])  # W of 32x48 runs one SGEMM, 256x300 a GEMV a row
def test_matmul_few_rows(k):
    """One to three rows in all (over the leading dims too) run one GEMV a row, constant
    or fed weight alike; four and more one SGEMM."""
    rng = np.random.default_rng(3)
    n = 48 if k == 32 else 300
    b = rng.standard_normal((k, n)).astype(np.float32)
    node = helper.make_node("MatMul", ["a", "b"], ["y"])
    graph = helper.make_graph(
        [node], "g",
        [helper.make_tensor_value_info("a", onnx.TensorProto.FLOAT, [None, None, k])],
        [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, None)],
        [onnx.numpy_helper.from_array(b, "b")],
    )  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8)
    shapes = [(1, 1), (1, 2), (3, 1), (1, 3), (2, 2), (1, 5)]
    _check(model, [{"a": rng.standard_normal((*s, k)).astype(np.float32)} for s in shapes])


# -- LSTM / GRU weights prepared once ---------------------------------------------------


@pytest.mark.parametrize(
    ("kind", "kw"),
    [
        ("LSTM", dict(input_size=24, hidden_size=64)),
        ("LSTM", dict(input_size=24, hidden_size=32, num_layers=2, bidirectional=True)),
        ("GRU", dict(input_size=24, hidden_size=64)),
        ("GRU", dict(input_size=24, hidden_size=32, bidirectional=True)),
        # H = 1: the transpose of R is R itself, which must not be halved in place
        ("GRU", dict(input_size=24, hidden_size=1)),
        ("LSTM", dict(input_size=24, hidden_size=1)),
    ],
)
def test_recurrent_constant_weights(kind, kw):
    torch.manual_seed(2)
    x = torch.randn(3, 2, 24)
    model = _export(TorchRecurrent(kind, **kw).eval(), (x,), ["x"], {"x": {0: "T", 1: "batch"}})
    assert kind in _ops(model)
    rng = np.random.default_rng(2)
    shapes = [(3, 2), (1, 1), (5, 3), (3, 2)]
    _check(model, [{"x": rng.standard_normal((*s, 24)).astype(np.float32)} for s in shapes])


# -- Conv1d on short signals: im2col views kept per input shape ------------------------


class _Conv1d(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.stft = torch.nn.Conv1d(1, 66, 64, stride=32, bias=False)
        self.c1 = torch.nn.Conv1d(66, 32, 3, padding=1)
        self.c2 = torch.nn.Conv1d(32, 16, 3, stride=2, padding=1)
        self.c3 = torch.nn.Conv1d(16, 8, 1)

    def forward(self, x):
        y = torch.relu(self.c1(torch.abs(self.stft(x))))
        return self.c3(torch.relu(self.c2(y)))


def test_conv1d_short_signals_across_lengths():
    """Lengths change between runs and come back: each run reads only its own input."""
    torch.manual_seed(3)
    model = _export(_Conv1d().eval(), (torch.randn(1, 1, 256),), ["x"], {"x": {0: "n", 2: "len"}})
    assert "Conv" in _ops(model)
    rng = np.random.default_rng(3)
    lengths = [(1, 256), (1, 160), (2, 256), (1, 64), (1, 256)]
    # With constant weights Conv folds the bias into its GEMM, with fed ones it adds it after
    # (another rounding): the reference is a session that never ran another length.
    feeds = [{"x": rng.standard_normal((n, 1, t)).astype(np.float32)} for n, t in lengths]
    _check(model, feeds, fresh=True)


# -- TreeEnsembleClassifier on a few rows ---------------------------------------------


def test_tree_classifier_few_rows_and_nan():
    skl = pytest.importorskip("sklearn.ensemble")
    skl2onnx = pytest.importorskip("skl2onnx")
    from skl2onnx.common.data_types import FloatTensorType

    rng = np.random.default_rng(4)
    x = rng.standard_normal((300, 10)).astype(np.float32)
    y = (x[:, 0] + x[:, 3] > 0).astype(int) + (x[:, 5] > 1)
    clf = skl.RandomForestClassifier(n_estimators=12, max_depth=5, random_state=0).fit(x, y)
    model = skl2onnx.convert_sklearn(
        clf, initial_types=[("input", FloatTensorType([None, 10]))],
        target_opset={"": 17, "ai.onnx.ml": 3}, options={"zipmap": False},
    )  # fmt: skip
    assert _ops(model) == {"TreeEnsembleClassifier"}
    ours = onnxep.InferenceSession(model.SerializeToString(), providers=["cpu"])
    peer = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    nan = x[:4].copy()
    nan[0, 0] = np.nan
    nan[1, :] = np.inf
    for feed in (x[:1], x[:4], nan, x, x[:4]):
        got, want = ours.run(None, {"input": feed}), peer.run(None, {"input": feed})
        np.testing.assert_array_equal(got[0], want[0])
        np.testing.assert_allclose(got[1], want[1], rtol=1e-6, atol=1e-7)
    # A few rows walk the same trees as a large batch: the rows' results do not depend on it.
    big = ours.run(None, {"input": x})
    few = ours.run(None, {"input": x[:4]})
    assert few[0].tolist() == big[0][:4].tolist()
    assert few[1].tobytes() == big[1][:4].tobytes()


def test_tree_compiled_walk_matches_numpy_levels(monkeypatch):
    """Few rows walk compiled (numba), many level by level in NumPy: the same leaves."""
    from onnxep.providers_cpu import jit

    if not jit.ENABLED:
        pytest.skip("numba not available: only the NumPy traversal runs")
    skl = pytest.importorskip("sklearn.ensemble")
    skl2onnx = pytest.importorskip("skl2onnx")
    from skl2onnx.common.data_types import FloatTensorType

    rng = np.random.default_rng(5)
    x = rng.standard_normal((400, 6)).astype(np.float32)
    y = x[:, 0] * 2 - x[:, 4] + np.sin(x[:, 2])
    reg = skl.GradientBoostingRegressor(n_estimators=20, max_depth=4, random_state=0).fit(x, y)
    model = skl2onnx.convert_sklearn(
        reg, initial_types=[("input", FloatTensorType([None, 6]))],
        target_opset={"": 17, "ai.onnx.ml": 3},
    )  # fmt: skip
    ours = onnxep.InferenceSession(model.SerializeToString(), providers=["cpu"])
    peer = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    few = x[:8].copy()
    few[0, :] = np.nan
    few[1, 2] = np.nan
    few[2, :] = -np.inf
    compiled = ours.run(None, {"input": few})[0]
    monkeypatch.setattr(jit, "ENABLED", False)
    levels = ours.run(None, {"input": few})[0]
    assert compiled.tobytes() == levels.tobytes()
    np.testing.assert_allclose(compiled, peer.run(None, {"input": few})[0], rtol=1e-5, atol=1e-6)
