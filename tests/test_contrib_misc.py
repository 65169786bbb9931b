"""onnxruntime parity for com.microsoft FusedGemm and Inverse, and LayerNormalization below
opset 17 (onnxruntime's own default-domain kernel there)."""

from __future__ import annotations

import numpy as np
import pytest
from contrib_cases import check, one_node, run_both

import onnxep
from onnxep.errors import OnnxepError

pytest.importorskip("onnxruntime")


@pytest.mark.parametrize("opset", [1, 9, 16, 17])
@pytest.mark.parametrize("axis", [-1, 1])
@pytest.mark.parametrize("dtype", [np.float32, np.float16, np.float64])
def test_layer_normalization_below_opset_17(opset, axis, dtype):
    rng = np.random.default_rng(opset)
    x = rng.standard_normal((2, 3, 8)).astype(dtype)
    d = x.shape[axis:] if axis != -1 else x.shape[-1:]
    inputs = [("x", x), ("scale", rng.standard_normal(d).astype(dtype))]
    inputs.append(("bias", rng.standard_normal(d).astype(dtype)))
    outs = [("y", dtype), ("mean", np.float32), ("inv", np.float32)]
    tol = 2e-2 if dtype == np.float16 else 1e-5
    attrs = {"axis": axis, "epsilon": 1e-5}
    check(
        "LayerNormalization",
        inputs,
        outs,
        attrs,
        {"scale", "bias"},
        tol,
        tol,
        domain="",
        opset=opset,
    )


@pytest.mark.parametrize(
    "act,params",
    [("Relu", {}), ("LeakyRelu", {"activation_alpha": 0.2}), ("Sigmoid", {}), ("Tanh", {})]
    + [("HardSigmoid", {"activation_alpha": 0.3, "activation_beta": 0.4})],
)
@pytest.mark.parametrize("trans", [(0, 0), (1, 1)])
@pytest.mark.parametrize("with_c", [False, True])
def test_fused_gemm(act, params, trans, with_c):
    rng = np.random.default_rng(1)
    a = rng.standard_normal((3, 5) if not trans[0] else (5, 3)).astype(np.float32)
    b = rng.standard_normal((5, 4) if not trans[1] else (4, 5)).astype(np.float32)
    inputs = [
        ("a", a),
        ("b", b),
        ("c", rng.standard_normal(4).astype(np.float32)) if with_c else ("", None),
    ]
    attrs = {"transA": trans[0], "transB": trans[1], "alpha": 0.7, "beta": 1.3, **params}
    attrs["activation"] = act
    check("FusedGemm", inputs, [("y", np.float32)], attrs, {"b", "c"}, 1e-5, 1e-5)


@pytest.mark.parametrize("shape", [(3, 3), (2, 4, 4), (1,)])
@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.float16])
def test_inverse(shape, dtype):
    rng = np.random.default_rng(2)
    if shape == (1,):
        model = one_node("Inverse", [("x", np.ones((2, 3), dtype))], [("y", dtype)])
        sess = onnxep.InferenceSession(model, providers=["cpu"])
        with pytest.raises(OnnxepError, match="square matrix"):
            sess.run(None, {"x": np.ones((2, 3), dtype)})
        return
    x = (rng.standard_normal(shape) + 3 * np.eye(shape[-1])).astype(dtype)
    tol = 5e-3 if dtype == np.float16 else 1e-5
    check("Inverse", [("x", x)], [("y", dtype)], atol=tol, rtol=tol)


@pytest.mark.parametrize(
    "mask", [[[0, 1, 1, 1]], [[0, 0, 1, 1]], [[1, 1, 0, 0]], [[0, 0, 0, 0]], [[1, 0, 1, 0]]]
)
@pytest.mark.parametrize("heads", [1, 2])
def test_attention_unidirectional_with_padding(mask, heads):
    """A causal row whose past keys are all padding: onnxruntime averages over that padding
    (filtered softly) and never over future keys (filtered outright)."""
    rng = np.random.default_rng(3)
    b, s, h = 1, 4, 4
    inputs = [("x", rng.standard_normal((b, s, h)).astype(np.float32))]
    inputs += [("w", rng.standard_normal((h, 3 * h)).astype(np.float32))]
    inputs += [("bias", rng.standard_normal(3 * h).astype(np.float32))]
    inputs += [("mask", np.array(mask, np.int32))]
    attrs = {"num_heads": heads, "unidirectional": 1}
    check("Attention", inputs, [("y", np.float32)], attrs, {"w", "bias"}, 1e-5, 1e-4)


def _lstm_model(rng, direction, hidden, inputs, with_lens, with_peepholes):
    from onnx import TensorProto, helper, numpy_helper

    nd = 2 if direction == "bidirectional" else 1
    w = (rng.standard_normal((nd, 4 * hidden, inputs)) * 0.5).astype(np.float32)
    r = (rng.standard_normal((nd, 4 * hidden, hidden)) * 0.5).astype(np.float32)
    b = (rng.standard_normal((nd, 8 * hidden)) * 0.1).astype(np.float32)
    inits = [numpy_helper.from_array(w, "W"), numpy_helper.from_array(r, "R")]
    inits.append(numpy_helper.from_array(b, "B"))
    names = ["x", "W", "R", "B", "lens" if with_lens else "", "h0", "c0"]
    if with_peepholes:
        inits.append(
            numpy_helper.from_array(rng.standard_normal((nd, 3 * hidden)).astype(np.float32), "P")
        )
        names.append("P")
    node = helper.make_node(
        "LSTM", names, ["y", "yh", "yc"], hidden_size=hidden, direction=direction
    )
    g_in = [helper.make_tensor_value_info("x", TensorProto.FLOAT, None)]
    g_in += [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in ("h0", "c0")]
    if with_lens:
        g_in.append(helper.make_tensor_value_info("lens", TensorProto.INT32, None))
    g_out = [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in ("y", "yh", "yc")]
    graph = helper.make_graph([node], "lstm", g_in, g_out, inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 14)]), nd


@pytest.mark.parametrize("direction", ["forward", "reverse", "bidirectional"])
@pytest.mark.parametrize("per_channel", [False, True])
@pytest.mark.parametrize("weight_type", ["QInt8", "QUInt8"])
@pytest.mark.parametrize("extras", ["plain", "lens", "peepholes"])
def test_dynamic_quantize_lstm(tmp_path, direction, per_channel, weight_type, extras):
    """quantize_dynamic's DynamicQuantizeLSTM against onnxruntime run on one thread: with more,
    onnxruntime quantizes the hidden state per chunk of batch rows, one chunk per thread."""
    import onnx
    from onnxruntime.quantization import QuantType, quantize_dynamic

    rng = np.random.default_rng(4)
    t, batch, hidden, size = 5, 3, 8, 6
    model, nd = _lstm_model(rng, direction, hidden, size, extras == "lens", extras == "peepholes")
    onnx.save(model, tmp_path / "lstm.onnx")
    quantize_dynamic(
        tmp_path / "lstm.onnx",
        tmp_path / "q.onnx",
        per_channel=per_channel,
        weight_type=getattr(QuantType, weight_type),
    )
    q = onnx.load(tmp_path / "q.onnx")
    assert [n.op_type for n in q.graph.node] == ["DynamicQuantizeLSTM"]
    feeds = {"x": rng.standard_normal((t, batch, size)).astype(np.float32)}
    feeds |= {
        k: (rng.standard_normal((nd, batch, hidden)) * 0.5).astype(np.float32) for k in ("h0", "c0")
    }
    if extras == "lens":
        feeds["lens"] = np.array([5, 2, 4], np.int32)
    got, ref = run_both(q, feeds, ort_threads=1)
    # With rows of different lengths onnxruntime's quantized hidden states are not those of
    # a frozen finished row (nor of one that runs on); the difference stays well below the
    # quantization's own error (about 1e-2 against the float LSTM here).
    atol = 5e-3 if extras == "lens" else 2e-6
    for g, r in zip(got, ref):
        np.testing.assert_allclose(g, r, atol=atol, rtol=1e-5)


@pytest.mark.parametrize("quant_type", [0, 1])
@pytest.mark.parametrize("n,k,block", [(8, 32, 16), (5, 24, 32), (16, 64, 64), (3, 7, 16)])
@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_matmul_bnb4(quant_type, n, k, block, dtype):
    rng = np.random.default_rng(5)
    numel = n * k
    b = rng.integers(0, 256, ((numel + 1) // 2,), dtype=np.uint8)
    absmax = rng.uniform(0.1, 2.0, ((numel + block - 1) // block,)).astype(dtype)
    a = rng.standard_normal((2, 3, k)).astype(dtype)
    attrs = {"K": k, "N": n, "block_size": block, "quant_type": quant_type}
    tol = 2e-2 if dtype == np.float16 else 1e-5
    inputs = [("a", a), ("b", b), ("absmax", absmax)]
    check("MatMulBnb4", inputs, [("y", dtype)], attrs, {"b", "absmax"}, tol, tol)


def test_matmul_bnb4_declines_trans_b_0():
    inputs = [("a", np.ones((2, 4), np.float32)), ("b", np.zeros(8, np.uint8))]
    inputs.append(("absmax", np.ones(1, np.float32)))
    attrs = {"K": 8, "N": 2, "block_size": 16, "quant_type": 1, "transB": 0}
    model = one_node("MatMulBnb4", inputs, [("y", np.float32)], attrs, {"b", "absmax"})
    with pytest.raises(OnnxepError, match="transB=0"):
        onnxep.InferenceSession(model, providers=["cpu"])


@pytest.mark.parametrize("trans", [(0, 0), (1, 0), (0, 1), (1, 1)])
@pytest.mark.parametrize("batched", [False, True])
def test_transpose_matmul(trans, batched):
    rng = np.random.default_rng(6)
    lead = (2,) if batched else ()
    a = rng.standard_normal(lead + ((5, 3) if trans[0] else (3, 5))).astype(np.float32)
    b = rng.standard_normal(lead + ((4, 5) if trans[1] else (5, 4))).astype(np.float32)
    attrs = {"transA": trans[0], "transB": trans[1], "alpha": 0.5}
    check("TransposeMatMul", [("a", a), ("b", b)], [("y", np.float32)], attrs, atol=1e-5, rtol=1e-5)
