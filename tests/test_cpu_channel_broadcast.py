"""Add, Mul, Sub and Div of a feature map and one value per channel in one compiled pass
(providers_cpu/ops/channel_broadcast.py): the same bits as NumPy's broadcasting, with the
loop and without it, either operand order, special values, and every other shape still
broadcast as before."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import helper

import onnxep
from onnxep.providers_cpu import jit
from onnxep.providers_cpu.ops import channel_broadcast as cb
from onnxep.testing import compare_output

ort = pytest.importorskip("onnxruntime")

OPS = {"Add": (cb.ADD, np.add), "Sub": (cb.SUB, np.subtract), "Mul": (cb.MUL, np.multiply),
       "Div": (cb.DIV, np.divide)}  # fmt: skip
_ELEM = {np.float32: onnx.TensorProto.FLOAT, np.float64: onnx.TensorProto.DOUBLE,
         np.int64: onnx.TensorProto.INT64, np.int32: onnx.TensorProto.INT32}  # fmt: skip


def _operands(shape, vshape, dtype, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(shape).astype(dtype)
    v = (rng.standard_normal(vshape) + 2.0).astype(dtype)
    return x, v


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("swap", [False, True], ids=["map-first", "channel-first"])
@pytest.mark.parametrize("vshape", ["C11", "1C11"])
@pytest.mark.parametrize("op", list(OPS))
@pytest.mark.parametrize("shape", [(2, 256, 15, 40), (1, 64, 8, 40, 2), (3, 96, 200)])
def test_same_bits_as_numpy(compiled, op, vshape, swap, dtype, shape):
    c = shape[1]
    vs = (c, *[1] * (len(shape) - 2)) if vshape == "C11" else (1, c, *[1] * (len(shape) - 2))
    x, v = _operands(shape, vs, dtype)
    code, ufunc = OPS[op]
    f = cb.binary(code)
    got = f(v, x) if swap else f(x, v)
    want = ufunc(v, x) if swap else ufunc(x, v)
    assert got.dtype == want.dtype and got.shape == want.shape
    assert got.tobytes() == want.tobytes()


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
@pytest.mark.parametrize("op", list(OPS))
def test_special_values(compiled, op):
    x, v = _operands((2, 64, 16, 16), (64, 1, 1), np.float32)
    x[0, 0, 0, :4] = [np.nan, np.inf, -np.inf, 0.0]
    v[1] = 0.0
    v[2] = np.nan
    v[3] = -np.inf
    code, ufunc = OPS[op]
    for a, b in ((x, v), (v, x)):
        got = cb.binary(code)(a, b)
        assert got.tobytes() == ufunc(a, b).tobytes()


def test_what_is_not_per_channel_is_not_taken(monkeypatch):
    if not jit.ENABLED:
        pytest.skip("numba not installed: no compiled loop")
    x, _ = _operands((2, 64, 16, 16), (1,), np.float32)
    assert cb.per_channel(x, np.ones((64, 1, 1), np.float32))
    assert cb.per_channel(x, np.ones((1, 64, 1, 1), np.float32))
    assert not cb.per_channel(x, np.ones((2, 64, 1, 1), np.float32))  # per sample
    assert not cb.per_channel(x, np.ones((64, 16, 1), np.float32))  # per channel and row
    assert not cb.per_channel(x, np.ones((1, 1, 64, 1, 1), np.float32))  # widens x
    assert not cb.per_channel(x, np.ones((64, 1, 1), np.float64))  # other dtype
    assert not cb.per_channel(x[:, :, ::2], np.ones((64, 1, 1), np.float32))  # a view
    assert not cb.per_channel(x[0, 0], np.ones((16, 1), np.float32))  # 2-D
    calls = []
    monkeypatch.setattr(cb, "apply", lambda *a: calls.append(a))
    for other in ((64, 16, 1), (1, 1, 1, 16), (2, 64, 1, 1)):
        v = np.ones(other, np.float32)
        assert cb.binary(cb.MUL)(x, v).tobytes() == (x * v).tobytes()
    long_rows = np.ones((1, 4, 80, 80), np.float32)  # 6400 positions a channel: NumPy's loop
    cb.binary(cb.ADD)(long_rows, np.ones((4, 1, 1), np.float32))
    assert not calls


def _model(op: str, dtype, shape, vshape, swap: bool, opset: int = 14) -> onnx.ModelProto:
    v = (np.random.default_rng(3).standard_normal(vshape) + 2.0).astype(dtype)
    ins = ["v", "x"] if swap else ["x", "v"]
    graph = helper.make_graph(
        [helper.make_node(op, ins, ["y"])], "g",
        [helper.make_tensor_value_info("x", _ELEM[dtype], shape)],
        [helper.make_tensor_value_info("y", _ELEM[dtype], None)],
        [onnx.numpy_helper.from_array(v, "v")],
    )  # fmt: skip
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=8)


@pytest.mark.parametrize("swap", [False, True], ids=["map-first", "channel-first"])
@pytest.mark.parametrize("op", list(OPS))
def test_sessions_match_onnxruntime(compiled, op, swap, monkeypatch):
    model = _model(op, np.float32, [2, 128, 8, 20], (1, 128, 1, 1), swap)
    x = np.random.default_rng(4).standard_normal((2, 128, 8, 20)).astype(np.float32)
    calls = []
    real = cb.apply
    monkeypatch.setattr(cb, "apply", lambda *a: calls.append(1) or real(*a))
    sess = onnxep.InferenceSession(model.SerializeToString(), providers=["cpu"])
    got = [sess.run(None, {"x": x})[0] for _ in range(2)]  # checked run, then direct calls
    assert got[0].tobytes() == got[1].tobytes()
    assert len(calls) == (2 if compiled else 0)
    peer = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    bad = [r for r in compare_output("y", got[0], peer.run(None, {"x": x})[0], "cpu", "ort")]
    assert all(r.ok for r in bad), [r.describe() for r in bad]


@pytest.mark.parametrize("dtype", [np.int64, np.int32])
def test_integer_division_still_truncates(compiled, dtype):
    model = _model("Div", dtype, [2, 64, 16, 16], (64, 1, 1), False)
    rng = np.random.default_rng(5)
    v = (rng.integers(1, 10, (64, 1, 1)) * rng.choice([-1, 1], (64, 1, 1))).astype(dtype)
    model.graph.initializer[0].CopyFrom(onnx.numpy_helper.from_array(v, "v"))
    x = rng.integers(-1000, 1000, (2, 64, 16, 16)).astype(dtype)
    got = onnxep.InferenceSession(model.SerializeToString(), providers=["cpu"]).run(None, {"x": x})
    # rounding toward zero, not down (the compiled float loop must not take integers)
    want = (np.abs(x) // np.abs(v) * np.sign(x) * np.sign(v)).astype(dtype)
    assert got[0].dtype == dtype
    np.testing.assert_array_equal(got[0], want)


def test_other_nodes_keep_the_ufunc_and_its_in_place_steps():
    """Same-shape Add and Mul (and an Add whose channel count is not known) keep the generic
    kernel, whose direct form is the ufunc: the executor writes into a dead input."""
    x = helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [2, 8, 4, 4])
    nodes = [helper.make_node("Add", ["x", "x"], ["a"]), helper.make_node("Mul", ["a", "a"], ["b"])]
    nodes.append(helper.make_node("Add", ["b", "v"], ["y"]))
    v = helper.make_tensor_value_info("v", onnx.TensorProto.FLOAT, ["c", 1, 1])  # C not known
    graph = helper.make_graph(
        nodes, "g", [x, v], [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, None)]
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 14)], ir_version=8)
    sess = onnxep.InferenceSession(model.SerializeToString(), providers=["cpu"])
    rep = sess.placement()
    assert (rep.direct_steps, rep.in_place_steps) == (3, 2)
    feeds = {
        "x": np.ones((2, 8, 4, 4), np.float32),
        "v": np.arange(8, dtype=np.float32).reshape(8, 1, 1),
    }
    want = (feeds["x"] * 2) ** 2 + feeds["v"]
    for _ in range(2):
        np.testing.assert_array_equal(sess.run(None, feeds)[0], want)
