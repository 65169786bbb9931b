"""The CPU provider's gated-MLP fusions: SiLU(gate) * up -> onnxep::SwiGLU, and MatMuls
reading one activation with constant weights joined into one product (the gate and up pair
packed into the SwiGLU, any other group split after it).

The SwiGLU kernel must give the unfused SiLU and Mul nodes' bytes (numba on and off, float32
and float64, packed and two-input, strided and empty inputs); the joined products are
tolerance-level against the separate ones and onnxruntime."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import onnxep
from onnxep.providers_cpu import jit

ort = pytest.importorskip("onnxruntime")

JOINS = ["fuse_swiglu", "fuse_shared_input_matmuls"]


def _mlp(k: int, n: int, dtype=np.float32, extra: int = 0, commuted: bool = False) -> bytes:
    """x -> gate, up (and ``extra`` more projections of x, summed into the output's
    first columns) -> down(SiLU(gate) * up)."""
    rng = np.random.default_rng(k * 7 + n)
    elem = helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
    w = {
        "wg": rng.standard_normal((k, n)),
        "wu": rng.standard_normal((k, n)),
        "wd": rng.standard_normal((n, k)),
    }
    nodes = [
        helper.make_node("MatMul", ["x", "wg"], ["g"]),
        helper.make_node("MatMul", ["x", "wu"], ["u"]),
        helper.make_node("Sigmoid", ["g"], ["s"]),
        helper.make_node("Mul", ["g", "s"], ["silu"]),
        helper.make_node("Mul", ["silu", "u"] if not commuted else ["u", "silu"], ["h"]),
        helper.make_node("MatMul", ["h", "wd"], ["y0"]),
    ]
    last = "y0"
    for i in range(extra):
        w[f"we{i}"] = rng.standard_normal((k, k))
        nodes.append(helper.make_node("MatMul", ["x", f"we{i}"], [f"e{i}"]))
        nodes.append(helper.make_node("Add", [last, f"e{i}"], [f"y{i + 1}"]))
        last = f"y{i + 1}"
    nodes.append(helper.make_node("Identity", [last], ["y"]))
    inits = [numpy_helper.from_array((a * 0.2).astype(dtype), name) for name, a in w.items()]
    graph = helper.make_graph(
        nodes,
        "mlp",
        [helper.make_tensor_value_info("x", elem, ["b", "s", k])],
        [helper.make_tensor_value_info("y", elem, ["b", "s", k])],
        inits,
    )
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    onnx.checker.check_model(m)
    return m.SerializeToString()


def _sess(model, disabled=()):
    so = onnxep.SessionOptions(disabled_rewrites=list(disabled))
    return onnxep.InferenceSession(model, so, providers=["cpu"])


def _ops(sess):
    return [n.op_type for n in sess.placement().nodes]


def _fired(sess, name):
    return {f.name: f for f in sess.placement().fusions}[name].fired


@pytest.mark.parametrize("jit_on", [True, False])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("shape", [(1, 1), (2, 5), (0, 3), (3, 1)])
def test_swiglu_alone_gives_the_unfused_bytes(monkeypatch, jit_on, dtype, shape):
    if jit_on and not jit.wanted():
        pytest.skip("numba not installed")
    monkeypatch.setattr(jit, "ENABLED", jit_on and jit.wanted())
    model = _mlp(16, 24, dtype)
    x = np.random.default_rng(1).standard_normal((*shape, 16)).astype(dtype) * 3
    fused = _sess(model, ["fuse_shared_input_matmuls"])
    plain = _sess(model, JOINS)
    assert "SwiGLU" in _ops(fused) and "SwiGLU" not in _ops(plain)
    assert _ops(fused).count("MatMul") == 3
    (got,), (ref,) = fused.run(None, {"x": x}), plain.run(None, {"x": x})
    assert got.dtype == ref.dtype and got.shape == ref.shape
    np.testing.assert_array_equal(got, ref)


@pytest.mark.parametrize("jit_on", [True, False])
@pytest.mark.parametrize("shape", [(1, 1), (2, 7), (0, 2)])
@pytest.mark.parametrize("extra", [0, 2])
def test_joined_products_against_separate_and_onnxruntime(monkeypatch, jit_on, shape, extra):
    if jit_on and not jit.wanted():
        pytest.skip("numba not installed")
    monkeypatch.setattr(jit, "ENABLED", jit_on and jit.wanted())
    model = _mlp(32, 48, extra=extra)
    x = np.random.default_rng(2).standard_normal((*shape, 32)).astype(np.float32)
    joined = _sess(model)
    plain = _sess(model, JOINS)
    # gate and up alone become one product packed into the SwiGLU; with more projections
    # of x, all of them become one product and a Split feeds the SwiGLU its two halves
    assert _fired(joined, "fuse_shared_input_matmuls") == 1
    assert _ops(joined).count("MatMul") == 2
    assert _ops(joined).count("Split") == (1 if extra else 0)
    (got,), (ref,) = joined.run(None, {"x": x}), plain.run(None, {"x": x})
    np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-5)
    (theirs,) = ort.InferenceSession(model, providers=["CPUExecutionProvider"]).run(None, {"x": x})
    np.testing.assert_allclose(got, theirs, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("jit_on", [True, False])
def test_swiglu_kernel_on_strided_and_broadcast_inputs(monkeypatch, jit_on):
    if jit_on and not jit.wanted():
        pytest.skip("numba not installed")
    monkeypatch.setattr(jit, "ENABLED", jit_on and jit.wanted())
    from onnxep.providers_cpu.ops.logistic import logistic

    rng = np.random.default_rng(3)
    node = helper.make_node("SwiGLU", ["g", "u"], ["y"], domain="onnxep")
    model = helper.make_model(
        helper.make_graph(
            [node],
            "g",
            [
                helper.make_tensor_value_info("g", TensorProto.FLOAT, None),
                helper.make_tensor_value_info("u", TensorProto.FLOAT, None),
            ],
            [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        ),
        opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("onnxep", 1)],
        ir_version=8,
    )
    sess = onnxep.InferenceSession(model.SerializeToString(), providers=["cpu"])
    (step,) = sess._compiled.executor.plan.steps  # noqa: SLF001  (the kernel itself)
    big = rng.standard_normal((4, 6, 20)).astype(np.float32) * 4
    big[0, 0, :3] = [np.nan, np.inf, -np.inf]
    cases = [
        (big[:, ::2, :9], big[:, 1::2, 9:18]),  # strided rows and columns
        (big[..., :10], big[..., 10:]),  # a packed product's halves
        (big[:, :, :5], big[:1, :1, 5:10]),  # up broadcasts
        (big[:1, :1, :5], big[:, :, 5:10]),  # gate broadcasts: a fresh, wider product
        (big[:0, :, :5], big[:0, :, 5:10]),  # no rows
    ]
    for g, u in cases:
        (got,) = step.fn(g, u)
        ref = np.multiply(logistic(np.ascontiguousarray(g), mul=True), u)
        assert got.shape == ref.shape and got.dtype == np.float32
        np.testing.assert_array_equal(got, ref)
        # the packed form: gate then up along the last axis
        if g.shape == u.shape:
            (packed,) = step.fn(np.concatenate([g, u], axis=-1))
            np.testing.assert_array_equal(packed, ref)
    with pytest.raises(onnxep.errors.InvalidArgument, match="even size"):
        step.fn(big[..., :5])
