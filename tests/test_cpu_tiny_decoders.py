"""The compiled decode-step kernels of the CPU provider (norms_jit, causal_conv_jit,
linear_attention_jit, gqa_decode_jit, rotary_jit) against the NumPy paths they replace:
the same node run with numba off, on odd sizes, strided inputs, empty batches and the
attribute variants each path takes or leaves to the generic kernel."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import onnxep
from onnxep.errors import BoundsError
from onnxep.providers_cpu import jit

pytestmark = pytest.mark.skipif(not jit.wanted(), reason="numba not installed")

MS = "com.microsoft"
_ELEM = {
    np.dtype(np.float32): TensorProto.FLOAT,
    np.dtype(np.int64): TensorProto.INT64,
    np.dtype(np.int32): TensorProto.INT32,
}


def _model(op, inputs, outputs, attrs=None, domain=MS, consts=None):
    consts = consts or {}
    names = ["" if a is None else n for n, a in inputs.items()]
    node = helper.make_node(op, names, outputs, domain=domain, **(attrs or {}))
    g_in = [
        helper.make_tensor_value_info(n, _ELEM[a.dtype], a.shape)
        for n, a in inputs.items()
        if a is not None and n not in consts
    ]
    g_out = [helper.make_tensor_value_info(o, TensorProto.FLOAT, None) for o in outputs if o]
    inits = [numpy_helper.from_array(a, n) for n, a in consts.items()]
    graph = helper.make_graph([node], "g", g_in, g_out, inits)
    opsets = [helper.make_opsetid("", 23), helper.make_opsetid(MS, 1)]
    return helper.make_model(graph, opset_imports=opsets, ir_version=10)


def _both(monkeypatch, model, feeds):
    """(compiled outputs, NumPy outputs) of one model on the same feeds."""
    sess = onnxep.InferenceSession(model, providers=["cpu"])
    got = sess.run(None, feeds)
    with monkeypatch.context() as m:
        m.setattr(jit, "ENABLED", False)
        ref = onnxep.InferenceSession(model, providers=["cpu"]).run(None, feeds)
    return got, ref


def _close(got, ref, tol=2e-6):
    assert len(got) == len(ref)
    for g, r in zip(got, ref):
        assert g.shape == r.shape and g.dtype == r.dtype, (g.shape, r.shape, g.dtype, r.dtype)
        np.testing.assert_allclose(g, r, rtol=tol, atol=tol)


def _rnd(rng, shape, scale=1.0):
    return (rng.standard_normal(shape) * scale).astype(np.float32)


def _fed_to_kernel(sess, feeds):
    """Run the session's one step on ``feeds`` as they are (strided views included):
    session feeds may be copied, a kernel's arguments are not."""
    (step,) = sess._compiled.executor.plan.steps  # noqa: SLF001  (the kernel itself)
    slots = list(sess._compiled.executor.plan.template)  # noqa: SLF001
    names = [i.name for i in sess.get_inputs()]
    for s, n in zip(sess._compiled.executor.plan.input_slots, names):  # noqa: SLF001
        slots[s] = feeds[n]
    return [x for x in step.fn(*[slots[i] for i in step.inputs]) if x is not None]


# ------------------------------------------------------------------ norms


@pytest.mark.parametrize("shape", [(1, 1, 64), (2, 3, 17), (0, 4, 8), (5, 1)])
@pytest.mark.parametrize("with_bias", [False, True])
def test_skip_rms_norm(monkeypatch, shape, with_bias):
    rng = np.random.default_rng(sum(shape))
    k = shape[-1]
    ins = {"x": _rnd(rng, shape, 3), "skip": _rnd(rng, shape), "gamma": _rnd(rng, (k,))}
    if with_bias:
        ins["bias"] = _rnd(rng, (k,))
    model = _model("SkipSimplifiedLayerNormalization", ins, ["y", "", "", "s"], {"epsilon": 1e-6})
    got, ref = _both(monkeypatch, model, ins)
    _close(got, ref)


@pytest.mark.parametrize("shape", [(1, 1, 64), (3, 33), (0, 16)])
def test_simplified_layer_norm(monkeypatch, shape):
    rng = np.random.default_rng(len(shape))
    ins = {"x": _rnd(rng, shape, 2), "scale": _rnd(rng, shape[-1:])}
    model = _model("SimplifiedLayerNormalization", ins, ["y"], {"epsilon": 1e-5}, domain="")
    got, ref = _both(monkeypatch, model, ins)
    _close(got, ref)


def test_norms_take_strided_rows():
    from onnxep.providers_cpu.ops import norms_jit

    rng = np.random.default_rng(3)
    big = _rnd(rng, (4, 3, 40))
    x = big[:, ::2, 3:35]  # neither rows nor the last axis contiguous
    w = _rnd(rng, (64,))[::2]
    y, _ = norms_jit.rms(x, w, 1e-6)
    xd = x.astype(np.float64)
    want = xd / np.sqrt((xd * xd).mean(-1, keepdims=True) + 1e-6) * w
    np.testing.assert_allclose(y, want, rtol=2e-6, atol=2e-6)
    z = norms_jit.lp_last(x, 2)
    np.testing.assert_allclose(z, xd / np.linalg.norm(xd, axis=-1, keepdims=True), rtol=2e-6)


@pytest.mark.parametrize("p", [1, 2])
@pytest.mark.parametrize("shape", [(1, 1, 2, 16), (3, 7), (2, 0)])
def test_lp_normalization(monkeypatch, p, shape):
    rng = np.random.default_rng(p + len(shape))
    x = _rnd(rng, shape)
    if x.size:
        x.reshape(-1, shape[-1])[0] = 0  # a zero row gives zeros, not NaN
    model = _model("LpNormalization", {"x": x}, ["y"], {"p": p, "axis": -1}, domain="")
    got, ref = _both(monkeypatch, model, {"x": x})
    _close(got, ref)
    if x.size:
        assert not np.isnan(got[0]).any() and not got[0].reshape(-1, shape[-1])[0].any()


@pytest.mark.parametrize("shape,c", [((1, 1, 64), 16), ((2, 3, 20), 10), ((5, 8), 8)])
@pytest.mark.parametrize("activation", ["silu", "sigmoid"])
def test_gated_rms_norm(monkeypatch, shape, c, activation):
    rng = np.random.default_rng(c)
    ins = {"X": _rnd(rng, shape, 2), "scale": _rnd(rng, (c,)), "gate": _rnd(rng, shape, 4)}
    ins["gate"].flat[:2] = [-100.0, 100.0]  # exp overflows on one side only
    model = _model("GatedRMSNorm", ins, ["Y"], {"epsilon": 1e-5, "activation": activation})
    got, ref = _both(monkeypatch, model, ins)
    _close(got, ref)


@pytest.mark.parametrize("shape", [(1, 1, 4), (2, 3, 5), (0, 2, 3)])
@pytest.mark.parametrize("with_beta", [False, True])
def test_linear_attention_gate(monkeypatch, shape, with_beta):
    rng = np.random.default_rng(len(shape) + with_beta)
    h = shape[-1]
    ins = {
        "a": _rnd(rng, shape, 4),
        "dt_bias": _rnd(rng, (h,)),
        "decay_scale": -np.exp(_rnd(rng, (h,))),
    }
    if ins["a"].size:
        ins["a"].flat[:2] = [-100.0, 100.0]
    outs = ["decay"]
    if with_beta:
        ins["b"] = _rnd(rng, shape, 4)
        outs.append("beta")
    got, ref = _both(monkeypatch, _model("LinearAttentionGate", ins, outs), ins)
    _close(got, ref)


# ------------------------------------------------------------------ recurrent state ops


@pytest.mark.parametrize("b,c,length,k,dil", [(1, 8, 1, 4, 1), (2, 5, 3, 3, 2), (0, 4, 1, 4, 1)])
@pytest.mark.parametrize("with_bias", [False, True])
@pytest.mark.parametrize("with_past", [False, True])
def test_causal_conv_with_state(monkeypatch, b, c, length, k, dil, with_bias, with_past):
    rng = np.random.default_rng(b + c + length + k)
    pad = (k - 1) * dil
    ins = {
        "input": _rnd(rng, (b, c, length)),
        "weight": _rnd(rng, (c, 1, k)),
        "bias": _rnd(rng, (c,)) if with_bias else None,
        "past_state": _rnd(rng, (b, c, pad)) if with_past else None,
    }
    attrs = {"activation": "silu", "dilation": dil}
    model = _model("CausalConvWithState", ins, ["y", "present"], attrs)
    got, ref = _both(monkeypatch, model, {n: a for n, a in ins.items() if a is not None})
    _close(got, ref)


def test_causal_conv_strided_state(monkeypatch):
    """A decode loop's state is a view into a longer buffer: the kernel reads it there."""
    rng = np.random.default_rng(7)
    ins = {
        "input": _rnd(rng, (1, 6, 1)),
        "weight": _rnd(rng, (6, 1, 4)),
        "bias": _rnd(rng, (6,)),
        "past_state": _rnd(rng, (1, 6, 8))[:, :, 2:5],
    }
    model = _model("CausalConvWithState", ins, ["y", "present"], {"activation": "silu"})
    got = _fed_to_kernel(onnxep.InferenceSession(model, providers=["cpu"]), ins)
    plain = {n: np.ascontiguousarray(a) for n, a in ins.items()}
    with monkeypatch.context() as m:
        m.setattr(jit, "ENABLED", False)
        ref = onnxep.InferenceSession(model, providers=["cpu"]).run(None, plain)
    _close(got, ref)


LA_HEADS = [(2, 4, 2, 8, 8), (4, 2, 2, 8, 16), (2, 2, 2, 16, 4), (1, 4, 4, 4, 8)]


@pytest.mark.parametrize("heads", LA_HEADS)
@pytest.mark.parametrize("rule", ["linear", "gated", "delta", "gated_delta"])
@pytest.mark.parametrize("kinds", [("per_key", "per_head"), ("per_head", "shared")])
@pytest.mark.parametrize("with_past", [False, True])
def test_linear_attention_decode(monkeypatch, heads, rule, kinds, with_past):
    hq, hkv, nk, dk, dv = heads
    b = 2
    rng = np.random.default_rng(sum(heads) + len(rule))
    key = _rnd(rng, (b, 1, nk, dk))
    key /= np.linalg.norm(key, axis=-1, keepdims=True)
    ins = {
        "query": _rnd(rng, (b, 1, hq * dk)),
        "key": key.reshape(b, 1, nk * dk),
        "value": _rnd(rng, (b, 1, hkv * dv)),
        "past_state": _rnd(rng, (b, hkv, dk, dv), 0.5) if with_past else None,
        "decay": None,
        "beta": None,
    }
    if rule in ("gated", "gated_delta"):
        width = hkv * dk if kinds[0] == "per_key" else hkv
        ins["decay"] = -np.abs(_rnd(rng, (b, 1, width), 0.5))
    if rule in ("delta", "gated_delta"):
        width = hkv if kinds[1] == "per_head" else 1
        ins["beta"] = (1 / (1 + np.exp(-_rnd(rng, (b, 1, width))))).astype(np.float32)
    attrs = {"q_num_heads": hq, "kv_num_heads": hkv, "update_rule": rule}
    model = _model("LinearAttention", ins, ["o", "present"], attrs)
    got, ref = _both(monkeypatch, model, {n: a for n, a in ins.items() if a is not None})
    _close(got, ref, tol=1e-5)


# ------------------------------------------------------------------ attention


def _gqa(nh, nkv, d, past, packed, rotary, interleaved, rot_half):
    rng = np.random.default_rng(nh * 10 + nkv + past + packed + rotary)
    b = 2
    if packed:
        ins = {"query": _rnd(rng, (b, 1, (nh + 2 * nkv) * d)), "key": None, "value": None}
    else:
        ins = {
            "query": _rnd(rng, (b, 1, nh * d)),
            "key": _rnd(rng, (b, 1, nkv * d)),
            "value": _rnd(rng, (b, 1, nkv * d)),
        }
    ins["past_key"] = _rnd(rng, (b, nkv, past, d))
    ins["past_value"] = _rnd(rng, (b, nkv, past, d))
    ins["seqlens_k"] = np.full((b,), past, np.int32)
    ins["total_sequence_length"] = np.array(past + 1, np.int32)
    consts = {}
    attrs = {"num_heads": nh, "kv_num_heads": nkv}
    if rotary:
        ins["cos_cache"] = np.cos(_rnd(rng, (64, rot_half)))
        ins["sin_cache"] = np.sin(_rnd(rng, (64, rot_half)))
        consts = {"cos_cache": ins["cos_cache"], "sin_cache": ins["sin_cache"]}
        attrs.update(do_rotary=1, rotary_interleaved=int(interleaved))
    model = _model(
        "GroupQueryAttention", ins, ["y", "present_key", "present_value"], attrs, consts=consts
    )
    feeds = {n: a for n, a in ins.items() if a is not None and n not in consts}
    return model, feeds


@pytest.mark.parametrize("nh,nkv,d", [(4, 2, 16), (2, 2, 8), (6, 1, 12)])
@pytest.mark.parametrize("past", [0, 1, 17])
@pytest.mark.parametrize("packed", [False, True])
@pytest.mark.parametrize("rotary", [None, "halves", "interleaved", "partial"])
def test_gqa_decode_token(monkeypatch, nh, nkv, d, past, packed, rotary):
    rot_half = d // 4 if rotary == "partial" else d // 2
    model, feeds = _gqa(
        nh, nkv, d, past, packed, rotary is not None, rotary == "interleaved", rot_half
    )
    got, ref = _both(monkeypatch, model, feeds)
    _close(got, ref, tol=1e-5)


# ------------------------------------------------------------------ rotary


@pytest.mark.parametrize("layout", ["3d", "4d"])
@pytest.mark.parametrize("interleaved", [False, True])
@pytest.mark.parametrize("pos_kind", ["2d", "start"])
@pytest.mark.parametrize("rot", [0, 8])
def test_rotary_embedding(monkeypatch, layout, interleaved, pos_kind, rot):
    rng = np.random.default_rng(len(layout) + interleaved + rot)
    b, s, n, h = 2, 3, 2, 16
    x = _rnd(rng, (b, s, n * h)) if layout == "3d" else _rnd(rng, (b, n, s, h))
    half = (rot or h) // 2
    cos = np.cos(_rnd(rng, (32, half)))
    sin = np.sin(_rnd(rng, (32, half)))
    pos = rng.integers(0, 32, (b, s)) if pos_kind == "2d" else np.array([5], np.int64)
    attrs = {"interleaved": int(interleaved), "num_heads": n if layout == "3d" else 0}
    if rot:
        attrs["rotary_embedding_dim"] = rot
    ins = {"x": x, "pos": pos.astype(np.int64), "cos": cos, "sin": sin}
    model = _model("RotaryEmbedding", ins, ["y"], attrs, consts={"cos": cos, "sin": sin})
    got, ref = _both(monkeypatch, model, {"x": x, "pos": ins["pos"]})
    _close(got, ref)


def test_rotary_position_past_the_cache_is_named():
    rng = np.random.default_rng(0)
    cos = np.cos(_rnd(rng, (8, 4)))
    ins = {
        "x": _rnd(rng, (1, 1, 16)),
        "pos": np.array([[8]], np.int64),
        "cos": cos,
        "sin": cos.copy(),
    }
    model = _model(
        "RotaryEmbedding", ins, ["y"], {"num_heads": 2}, consts={"cos": cos, "sin": ins["sin"]}
    )
    sess = onnxep.InferenceSession(model, providers=["cpu"])
    with pytest.raises(BoundsError, match="position 8"):
        sess.run(None, {"x": ins["x"], "pos": ins["pos"]})


def test_rms_of_empty_rows():
    """Rows of no elements: nothing to normalize (the NumPy path divides by the width)."""
    x = np.zeros((2, 0), np.float32)
    ins = {"x": x, "skip": x.copy(), "gamma": np.zeros(0, np.float32)}
    model = _model("SkipSimplifiedLayerNormalization", ins, ["y", "", "", "s"], {"epsilon": 1e-6})
    y, s = onnxep.InferenceSession(model, providers=["cpu"]).run(None, ins)
    assert y.shape == s.shape == (2, 0) and y.dtype == s.dtype == np.float32
