"""onnxruntime parity for the LLM contrib kernels other than attention.

Every case builds a one-node model, feeds it random inputs, and compares
onnxep's CPU provider against onnxruntime's CPU provider.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import onnxep

ort = pytest.importorskip("onnxruntime")

MS = "com.microsoft"
_ELEM = {
    np.dtype(np.float32): TensorProto.FLOAT,
    np.dtype(np.float16): TensorProto.FLOAT16,
    np.dtype(np.float64): TensorProto.DOUBLE,
    np.dtype(ml_dtypes.bfloat16): TensorProto.BFLOAT16,
    np.dtype(np.uint8): TensorProto.UINT8,
    np.dtype(np.int32): TensorProto.INT32,
    np.dtype(np.int64): TensorProto.INT64,
}


def omitted(name, value):
    """Inputs named "" or "_..." (or given as None) are omitted optional inputs."""
    return value is None or not name or name.startswith("_")


def make_model(op, inputs, outputs, attrs=None, domain=MS, initializers=None, out_types=None):
    """A one-node model; ``inputs`` maps name -> array ("" names an omitted optional input).

    Arrays in ``initializers`` become graph initializers instead of graph inputs.
    ``out_types`` maps output name -> numpy dtype (default: input 0's dtype).
    """
    initializers = initializers or {}
    names = ["" if omitted(n, a) else n for n, a in inputs.items()]
    node = helper.make_node(op, names, outputs, domain=domain, **(attrs or {}))
    g_inputs = [
        helper.make_tensor_value_info(n, _ELEM[np.dtype(a.dtype)], a.shape)
        for n, a in inputs.items()
        if not omitted(n, a) and n not in initializers
    ]
    first = next(a for a in inputs.values() if a is not None)
    g_outputs = []
    for o in outputs:
        if not o:
            continue
        dt = (out_types or {}).get(o, first.dtype)
        g_outputs.append(helper.make_tensor_value_info(o, _ELEM[np.dtype(dt)], None))
    inits = [numpy_helper.from_array(a, n) for n, a in initializers.items()]
    graph = helper.make_graph([node], "g", g_inputs, g_outputs, inits)
    opsets = [helper.make_opsetid("", 21), helper.make_opsetid(MS, 1)]
    return helper.make_model(graph, opset_imports=opsets, ir_version=10)


def run_ort(model, feeds):
    names = [o.name for o in model.graph.output]
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    sess = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
    return sess.run(names, feeds)


def run_both(model, feeds, ref_model=None):
    """(onnxep outputs, onnxruntime outputs) for the model's graph outputs."""
    names = [o.name for o in model.graph.output]
    ref = run_ort(ref_model or model, feeds)
    got = onnxep.InferenceSession(model, providers=["cpu"]).run(names, feeds)
    return got, ref


def assert_close(got, ref, atol=1e-5, rtol=1e-4):
    for i, (a, b) in enumerate(zip(got, ref)):
        a = np.asarray(a)
        b = np.asarray(b)
        assert a.shape == b.shape, f"output {i}: shape {a.shape} != {b.shape}"
        assert a.dtype == b.dtype, f"output {i}: dtype {a.dtype} != {b.dtype}"
        a64 = a.astype(np.float64)
        b64 = b.astype(np.float64)
        err = np.abs(a64 - b64) - (atol + rtol * np.abs(b64))
        assert (err <= 0).all(), (
            f"output {i}: max excess {err.max():.3g}, max abs diff {np.abs(a64 - b64).max():.3g}"
        )


def check(
    op,
    inputs,
    outputs,
    attrs=None,
    domain=MS,
    initializers=None,
    atol=1e-5,
    rtol=1e-4,
    out_types=None,
    ref_domain=None,
):
    """Compare one node; ``ref_domain`` builds onnxruntime's model in another domain."""
    model = make_model(op, inputs, outputs, attrs, domain, initializers, out_types)
    ref_model = None
    if ref_domain is not None and ref_domain != domain:
        ref_model = make_model(op, inputs, outputs, attrs, ref_domain, initializers, out_types)
    feeds = {n: a for n, a in inputs.items() if not omitted(n, a) and n not in (initializers or {})}
    got, ref = run_both(model, feeds, ref_model)
    assert_close(got, ref, atol, rtol)
    return got, ref


def check_low_precision(op, inputs, outputs, attrs, dtype, keep=(), atol=2e-2, rtol=2e-2):
    """onnxep in ``dtype`` against onnxruntime in float32 on the same (rounded) values.

    For kernels onnxruntime's CPU provider runs in float32 only. Float32 inputs
    not named in ``keep`` are rounded to ``dtype``; outputs are compared in float32.
    """
    low = {
        n: (a.astype(dtype) if a is not None and a.dtype == np.float32 and n not in keep else a)
        for n, a in inputs.items()
    }
    ref_in = {
        n: (a.astype(np.float32) if a is not None and a.dtype == dtype else a)
        for n, a in low.items()
    }
    model = make_model(op, low, outputs, attrs)
    ref_model = make_model(op, ref_in, outputs, attrs)
    names = [o.name for o in model.graph.output]
    got = onnxep.InferenceSession(model, providers=["cpu"]).run(
        names, {n: a for n, a in low.items() if not omitted(n, a)}
    )
    ref = run_ort(ref_model, {n: a for n, a in ref_in.items() if not omitted(n, a)})
    for g in got:
        assert g.dtype == dtype
    assert_close([g.astype(np.float32) for g in got], ref, atol, rtol)


def rnd(rng, shape, dtype=np.float32, scale=1.0):
    return (rng.standard_normal(shape) * scale).astype(dtype)


TOL = {np.float32: (1e-5, 1e-4), np.float16: (2e-3, 2e-3), np.float64: (1e-10, 1e-9)}


# ---------------------------------------------------------------- activations

ACT_SHAPES = [(7,), (2, 3, 16), (1, 5, 33), (4, 2, 3, 8)]


@pytest.mark.parametrize("shape", ACT_SHAPES)
@pytest.mark.parametrize("seed", [0, 1])
def test_gelu(shape, seed):
    rng = np.random.default_rng(seed)
    check("Gelu", {"X": rnd(rng, shape, scale=3.0)}, ["Y"])


@pytest.mark.parametrize("shape", ACT_SHAPES)
@pytest.mark.parametrize("seed", [0, 1])
def test_bias_gelu(shape, seed):
    rng = np.random.default_rng(seed)
    x = rnd(rng, shape, scale=3.0)
    check("BiasGelu", {"A": x, "B": rnd(rng, shape[-1:])}, ["C"])


@pytest.mark.parametrize("shape", ACT_SHAPES)
@pytest.mark.parametrize("with_bias", [False, True])
@pytest.mark.parametrize("seed", [0, 1])
def test_fast_gelu(shape, with_bias, seed):
    rng = np.random.default_rng(seed)
    ins = {"X": rnd(rng, shape, scale=3.0)}
    if with_bias:
        ins["bias"] = rnd(rng, shape[-1:])
    check("FastGelu", ins, ["Y"])


@pytest.mark.parametrize("shape", ACT_SHAPES)
@pytest.mark.parametrize("alpha", [None, 1.0, 0.5, -2.25])
def test_quick_gelu(shape, alpha):
    rng = np.random.default_rng(len(shape))
    attrs = {} if alpha is None else {"alpha": alpha}
    check("QuickGelu", {"X": rnd(rng, shape, scale=4.0)}, ["Y"], attrs)


# ---------------------------------------------------------------- FusedMatMul

FMM_CASES = [
    # (A shape, B shape, transA, transB, transBatchA, transBatchB)
    ((3, 4), (4, 5), 0, 0, 0, 0),
    ((4, 3), (4, 5), 1, 0, 0, 0),
    ((3, 4), (5, 4), 0, 1, 0, 0),
    ((2, 3, 4), (2, 4, 5), 0, 0, 0, 0),
    ((2, 4, 3), (2, 5, 4), 1, 1, 0, 0),
    ((3, 2, 4), (2, 4, 5), 0, 0, 1, 0),
    ((2, 3, 4), (4, 2, 5), 0, 0, 0, 1),
    ((4, 2, 3), (5, 2, 4), 1, 1, 1, 1),
    ((3, 2, 6, 4), (2, 6, 4, 5), 0, 0, 1, 0),
    ((2, 6, 3, 4), (5, 2, 6, 4), 0, 1, 0, 1),
    ((1, 3, 4), (2, 4, 5), 0, 0, 0, 0),
    ((4,), (4, 5), 0, 0, 0, 0),
    ((2, 3, 4), (4,), 0, 1, 0, 0),
    # onnxruntime needs equal ranks >= 3 once a transBatch flag is set
    ((4, 2, 6, 3), (5, 2, 6, 4), 1, 1, 1, 1),
    ((3, 2, 5, 4), (2, 5, 4, 6), 0, 0, 1, 0),
]


@pytest.mark.parametrize("case", FMM_CASES)
@pytest.mark.parametrize("alpha", [None, 0.5])
def test_fused_matmul(case, alpha):
    sa, sb, ta, tb, tba, tbb = case
    rng = np.random.default_rng(sum(sa) + sum(sb))
    attrs = {"transA": ta, "transB": tb, "transBatchA": tba, "transBatchB": tbb}
    if alpha is not None:
        attrs["alpha"] = alpha
    check("FusedMatMul", {"A": rnd(rng, sa), "B": rnd(rng, sb)}, ["Y"], attrs)


# ---------------------------------------------------------------- norms


@pytest.mark.parametrize("domain", ["", MS])
@pytest.mark.parametrize(
    "shape,axis", [((2, 3, 16), -1), ((4, 7), 1), ((2, 3, 5, 8), 2), ((2, 3, 8), 0), ((3, 64), -1)]
)
@pytest.mark.parametrize("dtype", [np.float32, np.float16, np.float64])
@pytest.mark.parametrize("with_inv", [False, True])
def test_simplified_layer_norm(domain, shape, axis, dtype, with_inv):
    rng = np.random.default_rng(len(shape) + axis)
    x = rnd(rng, shape, dtype, scale=2.0)
    a = axis % len(shape)
    scale = rnd(rng, shape[a:], dtype)
    outs = ["Y", "inv_std_var"] if with_inv else ["Y"]
    attrs = {"axis": axis, "epsilon": 1e-3 if dtype == np.float16 else 1e-6}
    atol, rtol = TOL[dtype]
    check(
        "SimplifiedLayerNormalization",
        {"X": x, "scale": scale},
        outs,
        attrs,
        domain=domain,
        atol=atol,
        rtol=rtol,
        out_types={"inv_std_var": np.float32},
        # onnxruntime runs this op in the default domain only
        ref_domain="",
    )


def _skip_inputs(rng, shape, skip_shape, dtype):
    hidden = shape[-1]
    ins = {
        "input": rnd(rng, shape, dtype, 2.0),
        "skip": rnd(rng, skip_shape, dtype),
        "gamma": rnd(rng, (hidden,), dtype),
    }
    return ins, hidden


SKIP_SHAPES = [
    ((2, 3, 16), (2, 3, 16)),
    ((2, 3, 16), (1, 3, 16)),
    ((2, 3, 16), (3, 16)),
    ((5, 32), (5, 32)),
]


@pytest.mark.parametrize("shapes", SKIP_SHAPES)
@pytest.mark.parametrize("with_bias", [False, True])
@pytest.mark.parametrize("with_sum", [False, True])
@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_skip_simplified_layer_norm(shapes, with_bias, with_sum, dtype):
    shape, skip_shape = shapes
    rng = np.random.default_rng(len(shape) * 10 + with_bias)
    ins, hidden = _skip_inputs(rng, shape, skip_shape, dtype)
    if with_bias:
        ins["bias"] = rnd(rng, (hidden,), dtype)
    outs = ["output", "mean", "inv_std_var", "sum"] if with_sum else ["output"]
    atol, rtol = TOL[dtype]
    types = {"mean": np.float32, "inv_std_var": np.float32}
    check(
        "SkipSimplifiedLayerNormalization",
        ins,
        outs,
        {"epsilon": 1e-5},
        atol=atol,
        rtol=rtol,
        out_types=types,
    )


@pytest.mark.parametrize("shapes", SKIP_SHAPES)
@pytest.mark.parametrize("with_beta", [False, True])
@pytest.mark.parametrize("with_bias", [False, True])
@pytest.mark.parametrize("with_sum", [False, True])
@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_skip_layer_norm(shapes, with_beta, with_bias, with_sum, dtype):
    shape, skip_shape = shapes
    rng = np.random.default_rng(len(shape) * 10 + with_bias + 2 * with_beta)
    ins, hidden = _skip_inputs(rng, shape, skip_shape, dtype)
    if with_beta or with_bias:
        ins["beta" if with_beta else "_beta"] = rnd(rng, (hidden,), dtype) if with_beta else None
    if with_bias:
        ins["bias"] = rnd(rng, (hidden,), dtype)
    outs = ["output", "mean", "inv_std_var", "sum"] if with_sum else ["output"]
    atol, rtol = TOL[dtype]
    types = {"mean": np.float32, "inv_std_var": np.float32}
    check(
        "SkipLayerNormalization",
        ins,
        outs,
        {"epsilon": 1e-5},
        atol=atol,
        rtol=rtol,
        out_types=types,
    )


# ---------------------------------------------------------------- MatMulNBits


def _nbits_inputs(rng, m_shape, k, n, bits, block_size, zp_kind, dtype):
    k_blocks = -(-k // block_size)
    blob = block_size * bits // 8
    ins = {
        "A": rnd(rng, m_shape + (k,), dtype),
        "B": rng.integers(0, 256, (n, k_blocks, blob), dtype=np.uint8),
        "scales": (rng.random((n, k_blocks)) * 0.1 + 0.01).astype(dtype),
    }
    if zp_kind == "packed":
        zp_bytes = -(-k_blocks * bits // 8)
        ins["zero_points"] = rng.integers(0, 256, (n, zp_bytes), dtype=np.uint8)
    elif zp_kind == "float":
        ins["zero_points"] = (rng.random((n, k_blocks)) * (1 << bits)).astype(dtype)
    return ins


NBITS_SHAPES = [
    # (leading dims of A, K, N, block_size)
    ((1,), 32, 8, 16),
    ((3,), 64, 5, 32),
    ((2, 3), 80, 7, 32),
    ((4,), 100, 6, 16),
    ((2, 1, 2), 256, 3, 128),
    ((5,), 33, 4, 64),
    ((2,), 300, 5, 256),
]


@pytest.mark.parametrize("shape", NBITS_SHAPES)
@pytest.mark.parametrize("bits", [2, 4, 8])
@pytest.mark.parametrize("zp_kind", ["none", "packed", "float"])
@pytest.mark.parametrize("const_b", [True, False])
def test_matmul_nbits(shape, bits, zp_kind, const_b):
    if bits == 8 and zp_kind == "float":
        pytest.skip("onnxruntime's CPU MatMulNBits rejects 8-bit weights with float zero points")
    lead, k, n, block_size = shape
    rng = np.random.default_rng(k * 7 + n + bits)
    ins = _nbits_inputs(rng, lead, k, n, bits, block_size, zp_kind, np.float32)
    attrs = {"K": k, "N": n, "bits": bits, "block_size": block_size}
    inits = (
        {name: ins[name] for name in ("B", "scales", "zero_points") if name in ins}
        if const_b
        else None
    )
    check("MatMulNBits", ins, ["Y"], attrs, initializers=inits, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("shape", NBITS_SHAPES[:4])
@pytest.mark.parametrize("zp_kind", ["none", "packed", "float"])
@pytest.mark.parametrize("with_bias", [False, True])
@pytest.mark.parametrize("accuracy_level", [0, 4])
def test_matmul_nbits_bias_and_accuracy(shape, zp_kind, with_bias, accuracy_level):
    lead, k, n, block_size = shape
    rng = np.random.default_rng(k + n)
    ins = _nbits_inputs(rng, lead, k, n, 4, block_size, zp_kind, np.float32)
    if with_bias:
        ins.setdefault("zero_points", None)
        ins["_g_idx"] = None
        ins["bias"] = rnd(rng, (n,))
    attrs = {"K": k, "N": n, "bits": 4, "block_size": block_size, "accuracy_level": accuracy_level}
    # accuracy_level 4 lets onnxruntime quantize A to int8 blocks: a looser match.
    tol = (1e-4, 1e-4) if accuracy_level == 0 else (0.05, 0.02)
    # onnxruntime's int8 path reads zero points only when they are constant.
    inits = {
        name: ins[name] for name in ("B", "scales", "zero_points") if ins.get(name) is not None
    }
    check("MatMulNBits", ins, ["Y"], attrs, initializers=inits, atol=tol[0], rtol=tol[1])


@pytest.mark.parametrize("shape", NBITS_SHAPES[:4])
@pytest.mark.parametrize("zp_kind", ["none", "packed", "float"])
@pytest.mark.parametrize("order", ["sequential", "shuffled"])
def test_matmul_nbits_g_idx(shape, zp_kind, order):
    lead, k, n, block_size = shape
    rng = np.random.default_rng(k + 3 * n)
    ins = _nbits_inputs(rng, lead, k, n, 4, block_size, zp_kind, np.float32)
    g_idx = (np.arange(k) // block_size).astype(np.int32)
    if order == "shuffled":
        g_idx = rng.permutation(g_idx).astype(np.int32)
    ins.setdefault("zero_points", None)
    ins["g_idx"] = g_idx
    attrs = {"K": k, "N": n, "bits": 4, "block_size": block_size}
    names = ("B", "scales", "zero_points", "g_idx")
    inits = {name: ins[name] for name in names if ins.get(name) is not None}
    if zp_kind != "packed":
        check("MatMulNBits", ins, ["Y"], attrs, initializers=inits, atol=1e-4, rtol=1e-4)
        return
    # onnxruntime's CPU kernel drops packed zero points when g_idx is present (a bug: the
    # spec applies them), so the reference gets the same zero points unpacked to floats.
    k_blocks = ins["scales"].shape[1]
    zp = ins["zero_points"]
    zp_f = np.stack([zp & 15, zp >> 4], axis=-1).reshape(n, -1)[:, :k_blocks].astype(np.float32)
    ref_ins = dict(ins, zero_points=zp_f)
    ref_model = make_model(
        "MatMulNBits", ref_ins, ["Y"], attrs, initializers=dict(inits, zero_points=zp_f)
    )
    model = make_model("MatMulNBits", ins, ["Y"], attrs, initializers=inits)
    got, ref = run_both(model, {"A": ins["A"]}, ref_model)
    assert_close(got, ref, 1e-4, 1e-4)


@pytest.mark.parametrize("shape", NBITS_SHAPES)
@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("zp_kind", ["none", "packed", "float"])
def test_matmul_nbits_fp16(shape, bits, zp_kind):
    if bits == 8 and zp_kind == "float":
        pytest.skip("onnxruntime's CPU MatMulNBits rejects 8-bit weights with float zero points")
    lead, k, n, block_size = shape
    rng = np.random.default_rng(k * 5 + n + bits)
    ins = _nbits_inputs(rng, lead, k, n, bits, block_size, zp_kind, np.float16)
    attrs = {"K": k, "N": n, "bits": bits, "block_size": block_size}
    inits = {name: ins[name] for name in ("B", "scales", "zero_points") if name in ins}
    check("MatMulNBits", ins, ["Y"], attrs, initializers=inits, atol=2e-2, rtol=5e-3)


# ---------------------------------------------------------------- hybrid linear-attention ops


@pytest.mark.parametrize("shape", [(2, 3, 4), (1, 1, 16), (3, 5, 7), (6, 2)])
@pytest.mark.parametrize("with_beta", [False, True])
@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_linear_attention_gate(shape, with_beta, dtype):
    rng = np.random.default_rng(sum(shape) + with_beta)
    h = shape[-1]
    ins = {
        "a": rnd(rng, shape, dtype, 4.0),
        "dt_bias": rnd(rng, (h,)),
        "decay_scale": -np.exp(rnd(rng, (h,))),
    }
    outs = ["decay"]
    if with_beta:
        ins["b"] = rnd(rng, shape, dtype, 4.0)
        outs.append("beta")
    atol, rtol = TOL[dtype]
    check("LinearAttentionGate", ins, outs, atol=atol, rtol=rtol)


@pytest.mark.parametrize(
    "shape,c", [((2, 3, 16), 16), ((2, 3, 32), 8), ((5, 12), 4), ((1, 2, 3, 20), 10)]
)
@pytest.mark.parametrize("activation", [None, "silu", "swish", "sigmoid"])
@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_gated_rms_norm(shape, c, activation, dtype):
    rng = np.random.default_rng(sum(shape) + c)
    ins = {
        "X": rnd(rng, shape, dtype, 2.0),
        "scale": rnd(rng, (c,), dtype),
        "gate": rnd(rng, shape, dtype, 3.0),
    }
    attrs = {"epsilon": 1e-5}
    if activation is not None:
        attrs["activation"] = activation
    atol, rtol = TOL[dtype]
    check("GatedRMSNorm", ins, ["Y"], attrs, atol=atol, rtol=rtol)


CONV_CASES = [
    # (batch, channels, length, kernel, dilation)
    (2, 4, 7, 4, 1),
    (1, 3, 1, 4, 1),
    (2, 5, 3, 4, 1),
    (3, 2, 9, 3, 2),
    (1, 6, 1, 3, 3),
    (2, 3, 5, 1, 1),
    (1, 8, 12, 5, 1),
]


@pytest.mark.parametrize("case", CONV_CASES)
@pytest.mark.parametrize("activation", [None, "none", "silu", "swish"])
@pytest.mark.parametrize("with_bias", [False, True])
@pytest.mark.parametrize("with_past", [False, True])
def test_causal_conv_with_state(case, activation, with_bias, with_past):
    b, c, length, k, dil = case
    rng = np.random.default_rng(b * 100 + c * 10 + length + k)
    pad = (k - 1) * dil
    ins = {"input": rnd(rng, (b, c, length)), "weight": rnd(rng, (c, 1, k))}
    ins["bias"] = rnd(rng, (c,)) if with_bias else None
    if with_past:
        ins["past_state"] = rnd(rng, (b, c, pad))
    attrs = {"dilation": dil} if dil != 1 else {}
    if activation is not None:
        attrs["activation"] = activation
    check("CausalConvWithState", ins, ["output", "present_state"], attrs)


@pytest.mark.parametrize("chan_shape", [(6,), (2, 3)])
@pytest.mark.parametrize("length,k,dil", [(5, 4, 1), (1, 4, 1), (7, 3, 2)])
@pytest.mark.parametrize("with_past", [False, True])
def test_causal_conv_with_state_channels_last(chan_shape, length, k, dil, with_past):
    rng = np.random.default_rng(length * 10 + k + len(chan_shape))
    b = 2
    c = int(np.prod(chan_shape))
    pad = (k - 1) * dil
    ins = {
        "input": rnd(rng, (b, length) + chan_shape),
        "weight": rnd(rng, (c, 1, k)),
        "bias": rnd(rng, (c,)),
    }
    if with_past:
        ins["past_state"] = rnd(rng, (b, pad) + chan_shape)
    attrs = {"channels_last": 1, "activation": "silu", "dilation": dil}
    check("CausalConvWithState", ins, ["output", "present_state"], attrs)


LA_HEADS = [
    # (q_num_heads, kv_num_heads, key heads, d_k, d_v)
    (2, 2, 2, 8, 8),
    (4, 2, 2, 8, 16),
    (4, 1, 1, 16, 8),
    (2, 4, 2, 8, 8),  # inverse GQA, key shared by pairs of KV heads
    (1, 4, 4, 4, 8),
    (2, 4, 4, 8, 4),
]


def _la_inputs(rng, b, t, heads, rule, decay_kind, beta_kind, with_past):
    hq, hkv, nk, dk, dv = heads
    k = rnd(rng, (b, t, nk, dk))
    if rule in ("delta", "gated_delta"):
        k = k / np.linalg.norm(k, axis=-1, keepdims=True)  # delta rules expect unit keys
    ins = {
        "query": rnd(rng, (b, t, hq * dk)),
        "key": k.reshape(b, t, nk * dk).astype(np.float32),
        "value": rnd(rng, (b, t, hkv * dv)),
        "past_state": rnd(rng, (b, hkv, dk, dv), scale=0.5) if with_past else None,
    }
    if rule in ("gated", "gated_delta"):
        width = hkv * dk if decay_kind == "per_key" else hkv
        ins["decay"] = -np.abs(rnd(rng, (b, t, width), scale=0.5))
    else:
        ins["decay"] = None
    if rule in ("delta", "gated_delta"):
        width = hkv if beta_kind == "per_head" else 1
        ins["beta"] = (1.0 / (1.0 + np.exp(-rnd(rng, (b, t, width))))).astype(np.float32)
    return ins


@pytest.mark.parametrize("heads", LA_HEADS)
@pytest.mark.parametrize("rule", ["linear", "gated", "delta", "gated_delta"])
@pytest.mark.parametrize("t", [1, 5])
@pytest.mark.parametrize("with_past", [False, True])
def test_linear_attention(heads, rule, t, with_past):
    rng = np.random.default_rng(sum(heads) + t + len(rule) + with_past)
    decay_kind = "per_key" if (t + heads[0]) % 2 else "per_head"
    beta_kind = "per_head" if (t + heads[1]) % 2 else "shared"
    ins = _la_inputs(rng, 2, t, heads, rule, decay_kind, beta_kind, with_past)
    attrs = {"q_num_heads": heads[0], "kv_num_heads": heads[1], "update_rule": rule}
    check("LinearAttention", ins, ["output", "present_state"], attrs, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("decay_kind", ["per_key", "per_head"])
@pytest.mark.parametrize("beta_kind", ["per_head", "shared"])
@pytest.mark.parametrize("scale", [None, 0.3])
def test_linear_attention_gate_kinds(decay_kind, beta_kind, scale):
    rng = np.random.default_rng(len(decay_kind) + len(beta_kind))
    heads = (4, 2, 2, 8, 8)
    ins = _la_inputs(rng, 3, 6, heads, "gated_delta", decay_kind, beta_kind, True)
    attrs = {"q_num_heads": 4, "kv_num_heads": 2}
    if scale is not None:
        attrs["scale"] = scale
    check("LinearAttention", ins, ["output", "present_state"], attrs, atol=1e-4, rtol=1e-4)


# ------------------------------------------------ state windows (CUDA-only in onnxruntime)


def _window_reference(run_prefix, t, window):
    """The windowed state onnxruntime would give: slot j is the state after token t - window + j."""
    slots = []
    for j in range(window):
        p = t - window + j
        slots.append(None if p < 0 else run_prefix(p + 1))
    shape = next(s for s in slots if s is not None).shape
    return np.stack([np.zeros(shape, np.float32) if s is None else s for s in slots])


@pytest.mark.parametrize("t,window", [(5, 3), (2, 4), (3, 1), (1, 2)])
def test_linear_attention_state_window(t, window):
    rng = np.random.default_rng(t * 10 + window)
    heads = (2, 2, 2, 4, 4)
    ins = _la_inputs(rng, 2, t, heads, "gated_delta", "per_head", "per_head", True)
    past = ins["past_state"]
    attrs = {"q_num_heads": 2, "kv_num_heads": 2}

    def prefix(n):
        sub = {
            k: (v[:, :n] if k in ("query", "key", "value", "decay", "beta") else v)
            for k, v in ins.items()
        }
        return run_ort(make_model("LinearAttention", sub, ["output", "present_state"], attrs), sub)

    windowed = dict(
        ins, past_state=np.concatenate([rnd(rng, (window - 1,) + past.shape), past[None]])
    )
    model = make_model(
        "LinearAttention", windowed, ["output", "present_state"], dict(attrs, state_window=window)
    )
    got = onnxep.InferenceSession(model, providers=["cpu"]).run(None, windowed)
    ref_out = prefix(t)[0]
    ref_state = _window_reference(lambda n: prefix(n)[1], t, window)
    assert_close(got, [ref_out, ref_state], 1e-4, 1e-4)


@pytest.mark.parametrize("t,window", [(5, 3), (2, 4), (3, 1), (1, 2)])
@pytest.mark.parametrize("channels_last", [0, 1])
def test_causal_conv_state_window(t, window, channels_last):
    rng = np.random.default_rng(t * 10 + window + channels_last)
    b, c, k = 2, 3, 4
    x = rnd(rng, (b, c, t))
    past = rnd(rng, (b, c, k - 1))
    w = rnd(rng, (c, 1, k))

    def prefix(n):
        sub = {"input": x[:, :, :n], "weight": w, "bias": None, "past_state": past}
        return run_ort(make_model("CausalConvWithState", sub, ["output", "present_state"]), sub)

    ref_out = prefix(t)[0]
    ref_state = _window_reference(lambda n: prefix(n)[1], t, window)
    win_past = np.concatenate([rnd(rng, (window - 1,) + past.shape), past[None]])
    if channels_last:
        x_in, win_past = x.transpose(0, 2, 1), win_past.transpose(0, 1, 3, 2)
        ref_out, ref_state = ref_out.transpose(0, 2, 1), ref_state.transpose(0, 1, 3, 2)
    else:
        x_in = x
    ins = {"input": x_in, "weight": w, "bias": None, "past_state": win_past}
    attrs = {"state_window": window, "channels_last": channels_last}
    model = make_model("CausalConvWithState", ins, ["output", "present_state"], attrs)
    feeds = {"input": x_in, "weight": w, "past_state": win_past}
    got = onnxep.InferenceSession(model, providers=["cpu"]).run(None, feeds)
    assert_close(got, [np.ascontiguousarray(ref_out), np.ascontiguousarray(ref_state)])


# ------------------------------------------------ half types onnxruntime's CPU provider lacks

LOWP = [np.float16, ml_dtypes.bfloat16]


@pytest.mark.parametrize("dtype", LOWP)
@pytest.mark.parametrize("rule", ["linear", "gated", "delta", "gated_delta"])
def test_linear_attention_low_precision(dtype, rule):
    rng = np.random.default_rng(len(rule))
    heads = (4, 2, 2, 8, 8)
    ins = _la_inputs(rng, 2, 4, heads, rule, "per_key", "per_head", True)
    attrs = {"q_num_heads": 4, "kv_num_heads": 2, "update_rule": rule}
    check_low_precision(
        "LinearAttention", ins, ["output", "present_state"], attrs, dtype, atol=3e-2, rtol=3e-2
    )


@pytest.mark.parametrize("dtype", LOWP)
@pytest.mark.parametrize("with_past", [False, True])
def test_causal_conv_low_precision(dtype, with_past):
    rng = np.random.default_rng(7 + with_past)
    ins = {"input": rnd(rng, (2, 4, 6)), "weight": rnd(rng, (4, 1, 4)), "bias": rnd(rng, (4,))}
    if with_past:
        ins["past_state"] = rnd(rng, (2, 4, 3))
    check_low_precision(
        "CausalConvWithState", ins, ["output", "present_state"], {"activation": "silu"}, dtype
    )


@pytest.mark.parametrize("dtype", LOWP)
@pytest.mark.parametrize("op", ["Gelu", "FastGelu", "QuickGelu", "BiasGelu"])
def test_gelus_low_precision(dtype, op):
    rng = np.random.default_rng(len(op))
    x = rnd(rng, (3, 4, 16), scale=3.0)
    ins = {"A": x, "B": rnd(rng, (16,))} if op == "BiasGelu" else {"X": x}
    out = "C" if op == "BiasGelu" else "Y"
    check_low_precision(op, ins, [out], {}, dtype)


@pytest.mark.parametrize("dtype", LOWP)
def test_fused_matmul_low_precision(dtype):
    rng = np.random.default_rng(3)
    ins = {"A": rnd(rng, (2, 8, 5)), "B": rnd(rng, (2, 4, 8))}
    attrs = {"transA": 1, "transB": 1, "alpha": 0.5}
    check_low_precision("FusedMatMul", ins, ["Y"], attrs, dtype, atol=5e-2, rtol=2e-2)


@pytest.mark.parametrize(
    "op", ["GatedRMSNorm", "LinearAttentionGate", "SkipSimplifiedLayerNormalization"]
)
def test_bfloat16_norms_and_gates(op):
    rng = np.random.default_rng(11)
    if op == "GatedRMSNorm":
        ins = {"X": rnd(rng, (2, 3, 16)), "scale": rnd(rng, (8,)), "gate": rnd(rng, (2, 3, 16))}
        outs, keep = ["Y"], ()
    elif op == "LinearAttentionGate":
        ins = {
            "a": rnd(rng, (2, 3, 4)),
            "dt_bias": rnd(rng, (4,)),
            "decay_scale": rnd(rng, (4,)),
            "b": rnd(rng, (2, 3, 4)),
        }
        outs, keep = ["decay", "beta"], ("dt_bias", "decay_scale")
    else:
        ins = {
            "input": rnd(rng, (2, 3, 16)),
            "skip": rnd(rng, (2, 3, 16)),
            "gamma": rnd(rng, (16,)),
        }
        outs, keep = ["output", "", "", "sum"], ()
    attrs = {"epsilon": 1e-5} if op != "LinearAttentionGate" else {}
    check_low_precision(op, ins, outs, attrs, ml_dtypes.bfloat16, keep=keep)


@pytest.mark.parametrize("empty_dim", [0, 1, 2])
@pytest.mark.parametrize("with_bias", [False, True])
def test_matmul_nbits_omitted_projection(empty_dim, with_bias):
    rng = np.random.default_rng(empty_dim)
    k, n = 32, 6
    b_shape = [n, 1, 16]
    b_shape[empty_dim] = 0
    ins = {
        "A": rnd(rng, (2, 3, k)),
        "B": np.zeros(b_shape, np.uint8),
        "scales": np.zeros((0,), np.float32),
    }
    if with_bias:
        ins.update({"_zero_points": None, "_g_idx": None, "bias": rnd(rng, (n,))})
    check("MatMulNBits", ins, ["Y"], {"K": k, "N": n, "bits": 4, "block_size": 32})


@pytest.mark.parametrize("state_length", [5, 9])
@pytest.mark.parametrize("t", [1, 4])
def test_causal_conv_state_length(state_length, t):
    """An explicit state_length keeps a longer history; the convolution reads its tail."""
    rng = np.random.default_rng(state_length + t)
    b, c, k = 2, 3, 4
    x = rnd(rng, (b, c, t))
    w = rnd(rng, (c, 1, k))
    past = rnd(rng, (b, c, state_length))
    sub = {"input": x, "weight": w, "bias": None, "past_state": past[:, :, -(k - 1) :]}
    ref_out = run_ort(make_model("CausalConvWithState", sub, ["output", "present_state"]), sub)[0]
    ref_state = np.concatenate([past, x], axis=2)[:, :, -state_length:]
    ins = dict(sub, past_state=past)
    model = make_model(
        "CausalConvWithState", ins, ["output", "present_state"], {"state_length": state_length}
    )
    got = onnxep.InferenceSession(model, providers=["cpu"]).run(
        None, {"input": x, "weight": w, "past_state": past}
    )
    assert_close(got, [ref_out, ref_state])


def test_causal_conv_channel_slice_and_update_capture():
    """input_channel_offset/input_channels pick a channels-last slice; state_update keeps rows."""
    rng = np.random.default_rng(5)
    b, t, width, off, c, k, cap = 2, 3, 10, 2, 4, 4, 5
    x = rnd(rng, (b, t, width))
    w = rnd(rng, (c, 1, k))
    sel = x[:, :, off : off + c]
    sub = {"input": np.ascontiguousarray(sel.transpose(0, 2, 1)), "weight": w}
    ref_out, ref_state = run_ort(
        make_model("CausalConvWithState", sub, ["output", "present_state"]), sub
    )
    attrs = {
        "channels_last": 1,
        "input_channel_offset": off,
        "input_channels": c,
        "state_update_capacity": cap,
    }
    ins = {"input": x, "weight": w}
    model = make_model(
        "CausalConvWithState", ins, ["output", "present_state", "state_update"], attrs
    )
    got = onnxep.InferenceSession(model, providers=["cpu"]).run(None, ins)
    update = np.zeros((b, cap, c), np.float32)
    update[:, :t] = sel
    ref = [ref_out.transpose(0, 2, 1), ref_state.transpose(0, 2, 1), update]
    assert_close(got, [np.ascontiguousarray(r) for r in ref])


@pytest.mark.parametrize("stash_type", [1, 11])
def test_simplified_layer_norm_double(stash_type):
    rng = np.random.default_rng(stash_type)
    if stash_type == 11:
        # onnxruntime's CPU kernel has no double statistics: check against the formula.
        x = rnd(rng, (3, 4, 16), np.float32)
        scale = rnd(rng, (16,), np.float32)
        model = make_model(
            "SimplifiedLayerNormalization",
            {"X": x, "scale": scale},
            ["Y", "inv_std_var"],
            {"stash_type": 11, "epsilon": 1e-5},
            domain="",
            out_types={"inv_std_var": np.float64},
        )
        y, inv = onnxep.InferenceSession(model, providers=["cpu"]).run(
            None, {"X": x, "scale": scale}
        )
        x64 = x.astype(np.float64)
        ref_inv = 1.0 / np.sqrt((x64 * x64).mean(-1, keepdims=True) + 1e-5)
        assert inv.dtype == np.float64 and y.dtype == np.float32
        assert_close([y, inv], [(x64 * ref_inv * scale).astype(np.float32), ref_inv], 1e-6, 1e-6)
        return
    x = rnd(rng, (3, 4, 16), np.float64)
    scale = rnd(rng, (16,), np.float64)
    check(
        "SimplifiedLayerNormalization",
        {"X": x, "scale": scale},
        ["Y", "inv_std_var"],
        {"stash_type": stash_type},
        domain="",
        atol=1e-6,
        rtol=1e-6,
        out_types={"inv_std_var": np.float64 if stash_type == 11 else np.float32},
    )


@pytest.mark.parametrize("zp_kind", ["none", "packed", "float"])
def test_matmul_nbits_bfloat16(zp_kind):
    rng = np.random.default_rng(len(zp_kind))
    k, n = 80, 6
    ins = _nbits_inputs(rng, (2, 3), k, n, 4, 32, zp_kind, np.float32)
    attrs = {"K": k, "N": n, "bits": 4, "block_size": 32}
    check_low_precision("MatMulNBits", ins, ["Y"], attrs, ml_dtypes.bfloat16, atol=5e-2, rtol=2e-2)


@pytest.mark.parametrize("const", [True, False])
def test_matmul_nbits_dequantizes_constants_once(const, monkeypatch):
    from onnxep.providers.ops import contrib as _contrib

    calls = []
    real = _contrib.dequantize_nbits
    monkeypatch.setattr(
        _contrib, "dequantize_nbits", lambda *a, **kw: calls.append(1) or real(*a, **kw)
    )
    rng = np.random.default_rng(0)
    k, n = 64, 8
    ins = _nbits_inputs(rng, (2,), k, n, 4, 32, "packed", np.float32)
    inits = {name: ins[name] for name in ("B", "scales", "zero_points")} if const else None
    model = make_model(
        "MatMulNBits", ins, ["Y"], {"K": k, "N": n, "bits": 4, "block_size": 32}, initializers=inits
    )
    sess = onnxep.InferenceSession(model, providers=["cpu"])
    feeds = {"A": ins["A"]} if const else ins
    for _ in range(3):
        sess.run(None, feeds)
    assert len(calls) == (1 if const else 3)


@pytest.mark.parametrize("heads", [LA_HEADS[1], LA_HEADS[3]])
@pytest.mark.parametrize("rule", ["linear", "gated", "delta", "gated_delta"])
@pytest.mark.parametrize("decay_kind", ["per_key", "per_head"])
@pytest.mark.parametrize("t,chunk_size", [(37, 8), (70, None), (16, 16)])
def test_linear_attention_long_prefill(heads, rule, decay_kind, t, chunk_size):
    """Sequences spanning several chunks, including a partial last one."""
    rng = np.random.default_rng(t + len(rule) + len(decay_kind))
    ins = _la_inputs(rng, 2, t, heads, rule, decay_kind, "per_head", True)
    attrs = {"q_num_heads": heads[0], "kv_num_heads": heads[1], "update_rule": rule}
    if chunk_size is not None:
        attrs["chunk_size"] = chunk_size
    check("LinearAttention", ins, ["output", "present_state"], attrs, atol=2e-4, rtol=2e-4)
