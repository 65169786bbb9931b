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
    outs = [helper.make_tensor_value_info(n, (out_types or {}).get(n, F), None) for n in outputs if n]
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
    ref = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"]).run(
        None, f
    )
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
