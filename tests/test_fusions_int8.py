"""The CPU provider's 8-bit fusions.

fuse_dynamic_quantize_matmul: quantize_dynamic's MatMul pattern (DynamicQuantizeLinear ->
MatMulInteger -> Cast -> Mul by the scale product, then a bias Add) becomes com.microsoft
DynamicQuantizeMatMul, or MatMulIntegerToFloat where the quantization is shared.
fuse_conv_integer_to_float: ConvInteger -> int32 Add -> Cast -> Mul becomes
onnxep::ConvIntegerToFloat. Each fused graph gives the unfused graph's outputs byte for
byte (on the VNNI and AVX2 tiles and on float BLAS), matches refuse escaping intermediates with
the reason, and the switches turn the passes off."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import ort_int8_reference
import pytest
from onnx import TensorProto, helper, numpy_helper

import onnxep
from onnxep.providers.fusions.reporting import ANOTHER_CONSUMER, GRAPH_OUTPUT
from onnxep.providers_cpu import jit, jit_int8
from onnxep.providers_cpu.ops import vnni_gemm

NAME = "fuse_dynamic_quantize_matmul"


@pytest.fixture(params=["vnni", "avx2", "numba-no-tiles", "blas"])
def int_path(request, monkeypatch):
    """The VNNI tiles and the AVX2 ones (each skipped where it cannot run); numba's loops
    without the tiles (float BLAS products, compiled quantization); numba off."""
    if request.param in ("vnni", "avx2"):
        if not jit_int8.runnable(request.param):
            pytest.skip(f"no numba or no {request.param} here: its tiles do not run")
        monkeypatch.setattr(jit_int8, "_isa", request.param)
    elif request.param == "numba-no-tiles":
        if not jit.ENABLED:
            pytest.skip("numba not installed")
        monkeypatch.setattr(jit_int8, "_isa", "")
    else:
        monkeypatch.setattr(jit, "ENABLED", False)
    return request.param


def _model(
    k=48,
    n=21,
    b_dt=np.uint8,
    per_column=False,
    b_zp=True,
    bias=True,
    shared=False,
    escape=None,
    swapped=False,
):
    """x (2, 5, k) float32 through quantize_dynamic's pattern; ``shared`` adds a second
    product reading the same DynamicQuantizeLinear; ``escape`` makes an intermediate a
    graph output ("output") or gives it another reader ("consumer")."""
    rng = np.random.default_rng(k + n)
    lo, hi = np.iinfo(b_dt).min, np.iinfo(b_dt).max
    inits = []

    def const(name, value):
        inits.append(numpy_helper.from_array(np.asarray(value), name))
        return name

    def product(tag, out):
        b = const(f"b{tag}", rng.integers(lo, hi + 1, (k, n)).astype(b_dt))
        shape = (n,) if per_column else ()
        scale = rng.uniform(0.001, 0.01, shape).astype(np.float32)
        bs = const(f"bs{tag}", scale)
        ins = ["q", b, "z"]
        if b_zp:
            ins.append(const(f"bz{tag}", rng.integers(lo, hi + 1, shape).astype(b_dt)))
        nodes = [
            helper.make_node("MatMulInteger", ins, [f"acc{tag}"]),
            helper.make_node("Cast", [f"acc{tag}"], [f"f{tag}"], to=TensorProto.FLOAT),
            helper.make_node("Mul", ["s", bs] if not swapped else [bs, "s"], [f"m{tag}"]),
            helper.make_node(
                "Mul",
                [f"f{tag}", f"m{tag}"] if not swapped else [f"m{tag}", f"f{tag}"],
                [f"y{tag}" if bias else out],
            ),
        ]
        if bias:
            bv = const(f"bias{tag}", rng.standard_normal(n).astype(np.float32))
            nodes.append(
                helper.make_node("Add", [bv, f"y{tag}"] if swapped else [f"y{tag}", bv], [out])
            )
        return nodes

    nodes = [helper.make_node("DynamicQuantizeLinear", ["x"], ["q", "s", "z"])]
    nodes += product("", "out")
    outputs = ["out"]
    if shared:
        nodes += product("2", "out2")
        outputs.append("out2")
    if escape == "output":
        outputs.append("acc")
    elif escape == "consumer":
        nodes.append(helper.make_node("Neg", ["f"], ["neg"]))
        outputs.append("neg")
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 5, k])],
        [
            helper.make_tensor_value_info(
                o, TensorProto.INT32 if o == "acc" else TensorProto.FLOAT, None
            )
            for o in outputs
        ],
        inits,
    )
    model = helper.make_model(
        graph,
        opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)],
        ir_version=9,
    )
    return model


def _sessions(model, name=NAME):
    fused = onnxep.InferenceSession(model, providers=["cpu"])
    plain = onnxep.InferenceSession(
        model, onnxep.SessionOptions(disabled_rewrites=[name]), providers=["cpu"]
    )
    return fused, plain


def _report(sess, name=NAME):
    (rep,) = [f for f in sess.placement().fusions if f.name == name]
    return rep


def _x(k=48, seed=0):
    return {"x": np.random.default_rng(seed).standard_normal((2, 5, k)).astype(np.float32)}


def _same(fused, plain, feeds):
    for got, want in zip(fused.run(None, feeds), plain.run(None, feeds)):
        assert got.dtype == want.dtype and got.shape == want.shape
        assert got.tobytes() == want.tobytes()


@pytest.mark.parametrize(
    "kw",
    [
        {},
        {"bias": False},
        {"per_column": True},
        {"b_zp": False},
        {"b_dt": np.int8, "per_column": True},
        {"swapped": True},
        {"k": 5, "n": 1},
    ],
    ids=["bias", "no-bias", "per-column", "no-b-zero-point", "int8-b", "operands-swapped", "tiny"],
)
def test_quantize_dynamic_matmul_becomes_dynamic_quantize_matmul(kw, int_path):
    model = _model(**kw)
    fused, plain = _sessions(model)
    rep = _report(fused)
    rule = "dynamic_quantize_matmul" + ("_bias" if kw.get("bias", True) else "")
    assert (rep.fired, rep.by_rule, rep.exact) == (1, {rule: 1}, True)
    assert [n.op_type for n in fused.placement().nodes] == ["DynamicQuantizeMatMul"]
    assert _report(plain).state == "off"
    k = kw.get("k", 48)
    for seed in range(3):
        _same(fused, plain, _x(k, seed))
    _same(fused, plain, {"x": np.zeros((2, 5, k), np.float32)})  # zero range: scale 0 vs 1
    feeds = _x(k, 9)
    ref_model, ref_feeds = ort_int8_reference.reference(model, feeds)
    ref = ort.InferenceSession(ref_model.SerializeToString(), providers=["CPUExecutionProvider"])
    np.testing.assert_allclose(fused.run(None, feeds)[0], ref.run(None, ref_feeds)[0], atol=1e-4)


def test_a_shared_quantization_becomes_matmul_integer_to_float(int_path):
    model = _model(shared=True, per_column=True)
    fused, plain = _sessions(model)
    assert _report(fused).by_rule == {"matmul_integer_to_float_bias": 2}
    ops = sorted(n.op_type for n in fused.placement().nodes)
    assert ops == ["DynamicQuantizeLinear", "MatMulIntegerToFloat", "MatMulIntegerToFloat"]
    for seed in range(3):
        _same(fused, plain, _x(48, seed))


@pytest.mark.parametrize(
    ("escape", "reason"), [("output", GRAPH_OUTPUT), ("consumer", ANOTHER_CONSUMER)]
)
def test_escaping_intermediates_are_refused(escape, reason):
    model = _model(escape=escape)
    fused, plain = _sessions(model)
    rep = _report(fused)
    assert rep.fired == 0
    assert reason in rep.refused, rep.refused
    _same(fused, plain, _x())


def test_a_per_row_scale_is_refused():
    """A scale of shape [rows, 1] broadcasts differently from the fused ops' per-column one."""
    model = _model()
    bs = next(i for i in model.graph.initializer if i.name == "bs")
    bs.CopyFrom(numpy_helper.from_array(np.full((5, 1), 0.01, np.float32), "bs"))
    fused, plain = _sessions(model)
    rep = _report(fused)
    assert rep.fired == 0
    assert any("B scale" in r for r in rep.refused), rep.refused
    _same(fused, plain, _x())


# -- ConvInteger -> Add -> Cast -> Mul ------------------------------------------------------

CONV = "fuse_conv_integer_to_float"


def _conv_model(
    x_dt=None,
    add="channel",
    scale="tensor",
    escape=None,
    swapped=False,
    c=5,
    o=6,
    kk=3,
    attrs=None,
):
    """x (2, c, 7, 6) float32 through DynamicQuantizeLinear (``x_dt`` None) or fed as 8-bit
    ``x_dt``, a ConvInteger with constant weights, then the rescale: ``add`` None, "scalar",
    "channel" ([1, O, 1, 1] computed at run time, as quantize_dynamic's bias is), "3d"
    ([O, 1, 1]) or "full" (one per element); ``scale`` "tensor" (the DynamicQuantizeLinear
    scale times a constant) or "channel"."""
    rng = np.random.default_rng(c * o + kk)
    inits, nodes = [], []

    def const(name, value):
        inits.append(numpy_helper.from_array(np.asarray(value), name))
        return name

    w = const("w", rng.integers(0, 256, (o, c, kk, kk)).astype(np.uint8))
    wz = const("wz", np.array(rng.integers(0, 256), np.uint8))
    if x_dt is None:
        nodes.append(helper.make_node("DynamicQuantizeLinear", ["x"], ["q", "s", "z"]))
        x_in = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, c, 7, 6])
        conv_in, s_in = ["q", w, "z", wz], "s"
    else:
        x_in = helper.make_tensor_value_info(
            "x", TensorProto.UINT8 if x_dt == np.uint8 else TensorProto.INT8, [2, c, 7, 6]
        )
        zx = const("zx", np.array(rng.integers(-100, 100), x_dt))
        conv_in, s_in = ["x", w, zx, wz], const("s", np.float32(0.02))
    attrs = attrs if attrs is not None else {"pads": [1, 1, 1, 1]}
    nodes.append(helper.make_node("ConvInteger", conv_in, ["acc"], **attrs))
    summed = "acc"
    if add is not None:
        summed = "summed"
        if add == "channel":  # a float bias quantized at run time, as quantize_dynamic does
            bias = const("bias", rng.standard_normal(o).astype(np.float32))
            nodes += [
                helper.make_node("Div", [bias, s_in], ["bq"]),
                helper.make_node("Cast", ["bq"], ["bi"], to=TensorProto.INT32),
                helper.make_node(
                    "Reshape", ["bi", const("bshape", np.array([1, -1, 1, 1]))], ["addend"]
                ),
            ]
            addend = "addend"
        else:
            shape = {"scalar": (), "3d": (o, 1, 1), "full": (1, o, 7, 6)}[add]
            addend = const("addend", rng.integers(-5000, 5000, shape).astype(np.int32))
        ins = [addend, "acc"] if swapped else ["acc", addend]
        nodes.append(helper.make_node("Add", ins, [summed]))
    nodes.append(helper.make_node("Cast", [summed], ["f"], to=TensorProto.FLOAT))
    ws = rng.uniform(0.001, 0.01, () if scale == "tensor" else (1, o, 1, 1)).astype(np.float32)
    nodes.append(helper.make_node("Mul", [s_in, const("ws", ws)], ["m"]))
    nodes.append(helper.make_node("Mul", ["m", "f"] if swapped else ["f", "m"], ["y"]))
    outputs = [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)]
    if escape == "output":
        outputs.append(helper.make_tensor_value_info("acc", TensorProto.INT32, None))
    elif escape == "consumer":
        nodes.append(helper.make_node("Neg", ["f"], ["neg"]))
        outputs.append(helper.make_tensor_value_info("neg", TensorProto.FLOAT, None))
    graph = helper.make_graph(nodes, "g", [x_in], outputs, inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9)


def _conv_feeds(x_dt, seed, c=5):
    rng = np.random.default_rng(seed)
    if x_dt is None:
        return {"x": rng.standard_normal((2, c, 7, 6)).astype(np.float32)}
    lo, hi = np.iinfo(x_dt).min, np.iinfo(x_dt).max
    return {"x": rng.integers(lo, hi + 1, (2, c, 7, 6)).astype(x_dt)}


@pytest.mark.parametrize(
    "kw",
    [
        {},
        {"add": None},
        {"add": "scalar", "scale": "channel"},
        {"add": "3d", "swapped": True},
        {"add": "full"},
        {"x_dt": np.uint8},
        {"x_dt": np.int8, "scale": "channel"},
        {"kk": 1, "attrs": {"strides": [2, 2]}},
    ],
    ids=[
        "channel-bias",
        "no-add",
        "scalar-add-channel-scale",
        "3d-add-swapped",
        "full-add",
        "uint8-x",
        "int8-x",
        "1x1-strided",
    ],
)
@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # the zero input's bias: x / 0
def test_conv_integer_rescale_becomes_conv_integer_to_float(kw, int_path, monkeypatch):
    model = _conv_model(**kw)
    scaled = []
    real = vnni_gemm.PackedConv.run
    monkeypatch.setattr(
        vnni_gemm.PackedConv,
        "run",
        lambda self, *a: scaled.append(a[-1] is not None) or real(self, *a),
    )
    fused, plain = _sessions(model, CONV)
    rep = _report(fused, CONV)
    assert (rep.fired, rep.exact) == (1, True), rep.refused
    assert "ConvIntegerToFloat" in [n.op_type for n in fused.placement().nodes]
    assert _report(plain, CONV).state == "off"
    for seed in range(3):
        _same(fused, plain, _conv_feeds(kw.get("x_dt"), seed))
    # the tiles write the rescaled result when the add and scale are per channel
    assert any(scaled) == (int_path in ("vnni", "avx2") and kw.get("add", "channel") != "full")
    if kw.get("x_dt") is None:
        _same(fused, plain, {"x": np.zeros((2, 5, 7, 6), np.float32)})
        feeds = _conv_feeds(None, 9)
        ref_model, ref_feeds = ort_int8_reference.reference(model, feeds)
        ref = ort.InferenceSession(
            ref_model.SerializeToString(), providers=["CPUExecutionProvider"]
        )
        got = fused.run(None, feeds)[0]
        np.testing.assert_allclose(got, ref.run(None, ref_feeds)[0], atol=1e-4)


@pytest.mark.parametrize(
    ("escape", "reason"), [("output", GRAPH_OUTPUT), ("consumer", ANOTHER_CONSUMER)]
)
def test_conv_escaping_intermediates_are_refused(escape, reason):
    model = _conv_model(escape=escape)
    fused, plain = _sessions(model, CONV)
    rep = _report(fused, CONV)
    assert rep.fired == 0
    assert reason in rep.refused, rep.refused
    _same(fused, plain, _conv_feeds(None, 0))
