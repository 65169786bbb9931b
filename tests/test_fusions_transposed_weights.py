"""fuse_transposed_weights: MatMul/MatMulBias by a constant matrix -> onnxep::MatMulNT on W^T.

Run on the ``fusions`` provider of test_fusions_pattern.py (the generic kernels, the CPU
reference of every fused op) with this pass appended to the standard list, last, as the
CUDA plugin runs it. The fused session must give the unfused one's outputs within the
dtype's tolerance (the pass is tolerance-level) and the factory's fp16 genai decoder its
greedy tokens; the graph-level checks run the pass on an onnx_ir model directly.
"""

from __future__ import annotations

import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import onnx_ir as ir
import pytest
from onnx import TensorProto, helper
from test_fusions_graphs import (
    F16,
    F32,
    assert_like_unfused,
    const,
    feeds,
    make_model,
    matmul_bias_model,
    tensor,
)
from test_fusions_graphs import shared_model as shared
from test_fusions_pattern import ALL, fusion, fusions_provider, ops, session

import onnxep
from onnxep.providers.fusions import standard_fusions
from onnxep.providers.fusions.transposed_weights import (
    NOT_CONSTANT,
    NOT_MATRIX,
    FuseTransposedWeights,
)

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # bench/ is imported from the repo root, not installed
from bench.factory import build_genai_decoder  # noqa: E402

NAME = "fuse_transposed_weights"
OFF = [*ALL, NAME]


def _passes():
    """The standard list with this pass last (appended until it is part of that list)."""
    passes = standard_fusions()
    if NAME in {p.name for p in passes}:
        return passes
    return [*passes, FuseTransposedWeights()]


@pytest.fixture(scope="module")
def make():
    with fusions_provider() as register:
        yield register(passes=_passes)


def _close(model, fused, plain):
    inputs = feeds(model)
    for got, want in zip(fused.run(None, inputs), plain.run(None, inputs)):
        assert_like_unfused(got, want, False)


@pytest.mark.parametrize("dt", [F32, F16])
def test_matmul_bias_becomes_matmul_nt(make, dt):
    model = matmul_bias_model(dt)
    fused = session(model, make)
    rep = fusion(fused, NAME)
    assert rep.by_rule == {"matmul_nt": 1} and rep.exact is False, fused.placement().format()
    assert ops(fused) == ["MatMulNT"]
    _close(model, fused, session(model, make, off=OFF))


@pytest.mark.parametrize("dt", [F32, F16])
@pytest.mark.parametrize("bias", [False, True], ids=["", "bias"])
def test_joined_gate_up_takes_the_swiglu_in(make, dt, bias):
    model = shared((16, 16), dt, swiglu=True, bias=bias)
    fused = session(model, make)
    rep = fusion(fused, NAME)
    assert rep.by_rule == {"matmul_nt": 1, "matmul_nt_swiglu": 1}, fused.placement().format()
    assert ops(fused) == ["MatMulNT"]
    _close(model, fused, session(model, make, off=OFF))
    # the same fold on the generic kernels as the unfused SwiGLU rounds it
    _close(model, fused, session(model, make, off=[NAME]))


def test_switched_off_it_leaves_the_matmuls(make):
    sess = session(matmul_bias_model(), make, off=[NAME])
    assert fusion(sess, NAME).state == "off"
    assert ops(sess) == ["MatMulBias"]


def test_a_weight_fed_at_run_time_is_refused(make):
    model = shared((16,), dynamic=0)
    sess = session(model, make)
    rep = fusion(sess, NAME)
    assert rep.fired == 0 and NOT_CONSTANT in rep.refused, rep.refused
    assert ops(sess) == ["MatMul"]


def test_a_batched_weight_is_refused(make):
    w = const("w", np.ones((2, 8, 4)) / 8)
    nodes = [helper.make_node("MatMul", ["x", "w"], ["y"], name="bmm")]
    model = make_model(nodes, [tensor("x", [2, 3, 8])], [tensor("y", [2, 3, 4])], [w])
    rep = fusion(session(model, make), NAME)
    assert rep.fired == 0 and rep.refused == {NOT_MATRIX: ("bmm",)}


def test_an_integer_matmul_is_refused(make):
    i32 = TensorProto.INT32
    w = const("w", np.arange(32).reshape(8, 4), np.int32)
    nodes = [helper.make_node("MatMul", ["x", "w"], ["y"], name="imm")]
    model = make_model(nodes, [tensor("x", [3, 8], i32)], [tensor("y", [3, 4], i32)], [w])
    sess = session(model, make)
    rep = fusion(sess, NAME)
    assert rep.fired == 0 and any("not one of float16 or float" in r for r in rep.refused)
    x = np.arange(24, dtype=np.int32).reshape(3, 8)
    np.testing.assert_array_equal(sess.run(None, {"x": x})[0], x @ np.arange(32).reshape(8, 4))


# -- on the graph: the transposed copy, shared and replacing the original --------------------


def _run_pass(model, has_kernel=True):
    p = FuseTransposedWeights()
    registry = SimpleNamespace(lookup=lambda d, o, v: object() if has_kernel else None)
    p.bind(SimpleNamespace(registry=registry), lambda n: True, {"": 17, "onnxep": 1})
    result = p.call(model)
    return p, result


def _tied_model():
    """Two MatMuls on one weight, and a third reader (a Shape) of another."""
    rng = np.random.default_rng(0)
    inits = [const("w", rng.standard_normal((8, 6))), const("v", rng.standard_normal((8, 6)))]
    nodes = [
        helper.make_node("MatMul", ["x", "w"], ["a"], name="mm_a"),
        helper.make_node("MatMul", ["x", "w"], ["b"], name="mm_b"),
        helper.make_node("MatMul", ["x", "v"], ["c"], name="mm_c"),
        helper.make_node("Shape", ["v"], ["s"], name="shape_v"),
    ]
    outs = [tensor(n, [3, 6]) for n in "abc"] + [tensor("s", [2], TensorProto.INT64)]
    return ir.serde.deserialize_model(make_model(nodes, [tensor("x", [3, 8])], outs, inits))


def test_one_transposed_copy_per_weight_and_the_original_dropped_when_unread():
    model = _tied_model()
    w = model.graph.initializers["w"].const_value.numpy()
    p, result = _run_pass(model)
    assert result.modified and p.fired == {"matmul_nt": 3}
    inits = model.graph.initializers
    assert "w" not in inits and "v" in inits  # v is still read by the Shape
    nts = [n for n in model.graph if n.op_type == "MatMulNT"]
    assert [n.name for n in nts] == ["mm_a", "mm_b", "mm_c"]
    assert nts[0].inputs[1] is nts[1].inputs[1]  # one copy for the tied weight
    wt = nts[0].inputs[1].const_value.numpy()
    assert wt.shape == (6, 8) and wt.flags.c_contiguous
    np.testing.assert_array_equal(wt, w.T)
    assert [v.name for v in model.graph.outputs] == ["a", "b", "c", "s"]


def test_without_the_kernel_every_match_is_refused_with_the_reason():
    model = _tied_model()
    p, result = _run_pass(model, has_kernel=False)
    assert not result.modified and p.fired == {}
    assert p.refusals == {"no kernel for onnxep::MatMulNT": ["mm_a", "mm_b", "mm_c"]}


# -- the factory's genai decoder -------------------------------------------------------------

PROMPT = np.random.default_rng(5).integers(0, 200, 6)


@pytest.fixture(scope="module")
def fp16_decoder(tmp_path_factory):
    path = tmp_path_factory.mktemp("genai") / "fp16" / "model.onnx"
    build_genai_decoder("tiny", seed=2, dtype="fp16", out_path=path, symmetric=True)
    return path


def test_factory_fp16_decoder_transposes_its_weights_and_decodes_as_unfused(fp16_decoder, make):
    fused = session(str(fp16_decoder), make)
    rep = fusion(fused, NAME)
    placed = {(n.domain, n.op_type) for n in fused.placement()}
    # per layer: the packed qkv, o, the joined gate/up (its SwiGLU folded in) and down; the
    # lm_head once
    assert rep.by_rule == {"matmul_nt": 9, "matmul_nt_swiglu": 2}, fused.placement().format()
    assert ("", "MatMul") not in placed and ("onnxep", "SwiGLU") not in placed
    reference = onnxep.generate(
        session(str(fp16_decoder), "cpu", off=OFF), PROMPT, 6, progress=False
    )
    got = onnxep.generate(fused, PROMPT, 6, progress=False)
    assert got.tokens == reference.tokens
