"""Each fusion on a small graph of its pattern: it fires, refuses escaping intermediates with the
reason, stays off when switched off, and the fused graph gives the unfused graph's outputs
(byte for byte where the pass claims it, else within the dtype's tolerance).

Runs on the ``fusions`` provider of test_fusions_pattern.py: the CUDA provider's pass list
over the generic kernels (the CPU reference of every fused op).
"""

from __future__ import annotations

import numpy as np
import pytest
from test_fusions_graphs import (
    F16,
    F32,
    assert_like_unfused,
    feeds,
    gelu_model,
    matmul_bias_model,
    positive,
    rms_model,
    rsqrt_model,
    shared_model,
    silu_model,
    skip_model,
    swiglu_model,
)
from test_fusions_pattern import ALL, fusion, fusions_provider, ops, session

from onnxep.providers.fusions.reporting import ANOTHER_CONSUMER, GRAPH_OUTPUT
from onnxep.providers.fusions.shared_input_matmuls import NOT_CONSTANT


@pytest.fixture
def fusions():
    with fusions_provider() as register:
        yield register


def check(make, model, pass_name, fused_ops, exact, fired=1, off=()):
    """Fires ``fired`` times leaving ``fused_ops`` in the graph; outputs match the unfused run.

    The weight transpose (the last pass: its own tests are test_fusions_transposed_weights.py)
    stays off, so the ops each pass emits are the ones left."""
    fused = session(model, make, off=(*off, "fuse_transposed_weights"))
    assert fusion(fused, pass_name).fired == fired, fused.placement().format()
    placed = ops(fused)
    for op in fused_ops:
        assert op in placed, placed
    plain = session(model, make, off=ALL)
    assert fusion(plain, pass_name).state == "off"
    inputs = feeds(model)
    names = [o.name for o in model.graph.output]
    for name, got, want in zip(names, fused.run(None, inputs), plain.run(None, inputs)):
        assert_like_unfused(got, want, exact, name)
    return fused


def refused(make, model, pass_name, reason):
    sess = session(model, make)
    rep = fusion(sess, pass_name)
    assert rep.fired == 0, sess.placement().format()
    assert any(reason in r for r in rep.refused), rep.refused
    return sess


# -- RMS norm --------------------------------------------------------------------------


@pytest.mark.parametrize(
    "kw",
    [
        {},
        {"div": True, "axes_attr": True},
        {"dt": F16},
        {"dt": F16, "cast": True},
    ],
    ids=["f32", "f32-div-axes-attribute", "f16", "f16-cast-to-f32"],
)
def test_rms_norm(fusions, kw):
    sess = check(
        fusions(), rms_model(**kw), "fuse_rms_norm", ["SimplifiedLayerNormalization"], False
    )
    assert ops(sess) == ["SimplifiedLayerNormalization"]
    assert fusion(sess, "fuse_rms_norm").exact is False


@pytest.mark.parametrize(
    ("escape", "reason"), [("output", GRAPH_OUTPUT), ("consumer", ANOTHER_CONSUMER)]
)
def test_rms_norm_refuses_escapes(fusions, escape, reason):
    refused(fusions(), rms_model(escape=escape), "fuse_rms_norm", reason)


def test_rms_norm_refuses_a_mean_over_other_axes(fusions):
    model = rms_model(axes_attr=True)
    model.graph.node[1].attribute[0].ints[:] = [1]
    refused(fusions(), model, "fuse_rms_norm", "not the last axis alone")


# -- skip RMS norm ------------------------------------------------------------------------


@pytest.mark.parametrize("opset23", [False, True], ids=["simplified", "rms-normalization-23"])
@pytest.mark.parametrize("dt", [F32, F16])
def test_skip_rms_norm_keeps_the_sum_exact(fusions, dt, opset23):
    model = skip_model(dt, opset23=opset23)
    sess = check(
        fusions(), model, "fuse_skip_rms_norm", ["SkipSimplifiedLayerNormalization"], False
    )
    assert "Add" in ops(sess)  # the next residual Add reads the fused node's sum output
    plain = session(model, fusions(), off=ALL)
    inputs = feeds(model)
    np.testing.assert_array_equal(sess.run(["z"], inputs)[0], plain.run(["z"], inputs)[0])


def test_skip_rms_norm_with_bias(fusions):
    check(fusions(), skip_model(bias=True), "fuse_skip_rms_norm", [], False)


def test_skip_rms_norm_refuses_an_escaping_inner_sum(fusions):
    refused(fusions(), skip_model(bias=True, escape=True), "fuse_skip_rms_norm", GRAPH_OUTPUT)


# -- Rsqrt --------------------------------------------------------------------------------


@pytest.mark.parametrize("div", [False, True], ids=["reciprocal", "div"])
@pytest.mark.parametrize("dt", [F32, F16])
def test_rsqrt_is_exact(fusions, dt, div):
    model = rsqrt_model(dt, div)
    make = fusions()
    fused, plain = session(model, make), session(model, make, off=ALL)
    assert ops(fused) == ["Rsqrt"] and fusion(fused, "fuse_rsqrt").exact
    feeds = positive(model)
    np.testing.assert_array_equal(fused.run(None, feeds)[0], plain.run(None, feeds)[0])


def test_rsqrt_refuses_an_escape_and_a_broadcasting_one(fusions):
    make = fusions()
    refused(make, rsqrt_model(escape=True), "fuse_rsqrt", ANOTHER_CONSUMER)
    refused(make, rsqrt_model(div=True, one_shape=(1, 1, 1)), "fuse_rsqrt", "broadcast")


# -- SiLU and SwiGLU ------------------------------------------------------------------------


@pytest.mark.parametrize("swapped", [False, True])
@pytest.mark.parametrize("dt", [F32, F16])
def test_silu_is_exact(fusions, dt, swapped):
    sess = check(fusions(), silu_model(dt, swapped), "fuse_silu", ["SiLU"], True)
    assert fusion(sess, "fuse_silu").exact


@pytest.mark.parametrize("dt", [F32, F16])
def test_swiglu_is_exact(fusions, dt):
    sess = check(fusions(), swiglu_model(dt), "fuse_swiglu", ["SwiGLU"], True)
    assert ops(sess) == ["SwiGLU"] and fusion(sess, "fuse_swiglu").by_rule == {"swiglu": 1}


def test_swiglu_from_primitives_when_silu_is_off(fusions):
    sess = check(fusions(), swiglu_model(), "fuse_swiglu", ["SwiGLU"], True, off=["fuse_silu"])
    assert fusion(sess, "fuse_swiglu").by_rule == {"swiglu_sigmoid": 1}


def test_swiglu_refuses_an_escaping_silu(fusions):
    sess = refused(fusions(), swiglu_model(escape=True), "fuse_swiglu", GRAPH_OUTPUT)
    assert ops(sess) == ["SiLU", "Mul"]


# -- GELU and bias GELU --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("form", "dt", "op"),
    [
        ("erf", F32, "Gelu"),
        ("erf", F16, "Gelu"),
        ("tanh", F32, "FastGelu"),
        ("tanh", F16, "FastGelu"),
    ],
)
def test_gelu(fusions, form, dt, op):
    sess = check(fusions(), gelu_model(dt, form), "fuse_gelu", [op], False)
    assert ops(sess) == [op]


def test_gelu_refuses_an_escape(fusions):
    refused(fusions(), gelu_model(escape=True), "fuse_gelu", ANOTHER_CONSUMER)


@pytest.mark.parametrize(
    ("form", "opset", "op"),
    [
        ("erf", 18, "BiasGelu"),
        ("tanh", 18, "FastGelu"),
        ("erf", 20, "BiasGelu"),
        ("tanh", 20, "FastGelu"),
    ],
)
@pytest.mark.parametrize("dt", [F32, F16])
def test_bias_gelu(fusions, form, opset, op, dt):
    sess = check(
        fusions(), gelu_model(dt, form, bias=True, opset=opset), "fuse_bias_gelu", [op], False
    )
    assert ops(sess) == [op]


def test_bias_gelu_refuses_an_escape_and_a_matrix_bias(fusions):
    make = fusions()
    refused(make, gelu_model(bias=True, escape=True, opset=20), "fuse_bias_gelu", ANOTHER_CONSUMER)
    model = gelu_model(bias=True, opset=20, form="tanh", bias_shape=(4, 8))
    refused(make, model, "fuse_bias_gelu", "1-D")


# -- MatMul + bias -----------------------------------------------------------------------


@pytest.mark.parametrize("swapped", [False, True])
@pytest.mark.parametrize("dt", [F32, F16])
def test_matmul_bias(fusions, dt, swapped):
    sess = check(
        fusions(), matmul_bias_model(dt, swapped=swapped), "fuse_matmul_bias", ["MatMulBias"], False
    )
    assert ops(sess) == ["MatMulBias"]


def test_matmul_bias_refuses_a_residual_and_an_escape(fusions):
    make = fusions()
    refused(make, matmul_bias_model(residual=True), "fuse_matmul_bias", "not a 1-D vector")
    refused(make, matmul_bias_model(escape=True), "fuse_matmul_bias", GRAPH_OUTPUT)


# -- MatMuls sharing an input ---------------------------------------------------------------


@pytest.mark.parametrize("opset", [11, 17])
def test_shared_input_matmuls_join_and_split(fusions, opset):
    sess = check(
        fusions(), shared_model(opset=opset), "fuse_shared_input_matmuls", ["Split"], False
    )
    assert ops(sess) == ["MatMul", "Split"]
    assert fusion(sess, "fuse_shared_input_matmuls").by_rule == {"joined_and_split": 1}


@pytest.mark.parametrize("dt", [F32, F16])
def test_gate_and_up_feed_one_packed_swiglu(fusions, dt):
    model = shared_model((16, 16), dt, swiglu=True)
    sess = check(fusions(), model, "fuse_shared_input_matmuls", ["SwiGLU"], False)
    assert ops(sess) == ["MatMul", "SwiGLU"]
    assert fusion(sess, "fuse_shared_input_matmuls").by_rule == {"joined_into_swiglu": 1}


def test_up_and_gate_in_the_other_order(fusions):
    model = shared_model((16, 16), swiglu=True)
    for n in model.graph.node:  # the second projection is now the gate
        n.input[:] = [{"m0": "m1", "m1": "m0"}.get(i, i) for i in n.input]
    sess = check(fusions(), model, "fuse_shared_input_matmuls", ["SwiGLU"], False)
    assert ops(sess) == ["MatMul", "SwiGLU"]


def test_matmul_bias_siblings_join_their_biases(fusions):
    sess = check(fusions(), shared_model(bias=True), "fuse_shared_input_matmuls", ["Split"], False)
    assert ops(sess) == ["MatMulBias", "Split"]


def test_a_sibling_with_a_non_constant_weight_stays_out(fusions):
    make = fusions()
    sess = session(shared_model(dynamic=1), make, off=["fuse_transposed_weights"])
    rep = fusion(sess, "fuse_shared_input_matmuls")
    assert rep.fired == 1 and rep.refused == {NOT_CONSTANT: ("proj1",)}
    assert sorted(ops(sess)) == ["MatMul", "MatMul", "Split"]
    check(make, shared_model(dynamic=1), "fuse_shared_input_matmuls", ["Split"], False)


def test_joined_weights_replace_the_originals():
    from test_fusions_pattern import run_pass

    from onnxep.providers.fusions import FuseSharedInputMatMuls

    model = run_pass(FuseSharedInputMatMuls(), shared_model())
    inits = model.graph.initializers
    assert sorted(inits) == ["proj0/joined_weight", "proj0/split_sizes"]
    assert inits["proj0/joined_weight"].const_value.numpy().shape == (8, 32)
