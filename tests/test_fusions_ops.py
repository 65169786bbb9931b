"""Each fusion on a small graph of its pattern: it fires, refuses escaping intermediates with the
reason, stays off when switched off, and the fused graph gives the unfused graph's outputs
(byte for byte where the pass claims it, else within the dtype's tolerance).

Runs on the ``fusions`` provider of test_fusions_pattern.py: the CUDA provider's pass list
over the generic kernels (the CPU reference of every fused op).
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from conftest import make_model, tensor
from onnx import TensorProto, helper, numpy_helper
from test_fusions_pattern import ALL, const, fusion, fusions_provider, ops, session

from onnxep.providers.fusions.reporting import ANOTHER_CONSUMER, GRAPH_OUTPUT
from onnxep.providers.fusions.shared_input_matmuls import NOT_CONSTANT
from onnxep.testing import TOLERANCES

F32, F16 = np.float32, np.float16
ELEM = {F32: TensorProto.FLOAT, F16: TensorProto.FLOAT16}
MSFT = ("com.microsoft", 1)
node = helper.make_node


@pytest.fixture
def fusions():
    with fusions_provider() as register:
        yield register


def _feeds(model, seed=0):
    rng = np.random.default_rng(seed)
    out = {}
    for v in model.graph.input:
        t = v.type.tensor_type
        shape = [d.dim_value for d in t.shape.dim]
        dt = F16 if t.elem_type == TensorProto.FLOAT16 else F32
        out[v.name] = rng.standard_normal(shape).astype(dt)
    return out


def check(make, model, pass_name, fused_ops, exact, fired=1, off=()):
    """Fires ``fired`` times leaving ``fused_ops`` in the graph; outputs match the unfused run."""
    fused = session(model, make, off=off)
    assert fusion(fused, pass_name).fired == fired, fused.placement().format()
    placed = ops(fused)
    for op in fused_ops:
        assert op in placed, placed
    plain = session(model, make, off=ALL)
    assert fusion(plain, pass_name).state == "off"
    feeds = _feeds(model)
    names = [o.name for o in model.graph.output]
    for name, got, want in zip(names, fused.run(None, feeds), plain.run(None, feeds)):
        assert got.dtype == want.dtype and got.shape == want.shape, name
        if exact:
            np.testing.assert_array_equal(got, want, err_msg=name)
        else:
            atol, rtol = TOLERANCES[np.dtype(got.dtype)]
            np.testing.assert_allclose(got, want, rtol=rtol, atol=atol, err_msg=name)
    return fused


def refused(make, model, pass_name, reason):
    sess = session(model, make)
    rep = fusion(sess, pass_name)
    assert rep.fired == 0, sess.placement().format()
    assert any(reason in r for r in rep.refused), rep.refused
    return sess


# -- RMS norm --------------------------------------------------------------------------


def rms_model(dt=F32, div=False, axes_attr=False, escape=None, cast=False, d=16):
    e = ELEM[dt]
    cdt = F32 if cast else dt
    inits = [
        const("two", 2.0, cdt),
        const("eps", 1e-6, cdt),
        const("one", 1.0, cdt),
        const("w", np.linspace(0.5, 1.5, d), dt),
    ]
    nodes = []
    x = "x"
    if cast:
        nodes.append(node("Cast", ["x"], ["x32"], to=TensorProto.FLOAT))
        x = "x32"
    if axes_attr:
        mean = node("ReduceMean", ["p"], ["m"], axes=[-1], keepdims=1)
    else:
        inits.append(numpy_helper.from_array(np.array([-1], np.int64), "axes"))
        # as torch writes it, both attributes out (onnxscript's rule matches only then)
        mean = node("ReduceMean", ["p", "axes"], ["m"], keepdims=1, noop_with_empty_axes=0)
    nodes += [
        node("Pow", [x, "two"], ["p"]),
        mean,
        node("Add", ["m", "eps"], ["a"]),
        node("Sqrt", ["a"], ["s"]),
        node("Div", ["one", "s"], ["r"]) if div else node("Reciprocal", ["s"], ["r"]),
        node("Mul", [x, "r"], ["n"]),
    ]
    if cast:
        nodes.append(node("Cast", ["n"], ["n16"], to=e))
        nodes.append(node("Mul", ["w", "n16"], ["y"], name="scale"))
    else:
        nodes.append(node("Mul", ["n", "w"], ["y"], name="scale"))
    outputs = [tensor("y", [2, 3, d], e)]
    if escape == "output":
        outputs.append(tensor("m", [2, 3, 1], ELEM[cdt]))
    elif escape == "consumer":
        nodes.append(node("Neg", ["s"], ["ns"]))
        outputs.append(tensor("ns", [2, 3, 1], ELEM[cdt]))
    opset = 17 if axes_attr else 18
    return make_model(nodes, [tensor("x", [2, 3, d], e)], outputs, inits, opset=opset)


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


def skip_model(dt=F32, opset23=False, bias=False, escape=False, d=16):
    e = ELEM[dt]
    inits = [const("w", np.linspace(0.5, 1.5, d), dt), const("bias", np.linspace(-1, 1, d), dt)]
    nodes = [node("Add", ["h", "res"], ["t"], name="residual")]
    s = "t"
    if bias:
        nodes.append(node("Add", ["t", "bias"], ["tb"], name="bias_add"))
        s = "tb"
    if opset23:
        nodes.append(node("RMSNormalization", [s, "w"], ["y"], axis=-1, epsilon=1e-6))
    else:
        rms = rms_model(dt, d=d)
        inits += [i for i in rms.graph.initializer if i.name != "w"]
        for n in rms.graph.node:
            n.input[:] = [s if i == "x" else i for i in n.input]
            nodes.append(n)
    nodes.append(node("Add", [s, "c"], ["z"], name="next_residual"))
    inputs = [tensor(n, [2, 3, d], e) for n in ("h", "res", "c")]
    outputs = [tensor("y", [2, 3, d], e), tensor("z", [2, 3, d], e)]
    if escape:
        outputs.append(tensor("t", [2, 3, d], e))
    return make_model(nodes, inputs, outputs, inits, opset=23 if opset23 else 18)


@pytest.mark.parametrize("opset23", [False, True], ids=["simplified", "rms-normalization-23"])
@pytest.mark.parametrize("dt", [F32, F16])
def test_skip_rms_norm_keeps_the_sum_exact(fusions, dt, opset23):
    model = skip_model(dt, opset23=opset23)
    sess = check(
        fusions(), model, "fuse_skip_rms_norm", ["SkipSimplifiedLayerNormalization"], False
    )
    assert "Add" in ops(sess)  # the next residual Add reads the fused node's sum output
    plain = session(model, fusions(), off=ALL)
    feeds = _feeds(model)
    np.testing.assert_array_equal(sess.run(["z"], feeds)[0], plain.run(["z"], feeds)[0])


def test_skip_rms_norm_with_bias(fusions):
    check(fusions(), skip_model(bias=True), "fuse_skip_rms_norm", [], False)


def test_skip_rms_norm_refuses_an_escaping_inner_sum(fusions):
    refused(fusions(), skip_model(bias=True, escape=True), "fuse_skip_rms_norm", GRAPH_OUTPUT)


# -- Rsqrt --------------------------------------------------------------------------------


def rsqrt_model(dt=F32, div=False, escape=False, one_shape=()):
    e = ELEM[dt]
    nodes = [node("Sqrt", ["x"], ["s"])]
    if div:
        nodes.append(node("Div", ["one", "s"], ["y"], name="inv"))
    else:
        nodes.append(node("Reciprocal", ["s"], ["y"], name="inv"))
    shape_y = [4, 8] if len(one_shape) <= 2 else [1] * (len(one_shape) - 2) + [4, 8]
    outputs = [tensor("y", shape_y, e)]
    if escape:
        nodes.append(node("Neg", ["s"], ["ns"]))
        outputs.append(tensor("ns", [4, 8], e))
    inits = [const("one", np.ones(one_shape), dt)]
    return make_model(nodes, [tensor("x", [4, 8], e)], outputs, inits)


def _positive(model):
    return {k: np.abs(v) + 1e-3 for k, v in _feeds(model).items()}


@pytest.mark.parametrize("div", [False, True], ids=["reciprocal", "div"])
@pytest.mark.parametrize("dt", [F32, F16])
def test_rsqrt_is_exact(fusions, dt, div):
    model = rsqrt_model(dt, div)
    make = fusions()
    fused, plain = session(model, make), session(model, make, off=ALL)
    assert ops(fused) == ["Rsqrt"] and fusion(fused, "fuse_rsqrt").exact
    feeds = _positive(model)
    np.testing.assert_array_equal(fused.run(None, feeds)[0], plain.run(None, feeds)[0])


def test_rsqrt_refuses_an_escape_and_a_broadcasting_one(fusions):
    make = fusions()
    refused(make, rsqrt_model(escape=True), "fuse_rsqrt", ANOTHER_CONSUMER)
    refused(make, rsqrt_model(div=True, one_shape=(1, 1, 1)), "fuse_rsqrt", "broadcast")


# -- SiLU and SwiGLU ------------------------------------------------------------------------


def silu_model(dt=F32, swapped=False):
    e = ELEM[dt]
    mul = ["s", "x"] if swapped else ["x", "s"]
    nodes = [node("Sigmoid", ["x"], ["s"]), node("Mul", mul, ["y"])]
    return make_model(nodes, [tensor("x", [4, 8], e)], [tensor("y", [4, 8], e)])


@pytest.mark.parametrize("swapped", [False, True])
@pytest.mark.parametrize("dt", [F32, F16])
def test_silu_is_exact(fusions, dt, swapped):
    sess = check(fusions(), silu_model(dt, swapped), "fuse_silu", ["SiLU"], True)
    assert fusion(sess, "fuse_silu").exact


def swiglu_model(dt=F32, escape=False):
    e = ELEM[dt]
    nodes = [
        node("Sigmoid", ["g"], ["s"]),
        node("Mul", ["g", "s"], ["act"]),
        node("Mul", ["act", "u"], ["y"], name="gated"),
    ]
    outputs = [tensor("y", [4, 8], e)]
    if escape:
        outputs.append(tensor("act", [4, 8], e))
    return make_model(nodes, [tensor("g", [4, 8], e), tensor("u", [4, 8], e)], outputs)


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


def gelu_model(dt=F32, form="erf", bias=None, opset=18, escape=False, bias_shape=(8,)):
    """GELU as torch exports it at opset 18 (primitives) or 20 (ONNX Gelu), after x (+ bias)."""
    e = ELEM[dt]
    inits = [const("b", np.linspace(-1, 1, math.prod(bias_shape)).reshape(bias_shape), dt)]
    nodes = []
    x = "x"
    if bias:
        nodes.append(node("Add", ["x", "b"], ["xb"], name="bias_add"))
        x = "xb"
    if opset >= 20:
        approx = "tanh" if form == "tanh" else "none"
        nodes.append(node("Gelu", [x], ["y"], approximate=approx))
    elif form == "erf":
        inits += [const(n, v, dt) for n, v in (("sqrt2", 1.4142135), ("one", 1.0), ("half", 0.5))]
        nodes += [
            node("Div", [x, "sqrt2"], ["d"]),
            node("Erf", ["d"], ["erf"]),
            node("Add", ["erf", "one"], ["e1"]),
            node("Mul", ["half", "e1"], ["h"]),
            node("Mul", [x, "h"], ["y"], name="gelu_out"),
        ]
    else:
        consts = (("three", 3.0), ("k", 0.044715), ("c", 0.7978846), ("one", 1.0), ("half", 0.5))
        inits += [const(n, v, dt) for n, v in consts]
        nodes += [
            node("Pow", [x, "three"], ["p3"]),
            node("Mul", ["k", "p3"], ["kp"]),
            node("Add", [x, "kp"], ["inner"]),
            node("Mul", ["c", "inner"], ["ci"]),
            node("Tanh", ["ci"], ["erf"]),
            node("Add", ["erf", "one"], ["e1"]),
            node("Mul", ["half", "e1"], ["h"]),
            node("Mul", [x, "h"], ["y"], name="gelu_out"),
        ]
    outputs = [tensor("y", [4, 8], e)]
    if escape:
        name = "xb" if bias else "erf"
        nodes.append(node("Neg", [name], ["n"]))
        outputs.append(tensor("n", [4, 8], e))
    return make_model(nodes, [tensor("x", [4, 8], e)], outputs, inits, opset=opset)


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


def matmul_bias_model(dt=F32, residual=False, escape=False, swapped=False):
    e = ELEM[dt]
    rng = np.random.default_rng(1)
    inits = [
        const("w", rng.standard_normal((8, 16)) / 3, dt),
        const("b", np.linspace(-1, 1, 16), dt),
    ]
    addend = "r" if residual else "b"
    pair = [addend, "mm"] if swapped else ["mm", addend]
    nodes = [node("MatMul", ["x", "w"], ["mm"]), node("Add", pair, ["y"], name="bias_add")]
    inputs = [tensor("x", [2, 3, 8], e)] + ([tensor("r", [2, 3, 16], e)] if residual else [])
    outputs = [tensor("y", [2, 3, 16], e)] + ([tensor("mm", [2, 3, 16], e)] if escape else [])
    return make_model(nodes, inputs, outputs, inits)


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


def shared_model(widths=(16, 8, 8), dt=F32, swiglu=False, dynamic=None, opset=17, bias=False):
    e = ELEM[dt]
    rng = np.random.default_rng(2)
    inits, nodes, outputs = [], [], []
    inputs = [tensor("x", [2, 3, 8], e)]
    for k, n in enumerate(widths):
        inits.append(const(f"w{k}", rng.standard_normal((8, n)) / 3, dt))
        w = f"w{k}"
        if dynamic == k:
            inputs.append(tensor("wd", [8, n], e))
            w = "wd"
        nodes.append(node("MatMul", ["x", w], [f"m{k}"], name=f"proj{k}"))
        out = f"m{k}"
        if bias:
            inits.append(const(f"b{k}", np.linspace(-1, 1, n), dt))
            nodes.append(node("Add", [f"m{k}", f"b{k}"], [f"y{k}"]))
            out = f"y{k}"
        if not swiglu:
            outputs.append(tensor(out, [2, 3, n], e))
    if swiglu:
        nodes += [
            node("Sigmoid", ["m0"], ["s"]),
            node("Mul", ["m0", "s"], ["act"]),
            node("Mul", ["act", "m1"], ["y"]),
        ]
        outputs.append(tensor("y", [2, 3, widths[0]], e))
    return make_model(nodes, inputs, outputs, inits, opset=opset)


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
    sess = session(shared_model(dynamic=1), make)
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
