"""fuse_attention: attention written in standard ops -> onnxep::Attention.

On small hand-built graphs of each form torch exports (fp32 and fp16, with and without a
mask, GQA's repeated K/V heads), and on the torch-exported decoders in tests/data and the
factory's exports: it fires, the fused session gives the unfused one's outputs within the
dtype's tolerance (it is tolerance-level), escaping intermediates are refused with the
reason, and the switch turns it off. Runs on the ``fusions`` provider of
test_fusions_pattern.py (the CUDA provider's pass list over the generic kernels).
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
from conftest import exported_feeds
from onnx import TensorProto, helper, numpy_helper
from test_fusions_graphs import ELEM, F16, F32, make_model, tensor
from test_fusions_pattern import ALL, NAME, fusion, fusions_provider, ops, session

import onnxep
from onnxep.errors import RunError
from onnxep.providers.fusions.reporting import ANOTHER_CONSUMER, GRAPH_OUTPUT
from onnxep.testing import TOLERANCES

DATA = Path(__file__).parent / "data"
PASS = "fuse_attention"
B, HQ, HKV, S, T, D = 2, 4, 2, 3, 5, 8
node = helper.make_node


@pytest.fixture(scope="module")
def make():
    with fusions_provider() as register:
        yield register()


def const(name, value, dtype=np.float32):
    return numpy_helper.from_array(np.asarray(value, dtype), name)


def attention_model(
    dt=F32,
    key="transpose",
    scale="div",
    mask=None,
    softmax_cast=False,
    nan_guard=False,
    gqa=False,
    escape=None,
    axis=-1,
    kv_heads=None,
):
    """``MatMul(Softmax(mask(scale(q @ kᵀ))), v)`` in one of the forms exporters write.

    key: ``transpose`` (Transpose of K [B,H,T,D]), ``bshd`` (K given as [B,T,H,D]),
    ``rank3`` (Reshape -> Transpose -> Reshape), ``pre`` (kᵀ given as [B,H,D,T]).
    scale: ``div`` / ``mul`` (on the scores), ``split`` (a square root on q and on kᵀ),
    ``none``, ``input`` (by a graph input: not a constant). mask: None, ``add`` (a float
    [B,1,S,T] mask added), ``where`` (Where(cond, -inf, scores)), ``where0`` (filled with 0).
    """
    e = ELEM[dt]
    hk = kv_heads or (HKV if gqa else HQ)
    nodes, inits = [], [const("c", math.sqrt(D), dt), const("r", D**-0.25, dt)]
    inputs = [tensor("q", [B, HQ, S, D], e)]
    kshape = {"bshd": [B, T, hk, D], "pre": [B, hk, D, T]}.get(key, [B, hk, T, D])
    if key == "mqa-broadcast":  # one K head broadcast by the MatMul, but V of every head
        key, kshape = "transpose", [B, 1, T, D]
    inputs += [tensor("k", kshape, e), tensor("v", [B, hk, T, D], e)]
    k, v = "k", "v"
    if gqa:  # repeat_interleave of the heads, as torch exports it
        inits += [
            const("ax2", [2], np.int64),
            const("rep", [1, 1, HQ // HKV, 1, 1], np.int64),
            const("hq_shape", [B, HQ, T, D], np.int64),
        ]
        for name in ("k", "v"):
            nodes += [
                node("Unsqueeze", [name, "ax2"], [f"{name}_u"]),
                node("Expand", [f"{name}_u", "rep"], [f"{name}_e"]),
                node("Reshape", [f"{name}_e", "hq_shape"], [f"{name}_rep"]),
            ]
        k, v = "k_rep", "v_rep"
    if key == "transpose":
        nodes.append(node("Transpose", [k], ["kt"], perm=[0, 1, 3, 2]))
    elif key == "bshd":
        nodes.append(node("Transpose", [k], ["kt"], perm=[0, 2, 3, 1]))
    elif key in ("rank3", "rank3-scrambled"):  # scrambled: a reshape that is no transpose
        flat = [-1, T, D] if key == "rank3" else [-1, D, T]
        inits += [const("flat", flat, np.int64), const("back", [B, HQ, D, T], np.int64)]
        nodes += [
            node("Reshape", [k, "flat"], ["k3"]),
            node("Transpose", ["k3"], ["k3t"], perm=[0, 2, 1]),
            node("Reshape", ["k3t", "back"], ["kt"]),
        ]
    else:
        nodes.append(node("Identity", [k], ["kt"]))
    q, kt = "q", "kt"
    if scale == "split":
        nodes += [node("Mul", ["q", "r"], ["qs"]), node("Mul", ["r", "kt"], ["kts"])]
        q, kt = "qs", "kts"
    nodes.append(node("MatMul", [q, kt], ["scores"], name="qk"))
    s = "scores"
    if scale in ("div", "mul", "input"):
        if scale == "mul":
            inits.append(const("inv", 1 / math.sqrt(D), dt))
            nodes.append(node("Mul", ["inv", s], ["scaled"]))
        elif scale == "div":
            nodes.append(node("Div", [s, "c"], ["scaled"]))
        else:
            inputs.append(tensor("sc", [], e))
            nodes.append(node("Mul", [s, "sc"], ["scaled"]))
        s = "scaled"
    if mask == "add":
        inputs.append(tensor("mask", [B, 1, S, T], e))
        nodes.append(node("Add", ["mask", s], ["masked"]))
        s = "masked"
    elif mask in ("where", "where0"):
        inputs.append(tensor("cond", [S, T], TensorProto.BOOL))
        inits.append(const("fill", -np.inf if mask == "where" else 0.0, dt))
        nodes.append(node("Where", ["cond", "fill", s], ["masked"]))
        s = "masked"
    if softmax_cast:
        nodes += [
            node("Cast", [s], ["wide"], to=TensorProto.FLOAT),
            node("Softmax", ["wide"], ["p32"], axis=axis),
            node("Cast", ["p32"], ["probs"], to=e),
        ]
    else:
        nodes.append(node("Softmax", [s], ["probs"], axis=axis))
    p = "probs"
    if nan_guard:
        inits.append(const("zero", 0.0, dt))
        nodes += [
            node("IsNaN", [p], ["nan"]),
            node("Where", ["nan", "zero", p], ["guarded"]),
        ]
        p = "guarded"
    nodes.append(node("MatMul", [p, v], ["y"], name="pv"))
    outputs = [tensor("y", [B, HQ, S, D], e)]
    if escape == "output":
        outputs.append(tensor("scores", [B, HQ, S, T], e))
    elif escape == "consumer":
        nodes.append(node("Neg", ["probs"], ["neg"]))
        outputs.append(tensor("neg", [B, HQ, S, T], e))
    return make_model(nodes, inputs, outputs, inits)


def feeds(model, seed=0):
    rng = np.random.default_rng(seed)
    out = {}
    for v in model.graph.input:
        t = v.type.tensor_type
        shape = [d.dim_value for d in t.shape.dim]
        if t.elem_type == TensorProto.BOOL:  # a causal pattern: no row entirely hidden
            out[v.name] = np.triu(np.ones(shape, bool), k=1 + shape[1] - shape[0])
            continue
        dt = F16 if t.elem_type == TensorProto.FLOAT16 else F32
        out[v.name] = rng.standard_normal(shape).astype(dt)
    return out


def check(make, model, rule="attention"):
    """Fires once by ``rule``; the fused run gives the unfused run's outputs."""
    fused = session(model, make)
    rep = fusion(fused, PASS)
    assert (rep.fired, dict(rep.by_rule), rep.exact) == (1, {rule: 1}, False), rep.refused
    assert "Attention" in ops(fused) and "Softmax" not in ops(fused)
    plain = session(model, make, off=ALL)
    inputs = feeds(model)
    for got, want in zip(fused.run(None, inputs), plain.run(None, inputs)):
        assert got.dtype == want.dtype and got.shape == want.shape
        atol, rtol = TOLERANCES[np.dtype(got.dtype)]
        np.testing.assert_allclose(got, want, rtol=rtol, atol=atol)
    return fused


FORMS = {
    "transpose-div": {},
    "bshd-mul": {"key": "bshd", "scale": "mul"},
    "rank3-split": {"key": "rank3", "scale": "split"},
    "pre-transposed-unscaled": {"key": "pre", "scale": "none"},
    "add-mask": {"mask": "add"},
    "where-mask-nan-guard": {"mask": "where", "nan_guard": True},
    "mqa-broadcast-by-matmul": {"kv_heads": 1},
    "split-add-mask-nan-guard": {
        "key": "rank3",
        "scale": "split",
        "mask": "add",
        "nan_guard": True,
    },
}


@pytest.mark.parametrize("dt", [F32, F16], ids=["f32", "f16"])
@pytest.mark.parametrize("kw", FORMS.values(), ids=FORMS.keys())
def test_fires_on_each_form(make, kw, dt):
    check(make, attention_model(dt, **kw))


def test_fires_on_fp16_with_a_float32_softmax(make):
    check(make, attention_model(F16, mask="add", softmax_cast=True))


@pytest.mark.parametrize("dt", [F32, F16], ids=["f32", "f16"])
@pytest.mark.parametrize(
    "kw", [{}, {"mask": "where"}, {"key": "rank3", "scale": "split", "mask": "add"}]
)
def test_gqa_repeat_is_folded_into_the_kv_heads(make, kw, dt):
    fused = check(make, attention_model(dt, gqa=True, **kw), rule="attention_gqa")
    placed = ops(fused)
    # the repeat and the glue around the scores are gone: the op reads K and V as given
    for gone in ("Expand", "Unsqueeze", "Reshape", "Transpose", "Div", "Mul", "Where"):
        assert gone not in placed, placed


def test_glue_it_cannot_prove_stays_and_the_op_reads_after_it(make):
    # Reshape -> Transpose -> Reshape that is not K's transpose: the op reads its result
    # (transposed back), so the graph's own arithmetic is kept
    fused = check(make, attention_model(key="rank3-scrambled"))
    assert ops(fused).count("Transpose") == 2 and ops(fused).count("Reshape") == 2


def test_a_repeat_read_elsewhere_stays_for_that_reader(make):
    model = attention_model(gqa=True)
    model.graph.output.append(tensor("k_rep", [B, HQ, T, D]))
    fused = check(make, model, rule="attention_gqa")
    assert ops(fused).count("Expand") == 1  # K's repeat, for the graph output; V's is gone


@pytest.mark.parametrize(
    ("escape", "reason"), [("output", GRAPH_OUTPUT), ("consumer", ANOTHER_CONSUMER)]
)
def test_refuses_escaping_scores_or_probabilities(make, escape, reason):
    model = attention_model(escape=escape)
    sess = session(model, make)
    rep = fusion(sess, PASS)
    assert rep.fired == 0 and rep.refused == {reason: ("pv",)}
    assert "Attention" not in ops(sess)


@pytest.mark.parametrize(
    ("kw", "reason"),
    [
        ({"scale": "input"}, "the scores are scaled by something other than a constant scalar"),
        ({"mask": "where0"}, "the Where fills something other than a constant -inf"),
        ({"axis": 2}, "the Softmax is not over the last axis"),
        ({"key": "mqa-broadcast"}, "K and V have different numbers of heads"),
    ],
    ids=["scale-not-constant", "fill-not-minus-inf", "softmax-axis", "k-v-heads-differ"],
)
def test_refuses_what_it_cannot_prove(make, kw, reason):
    sess = session(attention_model(**kw), make)
    rep = fusion(sess, PASS)
    assert rep.fired == 0 and reason in rep.refused, rep.refused


def test_switched_off_stays_off(make):
    sess = session(attention_model(mask="add"), make, off=[PASS])
    assert fusion(sess, PASS).state == "off"
    assert "Attention" not in ops(sess) and "Softmax" in ops(sess)


def test_the_kernel_refuses_heads_that_do_not_group(make):
    # onnxep::Attention written directly: 3 query heads cannot share 2 K/V heads
    model = helper.make_model(
        helper.make_graph(
            [node("Attention", ["q", "k", "v"], ["y"], domain="onnxep", name="att")],
            "g",
            [tensor(n, [1, f"h{n}", 2, D]) for n in "qkv"],
            [tensor("y", [1, "hq", 2, D])],
        ),
        opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("onnxep", 1)],
    )
    sess = onnxep.InferenceSession(model, providers=[make])
    good = {n: np.ones(s, np.float32) for n, s in [("q", (1, 4, 2, D)), ("k", (1, 2, 2, D))]}
    good["v"] = good["k"]
    bad = dict(good, q=np.ones((1, 3, 2, D), np.float32))
    with pytest.raises(RunError, match="InvalidArgument: .* 3 heads are not a multiple"):
        sess.run(None, bad)
    assert sess.run(None, good)[0].shape == (1, 4, 2, D)  # the session is still usable


# -- the torch-exported decoders -----------------------------------------------------------

DIMS = {"batch": 2, "seq": 3, "past": 4, "total": 7, "sequence": 5}
#: One attention per layer (2 layers), its K/V heads repeated 4 <- 2 and folded.
DECODERS = ["hf_llama.onnx", "hf_llama_kv.onnx", "llama_kv.onnx"]


def fused_matches_unfused(path, make, fired, rule):
    fused = session(str(path), make)
    rep = fusion(fused, PASS)
    assert (rep.fired, dict(rep.by_rule)) == (fired, {rule: fired}), rep.refused
    assert "Softmax" not in ops(fused)
    plain = session(str(path), make, off=ALL)
    feeds = exported_feeds(fused, DIMS, np.random.default_rng(0), vocab=100)
    atol, rtol = TOLERANCES[np.dtype(np.float32)]
    for arg, a, b in zip(fused.get_outputs(), fused.run(None, feeds), plain.run(None, feeds)):
        np.testing.assert_allclose(a, b, rtol=rtol, atol=atol, err_msg=arg.name)
        if arg.name == "logits":
            np.testing.assert_array_equal(a.argmax(-1), b.argmax(-1))
    return fused, plain


@pytest.mark.parametrize("name", DECODERS)
def test_fires_on_every_layer_of_the_exported_decoders(make, name):
    fused_matches_unfused(DATA / name, make, 2, "attention_gqa")


@pytest.mark.parametrize("name", ["hf_llama_kv.onnx", "llama_kv.onnx"])
def test_greedy_tokens_match_the_unfused_decode(make, name):
    fused = session(str(DATA / name), make)
    plain = session(str(DATA / name), make, off=ALL)
    prompt = np.array([[5, 17, 42, 7]], np.int64)
    got = onnxep.generate(fused, prompt, 6, progress=False).token_ids
    want = onnxep.generate(plain, prompt, 6, progress=False).token_ids
    np.testing.assert_array_equal(got, want)


def test_explain_shows_it_firing(make, capsys):
    from onnxep.cli import main

    assert main(["explain", str(DATA / "llama_kv.onnx"), "--providers", NAME]) == 0
    assert f"{NAME}/{PASS}: fired 2" in capsys.readouterr().out


@pytest.mark.slow
def test_fires_on_the_factory_torch_exports(make, tmp_path):
    pytest.importorskip("torch")
    from bench.factory.torch_models import export_bert, export_llama

    llama = tmp_path / "llama.onnx"
    export_llama(llama, vocab=128, hidden=64, layers=2, heads=4, kv_heads=2, inter=128)
    fused_matches_unfused(llama, make, 2, "attention_gqa")
    bert = tmp_path / "bert.onnx"  # a float padding bias added to the scores, no GQA
    export_bert(bert, vocab=256, hidden=64, layers=2, heads=2, inter=128, max_positions=64)
    fused_matches_unfused(bert, make, 2, "attention")
