"""Convolution, pooling, image and signal kernels beyond the node suite.

Parity with onnxruntime on attribute combinations the backend cases leave out
(groups, depthwise, auto_pad, dilations with ceil_mode, N-D, narrow dtypes),
the CPU overrides against the generic kernels they replace, and the edge
rules (GlobalMaxPool keeps every dim, ImageDecoder declines without Pillow).
"""

from __future__ import annotations

import sys

import numpy as np
import pytest
from onnx import TensorProto, helper

import onnxep
from onnxep.errors import NotSupported
from onnxep.providers.dtypes import elem_type
from onnxep.providers.node import NodeInfo, ValueInfo

ort = pytest.importorskip("onnxruntime")


def _model(op, inputs, attrs, opset, nout, out_elem):
    names = ["" if a is None else f"x{i}" for i, a in enumerate(inputs)]
    outs = [f"y{j}" for j in range(nout)]
    node = helper.make_node(op, names, outs, **attrs)
    g_in = [
        helper.make_tensor_value_info(n, elem_type(a.dtype), list(a.shape))
        for n, a in zip(names, inputs)
        if a is not None
    ]
    g_out = [helper.make_tensor_value_info(o, e, None) for o, e in zip(outs, out_elem)]
    model = helper.make_model(
        helper.make_graph([node], "g", g_in, g_out),
        opset_imports=[helper.make_opsetid("", opset)],
    )
    model.ir_version = 10
    feed = {n: a for n, a in zip(names, inputs) if a is not None}
    return model.SerializeToString(), feed


def run_both(op, inputs, attrs=None, opset=19, nout=1, out_elem=None):
    out_elem = out_elem or [elem_type(inputs[0].dtype)] * nout
    blob, feed = _model(op, inputs, attrs or {}, opset, nout, out_elem)
    want = ort.InferenceSession(blob, providers=["CPUExecutionProvider"]).run(None, feed)
    got = onnxep.InferenceSession(blob, providers=["cpu"]).run(None, feed)
    return want, got


def assert_parity(op, inputs, attrs=None, tol=1e-4, **kw):
    want, got = run_both(op, inputs, attrs, **kw)
    for w, g in zip(want, got):
        assert g.shape == w.shape and g.dtype == w.dtype
        np.testing.assert_allclose(g.astype(np.float64), w.astype(np.float64), rtol=tol, atol=tol)


def f32(rng, *shape):
    return rng.standard_normal(shape).astype(np.float32)


CONV_CASES = [
    ((1, 3, 32, 32), (16, 3, 7, 7), dict(strides=[2, 2], pads=[3, 3, 3, 3])),
    ((2, 8, 9, 10), (6, 4, 3, 2), dict(group=2, auto_pad="SAME_LOWER", strides=[2, 3])),
    ((1, 8, 9, 10), (8, 1, 3, 3), dict(group=8, pads=[1, 1, 1, 1], strides=[2, 2])),
    ((2, 8, 9, 10), (8, 1, 3, 3), dict(group=8, pads=[2, 2, 2, 2], dilations=[2, 2])),
    ((1, 8, 9, 10), (16, 8, 1, 1), {}),
    ((1, 4, 11), (5, 4, 3), dict(strides=[2], dilations=[2], pads=[1, 2])),
    ((1, 6, 5, 6, 7), (6, 2, 2, 3, 2), dict(group=3, pads=[1, 0, 1, 0, 2, 1])),
    ((1, 4, 9, 10), (6, 4, 3, 3), dict(pads=[1, 2, 0, 1], dilations=[2, 1])),
    ((1, 3, 16, 16), (8, 3, 3, 3), dict(pads=[1, 1, 1, 1])),
]


@pytest.mark.parametrize("xs,ws,attrs", CONV_CASES)
def test_conv_parity(rng, xs, ws, attrs):
    assert_parity("Conv", [f32(rng, *xs), f32(rng, *ws), f32(rng, ws[0])], attrs)


def _node(op, inputs, attrs, opset=19):
    vis = tuple(ValueInfo(f"x{i}", "tensor", a.dtype, a.shape) for i, a in enumerate(inputs))
    return NodeInfo(op, opset=opset, attrs=attrs, inputs=vis, outputs=(ValueInfo("y"),))


@pytest.mark.parametrize("xs,ws,attrs", CONV_CASES)
def test_cpu_conv_matches_generic(rng, xs, ws, attrs):
    from onnxep.providers.ops.op_conv import conv as generic
    from onnxep.providers_cpu.ops.op_conv import conv as cpu

    x, w = f32(rng, *xs), f32(rng, *ws)
    node = _node("Conv", [x, w], attrs)
    np.testing.assert_allclose(
        cpu(node, np)(x, w)[0], generic(node, np)(x, w)[0], rtol=1e-4, atol=1e-4
    )


def test_conv_float16(rng):
    x, w = f32(rng, 1, 4, 8, 8), f32(rng, 6, 4, 3, 3)
    got = onnxep.InferenceSession(
        _model("Conv", [x.astype(np.float16), w.astype(np.float16)], {}, 19, 1, [10])[0],
        providers=["cpu"],
    ).run(None, {"x0": x.astype(np.float16), "x1": w.astype(np.float16)})[0]
    want = run_both("Conv", [x, w])[0][0]
    assert got.dtype == np.float16
    np.testing.assert_allclose(got.astype(np.float32), want, rtol=2e-2, atol=2e-2)


POOL_CASES = [
    dict(kernel_shape=[3, 3], strides=[2, 2], ceil_mode=1),
    dict(kernel_shape=[3, 2], pads=[1, 0, 1, 1], dilations=[2, 2]),
    dict(kernel_shape=[3, 3], auto_pad="SAME_UPPER", strides=[2, 2]),
    dict(kernel_shape=[2, 3], auto_pad="SAME_LOWER", strides=[2, 2]),
    dict(kernel_shape=[3, 3], strides=[2, 3], pads=[1, 1, 1, 1], ceil_mode=1),
]


@pytest.mark.parametrize("attrs", POOL_CASES)
def test_pool_parity(rng, attrs):
    x = f32(rng, 2, 3, 9, 10)
    assert_parity("MaxPool", [x], attrs)
    assert_parity("MaxPool", [x], attrs, nout=2, out_elem=[TensorProto.FLOAT, TensorProto.INT64])
    assert_parity(
        "MaxPool",
        [x],
        {**attrs, "storage_order": 1},
        nout=2,
        out_elem=[TensorProto.FLOAT, TensorProto.INT64],
    )
    assert_parity("MaxPool", [(x * 40).astype(np.int8)], attrs, opset=22)
    assert_parity("AveragePool", [x], {**attrs, "count_include_pad": 1})
    assert_parity("AveragePool", [x], attrs)
    assert_parity("LpPool", [x], {**attrs, "p": 3}, opset=18)


@pytest.mark.parametrize("shape", [(2, 3, 5), (2, 3, 4, 5), (1, 2, 3, 4, 5)])
@pytest.mark.parametrize("op", ["GlobalMaxPool", "GlobalAveragePool", "GlobalLpPool"])
def test_global_pools_keep_every_dim(rng, op, shape):
    want, got = run_both(op, [f32(rng, *shape)])
    assert got[0].shape == shape[:2] + (1,) * (len(shape) - 2)
    np.testing.assert_allclose(got[0], want[0], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(
    "xs,attrs",
    [
        ((1, 4, 5), dict(strides=[2], output_padding=[1])),
        ((2, 4, 5, 6), dict(group=2, strides=[2, 3], pads=[1, 0, 0, 1], dilations=[1, 2])),
        ((1, 4, 5, 6), dict(strides=[2, 2], output_shape=[11, 12])),
        ((1, 4, 5, 6), dict(strides=[2, 2], auto_pad="SAME_UPPER")),
        ((1, 2, 3, 4, 5), dict(strides=[2, 1, 2])),
    ],
)
def test_conv_transpose_parity(rng, xs, attrs):
    k = [3, 2] if len(xs) == 4 else [3] * (len(xs) - 2)
    g = attrs.get("group", 1)
    assert_parity("ConvTranspose", [f32(rng, *xs), f32(rng, xs[1], 3, *k), f32(rng, 3 * g)], attrs)


def test_resize_variants(rng):
    x = f32(rng, 1, 2, 5, 7)
    sc = np.array([1, 1, 0.6, 1.7], np.float32)
    for mode in ("nearest", "linear", "cubic"):
        assert_parity("Resize", [x, None, sc], dict(mode=mode))
        assert_parity(
            "Resize", [x, None, np.array([0.6, 1.7], np.float32)], dict(mode=mode, axes=[3, 2])
        )
        for policy in ("not_larger", "not_smaller"):
            attrs = dict(mode=mode, axes=[2, 3], keep_aspect_ratio_policy=policy)
            assert_parity("Resize", [x, None, None, np.array([4, 4], np.int64)], attrs)
        roi = np.array([0, 0, 0.1, 0.2, 1, 1, 0.8, 1.2], np.float32)
        attrs = dict(
            mode=mode, coordinate_transformation_mode="tf_crop_and_resize", extrapolation_value=-3.0
        )
        assert_parity("Resize", [x, roi, None, np.array([1, 2, 4, 6], np.int64)], attrs)
    big = f32(rng, 1, 2, 20, 21)
    for mode in ("linear", "cubic"):
        sc = np.array([1, 1, 0.3, 0.6], np.float32)
        assert_parity("Resize", [big, None, sc], dict(mode=mode, antialias=1))
    img = (rng.random((1, 3, 6, 7)) * 255).astype(np.uint8)
    want, got = run_both(
        "Resize", [img, None, np.array([1, 1, 1.5, 0.6], np.float32)], dict(mode="linear")
    )
    assert got[0].dtype == np.uint8
    assert np.abs(got[0].astype(int) - want[0].astype(int)).max() <= 1


@pytest.mark.parametrize("mode", ["linear", "nearest", "cubic"])
@pytest.mark.parametrize("pad", ["zeros", "border", "reflection"])
def test_grid_sample_parity(rng, mode, pad):
    for ac in (0, 1):
        attrs = dict(mode=mode, padding_mode=pad, align_corners=ac)
        assert_parity(
            "GridSample", [f32(rng, 2, 3, 5, 6), f32(rng, 2, 4, 7, 2) * 0.8], attrs, opset=20
        )
        if mode != "cubic":
            x3, g3 = f32(rng, 1, 2, 4, 5, 6), f32(rng, 1, 3, 2, 4, 3) * 0.8
            assert_parity("GridSample", [x3, g3], attrs, opset=20)


@pytest.mark.parametrize("mode", ["avg", "max"])
def test_roi_align_adaptive_grid(rng, mode):
    x = f32(rng, 2, 3, 10, 12)
    rois = np.array([[0.5, 1.2, 7.3, 8.1], [-1, -1, 11, 14], [4, 3, 9, 6]], np.float32)
    batch = np.array([0, 1, 0], np.int64)
    for ctm in ("half_pixel", "output_half_pixel"):
        attrs = dict(
            mode=mode,
            coordinate_transformation_mode=ctm,
            output_height=3,
            output_width=4,
            spatial_scale=0.8,
        )
        assert_parity("RoiAlign", [x, rois, batch], attrs, opset=16)


def test_dft_length_and_axis(rng):
    x = f32(rng, 2, 8, 6, 1)
    blob, feed = _model(
        "DFT", [x, np.array(7, np.int64), np.array(1, np.int64)], {}, 20, 1, [TensorProto.FLOAT]
    )
    got = onnxep.InferenceSession(blob, providers=["cpu"]).run(None, feed)[0]
    want = np.fft.fft(x[..., 0], n=7, axis=1)
    np.testing.assert_allclose(got[..., 0], want.real, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(got[..., 1], want.imag, rtol=1e-4, atol=1e-4)


def test_image_decoder_declines_without_pillow(monkeypatch):
    from onnxep.providers_cpu.ops.op_image_decoder import image_decoder

    monkeypatch.setitem(sys.modules, "PIL", None)  # makes "from PIL import Image" fail
    node = NodeInfo(
        "ImageDecoder", opset=20, inputs=(ValueInfo("x", "tensor", np.dtype(np.uint8)),)
    )
    with pytest.raises(NotSupported, match="Pillow"):
        image_decoder(node, np)


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("n", [1, 3])
@pytest.mark.parametrize("xs,ws,attrs", CONV_CASES)
def test_conv_constant_weights_and_bias(rng, n, xs, ws, attrs, bias):
    """Initializer weights take the packed path (bias folded into the GEMM when group is 1)."""
    from onnx import numpy_helper

    x, w, b = f32(rng, n, *xs[1:]), f32(rng, *ws), f32(rng, ws[0])
    node = helper.make_node("Conv", ["x", "w", "b"] if bias else ["x", "w"], ["y"], **attrs)
    graph = helper.make_graph(
        [node],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(x.shape))],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [numpy_helper.from_array(w, "w"), numpy_helper.from_array(b, "b")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 19)])
    model.ir_version = 10
    blob = model.SerializeToString()
    want = ort.InferenceSession(blob, providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    sess = onnxep.InferenceSession(blob, providers=["cpu"])
    for _ in range(2):  # the first run tunes the GEMM split, the second uses it
        got = sess.run(None, {"x": x})[0]
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize(
    "act,params",
    [
        ("Relu", None),
        ("LeakyRelu", [0.2]),
        ("Sigmoid", None),
        ("Tanh", None),
        ("Clip", [-0.5, 0.7]),
        ("HardSigmoid", [0.3, 0.4]),
        ("", None),
    ],
)
@pytest.mark.parametrize("with_z", [False, True])
def test_fused_conv_parity(rng, act, params, with_z):
    from onnx import numpy_helper

    x, w, b = f32(rng, 2, 4, 9, 10), f32(rng, 6, 4, 3, 3), f32(rng, 6)
    z = f32(rng, 2, 6, 9, 10)
    attrs = dict(kernel_shape=[3, 3], pads=[1, 1, 1, 1])
    if act:
        attrs["activation"] = act
    if params:
        attrs["activation_params"] = params
    ins = ["x", "w", "b", "z"] if with_z else ["x", "w", "b"]
    node = helper.make_node("FusedConv", ins, ["y"], domain="com.microsoft", **attrs)
    g_in = [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(x.shape))]
    if with_z:
        g_in.append(helper.make_tensor_value_info("z", TensorProto.FLOAT, list(z.shape)))
    graph = helper.make_graph(
        [node],
        "g",
        g_in,
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [numpy_helper.from_array(w, "w"), numpy_helper.from_array(b, "b")],
    )
    model = helper.make_model(
        graph,
        opset_imports=[helper.make_opsetid("", 19), helper.make_opsetid("com.microsoft", 1)],
    )
    model.ir_version = 10
    blob = model.SerializeToString()
    feed = {"x": x, "z": z} if with_z else {"x": x}
    want = ort.InferenceSession(blob, providers=["CPUExecutionProvider"]).run(None, feed)[0]
    got = onnxep.InferenceSession(blob, providers=["cpu"]).run(None, feed)[0]
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize(
    "xs,ws,pads,dil",
    [
        ((1, 4, 9, 10), (6, 4, 3, 3), [1, 2, 0, 1], [2, 1]),
        ((1, 3, 16, 16), (8, 3, 3, 3), [1, 1, 1, 1], [1, 1]),
        ((1, 5, 7, 6), (4, 5, 2, 3), [0, 0, 0, 0], [1, 2]),
    ],
)
def test_cpu_conv_wide_and_standard_im2col_agree(rng, xs, ws, pads, dil):
    """Both stride-1 im2col layouts the CPU Conv times against each other give the same result."""
    from onnxep.providers_cpu.ops.nn_cpu import Scratch, TunedMatmul
    from onnxep.providers_cpu.ops.op_conv import im2col_standard, im2col_wide

    x, w, b = f32(rng, *xs), f32(rng, *ws), f32(rng, ws[0])
    k = list(ws[2:])
    oh = xs[2] + pads[0] + pads[2] - ((k[0] - 1) * dil[0] + 1) + 1
    ow = xs[3] + pads[1] + pads[3] - ((k[1] - 1) * dil[1] + 1) + 1
    aug = TunedMatmul(np.concatenate([w.reshape(ws[0], -1), b[:, None]], axis=1))
    args = (k, dil, pads[:2], pads[2:], (oh, ow), ws[0])
    scratch = Scratch()
    for _ in range(2):  # the second run reuses the scratch buffers
        wide = im2col_wide(scratch, x, aug, *args)
        std = im2col_standard(scratch, x, aug, k, [1, 1], *args[1:])
        np.testing.assert_allclose(wide, std, rtol=1e-5, atol=1e-5)
    want = run_both("Conv", [x, w, b], dict(pads=pads, dilations=dil))[0][0]
    np.testing.assert_allclose(wide, want, rtol=1e-4, atol=1e-4)


def test_conv_empty_batch_matches_onnxruntime():
    """A batch of 0 gives the empty result (the im2col sizing used to divide by zero)."""
    import onnxruntime as ort

    path = "tests/data/resnet_cnn.onnx"
    sess = onnxep.InferenceSession(path, providers=["cpu"])
    name = sess.get_inputs()[0].name
    shape = [0 if not isinstance(d, int) else d for d in sess.get_inputs()[0].shape]
    x = np.zeros(shape, np.float32)
    got = sess.run(None, {name: x})[0]
    ref = ort.InferenceSession(path, providers=["CPUExecutionProvider"]).run(None, {name: x})[0]
    assert got.shape == ref.shape and got.dtype == ref.dtype
