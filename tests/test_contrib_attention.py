"""Parity of the com.microsoft attention and rotary kernels with onnxruntime's CPU provider."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import onnxep

ort = pytest.importorskip("onnxruntime")

F = TensorProto.FLOAT
I32 = TensorProto.INT32
I64 = TensorProto.INT64


def _model(op, inputs, outputs, attrs, feeds, out_types=None):
    """One-node com.microsoft model; ``inputs`` are names ('' for omitted)."""
    node = helper.make_node(op, inputs, outputs, domain="com.microsoft", **attrs)
    ins = [
        helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(feeds[n].dtype), None)
        for n in inputs
        if n
    ]
    outs = [
        helper.make_tensor_value_info(n, (out_types or {}).get(n, F), None) for n in outputs if n
    ]
    graph = helper.make_graph([node], op, ins, outs)
    m = helper.make_model(
        graph,
        opset_imports=[helper.make_opsetid("", 21), helper.make_opsetid("com.microsoft", 1)],
    )
    m.ir_version = 10
    return m


def _run_both(model, feeds):
    names = [i.name for i in model.graph.input]
    f = {n: feeds[n] for n in names}
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    ref = ort.InferenceSession(
        model.SerializeToString(), so, providers=["CPUExecutionProvider"]
    ).run(None, f)
    got = onnxep.InferenceSession(model, providers=["cpu"]).run(None, f)
    return got, ref


def _close(a, b, atol=1e-4, rtol=1e-3, what=""):
    a = np.asarray(a, dtype=np.float64)
    b = np.asarray(b, dtype=np.float64)
    assert a.shape == b.shape, f"{what}: shape {a.shape} != {b.shape}"
    err = np.abs(a - b) - (atol + rtol * np.abs(b))
    assert np.all(err <= 0), f"{what}: max excess {err.max():.3g}"


def _rope_cache(rng, max_len, rot_dim):
    inv = 1.0 / (10000 ** (np.arange(0, rot_dim, 2) / rot_dim))
    ang = np.arange(max_len)[:, None] * inv[None, :]
    return np.cos(ang).astype(np.float32), np.sin(ang).astype(np.float32)


# ----------------------------------------------------------------------------- GroupQueryAttention

GQA_CASES = [
    # name, batch, seq, nh, nkv, hd, past_lens(list per batch) or None, cap, attrs, packed
    ("prefill", 2, 5, 4, 2, 8, [0, 0], None, {}, False),
    ("prefill_padded", 3, 6, 4, 1, 16, [0, 0, 0], None, {}, False),
    ("decode", 3, 1, 6, 2, 8, [4, 7, 2], None, {}, False),
    ("decode_shared", 2, 1, 4, 4, 8, [3, 9], 16, {}, False),
    ("chunk_shared", 1, 4, 4, 2, 8, [5], 12, {}, False),
    ("packed", 2, 1, 4, 2, 8, [3, 6], None, {}, True),
    ("rotary", 2, 1, 4, 2, 16, [3, 5], 10, {"do_rotary": 1}, False),
    ("rotary_il", 2, 4, 4, 2, 16, [0, 0], None, {"do_rotary": 1, "rotary_interleaved": 1}, True),
    ("window", 2, 6, 4, 2, 8, [0, 0], None, {"local_window_size": 3}, False),
    ("window_decode", 2, 1, 4, 2, 8, [6, 9], 12, {"local_window_size": 4}, False),
    ("softcap_scale", 2, 3, 4, 2, 8, [0, 0], None, {"softcap": 2.0, "scale": 0.3}, False),
    ("smooth", 2, 1, 4, 2, 8, [4, 2], None, {"smooth_softmax": 1}, False),
]


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("case", GQA_CASES, ids=[c[0] for c in GQA_CASES])
def test_group_query_attention(case, seed):
    name, b, s, nh, nkv, hd, past_lens, cap, attrs, packed = case
    rng = np.random.default_rng(seed)
    first_prompt = all(p == 0 for p in past_lens)
    if first_prompt:
        # right-padded prompt: entry 0 full, the others shorter
        valid = [s] + [int(rng.integers(1, s + 1)) for _ in range(b - 1)]
        tot = np.array(valid, dtype=np.int32)
    else:
        valid = [s] * b
        tot = np.array([p + s for p in past_lens], dtype=np.int32)
    total_len = int(tot.max())
    feeds = {}
    if packed:
        feeds["query"] = rng.standard_normal((b, s, (nh + 2 * nkv) * hd)).astype(np.float32)
        names = ["query", "", ""]
    else:
        feeds["query"] = rng.standard_normal((b, s, nh * hd)).astype(np.float32)
        feeds["key"] = rng.standard_normal((b, s, nkv * hd)).astype(np.float32)
        feeds["value"] = rng.standard_normal((b, s, nkv * hd)).astype(np.float32)
        names = ["query", "key", "value"]
    past_len = 0 if first_prompt else (cap or max(past_lens))
    if cap is not None:
        past_len = cap
    feeds["past_key"] = rng.standard_normal((b, nkv, past_len, hd)).astype(np.float32)
    feeds["past_value"] = rng.standard_normal((b, nkv, past_len, hd)).astype(np.float32)
    feeds["seqlens_k"] = (tot - 1).astype(np.int32)
    feeds["total_sequence_length"] = np.array(total_len, dtype=np.int32)
    names += ["past_key", "past_value", "seqlens_k", "total_sequence_length"]
    if attrs.get("do_rotary"):
        cos, sin = _rope_cache(rng, 32, hd)
        feeds["cos_cache"], feeds["sin_cache"] = cos, sin
        names += ["cos_cache", "sin_cache"]
    model = _model(
        "GroupQueryAttention",
        names,
        ["output", "present_key", "present_value"],
        {"num_heads": nh, "kv_num_heads": nkv, **attrs},
        feeds,
    )
    got, ref = _run_both(model, feeds)
    for bi in range(b):
        q = valid[bi]
        _close(got[0][bi, :q], ref[0][bi, :q], what=f"{name} output[{bi}]")
        t = int(tot[bi])
        for o in (1, 2):
            assert got[o].shape == ref[o].shape
            _close(got[o][bi, :, :t], ref[o][bi, :, :t], what=f"{name} present{o}[{bi}]")


# ----------------------------------------------------------------------------- RotaryEmbedding

ROPE_CASES = [
    # name, rank, b, s, nh, hd, rot_dim(attr, 0 = full), interleaved, pos kind, packed batching
    ("3d_2dpos", 3, 2, 5, 3, 16, 0, 0, "2d", 0),
    ("3d_1dpos", 3, 2, 4, 2, 8, 0, 1, "1d", 0),
    ("4d_2dpos", 4, 2, 3, 4, 8, 0, 0, "2d", 0),
    ("4d_il", 4, 1, 6, 2, 16, 0, 1, "2d", 0),
    ("3d_partial", 3, 2, 5, 2, 16, 8, 0, "2d", 0),
    ("3d_partial_il", 3, 2, 5, 2, 16, 8, 1, "1d", 0),
    ("4d_partial", 4, 2, 5, 2, 16, 8, 0, "2d", 0),
    ("packed_batching", 3, 2, 5, 2, 8, 0, 0, "2d", 1),
]


def _rope_feeds(rng, rank, b, s, nh, hd, rot, pos_kind, max_len=24):
    shape = (b, s, nh * hd) if rank == 3 else (b, nh, s, hd)
    x = rng.standard_normal(shape).astype(np.float32)
    cos, sin = _rope_cache(rng, max_len, rot or hd)
    if pos_kind == "1d":
        pos = np.array([int(rng.integers(0, max_len - s))], dtype=np.int64)
    else:
        pos = rng.integers(0, max_len, size=(b, s)).astype(np.int64)
    return {"input": x, "position_ids": pos, "cos_cache": cos, "sin_cache": sin}


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("case", ROPE_CASES, ids=[c[0] for c in ROPE_CASES])
def test_rotary_embedding(case, seed):
    name, rank, b, s, nh, hd, rot, il, pos_kind, packed = case
    rng = np.random.default_rng(seed)
    feeds = _rope_feeds(rng, rank, b, s, nh, hd, rot, pos_kind)
    attrs = {"interleaved": il, "is_packed_batching": packed, "scale": 0.5 if seed else 1.0}
    if rot:
        attrs.update(rotary_embedding_dim=rot, num_heads=nh)
    elif rank == 3 and seed == 1:
        attrs["num_heads"] = nh
    names = ["input", "position_ids", "cos_cache", "sin_cache"]
    model = _model("RotaryEmbedding", names, ["output"], attrs, feeds)
    got, ref = _run_both(model, feeds)
    _close(got[0], ref[0], atol=1e-5, what=name)


MROPE_CASES = [
    # name, rank, b, s, nh, hd, rot, interleaved, section, layout
    ("sectioned", 3, 2, 5, 2, 16, 0, 0, [2, 3, 3], 0),
    ("interleaved_layout", 3, 2, 5, 2, 24, 0, 0, [4, 4, 4], 1),
    ("qwen35_like", 4, 1, 6, 2, 32, 16, 0, [3, 3, 2], 1),
    ("scaled", 3, 2, 3, 2, 16, 0, 0, [4, 2, 2], 1),
    ("il_pairs", 3, 2, 4, 3, 16, 0, 1, [4, 2, 2], 0),
]


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("case", MROPE_CASES, ids=[c[0] for c in MROPE_CASES])
def test_mrotary_embedding(case, seed):
    name, rank, b, s, nh, hd, rot, il, section, layout = case
    rng = np.random.default_rng(seed)
    feeds = _rope_feeds(rng, rank, b, s, nh, hd, rot, "2d")
    feeds["position_ids"] = rng.integers(0, 24, size=(3, b, s)).astype(np.int64)
    attrs = {"interleaved": il, "mrope_section": section, "mrope_layout": layout, "num_heads": nh}
    if rot:
        attrs["rotary_embedding_dim"] = rot
    if name == "scaled":
        attrs["scale"] = 0.7
    names = ["input", "position_ids", "cos_cache", "sin_cache"]
    model = _model("MRotaryEmbedding", names, ["output"], attrs, feeds)
    got, ref = _run_both(model, feeds)
    _close(got[0], ref[0], atol=1e-5, what=name)
    if name == "scaled":
        return  # RotaryEmbedding ignores scale, as in onnxruntime
    # The same math through RotaryEmbedding, which onnxruntime rejects for 3-D ids.
    model2 = _model("RotaryEmbedding", names, ["output"], attrs, feeds)
    got2 = onnxep.InferenceSession(model2, providers=["cpu"]).run(None, feeds)
    _close(got2[0], ref[0], atol=1e-5, what=name + " via RotaryEmbedding")


@pytest.mark.parametrize("layout", [0, 1])
@pytest.mark.parametrize("rank", [3, 4])
def test_rotary_mrope_identical_streams_match_2d(rank, layout):
    rng = np.random.default_rng(7)
    b, s, nh, hd = 2, 5, 2, 16
    feeds = _rope_feeds(rng, rank, b, s, nh, hd, 0, "2d")
    names = ["input", "position_ids", "cos_cache", "sin_cache"]
    attrs = {"mrope_section": [3, 3, 2], "mrope_layout": layout}
    plain = _model("RotaryEmbedding", names, ["output"], {}, feeds)
    want = ort.InferenceSession(plain.SerializeToString(), providers=["CPUExecutionProvider"]).run(
        None, feeds
    )[0]
    feeds3 = dict(feeds, position_ids=np.stack([feeds["position_ids"]] * 3))
    m3 = _model("RotaryEmbedding", names, ["output"], attrs, feeds3)
    got = onnxep.InferenceSession(m3, providers=["cpu"]).run(None, feeds3)[0]
    _close(got, want, atol=1e-6, rtol=1e-5, what="3-D identical streams")


# ----------------------------------------------------------------------------- MultiHeadAttention


def _mask(rng, kind, b, s, total):
    if kind is None:
        return None
    if kind == "1d":
        return rng.integers(1, total + 1, size=(b,)).astype(np.int32)
    if kind == "2d":
        m = (rng.random((b, total)) > 0.3).astype(np.int32)
        m[:, 0] = 1
        return m
    if kind == "3d":
        m = (rng.random((b, s, total)) > 0.3).astype(np.int32)
        m[:, :, 0] = 1
        return m
    raise ValueError(kind)


MHA_CASES = [
    # name, b, s, l, nh, hd, vd, bias, mask kind, attention_bias, past_len, kv form, attrs
    ("self", 2, 4, 4, 2, 8, 8, False, None, False, 0, "3d", {}),
    ("cross_bias", 2, 3, 5, 3, 8, 8, True, None, False, 0, "3d", {}),
    ("diff_v", 2, 3, 5, 2, 8, 4, True, None, False, 0, "3d", {}),
    ("kpm_2d", 2, 4, 4, 2, 8, 8, True, "2d", False, 0, "3d", {}),
    ("kpm_1d", 3, 4, 6, 2, 8, 8, False, "1d", False, 0, "3d", {}),
    ("kpm_3d", 2, 4, 6, 2, 8, 8, False, "3d", False, 0, "3d", {}),
    ("attn_bias", 2, 4, 5, 2, 8, 8, True, None, True, 0, "3d", {"scale": 0.2}),
    ("past", 2, 1, 1, 2, 8, 8, True, None, False, 5, "3d", {}),
    ("past_causal", 2, 3, 3, 2, 8, 8, True, "2d", True, 4, "3d", {"unidirectional": 1}),
    ("causal", 2, 5, 5, 4, 4, 4, False, None, False, 0, "3d", {"unidirectional": 1}),
    ("packed_kv", 2, 3, 4, 2, 8, 8, False, None, False, 0, "kv", {}),
    ("packed_qkv", 2, 4, 4, 2, 8, 8, False, "2d", False, 0, "qkv", {}),
    ("bnsh_kv", 2, 3, 6, 2, 8, 8, True, None, False, 0, "bnsh", {}),
    ("mask_filter", 2, 4, 4, 2, 8, 8, False, "2d", False, 0, "3d", {"mask_filter_value": -50.0}),
]


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("case", MHA_CASES, ids=[c[0] for c in MHA_CASES])
def test_multi_head_attention(case, seed):
    name, b, s, l, nh, hd, vd, use_bias, mkind, use_ab, past, form, attrs = case
    rng = np.random.default_rng(seed)
    f = {}
    r = rng.standard_normal
    if form == "qkv":
        f["query"] = r((b, s, nh, 3, hd)).astype(np.float32)
    else:
        f["query"] = r((b, s, nh * hd)).astype(np.float32)
    if form == "3d":
        f["key"] = r((b, l, nh * hd)).astype(np.float32)
        f["value"] = r((b, l, nh * vd)).astype(np.float32)
    elif form == "kv":
        f["key"] = r((b, l, nh, 2, hd)).astype(np.float32)
    elif form == "bnsh":
        f["key"] = r((b, nh, l, hd)).astype(np.float32)
        f["value"] = r((b, nh, l, vd)).astype(np.float32)
    total = past + l
    if use_bias:
        f["bias"] = r((2 * nh * hd + nh * vd,)).astype(np.float32)
    m = _mask(rng, mkind, b, s, total)
    if m is not None:
        f["key_padding_mask"] = m
    if use_ab:
        f["attention_bias"] = r((1, nh, s, total)).astype(np.float32)
    outs = ["output"]
    if past:
        f["past_key"] = r((b, nh, past, hd)).astype(np.float32)
        f["past_value"] = r((b, nh, past, vd)).astype(np.float32)
        outs += ["present_key", "present_value"]
    order = [
        "query",
        "key",
        "value",
        "bias",
        "key_padding_mask",
        "attention_bias",
        "past_key",
        "past_value",
    ]
    names = [n if n in f else "" for n in order]
    while names and not names[-1]:
        names.pop()
    model = _model("MultiHeadAttention", names, outs, {"num_heads": nh, **attrs}, f)
    if form in ("kv", "qkv"):
        # onnxruntime's CPU provider has no packed layouts: compare against the unpacked call
        got = onnxep.InferenceSession(model, providers=["cpu"]).run(None, f)
        u = dict(f)
        if form == "qkv":
            qkv = f["query"]
            u["query"] = qkv[:, :, :, 0].reshape(b, s, -1)
            u["key"] = qkv[:, :, :, 1].reshape(b, s, -1)
            u["value"] = qkv[:, :, :, 2].reshape(b, s, -1)
        else:
            u["key"] = f["key"][:, :, :, 0].reshape(b, l, -1)
            u["value"] = f["key"][:, :, :, 1].reshape(b, l, -1)
        un = ["query", "key", "value"] + names[3:]
        _, ref = _run_both(_model("MultiHeadAttention", un, outs, {"num_heads": nh, **attrs}, u), u)
    else:
        got, ref = _run_both(model, f)
    for g, w, o in zip(got, ref, outs, strict=True):
        _close(g, w, what=f"{name} {o}")


# ----------------------------------------------------------------------------- Attention (contrib)

ATT_CASES = [
    # name, b, s, din, nh, hd, sizes, mask kind, past_len, attention_bias, attrs
    ("plain", 2, 4, 16, 2, 8, None, None, 0, False, {}),
    ("mask_1d", 3, 5, 12, 3, 4, None, "1d", 0, False, {}),
    ("mask_2d", 2, 5, 12, 2, 8, None, "2d", 0, False, {}),
    ("mask_3d", 2, 4, 12, 2, 8, None, "3d", 0, False, {}),
    ("mask_2b", 2, 6, 8, 2, 4, None, "2b", 0, False, {}),
    ("causal", 2, 5, 16, 4, 4, None, None, 0, False, {"unidirectional": 1}),
    ("past_causal", 2, 3, 16, 2, 8, None, "2d", 4, False, {"unidirectional": 1}),
    ("past_decode", 3, 1, 16, 2, 8, None, "1d", 6, False, {"unidirectional": 1}),
    ("qkv_sizes", 2, 4, 16, 2, 8, [16, 16, 8], None, 0, False, {}),
    (
        "scale_bias",
        2,
        4,
        16,
        2,
        8,
        None,
        "2d",
        0,
        True,
        {"scale": 0.1, "mask_filter_value": -1000.0},
    ),
]


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("case", ATT_CASES, ids=[c[0] for c in ATT_CASES])
def test_attention_contrib(case, seed):
    name, b, s, din, nh, hd, sizes, mkind, past, use_ab, attrs = case
    rng = np.random.default_rng(seed)
    r = rng.standard_normal
    dq, dk, dv = sizes or [nh * hd] * 3
    f = {
        "input": r((b, s, din)).astype(np.float32),
        "weights": (r((din, dq + dk + dv)) * 0.3).astype(np.float32),
        "bias": r((dq + dk + dv,)).astype(np.float32),
    }
    total = past + s
    if mkind == "2b":
        end = rng.integers(total // 2 + 1, total + 1, size=b)
        start = rng.integers(0, total // 2, size=b)
        f["mask_index"] = np.concatenate([end, start]).astype(np.int32)
    else:
        m = _mask(rng, mkind, b, s, total)
        if m is not None:
            f["mask_index"] = m
    outs = ["output"]
    if past:
        f["past"] = r((2, b, nh, past, hd)).astype(np.float32)
        outs.append("present")
    if use_ab:
        f["attention_bias"] = r((b, nh, s, total)).astype(np.float32)
    a = {"num_heads": nh, **attrs}
    if sizes:
        a["qkv_hidden_sizes"] = sizes
    order = ["input", "weights", "bias", "mask_index", "past", "attention_bias"]
    names = [n if n in f else "" for n in order]
    while names and not names[-1]:
        names.pop()
    model = _model("Attention", names, outs, a, f)
    got, ref = _run_both(model, f)
    for g, w, o in zip(got, ref, outs, strict=True):
        _close(g, w, what=f"{name} {o}")


GQA_EXTRA = [
    # name, b, s, nh, nkv, hd, past_lens, cap, attrs, extras
    ("attn_bias_prefill", 2, 4, 4, 2, 8, [0, 0], None, {}, ("attention_bias",)),
    ("attn_bias_decode", 2, 1, 4, 2, 8, [3, 6], 10, {}, ("attention_bias",)),
    ("head_sink", 2, 3, 4, 2, 8, [0, 0], None, {}, ("head_sink",)),
    ("head_sink_decode", 2, 1, 4, 1, 8, [5, 2], None, {"local_window_size": 3}, ("head_sink",)),
    ("pos_ids_decode", 2, 1, 4, 2, 16, [4, 6], 12, {"do_rotary": 1}, ("position_ids",)),
    ("bidirectional", 2, 4, 4, 2, 8, [0, 0], None, {"causal": 0}, ()),
    ("query_seqlens", 2, 4, 4, 2, 8, [3, 5], 12, {}, ("query_seqlens",)),
    ("pos_ids_prompt", 2, 4, 4, 2, 16, [0, 0], None, {"do_rotary": 1}, ("position_ids",)),
    ("qk_raw", 2, 4, 4, 2, 8, [0, 0], None, {"qk_output": 1, "softcap": 1.5}, ("qk",)),
    ("qk_raw_bias", 2, 1, 4, 2, 8, [3, 5], 8, {"qk_output": 1}, ("qk", "attention_bias")),
    ("qk_probs", 2, 1, 4, 2, 8, [3, 5], None, {"qk_output": 2}, ("qk",)),
    ("fp16", 2, 3, 4, 2, 16, [0, 0], None, {"do_rotary": 1}, ("fp16",)),
    ("fp16_decode", 2, 1, 4, 2, 8, [3, 6], 10, {"softcap": 3.0}, ("fp16",)),
]


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("case", GQA_EXTRA, ids=[c[0] for c in GQA_EXTRA])
def test_group_query_attention_extra(case, seed):
    name, b, s, nh, nkv, hd, past_lens, cap, attrs, extras = case
    rng = np.random.default_rng(seed + 10)
    dt = np.float16 if "fp16" in extras else np.float32
    r = rng.standard_normal
    first = all(p == 0 for p in past_lens)
    if "query_seqlens" in extras:
        qlens = np.array([int(rng.integers(1, s + 1)) for _ in range(b)], dtype=np.int32)
        tot = np.array([p + q for p, q in zip(past_lens, qlens, strict=True)], dtype=np.int32)
    elif first:
        qlens = np.array([s] + [int(rng.integers(1, s + 1)) for _ in range(b - 1)], dtype=np.int32)
        tot = qlens.copy()
    else:
        qlens = np.full(b, s, dtype=np.int32)
        tot = np.array([p + s for p in past_lens], dtype=np.int32)
    total_len = int(tot.max()) if "query_seqlens" not in extras else cap
    past_len = cap if cap is not None else (0 if first else max(past_lens))
    f = {
        "query": r((b, s, nh * hd)).astype(dt),
        "key": r((b, s, nkv * hd)).astype(dt),
        "value": r((b, s, nkv * hd)).astype(dt),
        "past_key": r((b, nkv, past_len, hd)).astype(dt),
        "past_value": r((b, nkv, past_len, hd)).astype(dt),
        "seqlens_k": (tot - 1).astype(np.int32),
        "total_sequence_length": np.array(total_len, dtype=np.int32),
    }
    if attrs.get("do_rotary"):
        cos, sin = _rope_cache(rng, 32, hd)
        f["cos_cache"], f["sin_cache"] = cos.astype(dt), sin.astype(dt)
    if "position_ids" in extras:
        f["position_ids"] = (tot[:, None] - s + np.arange(s)[None, :] + 2).astype(np.int64)
    if "attention_bias" in extras:
        f["attention_bias"] = r((b, 1, s, total_len)).astype(dt)
    if "head_sink" in extras:
        f["head_sink"] = r((nh,)).astype(dt)
    if "query_seqlens" in extras:
        f["query_seqlens"] = qlens
    order = [
        "query", "key", "value", "past_key", "past_value", "seqlens_k", "total_sequence_length",
        "cos_cache", "sin_cache", "position_ids", "attention_bias", "head_sink",
        "k_scale", "v_scale", "q_norm_weight", "k_norm_weight", "query_seqlens",
    ]  # fmt: skip
    names = [n if n in f else "" for n in order]
    while names and not names[-1]:
        names.pop()
    ot = TensorProto.FLOAT16 if dt == np.float16 else F
    outs = ["output", "present_key", "present_value"] + (["output_qk"] if "qk" in extras else [])
    model = _model(
        "GroupQueryAttention", names, outs, {"num_heads": nh, "kv_num_heads": nkv, **attrs}, f,
        out_types=dict.fromkeys(outs, ot),
    )  # fmt: skip
    got, ref = _run_both(model, f)
    atol, rtol = (2e-3, 5e-3) if dt == np.float16 else (1e-4, 1e-3)
    for bi in range(b):
        q = int(qlens[bi])
        _close(got[0][bi, :q], ref[0][bi, :q], atol, rtol, what=f"{name} output[{bi}]")
        t = int(tot[bi])
        for o in (1, 2):
            _close(
                got[o][bi, :, :t], ref[o][bi, :, :t], atol, rtol, what=f"{name} present{o}[{bi}]"
            )
        if "qk" in extras:
            _close(got[3][bi, :, :q], ref[3][bi, :, :q], atol, rtol, what=f"{name} output_qk[{bi}]")


def _as_fp16(model, feeds):
    """The same model with every float tensor (inputs and outputs) in float16."""
    m = onnx.ModelProto()
    m.CopyFrom(model)
    for vi in list(m.graph.input) + list(m.graph.output):
        if vi.type.tensor_type.elem_type == F:
            vi.type.tensor_type.elem_type = TensorProto.FLOAT16
    f = {k: v.astype(np.float16) if v.dtype == np.float32 else v for k, v in feeds.items()}
    return m, f


@pytest.mark.parametrize("op", ["RotaryEmbedding", "MultiHeadAttention"])
def test_float16(op):
    rng = np.random.default_rng(3)
    b, s, nh, hd = 2, 4, 2, 16
    if op == "RotaryEmbedding":
        f = _rope_feeds(rng, 3, b, s, nh, hd, 0, "2d")
        names = ["input", "position_ids", "cos_cache", "sin_cache"]
        model = _model(op, names, ["output"], {"interleaved": 1, "num_heads": nh}, f)
    else:
        f = {
            "query": rng.standard_normal((b, s, nh * hd)).astype(np.float32),
            "key": rng.standard_normal((b, s + 1, nh * hd)).astype(np.float32),
            "value": rng.standard_normal((b, s + 1, nh * hd)).astype(np.float32),
            "bias": rng.standard_normal((3 * nh * hd,)).astype(np.float32),
        }
        model = _model(op, list(f), ["output"], {"num_heads": nh}, f)
    m16, f16 = _as_fp16(model, f)
    got, ref = _run_both(m16, f16)
    assert got[0].dtype == np.float16
    _close(got[0], ref[0], atol=2e-3, rtol=5e-3, what=f"{op} fp16")


def test_attention_contrib_megatron_mask_matches_3d():
    # onnxruntime's CPU provider rejects the (B, 1, M, M) form; it reads rows [past, past + S)
    rng = np.random.default_rng(5)
    b, s, nh, hd, past, big = 2, 3, 2, 8, 4, 9
    r = rng.standard_normal
    f = {
        "input": r((b, s, 16)).astype(np.float32),
        "weights": (r((16, 3 * nh * hd)) * 0.3).astype(np.float32),
        "bias": r((3 * nh * hd,)).astype(np.float32),
        "mask_index": (rng.random((b, 1, big, big)) > 0.3).astype(np.int32),
        "past": r((2, b, nh, past, hd)).astype(np.float32),
    }
    f["mask_index"][..., 0] = 1
    names = ["input", "weights", "bias", "mask_index", "past"]
    m4 = _model("Attention", names, ["output", "present"], {"num_heads": nh}, f)
    got = onnxep.InferenceSession(m4, providers=["cpu"]).run(None, f)
    f3 = dict(
        f, mask_index=np.ascontiguousarray(f["mask_index"][:, 0, past : past + s, : past + s])
    )
    m3 = _model("Attention", names, ["output", "present"], {"num_heads": nh}, f3)
    _, ref = _run_both(m3, f3)
    _close(got[0], ref[0], what="megatron mask")
    _close(got[1], ref[1], what="megatron present")


@pytest.mark.parametrize("rotary", [0, 1])
def test_group_query_attention_fixed_capacity_loop(rotary):
    """Prefill then decode steps, each feeding its present cache back as the next past.

    The cache keeps a fixed capacity (the shared-buffer layout), the batch
    entries have different lengths, and both runtimes carry their own cache.
    """
    rng = np.random.default_rng(11)
    b, nh, nkv, hd, cap, prompt = 2, 4, 2, 16, 12, 5
    lens = np.array([prompt, 3], dtype=np.int32)
    attrs = {"num_heads": nh, "kv_num_heads": nkv, "do_rotary": rotary, "local_window_size": 6}
    cos, sin = _rope_cache(rng, 32, hd)
    names = [
        "query", "key", "value", "past_key", "past_value", "seqlens_k", "total_sequence_length",
    ] + (["cos_cache", "sin_cache"] if rotary else [])  # fmt: skip
    outs = ["output", "present_key", "present_value"]
    caches = {
        which: [np.zeros((b, nkv, cap, hd), np.float32) for _ in range(2)]
        for which in ("ep", "ort")
    }
    tot = lens.copy()
    for step in range(4):
        s = prompt if step == 0 else 1
        if step:
            tot = tot + 1
        f = {
            "query": rng.standard_normal((b, s, nh * hd)).astype(np.float32),
            "key": rng.standard_normal((b, s, nkv * hd)).astype(np.float32),
            "value": rng.standard_normal((b, s, nkv * hd)).astype(np.float32),
            "seqlens_k": (tot - 1).astype(np.int32),
            # a prompt passes its own length; decode passes the capacity bound
            "total_sequence_length": np.array(prompt if step == 0 else int(tot.max()), np.int32),
            "cos_cache": cos,
            "sin_cache": sin,
        }
        results = {}
        for which in ("ep", "ort"):
            ff = dict(f, past_key=caches[which][0], past_value=caches[which][1])
            model = _model("GroupQueryAttention", names, outs, attrs, ff)
            got, ref = _run_both(model, ff)
            results[which] = got if which == "ep" else ref
            caches[which] = list(results[which][1:])
        for bi in range(b):
            q = min(s, int(tot[bi]))
            _close(
                results["ep"][0][bi, :q], results["ort"][0][bi, :q], what=f"step {step} out[{bi}]"
            )
            for o in (1, 2):
                t = int(tot[bi])
                _close(
                    results["ep"][o][bi, :, :t],
                    results["ort"][o][bi, :, :t],
                    what=f"step {step} cache",
                )
