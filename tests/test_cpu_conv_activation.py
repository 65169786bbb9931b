"""The CPU's Conv + activation fusion beyond Relu/Clip (``fuse_conv_activation`` with
``extra``): HardSigmoid, LeakyRelu, HardSwish, SiLU (Sigmoid + Mul) and ClipSwish (Add,
Clip, Mul, Div), each byte-identical to the unfused graph on the CPU and within tolerance
of onnxruntime, on dense, pointwise, grouped and depthwise convs, with the compiled loops
and with NumPy alone; and the refusals."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from conftest import make_model, tensor
from onnx import TensorProto, helper, numpy_helper

import onnxep
from onnxep.providers_cpu import jit

H = helper.make_node
ELEM = {np.float32: TensorProto.FLOAT, np.float64: TensorProto.DOUBLE}

# (in channels, out channels, kernel, group, stride): dense 3x3 (GEMM), pointwise, grouped,
# depthwise stride 2 (the compiled depthwise loop applies the activation itself)
CONVS = [(4, 6, 3, 1, 1), (6, 5, 1, 1, 1), (4, 6, 3, 2, 1), (6, 6, 3, 6, 2)]


def _activation(kind, dtype):
    """Nodes from ``c`` to ``y`` and their constants."""

    def k(name, v):
        return numpy_helper.from_array(np.array(v, dtype), name)

    if kind == "HardSigmoid":
        return [H("HardSigmoid", ["c"], ["y"], alpha=0.25, beta=0.375)], []
    if kind == "LeakyRelu":
        return [H("LeakyRelu", ["c"], ["y"], alpha=0.125)], []
    if kind == "HardSwish":
        return [H("HardSwish", ["c"], ["y"])], []
    if kind == "SiLU":
        return [H("Sigmoid", ["c"], ["s"]), H("Mul", ["s", "c"], ["y"])], []
    if kind == "ClipSwish":
        nodes = [
            H("Add", ["c", "three"], ["a"]),
            H("Clip", ["a", "lo", "hi"], ["cl"]),
            H("Mul", ["c", "cl"], ["m"]),
            H("Div", ["m", "six"], ["y"]),
        ]
        return nodes, [k("three", 3.0), k("lo", 0.0), k("hi", 6.0), k("six", 6.0)]
    if kind == "Gelu":  # as torch exports F.gelu below opset 20
        nodes = [
            H("Div", ["c", "r2"], ["d"]),
            H("Erf", ["d"], ["e"]),
            H("Add", ["e", "one"], ["a"]),
            H("Mul", ["c", "a"], ["m"]),
            H("Mul", ["m", "half"], ["y"]),
        ]
        return nodes, [k("r2", 1.4142135), k("one", 1.0), k("half", 0.5)]
    raise AssertionError(kind)


def _model(kind, conv, dtype=np.float32, extra_consumer=False):
    cin, cout, ks, group, stride = conv
    rng = np.random.default_rng(0)
    w = (rng.standard_normal((cout, cin // group, ks, ks)) * 0.5).astype(dtype)
    b = rng.standard_normal(cout).astype(dtype)
    nodes = [
        H("Conv", ["x", "w", "b"], ["c"], group=group, strides=[stride] * 2, pads=[ks // 2] * 4)
    ]
    act, consts = _activation(kind, dtype)
    nodes += act
    outputs = [tensor("y", None, ELEM[dtype])]
    if extra_consumer:  # the Conv's output read outside the match
        nodes.append(H("Neg", ["c"], ["z"]))
        outputs.append(tensor("z", None, ELEM[dtype]))
    inits = [numpy_helper.from_array(w, "w"), numpy_helper.from_array(b, "b"), *consts]
    model = make_model(nodes, [tensor("x", [2, cin, 9, 11], ELEM[dtype])], outputs, inits)
    return model.SerializeToString()


def _feed(cin, dtype=np.float32):
    return {"x": (np.random.default_rng(1).standard_normal((2, cin, 9, 11)) * 3).astype(dtype)}


def _sessions(model):
    fused = onnxep.InferenceSession(model, providers=["cpu"])
    plain = onnxep.InferenceSession(
        model,
        onnxep.SessionOptions(disabled_rewrites=["fuse_conv_activation"]),
        providers=["cpu"],
    )
    return fused, plain


def _report(sess):
    return {f.name: f for f in sess.placement().fusions}["fuse_conv_activation"]


KINDS = ["HardSigmoid", "LeakyRelu", "HardSwish", "SiLU", "ClipSwish", "Gelu"]
DOMAIN = {"HardSigmoid": "com.microsoft", "LeakyRelu": "com.microsoft"}


@pytest.mark.parametrize("compiled", [True, False], ids=["compiled", "numpy"])
@pytest.mark.parametrize("conv", CONVS, ids=["dense", "pointwise", "grouped", "depthwise"])
@pytest.mark.parametrize("kind", KINDS)
def test_fused_equals_unfused_and_onnxruntime(kind, conv, compiled, monkeypatch):
    if compiled and not jit.ENABLED:
        pytest.skip("numba not installed")
    monkeypatch.setattr(jit, "ENABLED", compiled)
    model = _model(kind, conv)
    feed = _feed(conv[0])
    fused, plain = _sessions(model)
    nodes = fused.placement().nodes
    assert [n.op_type for n in nodes] == ["FusedConv"], nodes
    assert _report(fused).fired == 1
    assert _report(plain).fired == 0
    got, want = fused.run(None, feed)[0], plain.run(None, feed)[0]
    assert got.dtype == np.float32 and got.tobytes() == want.tobytes()
    ref = ort.InferenceSession(model, providers=["CPUExecutionProvider"]).run(None, feed)[0]
    np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-5 * np.abs(ref).max())


def test_the_fused_node_says_its_domain_and_activation(tmp_path):
    import onnx

    for kind in KINDS:
        path = tmp_path / f"{kind}.onnx"
        onnxep.InferenceSession(
            _model(kind, CONVS[0]),
            onnxep.SessionOptions(optimized_model_filepath=str(path)),
            providers=["cpu"],
        )
        (node,) = onnx.load(str(path)).graph.node
        attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        assert node.op_type == "FusedConv"
        assert node.domain == DOMAIN.get(kind, "onnxep"), kind
        assert attrs["activation"] == kind.encode()


@pytest.mark.parametrize("kind", [k for k in KINDS if k != "Gelu"])
def test_float64_fuses_exactly(kind):
    model = _model(kind, CONVS[3], np.float64)
    feed = _feed(6, np.float64)
    fused, plain = _sessions(model)
    assert _report(fused).fired == 1
    assert fused.run(None, feed)[0].tobytes() == plain.run(None, feed)[0].tobytes()


@pytest.mark.parametrize("kind", KINDS)
def test_refused_when_the_conv_output_has_another_consumer(kind):
    model = _model(kind, CONVS[0], extra_consumer=True)
    fused, plain = _sessions(model)
    assert _report(fused).fired == 0
    feed = _feed(4)
    for g, w in zip(fused.run(None, feed), plain.run(None, feed)):
        assert g.tobytes() == w.tobytes()


def test_float64_gelu_is_refused():
    """The fused Erf is the CPU's float32 approximation; float64 Erf is another kernel."""
    sess = onnxep.InferenceSession(_model("Gelu", CONVS[0], np.float64), providers=["cpu"])
    report = _report(sess)
    assert report.fired == 0
    assert any("float32" in r for r in report.refused), report.refused


def test_float16_is_refused_with_a_reason():
    w = numpy_helper.from_array(np.ones((2, 1, 1, 1), np.float16), "w")
    nodes = [H("Conv", ["x", "w"], ["c"]), H("HardSwish", ["c"], ["y"])]
    f16 = TensorProto.FLOAT16
    model = make_model(nodes, [tensor("x", [1, 1, 2, 2], f16)], [tensor("y", None, f16)], [w])
    sess = onnxep.InferenceSession(model.SerializeToString(), providers=["cpu"])
    report = _report(sess)
    assert report.fired == 0
    assert any("float16" in r for r in report.refused), report.refused


def test_clip_swish_with_a_computed_shift_is_refused():
    """The Add's constant must be a constant (it becomes an attribute)."""
    nodes, consts = _activation("ClipSwish", np.float32)
    rng = np.random.default_rng(0)
    inits = [
        numpy_helper.from_array(rng.standard_normal((3, 2, 1, 1)).astype(np.float32), "w"),
        *[c for c in consts if c.name != "three"],
    ]
    model = make_model(
        [H("Conv", ["x", "w"], ["c"]), *nodes],
        [tensor("x", [1, 2, 4, 4]), tensor("three", [])],
        [tensor("y", None)],
        inits,
    )
    sess = onnxep.InferenceSession(model.SerializeToString(), providers=["cpu"])
    assert _report(sess).fired == 0
    x = rng.standard_normal((1, 2, 4, 4)).astype(np.float32)
    feed = {"x": x, "three": np.array(3, np.float32)}
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    np.testing.assert_allclose(sess.run(None, feed)[0], want.run(None, feed)[0], rtol=1e-6)


def test_float64_constant_a_float_attribute_would_round_is_refused():
    nodes, _ = _activation("ClipSwish", np.float64)
    consts = [
        numpy_helper.from_array(np.array(v, np.float64), n)
        for n, v in (("three", 0.1), ("lo", 0.0), ("hi", 6.0), ("six", 6.0))
    ]
    w = numpy_helper.from_array(np.ones((2, 1, 1, 1)), "w")
    f64 = TensorProto.DOUBLE
    model = make_model(
        [H("Conv", ["x", "w"], ["c"]), *nodes],
        [tensor("x", [1, 1, 2, 2], f64)],
        [tensor("y", None, f64)],
        [w, *consts],
    )
    sess = onnxep.InferenceSession(model.SerializeToString(), providers=["cpu"])
    report = _report(sess)
    assert report.fired == 0
    assert any("not exact as a float attribute" in r for r in report.refused)


def test_other_providers_get_relu_and_clip_only():
    """The CUDA plugin's pass (and a default one) has no rule for the CPU-only activations."""
    from onnxep.providers.fusions import FuseConvActivation

    names = {r.name for r, _ in FuseConvActivation().rules}
    assert names == {"conv_relu", "conv_clip"}
    with pytest.raises(ValueError, match="unknown activations"):
        FuseConvActivation(extra=["Swish"])


@pytest.mark.skipif(not jit.ENABLED, reason="numba not installed")
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize(
    "name,params",
    [("Relu", None), ("Clip", [-0.0, 6.0]), ("Clip", [-1.5, 0.0]), ("LeakyRelu", [0.1])],
)
def test_store_every_value_activations_keep_the_bits(name, params, dtype):
    """Relu, Clip and LeakyRelu store each value times one (no masked store): the bits of
    the nodes' own definitions, NaN, -0, infinities and subnormals included, on rows longer
    than a vector and on a remainder."""
    from onnxep.providers_cpu.ops.conv_epilogue import Epilogue

    t = np.dtype(dtype).type
    special = [np.nan, -0.0, 0.0, -1.0, 2.0, -np.inf, np.inf, 1e-45, -1e-45, 7.0, -2.0]
    rng = np.random.default_rng(3)
    x = rng.standard_normal((3, 61)).astype(dtype)
    x.reshape(-1)[: len(special) * 5 : 5] = special
    if name == "Relu":
        want = np.where((x > 0) | np.isnan(x), x, t(0))
    elif name == "LeakyRelu":
        want = np.where(x < 0, x * t(params[0]), x)
    else:
        lo, hi = t(params[0]), t(params[1])
        want = x.copy()
        want[want < lo] = lo
        want[want > hi] = hi
    ep = Epilogue(name, params)
    got = x.copy()
    jit.loop("conv_epilogue")(got, np.zeros(1, dtype), False, ep.code, ep.prm(dtype), 0, 3)
    assert got.tobytes() == want.astype(dtype).tobytes()
