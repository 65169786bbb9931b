"""fuse_attention: attention written in standard ops -> onnxep::Attention.

On small hand-built graphs of each form torch exports (fp32 and fp16, with and without a
mask, GQA's repeated K/V heads), and on the torch-exported decoders in tests/data and the
factory's exports: it fires, the fused session gives the unfused one's outputs within the
dtype's tolerance (it is tolerance-level), escaping intermediates are refused with the
reason, and the switch turns it off. Runs on the ``fusions`` provider of
test_fusions_pattern.py (the CUDA provider's pass list over the generic kernels).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from attention_graphs import FORMS, GQA_FORMS, HQ, B, D, T, attention_model, feeds, node
from conftest import exported_feeds
from onnx import helper
from test_fusions_graphs import F16, F32, assert_like_unfused, tensor
from test_fusions_pattern import ALL, NAME, fusion, fusions_provider, ops, session

import onnxep
from onnxep.errors import RunError
from onnxep.providers.fusions.reporting import ANOTHER_CONSUMER, GRAPH_OUTPUT
from onnxep.testing import TOLERANCES

DATA = Path(__file__).parent / "data"
PASS = "fuse_attention"


@pytest.fixture(scope="module")
def make():
    with fusions_provider() as register:
        yield register()


def check(make, model, rule="attention"):
    """Fires once by ``rule``; the fused run gives the unfused run's outputs."""
    fused = session(model, make)
    rep = fusion(fused, PASS)
    assert (rep.fired, dict(rep.by_rule), rep.exact) == (1, {rule: 1}, False), rep.refused
    assert "Attention" in ops(fused) and "Softmax" not in ops(fused)
    plain = session(model, make, off=ALL)
    inputs = feeds(model)
    for got, want in zip(fused.run(None, inputs), plain.run(None, inputs)):
        assert_like_unfused(got, want, False)
    return fused


@pytest.mark.parametrize("dt", [F32, F16], ids=["f32", "f16"])
@pytest.mark.parametrize("kw", FORMS.values(), ids=FORMS.keys())
def test_fires_on_each_form(make, kw, dt):
    check(make, attention_model(dt, **kw))


def test_fires_on_fp16_with_a_float32_softmax(make):
    check(make, attention_model(F16, mask="add", softmax_cast=True))


@pytest.mark.parametrize("dt", [F32, F16], ids=["f32", "f16"])
@pytest.mark.parametrize("kw", GQA_FORMS.values(), ids=GQA_FORMS.keys())
def test_gqa_repeat_is_folded_into_the_kv_heads(make, kw, dt):
    fused = check(make, attention_model(dt, **kw), rule="attention_gqa")
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
    from onnxep.tools.cli import main

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
