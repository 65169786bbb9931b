"""LinearAttention's gates and q/k L2 norms folded into onnxep::GatedLinearAttention, on the CPU.

Runs on the ``fusions`` provider of test_fusions_pattern.py (the generic
kernels) with the two passes: they fire on small hand-built graphs and on the
factory's tiny hybrid decoder, refuse escaping intermediates with the reason,
stay off when switched off, and the fused session gives the unfused one's
outputs (byte for byte for the gate node and LpNormalization forms, whose
generic fused kernel runs the same arithmetic; within tolerance for the
primitive gate chains).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper
from test_fusions_graphs import assert_like_unfused, make_model, tensor
from test_fusions_pattern import fusion, fusions_provider, ops, session

from onnxep.providers.fusions.linear_attention_gates import FuseLinearAttentionGates
from onnxep.providers.fusions.linear_attention_l2_norm import FuseLinearAttentionL2Norm
from onnxep.providers.fusions.reporting import ANOTHER_CONSUMER, GRAPH_OUTPUT

GATES, L2 = "fuse_linear_attention_gates", "fuse_linear_attention_l2_norm"
BOTH = [GATES, L2]
MS = "com.microsoft"
B, T, HQ, HKV, DK, DV = 1, 3, 2, 2, 8, 4


def passes():
    return [FuseLinearAttentionGates(), FuseLinearAttentionL2Norm()]


@pytest.fixture(scope="module")
def make():
    with fusions_provider() as register:
        yield register(passes=passes)


def la_model(
    dt=TensorProto.FLOAT,
    form="gate",
    rule="gated_delta",
    outputs=2,
    q_norm=True,
    k_norm=True,
    scaled=True,
    escape=None,
    past=True,
):
    """q/k (per-head L2 norm, q scaled) and the gates feeding com.microsoft LinearAttention."""
    npdt = helper.tensor_dtype_to_np_dtype(dt)
    nodes, inits = [], []

    def c(name, value, dtype=npdt):
        inits.append(numpy_helper.from_array(np.asarray(value, dtype), name))
        return name

    def l2(x, tag):
        split = c(f"{tag}_split", [0, 0, HQ, DK], np.int64)
        join = c(f"{tag}_join", [0, 0, HQ * DK], np.int64)
        nodes.append(helper.make_node("Reshape", [x, split], [f"{tag}_h"], name=f"{tag}_flat"))
        nodes.append(
            helper.make_node("LpNormalization", [f"{tag}_h"], [f"{tag}_n"], name=f"{tag}_lp",
                             axis=-1, p=2)
        )  # fmt: skip
        nodes.append(
            helper.make_node("Reshape", [f"{tag}_n", join], [f"{tag}_b"], name=f"{tag}_unflat")
        )
        return f"{tag}_b"

    q = l2("q", "ql") if q_norm else "q"
    if q_norm and scaled:
        nodes.append(helper.make_node("Mul", [q, c("qs", DK**-0.5)], ["q_s"], name="q_scale"))
        q = "q_s"
    k = l2("k", "kl") if k_norm else "k"
    dt_bias = c("dt_bias", np.linspace(-0.5, 0.5, HKV), np.float32 if form == "gate" else npdt)
    scale = c("neg_exp_a", -np.exp(np.linspace(-1, 0.3, HKV)),
              np.float32 if form == "gate" else npdt)  # fmt: skip
    delta = rule == "gated_delta"
    if form == "gate":
        gate_outs = ["decay", "beta"] if delta else ["decay"]
        gate_ins = ["a", dt_bias, scale, "b"] if delta else ["a", dt_bias, scale]
        nodes.append(helper.make_node("LinearAttentionGate", gate_ins, gate_outs, name="gate",
                                      domain=MS))  # fmt: skip
    else:
        nodes += [
            helper.make_node("Add", ["a", dt_bias], ["z"], name="bias"),
            helper.make_node("Softplus", ["z"], ["sp"], name="softplus"),
            helper.make_node("Mul", ["sp", scale], ["decay"], name="decay_mul"),
        ]
        if delta:
            nodes.append(helper.make_node("Sigmoid", ["b"], ["beta"], name="sigmoid"))
    la_ins = [q, k, "v", "past" if past else "", "decay"] + (["beta"] if delta else [])
    la_outs = ["y", "present"][:outputs]
    nodes.append(
        helper.make_node("LinearAttention", la_ins, la_outs, name="la", domain=MS,
                         q_num_heads=HQ, kv_num_heads=HKV, update_rule=rule, scale=1.0)
    )  # fmt: skip
    ins = [
        tensor("q", [B, T, HQ * DK], dt),
        tensor("k", [B, T, HKV * DK], dt),
        tensor("v", [B, T, HKV * DV], dt),
        tensor("a", [B, T, HKV], dt),
    ]
    if delta:
        ins.append(tensor("b", [B, T, HKV], dt))
    if past:
        ins.append(tensor("past", [B, HKV, DK, DV], dt))
    outs = [tensor(n, None, dt) for n in la_outs]
    if escape == "output":
        outs.append(tensor("decay", None, dt))
    elif escape == "consumer":
        nodes.append(helper.make_node("Neg", ["kl_n" if k_norm else "decay"], ["neg"], name="neg"))
        outs.append(tensor("neg", None, dt))
    model = make_model(nodes, ins, outs, inits, opset=18)
    model.opset_import.append(helper.make_opsetid(MS, 1))
    return model


def la_feeds(model, seed=0):
    rng = np.random.default_rng(seed)
    feeds = {}
    for i in model.graph.input:
        shape = [d.dim_value for d in i.type.tensor_type.shape.dim]
        dt = helper.tensor_dtype_to_np_dtype(i.type.tensor_type.elem_type)
        feeds[i.name] = (rng.standard_normal(shape) * (0.3 if i.name == "past" else 1)).astype(dt)
    return feeds


def run_both(make, model, exact):
    fused = session(model, make)
    plain = session(model, make, off=BOTH)
    assert fusion(plain, GATES).state == "off" and fusion(plain, L2).state == "off"
    assert "GatedLinearAttention" not in ops(plain)
    feeds = la_feeds(model)
    names = [o.name for o in model.graph.output]
    for name, got, want in zip(names, fused.run(None, feeds), plain.run(None, feeds), strict=True):
        assert_like_unfused(got, want, exact, name)
    return fused


@pytest.mark.parametrize("dt", [TensorProto.FLOAT, TensorProto.FLOAT16], ids=["f32", "f16"])
@pytest.mark.parametrize("rule", ["gated_delta", "gated"])
@pytest.mark.parametrize("outputs", [2, 1])
def test_gate_node_and_both_norms_fold_into_one_node(make, dt, rule, outputs):
    fused = run_both(make, la_model(dt, rule=rule, outputs=outputs), exact=True)
    assert ops(fused) == ["GatedLinearAttention"], fused.placement().format()
    assert fusion(fused, GATES).fired == 1 and fusion(fused, L2).fired == 2
    assert fusion(fused, GATES).exact is False  # tolerance-level, as declared


@pytest.mark.parametrize("dt", [TensorProto.FLOAT, TensorProto.FLOAT16], ids=["f32", "f16"])
@pytest.mark.parametrize("rule", ["gated_delta", "gated"])
def test_primitive_gate_chains_fold_within_tolerance(make, dt, rule):
    fused = run_both(make, la_model(dt, form="primitive", rule=rule), exact=False)
    assert ops(fused) == ["GatedLinearAttention"], fused.placement().format()


@pytest.mark.parametrize(
    ("q_norm", "k_norm", "scaled", "fires"),
    [(True, False, False, 1), (False, True, False, 1), (False, False, False, 0)],
)
def test_each_norm_folds_on_its_own_and_no_past_state(make, q_norm, k_norm, scaled, fires):
    model = la_model(q_norm=q_norm, k_norm=k_norm, scaled=scaled, past=False)
    fused = run_both(make, model, exact=True)
    assert fusion(fused, L2).fired == fires
    assert "LpNormalization" not in ops(fused)


@pytest.mark.parametrize(("escape", "reason"), [("output", GRAPH_OUTPUT),
                                                 ("consumer", ANOTHER_CONSUMER)])  # fmt: skip
def test_an_escaping_decay_refuses_the_gate_fold(make, escape, reason):
    model = la_model(form="primitive", q_norm=False, k_norm=False, escape=escape)
    fused = run_both(make, model, exact=True)
    assert "GatedLinearAttention" not in ops(fused)
    rep = fusion(fused, GATES)
    assert rep.fired == 0 and reason in rep.refused, rep.refused


def test_an_escaping_norm_refuses_the_k_fold_only(make):
    fused = run_both(make, la_model(escape="consumer"), exact=True)
    rep = fusion(fused, L2)
    assert rep.fired == 1  # q's norm
    assert ANOTHER_CONSUMER in rep.refused, rep.refused
    assert ops(fused).count("LpNormalization") == 1


def test_a_norm_over_other_than_the_head_size_is_refused(make):
    model = la_model(k_norm=False, scaled=False)
    for init in model.graph.initializer:
        if init.name == "ql_split":  # normalise halves of heads: 4 values, not d_k = 8
            init.CopyFrom(numpy_helper.from_array(np.array([0, 0, 4, 4], np.int64), "ql_split"))
    fused = run_both(make, model, exact=True)
    rep = fusion(fused, L2)
    assert rep.fired == 0
    assert any("head size" in r for r in rep.refused), rep.refused


def test_switched_off_leaves_the_nodes(make):
    sess = session(la_model(), make, off=[GATES])
    assert "GatedLinearAttention" not in ops(sess)
    assert fusion(sess, GATES).state == "off"
    assert fusion(sess, L2).fired == 0  # it folds only into the fused node


def test_fires_on_the_tiny_hybrid_decoder(make):
    from conftest import exported_feeds

    from bench.factory.hybrid import build_hybrid_decoder

    model = build_hybrid_decoder("tiny")
    fused = session(model, make)
    plain = session(model, make, off=BOTH)
    layers = sum(1 for n in model.graph.node if n.op_type == "LinearAttention")
    assert layers > 0
    assert fusion(fused, GATES).fired == layers, fused.placement().format(max_nodes=0)
    assert fusion(fused, L2).fired == 2 * layers
    placed = ops(fused)
    assert placed.count("GatedLinearAttention") == layers
    assert "LinearAttentionGate" not in placed and "LpNormalization" not in placed
    dims = {"batch_size": 1, "sequence_length": 3, "past_sequence_length": 2,
            "total_sequence_length": 5}  # fmt: skip
    feeds = exported_feeds(fused, dims, np.random.default_rng(0), 100)
    for arg, got, want in zip(fused.get_outputs(), fused.run(None, feeds), plain.run(None, feeds),
                              strict=True):  # fmt: skip
        np.testing.assert_array_equal(got, want, err_msg=arg.name)


QWEN35 = Path(__file__).parent / "data" / "genai" / "qwen3_5_fp32" / "model.onnx"


def test_fires_on_the_genai_builders_qwen3_5_export_and_explain_shows_it(make, capsys):
    from onnxep.tools.cli import main

    fused = session(str(QWEN35), make)
    assert (fusion(fused, GATES).fired, fusion(fused, L2).fired) == (3, 6)
    assert not fusion(fused, GATES).refused and not fusion(fused, L2).refused
    assert main(["explain", str(QWEN35), "--providers", make]) == 0
    out = capsys.readouterr().out
    assert f"{make}/{GATES}: fired 3" in out and f"{make}/{L2}: fired 6" in out


@pytest.mark.parametrize("dtype", ["fp16", "int4"])
def test_fires_on_the_tiny_hybrid_decoder_in_other_precisions(make, dtype):
    from bench.factory.hybrid import build_hybrid_decoder

    model = build_hybrid_decoder("tiny", dtype=dtype)
    layers = sum(1 for n in model.graph.node if n.op_type == "LinearAttention")
    fused = session(model, make)
    assert (fusion(fused, GATES).fired, fusion(fused, L2).fired) == (layers, 2 * layers)
    assert not fusion(fused, GATES).refused and not fusion(fused, L2).refused
