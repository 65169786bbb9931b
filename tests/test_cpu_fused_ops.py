"""The CPU provider's fused attention and normalisation kernels against onnxruntime.

A torch decoder exported by the dynamo exporter at opset 23 (``F.rms_norm`` and
``F.scaled_dot_product_attention`` become RMSNormalization and Attention, with a KV
cache and GQA), then single nodes built with onnx.helper after the spec for what no
exporter writes yet: opset-23 RotaryEmbedding, Attention with 3-D inputs, causal,
boolean and float masks, past keys, softcap, a row with no attendable key;
RMSNormalization over several axes; com.microsoft RotaryEmbedding,
SimplifiedLayerNormalization, SkipSimplifiedLayerNormalization and GroupQueryAttention.
Every output is compared within the parity kit's tolerances.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from conftest import EXPORTED_DIMS, exported_feeds
from onnx import TensorProto, helper

import onnxep
from onnxep.testing import compare_output

ort = pytest.importorskip("onnxruntime")

DATA = Path(__file__).resolve().parent / "data"
F32 = TensorProto.FLOAT


def _ort_run(model: onnx.ModelProto, feeds: dict) -> list:
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return sess.run(None, feeds)


def _assert_matches_onnxruntime(model: onnx.ModelProto, feeds: dict) -> None:
    got = onnxep.InferenceSession(model.SerializeToString(), providers=["cpu"]).run(None, feeds)
    want = _ort_run(model, feeds)
    bad = []
    for out, g, w in zip(model.graph.output, got, want):
        results = compare_output(out.name, g, w, "cpu", "onnxruntime")
        bad += [r.describe() for r in results if not r.ok]
    assert not bad, "\n".join(bad)


def _model(nodes, inputs, outputs, opset=23, ms=False):
    graph = helper.make_graph(nodes, "g", inputs, outputs)
    opsets = [helper.make_opsetid("", opset)]
    if ms:
        opsets.append(helper.make_opsetid("com.microsoft", 1))
    return helper.make_model(graph, opset_imports=opsets, ir_version=10)


def _vi(name, shape, elem=F32):
    return helper.make_tensor_value_info(name, elem, shape)


RNG = np.random.default_rng(0)


def _rand(*shape, scale=1.0):
    return (RNG.standard_normal(shape) * scale).astype(np.float32)


# -- the torch export ----------------------------------------------------------------


@pytest.mark.parametrize("dims", [EXPORTED_DIMS["llama_kv_opset23.onnx"], {"batch": 1, "seq": 9,
                                  "past": 0}])  # fmt: skip
def test_torch_opset23_decoder_matches_onnxruntime(dims):
    model = onnx.load(DATA / "llama_kv_opset23.onnx")
    ops = {n.op_type for n in model.graph.node}
    assert {"Attention", "RMSNormalization"} <= ops
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    _assert_matches_onnxruntime(model, exported_feeds(sess, dims, np.random.default_rng(3)))


# -- RMSNormalization ----------------------------------------------------------------


@pytest.mark.parametrize(("shape", "axis"), [((2, 5, 16), -1), ((2, 5, 16), 1), ((3, 8), 0)])
def test_rms_normalization(shape, axis):
    a = axis % len(shape)
    node = helper.make_node("RMSNormalization", ["x", "g"], ["y"], axis=axis, epsilon=1e-5)
    model = _model([node], [_vi("x", shape), _vi("g", shape[a:])], [_vi("y", shape)])
    _assert_matches_onnxruntime(model, {"x": _rand(*shape), "g": _rand(*shape[a:])})


# -- RotaryEmbedding (opset 23) -------------------------------------------------------


@pytest.mark.parametrize("interleaved", [0, 1])
@pytest.mark.parametrize("rank", [3, 4])
@pytest.mark.parametrize("rot", [0, 8])
@pytest.mark.parametrize("with_pos", [True, False])
def test_rotary_embedding(interleaved, rank, rot, with_pos):
    b, s, heads, d = 2, 5, 3, 16
    half = (rot or d) // 2
    shape = (b, s, heads * d) if rank == 3 else (b, heads, s, d)
    attrs = dict(interleaved=interleaved, rotary_embedding_dim=rot)
    if rank == 3:
        attrs["num_heads"] = heads
    ins = ["x", "cos", "sin"] + (["pos"] if with_pos else [])
    node = helper.make_node("RotaryEmbedding", ins, ["y"], **attrs)
    cache = (32, half) if with_pos else (b, s, half)
    inputs = [_vi("x", shape), _vi("cos", cache), _vi("sin", cache)]
    feeds = {"x": _rand(*shape), "cos": _rand(*cache), "sin": _rand(*cache)}
    if with_pos:
        inputs.append(_vi("pos", [b, s], TensorProto.INT64))
        feeds["pos"] = RNG.integers(0, 32, (b, s)).astype(np.int64)
    _assert_matches_onnxruntime(_model([node], inputs, [_vi("y", shape)]), feeds)


# -- Attention (opset 23) -------------------------------------------------------------


def _attention_case(rank3, q_heads, kv_heads, lq, lk, past, mask, **attrs):
    b, d = 2, 8
    inputs, feeds = [], {}

    def add(name, *shape, elem=F32, value=None):
        inputs.append(_vi(name, list(shape), elem))
        feeds[name] = _rand(*shape) if value is None else value

    if rank3:
        add("q", b, lq, q_heads * d)
        add("k", b, lk, kv_heads * d)
        add("v", b, lk, kv_heads * d)
        attrs.update(q_num_heads=q_heads, kv_num_heads=kv_heads)
    else:
        add("q", b, q_heads, lq, d)
        add("k", b, kv_heads, lk, d)
        add("v", b, kv_heads, lk, d)
    ins = ["q", "k", "v"]
    total = lk + past
    if mask == "bool":
        allowed = RNG.random((lq, total)) > 0.3
        allowed[:, 0] = True
        add("mask", lq, total, elem=TensorProto.BOOL, value=allowed)
    elif mask == "float":
        add("mask", b, 1, lq, total)
    elif mask == "dead":
        allowed = RNG.random((b, q_heads, lq, total)) > 0.3
        allowed[0, 0, 1] = False  # a query with no key to attend: zeros
        add("mask", b, q_heads, lq, total, elem=TensorProto.BOOL, value=allowed)
    ins.append("mask" if mask else "")
    outs = ["y"]
    if past:
        add("past_k", b, kv_heads, past, d)
        add("past_v", b, kv_heads, past, d)
        ins += ["past_k", "past_v"]
        outs += ["present_k", "present_v"]
    while ins[-1] == "":
        ins.pop()
    node = helper.make_node("Attention", ins, outs, **attrs)
    return _model([node], inputs, [_vi(o, None) for o in outs]), feeds


@pytest.mark.parametrize(
    ("rank3", "q_heads", "kv_heads", "lq", "lk", "past", "mask", "attrs"),
    [
        (False, 4, 2, 5, 5, 0, None, dict(is_causal=1)),
        (True, 4, 2, 5, 5, 0, None, dict(is_causal=1)),
        (True, 3, 3, 4, 6, 0, "bool", {}),
        (False, 4, 1, 3, 3, 4, "float", {}),
        (False, 4, 2, 3, 3, 5, None, dict(is_causal=1, scale=0.3)),
        (True, 4, 2, 1, 1, 6, "bool", {}),
        (False, 2, 2, 4, 4, 0, "dead", {}),
        (False, 4, 2, 4, 4, 0, None, dict(softcap=2.0, is_causal=1)),
        (True, 2, 1, 6, 6, 0, "float", dict(softcap=5.0)),
    ],
)
def test_attention(rank3, q_heads, kv_heads, lq, lk, past, mask, attrs):
    _assert_matches_onnxruntime(
        *_attention_case(rank3, q_heads, kv_heads, lq, lk, past, mask, **attrs)
    )


# -- com.microsoft --------------------------------------------------------------------


@pytest.mark.parametrize("interleaved", [0, 1])
@pytest.mark.parametrize(("rank", "pos_shape"), [(3, (2, 5)), (3, (1,)), (4, (2, 5))])
def test_contrib_rotary_embedding(interleaved, rank, pos_shape):
    b, s, heads, d = 2, 5, 2, 8
    shape = (b, s, heads * d) if rank == 3 else (b, heads, s, d)
    attrs = dict(interleaved=interleaved)
    if rank == 3:
        attrs["num_heads"] = heads
    node = helper.make_node(
        "RotaryEmbedding", ["x", "pos", "cos", "sin"], ["y"], domain="com.microsoft", **attrs
    )
    pos = (
        RNG.integers(0, 16, pos_shape).astype(np.int64)
        if len(pos_shape) == 2
        else np.array([3], np.int64)
    )
    inputs = [_vi("x", shape), _vi("pos", list(pos_shape), TensorProto.INT64)]
    inputs += [_vi("cos", [16, d // 2]), _vi("sin", [16, d // 2])]
    feeds = {"x": _rand(*shape), "pos": pos, "cos": _rand(16, d // 2), "sin": _rand(16, d // 2)}
    _assert_matches_onnxruntime(_model([node], inputs, [_vi("y", shape)], ms=True), feeds)


def test_contrib_simplified_layer_norms():
    nodes = [
        helper.make_node(
            "SimplifiedLayerNormalization", ["x", "g"], ["y"], axis=-1, epsilon=1e-6
        ),
        helper.make_node(
            "SkipSimplifiedLayerNormalization", ["x", "skip", "g"], ["z", "", "", "sum"],
            domain="com.microsoft", epsilon=1e-6,
        ),
    ]  # fmt: skip
    shape = [2, 3, 16]
    inputs = [_vi("x", shape), _vi("skip", shape), _vi("g", [16])]
    outs = [_vi("y", shape), _vi("z", shape), _vi("sum", shape)]
    feeds = {"x": _rand(*shape), "skip": _rand(*shape), "g": _rand(16)}
    _assert_matches_onnxruntime(_model(nodes, inputs, outs, opset=17, ms=True), feeds)


# onnxruntime: a head size that is a multiple of 16, batch 1 for several new tokens on a past
@pytest.mark.parametrize(("b", "seq", "past"), [(2, 5, 0), (2, 1, 6), (1, 3, 4)])
def test_contrib_group_query_attention(b, seq, past):
    nh, nkv, d = 4, 2, 16
    total = past + seq
    node = helper.make_node(
        "GroupQueryAttention",
        ["q", "k", "v", "past_k", "past_v", "seqlens_k", "total_len", "cos", "sin"],
        ["y", "present_k", "present_v"],
        domain="com.microsoft", num_heads=nh, kv_num_heads=nkv, do_rotary=1,
    )  # fmt: skip
    i32 = TensorProto.INT32
    inputs = [
        _vi("q", [b, seq, nh * d]), _vi("k", [b, seq, nkv * d]), _vi("v", [b, seq, nkv * d]),
        _vi("past_k", [b, nkv, past, d]), _vi("past_v", [b, nkv, past, d]),
        _vi("seqlens_k", [b], i32), _vi("total_len", [], i32),
        _vi("cos", [16, d // 2]), _vi("sin", [16, d // 2]),
    ]  # fmt: skip
    feeds = {
        "q": _rand(b, seq, nh * d), "k": _rand(b, seq, nkv * d), "v": _rand(b, seq, nkv * d),
        "past_k": _rand(b, nkv, past, d), "past_v": _rand(b, nkv, past, d),
        "seqlens_k": np.full(b, total - 1, np.int32), "total_len": np.array(total, np.int32),
        "cos": _rand(16, d // 2), "sin": _rand(16, d // 2),
    }  # fmt: skip
    outs = [_vi(o, None) for o in ["y", "present_k", "present_v"]]
    _assert_matches_onnxruntime(_model([node], inputs, outs, opset=17, ms=True), feeds)
