"""The cuDNN path's arithmetic and glue, on the CPU (no GPU, no cuDNN here).

Three layers:

- ``conv_plan`` alone: the geometry it hands cuDNN must reproduce, through cuDNN's own
  output-size rule (floor((n + 2p - dk) / s) + 1, symmetric pads), the output shape
  onnxruntime computes for the same node, on a grid of attributes; and the cases it
  refuses say why.
- The CUDA kernels themselves (``providers_cuda/ops``) on NumPy arrays, with
  ``providers_cuda.dnn``'s classes replaced by a NumPy stand-in that does exactly
  what cuDNN's legacy calls do for a descriptor (symmetric pads only, exact buffer
  shapes checked as the real classes check them): the explicit padding, the 1-D lift,
  the ConvTranspose crop, the bias and the fused activations are then checked
  against onnxruntime's CPU provider in the same test.
- The library loader: a clear reason when libcudnn cannot be found.
"""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

from onnxep.providers.node import NodeInfo, ValueInfo
from onnxep.providers.ops import op_average_pool as g_avg
from onnxep.providers.ops import op_conv as g_conv
from onnxep.providers.ops import op_conv_transpose as g_convt
from onnxep.providers.ops import op_max_pool as g_max
from onnxep.providers_cuda import dnn, dnn_library
from onnxep.providers_cuda.ops import conv_plan as P

# -- onnxruntime as the reference -------------------------------------------------------


def _ort(op, inputs, attrs, n_out=1, domain=""):
    names = [f"i{k}" for k in range(len(inputs))]
    node = helper.make_node(
        op, names, [f"o{k}" for k in range(n_out)], domain=domain or None, **attrs
    )
    dt = TensorProto.FLOAT16 if inputs[0].dtype == np.float16 else TensorProto.FLOAT
    graph = helper.make_graph(
        [node],
        "g",
        [helper.make_tensor_value_info(n, dt, a.shape) for n, a in zip(names, inputs)],
        [
            helper.make_tensor_value_info(f"o{k}", TensorProto.INT64 if k else dt, None)
            for k in range(n_out)
        ],
    )
    opsets = [helper.make_opsetid("", 19)]
    if domain:
        opsets.append(helper.make_opsetid(domain, 1))
    model = helper.make_model(graph, opset_imports=opsets)
    model.ir_version = 9
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return sess.run(None, dict(zip(names, inputs)))


def node_info(op, attrs, inputs, n_out=1, domain=""):
    return NodeInfo(
        op_type=op,
        domain=domain,
        name=f"{op}_0",
        opset=19,
        attrs=attrs,
        inputs=tuple(
            ValueInfo(f"i{k}", "tensor", a.dtype, tuple(a.shape)) for k, a in enumerate(inputs)
        ),
        outputs=tuple(ValueInfo(f"o{k}", "tensor") for k in range(n_out)),
    )


# -- a NumPy cuDNN: what the legacy calls compute for one descriptor ---------------------


def _sym(pads):
    return list(pads) + list(pads)


class FakeConvForward:
    instances: list = []

    def __init__(self, geom, dtype):
        self.geom, self.dtype, self.algo = geom, dtype, None
        g = geom
        attrs = {
            "group": g.group,
            "strides": list(g.strides),
            "dilations": list(g.dilations),
            "pads": _sym(g.pads),
            "kernel_shape": list(g.w_shape[2:]),
        }
        x = np.zeros(g.x_shape, np.float32)
        w = np.zeros(g.w_shape, np.float32)
        self._conv = g_conv.conv(node_info("Conv", attrs, [x, w]), np)
        FakeConvForward.instances.append(self)

    def _run(self, x, w):
        assert x.shape == self.geom.x_shape and x.flags.c_contiguous, (x.shape, self.geom)
        assert w.shape == self.geom.w_shape and w.flags.c_contiguous
        assert x.dtype.name == self.dtype == w.dtype.name
        self.algo = 1
        (y,) = self._conv(x, w)
        assert y.shape == self.geom.y_shape, (y.shape, self.geom.y_shape)
        return np.ascontiguousarray(y)

    def __call__(self, x, w):
        return self._run(x, w)

    def bias_activation(self, x, w, bias, mode, coef=0.0):
        assert bias.shape == (self.geom.y_shape[1],)
        y = self._run(x, w) + bias.reshape(1, -1, *([1] * (len(self.geom.y_shape) - 2)))
        if mode == dnn.ACT_RELU:
            return np.maximum(y, 0).astype(x.dtype)
        if mode == dnn.ACT_CLIPPED_RELU:
            return np.clip(y, 0, coef).astype(x.dtype)
        raise AssertionError(mode)


class FakeBackwardData:
    def __init__(self, geom, dtype):
        self.geom, self.dtype, self.algo = geom, dtype, None
        g = geom
        # The data gradient of conv(dx; p, s, d) is ConvTranspose(dy; pads p, p) whose
        # output has dx's size: output_padding makes up the remainder (< stride).
        sp = len(g.strides)
        n_in, d_sz = g.x_shape[2:], g.dx_shape[2:]
        dk = [(k - 1) * d + 1 for k, d in zip(g.w_shape[2:], g.dilations)]
        out_pad = [
            D - (s * (n - 1) + k - 2 * p)
            for D, s, n, k, p in zip(d_sz, g.strides, n_in, dk, g.pads)
        ]
        assert all(0 <= r < s for r, s in zip(out_pad, g.strides)), out_pad
        attrs = {
            "group": g.group,
            "strides": list(g.strides),
            "dilations": list(g.dilations),
            "pads": _sym(g.pads),
            "output_padding": out_pad,
            "kernel_shape": list(g.w_shape[2:]),
        }
        x = np.zeros(g.x_shape, np.float32)
        w = np.zeros(g.w_shape, np.float32)
        assert sp == len(out_pad)
        self._convt = g_convt.conv_transpose(node_info("ConvTranspose", attrs, [x, w]), np)

    def __call__(self, dy, w):
        assert dy.shape == self.geom.x_shape and dy.flags.c_contiguous
        assert w.shape == self.geom.w_shape and w.flags.c_contiguous
        self.algo = 1
        (dx,) = self._convt(dy, w)
        assert dx.shape == self.geom.dx_shape, (dx.shape, self.geom.dx_shape)
        return np.ascontiguousarray(dx)


class FakePooling:
    def __init__(self, geom, dtype):
        self.geom, self.dtype = geom, dtype
        attrs = {
            "kernel_shape": list(geom.window),
            "strides": list(geom.strides),
            "pads": _sym(geom.pads),
        }
        x = np.zeros(geom.x_shape, np.float32)
        if geom.mode == "max":
            self._pool = g_max.max_pool(node_info("MaxPool", attrs, [x]), np)
        else:
            attrs["count_include_pad"] = int(geom.mode == "avg_include")
            self._pool = g_avg.average_pool(node_info("AveragePool", attrs, [x]), np)

    def __call__(self, x):
        assert x.shape == self.geom.x_shape and x.flags.c_contiguous, (x.shape, self.geom)
        (y,) = self._pool(x)
        assert y.shape == self.geom.y_shape
        return np.ascontiguousarray(y)


class FakeBiasAdd:
    def __init__(self, shape, dtype):
        self.shape = tuple(shape)

    def __call__(self, y, bias):
        assert y.shape == self.shape and y.flags.c_contiguous and bias.shape == (self.shape[1],)
        y += bias.reshape(1, -1, *([1] * (len(self.shape) - 2)))
        return y


@pytest.fixture
def fake_cudnn(monkeypatch):
    monkeypatch.setattr(dnn, "unavailable_reason", lambda: None)
    monkeypatch.setattr(dnn, "ConvForward", FakeConvForward)
    monkeypatch.setattr(dnn, "ConvBackwardData", FakeBackwardData)
    monkeypatch.setattr(dnn, "Pooling", FakePooling)
    monkeypatch.setattr(dnn, "BiasAdd", FakeBiasAdd)
    FakeConvForward.instances = []


def _cuda_kernel(module, name, node):
    import importlib

    mod = importlib.import_module(f"onnxep.providers_cuda.ops.{module}")
    return getattr(mod, name)(node, np)


# -- conv_plan against onnxruntime's shapes ----------------------------------------------


def _floor_out(n, p, k, d, s):
    return (n + 2 * p - ((k - 1) * d + 1)) // s + 1


CONV_GRID = [
    # (x spatial, kernel, strides, dilations, pads or auto_pad, group, channels in/out)
    ((9,), (3,), (1,), (1,), (1, 1), 1, (2, 4)),
    ((10,), (4,), (2,), (1,), (0, 3), 2, (4, 6)),
    ((11,), (4,), (2,), (1,), "SAME_UPPER", 1, (3, 2)),
    ((8, 7), (3, 3), (1, 1), (1, 1), (1, 1, 1, 1), 1, (3, 4)),
    ((8, 8), (3, 3), (2, 2), (1, 1), "SAME_UPPER", 1, (2, 3)),
    ((8, 8), (3, 3), (2, 2), (1, 1), "SAME_LOWER", 1, (2, 3)),
    ((9, 6), (2, 3), (2, 1), (1, 2), (0, 1, 1, 2), 2, (4, 4)),
    ((7, 7), (3, 3), (1, 1), (1, 1), (1, 1, 1, 1), 4, (4, 4)),  # depthwise
    ((7, 7), (3, 3), (1, 1), (1, 1), (1, 1, 1, 1), 4, (4, 8)),  # depthwise, multiplier 2
    ((6, 6), (2, 2), (1, 1), (1, 1), "VALID", 1, (2, 2)),
    ((5, 6, 4), (3, 3, 2), (1, 2, 1), (1, 1, 1), (1, 0, 1, 1, 1, 0), 1, (2, 3)),
    ((6, 5, 5), (3, 3, 3), (2, 1, 1), (1, 1, 1), "SAME_UPPER", 2, (2, 4)),
]


def conv_attrs(kernel, strides, dil, pads, group):
    attrs = {"kernel_shape": list(kernel), "strides": list(strides), "dilations": list(dil)}
    attrs["group"] = group
    if isinstance(pads, str):
        attrs["auto_pad"] = pads
    else:
        attrs["pads"] = list(pads)
    return attrs


@pytest.mark.parametrize("case", CONV_GRID, ids=lambda c: f"{len(c[0])}d-{c[4]}-g{c[5]}")
def test_conv_geometry_gives_onnxruntimes_shape_through_cudnns_rule(case):
    sp, kernel, strides, dil, pads, group, (c, m) = case
    rng = np.random.default_rng(0)
    x = rng.standard_normal((2, c, *sp)).astype(np.float32)
    w = rng.standard_normal((m, c // group, *kernel)).astype(np.float32)
    attrs = conv_attrs(kernel, strides, dil, pads, group)
    (ref,) = _ort("Conv", [x, w], attrs)
    nsp = len(sp)
    pb = list(attrs.get("pads", [0] * 2 * nsp))
    g = P.conv_geometry(
        x.shape,
        w.shape,
        group=group,
        kernel_shape=kernel,
        strides=strides,
        dilations=dil,
        pads_begin=pb[:nsp],
        pads_end=pb[nsp:],
        auto_pad=attrs.get("auto_pad", "NOTSET"),
    )
    assert not isinstance(g, str), g
    assert g.out_shape == ref.shape
    assert len(g.x_shape) == len(g.y_shape) == len(g.w_shape) == max(nsp, 2) + 2
    assert g.lifted == (nsp == 1)
    # cuDNN's own output size from the geometry (symmetric pads) is the ONNX one.
    for n, p, k, d, s, o in zip(g.x_shape[2:], g.pads, g.w_shape[2:], g.dilations, g.strides,
                                g.y_shape[2:]):  # fmt: skip
        assert _floor_out(n, p, k, d, s) == o
    assert int(np.prod(g.y_shape)) == int(np.prod(ref.shape))


def test_conv_geometry_splits_asymmetric_pads_into_symmetric_and_explicit():
    g = P.conv_geometry(
        (1, 1, 8, 8),
        (1, 1, 3, 3),
        group=1,
        kernel_shape=None,
        strides=(2, 2),
        dilations=(1, 1),
        pads_begin=(0, 2),
        pads_end=(1, 0),
        auto_pad="NOTSET",
    )
    assert g.pads == (0, 0) and g.pre_pad == ((0, 1), (2, 0)) and g.x_shape == (1, 1, 9, 10)
    g = P.conv_geometry(
        (1, 1, 8, 8),
        (1, 1, 3, 3),
        group=1,
        kernel_shape=None,
        strides=(1, 1),
        dilations=(1, 1),
        pads_begin=(1, 1),
        pads_end=(1, 1),
        auto_pad="NOTSET",
    )
    assert g.pads == (1, 1) and g.pre_pad is None and g.x_shape == (1, 1, 8, 8)


@pytest.mark.parametrize(
    ("x", "w", "group", "needle"),
    [
        ((1, 3, 8, 8), (4, 2, 3, 3), 1, "do not match"),  # channels
        ((1, 4, 8, 8), (3, 2, 3, 3), 2, "do not match"),  # M not divisible by group
        ((1, 2, 2, 2), (1, 2, 3, 3), 1, "fewer than the kernel"),  # input too small
        ((1, 2, 4, 4, 4, 4), (1, 2, 1, 1, 1, 1), 1, "4 spatial dims"),
        ((0, 2, 4, 4), (1, 2, 1, 1), 1, "empty"),
    ],
)
def test_conv_geometry_refuses_with_a_reason(x, w, group, needle):
    nsp = len(x) - 2
    g = P.conv_geometry(
        x,
        w,
        group=group,
        kernel_shape=None,
        strides=[1] * nsp,
        dilations=[1] * nsp,
        pads_begin=[0] * nsp,
        pads_end=[0] * nsp,
        auto_pad="NOTSET",
    )
    assert isinstance(g, str) and needle in g, g


TRANSPOSE_GRID = [
    # (x spatial, kernel, strides, dilations, extra attrs, group, (C, M/group))
    ((5,), (3,), (2,), (1,), {}, 1, (2, 3)),
    ((5,), (4,), (2,), (1,), {"pads": [1, 2], "output_padding": [1]}, 1, (2, 2)),
    ((4, 5), (3, 3), (2, 2), (1, 1), {"pads": [1, 1, 1, 1], "output_padding": [1, 1]}, 1, (2, 3)),
    ((4, 4), (3, 3), (2, 2), (1, 1), {"pads": [0, 1, 2, 0]}, 2, (4, 2)),
    ((4, 4), (2, 2), (2, 2), (1, 1), {}, 1, (3, 2)),  # the U-Net upsampler
    ((3, 4), (3, 3), (1, 2), (1, 1), {"auto_pad": "SAME_UPPER"}, 1, (2, 2)),
    ((3, 4), (3, 3), (2, 2), (1, 1), {"auto_pad": "SAME_LOWER"}, 1, (2, 2)),
    ((3, 3), (3, 3), (2, 2), (1, 1), {"output_shape": [7, 6]}, 1, (2, 2)),
    ((3, 3), (3, 3), (2, 2), (1, 1), {"output_shape": [6, 5]}, 1, (2, 2)),
    ((3, 3, 2), (2, 3, 2), (2, 1, 2), (1, 1, 1), {"pads": [0, 1, 0, 1, 0, 1]}, 1, (2, 2)),
]


def transpose_attrs(x, w, kernel, strides, dil, extra, group):
    attrs = {"kernel_shape": list(kernel), "strides": list(strides), "dilations": list(dil)}
    attrs.update(group=group, **extra)
    return attrs


@pytest.mark.parametrize("case", TRANSPOSE_GRID, ids=lambda c: f"{len(c[0])}d-{sorted(c[4])}")
def test_conv_transpose_geometry_gives_onnxruntimes_shape(case):
    sp, kernel, strides, dil, extra, group, (c, mg) = case
    rng = np.random.default_rng(1)
    x = rng.standard_normal((2, c, *sp)).astype(np.float32)
    w = rng.standard_normal((c, mg, *kernel)).astype(np.float32)
    attrs = transpose_attrs(x, w, kernel, strides, dil, extra, group)
    (ref,) = _ort("ConvTranspose", [x, w], attrs)
    node = node_info("ConvTranspose", attrs, [x, w])
    grp, ksh, st, dl, geometry = g_convt.conv_transpose_setup(node)
    full, pb, pe = geometry(list(sp), list(kernel))
    g = P.conv_transpose_geometry(
        x.shape,
        w.shape,
        group=grp,
        kernel_shape=ksh,
        strides=st,
        dilations=dl,
        full=full,
        pads_begin=pb,
        pads_end=pe,
    )
    assert not isinstance(g, str), g
    assert g.out_shape == ref.shape
    # The forward conv of dx (cuDNN's rule, symmetric pads) has x's size.
    for n, p, k, d, s, o in zip(g.dx_shape[2:], g.pads, g.w_shape[2:], g.dilations, g.strides,
                                g.x_shape[2:]):  # fmt: skip
        assert _floor_out(n, p, k, d, s) == o
    if g.crop is not None:
        dx_sp = g.dx_shape[3:] if g.lifted else g.dx_shape[2:]
        assert all(c0 + o <= d for c0, o, d in zip(g.crop, g.out_shape[2:], dx_sp))


POOL_GRID = [
    # (kind, x spatial, kernel, strides, pads or auto_pad, ceil_mode, count_include_pad)
    ("max", (9,), (3,), (2,), (1, 1), 0, 0),
    ("max", (8, 8), (3, 3), (2, 2), (1, 1, 1, 1), 0, 0),
    ("max", (8, 8), (3, 3), (2, 2), "SAME_UPPER", 0, 0),
    ("max", (7, 8), (2, 3), (2, 2), (0, 1, 1, 0), 1, 0),
    ("max", (7, 7), (3, 3), (2, 2), (0, 0, 0, 0), 1, 0),
    ("max", (5, 6, 4), (2, 2, 2), (2, 2, 2), (0, 0, 0, 0, 0, 0), 0, 0),
    ("avg", (8, 8), (3, 3), (1, 1), (1, 1, 1, 1), 0, 0),
    ("avg", (8, 8), (3, 3), (1, 1), (1, 1, 1, 1), 0, 1),
    ("avg", (8, 8), (3, 3), (2, 2), (0, 1, 1, 0), 0, 1),
    ("avg", (8, 8), (2, 2), (2, 2), (0, 0, 0, 0), 0, 0),
    ("avg", (7, 7), (3, 3), (2, 2), (1, 1, 1, 1), 1, 0),
    ("avg", (10,), (3,), (3,), (1, 1), 0, 1),
    ("avg", (4, 5, 6), (2, 3, 3), (1, 1, 2), (0, 1, 1, 0, 1, 1), 0, 1),
    # refused: asymmetric pads excluded from the count; ceil_mode cells past the pads
    ("avg", (8, 8), (3, 3), (2, 2), (0, 1, 1, 0), 0, 0),
    ("avg", (6, 6), (3, 3), (2, 2), (0, 0, 0, 0), 1, 1),
]


def pool_attrs(kernel, strides, pads, ceil, include, kind):
    attrs = {"kernel_shape": list(kernel), "strides": list(strides), "ceil_mode": ceil}
    if isinstance(pads, str):
        attrs["auto_pad"] = pads
    else:
        attrs["pads"] = list(pads)
    if kind == "avg":
        attrs["count_include_pad"] = include
    return attrs


def pool_plan(kind, shape, attrs):
    nsp = len(attrs["kernel_shape"])
    pads = attrs.get("pads", [0] * 2 * nsp)
    return P.pool_geometry_plan(
        kind,
        shape,
        kernel=attrs["kernel_shape"],
        strides=attrs["strides"],
        pads_begin=pads[:nsp],
        pads_end=pads[nsp:],
        ceil_mode=bool(attrs["ceil_mode"]),
        auto_pad=attrs.get("auto_pad", "NOTSET"),
        count_include_pad=bool(attrs.get("count_include_pad", 0)),
    )


@pytest.mark.parametrize("case", POOL_GRID, ids=lambda c: f"{c[0]}-{len(c[1])}d-{c[4]}-c{c[5]}")
def test_pool_plan_gives_onnxruntimes_shape_or_a_reason(case):
    kind, sp, kernel, strides, pads, ceil, include = case
    x = np.random.default_rng(2).standard_normal((1, 2, *sp)).astype(np.float32)
    attrs = pool_attrs(kernel, strides, pads, ceil, include, kind)
    (ref,) = _ort("MaxPool" if kind == "max" else "AveragePool", [x], attrs)
    g = pool_plan(kind, x.shape, attrs)
    if isinstance(g, str):
        # Only average pooling that would count explicit cells refuses on this grid.
        assert kind == "avg" and ("asymmetric" in g or "ceil_mode" in g), g
        return
    assert g.out_shape == ref.shape
    for n, p, k, s, o in zip(g.x_shape[2:], g.pads, g.window, g.strides, g.y_shape[2:]):
        assert (n + 2 * p - k) // s + 1 == o
        assert p < k


def test_pool_refusals_known_at_build_say_why():
    assert "Indices" in P.pool_attrs_refusal("MaxPool", None, want_indices=True)
    assert "dilations" in P.pool_attrs_refusal("MaxPool", [2, 2])
    assert P.pool_attrs_refusal("AveragePool", [1, 1]) is None


# -- the CUDA kernels on NumPy with the stand-in cuDNN ------------------------------------


@pytest.mark.parametrize("case", CONV_GRID, ids=lambda c: f"{len(c[0])}d-{c[4]}-g{c[5]}")
@pytest.mark.parametrize("bias", [False, True], ids=["nobias", "bias"])
def test_cuda_conv_kernel_matches_onnxruntime(fake_cudnn, case, bias):
    sp, kernel, strides, dil, pads, group, (c, m) = case
    rng = np.random.default_rng(3)
    x = rng.standard_normal((2, c, *sp)).astype(np.float32)
    w = rng.standard_normal((m, c // group, *kernel)).astype(np.float32)
    ins = [x, w] + ([rng.standard_normal(m).astype(np.float32)] if bias else [])
    attrs = conv_attrs(kernel, strides, dil, pads, group)
    (ref,) = _ort("Conv", ins, attrs)
    run = _cuda_kernel("op_conv", "conv", node_info("Conv", attrs, ins))
    (y,) = run(*ins)
    assert FakeConvForward.instances, "the cuDNN path was not taken"
    assert not run.cudnn.shapes.reasons
    np.testing.assert_allclose(y, ref, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize(
    ("act", "params"),
    [("Relu", None), ("Clip", [0.0, 6.0]), ("Clip", [-1.0, 1.0]), ("Sigmoid", None)],
)
@pytest.mark.parametrize("bias", [False, True], ids=["nobias", "bias"])
def test_cuda_fused_conv_kernel_matches_onnxruntime(fake_cudnn, act, params, bias):
    rng = np.random.default_rng(4)
    x = rng.standard_normal((1, 4, 7, 6)).astype(np.float32)
    w = rng.standard_normal((6, 2, 3, 3)).astype(np.float32)
    ins = [x, w] + ([rng.standard_normal(6).astype(np.float32)] if bias else [])
    attrs = {"kernel_shape": [3, 3], "pads": [1, 0, 1, 2], "group": 2, "activation": act}
    if params:
        attrs["activation_params"] = params
    (ref,) = _ort("FusedConv", ins, attrs, domain="com.microsoft")
    run = _cuda_kernel(
        "op_fused_conv", "fused_conv", node_info("FusedConv", attrs, ins, domain="com.microsoft")
    )
    (y,) = run(*ins)
    np.testing.assert_allclose(y, ref, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("case", TRANSPOSE_GRID, ids=lambda c: f"{len(c[0])}d-{sorted(c[4])}")
def test_cuda_conv_transpose_kernel_matches_onnxruntime(fake_cudnn, case):
    sp, kernel, strides, dil, extra, group, (c, mg) = case
    rng = np.random.default_rng(5)
    x = rng.standard_normal((2, c, *sp)).astype(np.float32)
    w = rng.standard_normal((c, mg, *kernel)).astype(np.float32)
    b = rng.standard_normal(mg * group).astype(np.float32)
    attrs = transpose_attrs(x, w, kernel, strides, dil, extra, group)
    (ref,) = _ort("ConvTranspose", [x, w, b], attrs)
    run = _cuda_kernel(
        "op_conv_transpose", "conv_transpose", node_info("ConvTranspose", attrs, [x, w, b])
    )
    (y,) = run(x, w, b)
    assert not run.cudnn.reasons, run.cudnn.reasons
    np.testing.assert_allclose(y, ref, rtol=1e-4, atol=1e-4)


def test_conv_transpose_past_its_full_output_goes_generic_and_says_why(fake_cudnn):
    # output_shape beyond the full output: ONNX pads zeros there; cuDNN has no such pad.
    rng = np.random.default_rng(9)
    x = rng.standard_normal((1, 2, 3, 3)).astype(np.float32)
    w = rng.standard_normal((2, 2, 3, 3)).astype(np.float32)
    attrs = {"kernel_shape": [3, 3], "strides": [2, 2], "output_shape": [8, 7]}
    (ref,) = _ort("ConvTranspose", [x, w], attrs)
    node = node_info("ConvTranspose", attrs, [x, w])
    run = _cuda_kernel("op_conv_transpose", "conv_transpose", node)
    (y,) = run(x, w)
    assert any("negative pads" in r for r in run.cudnn.reasons), run.cudnn.reasons
    np.testing.assert_allclose(y, ref, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("case", POOL_GRID, ids=lambda c: f"{c[0]}-{len(c[1])}d-{c[4]}-c{c[5]}")
def test_cuda_pool_kernels_match_onnxruntime(fake_cudnn, case):
    kind, sp, kernel, strides, pads, ceil, include = case
    x = np.random.default_rng(6).standard_normal((2, 3, *sp)).astype(np.float32)
    attrs = pool_attrs(kernel, strides, pads, ceil, include, kind)
    op = "MaxPool" if kind == "max" else "AveragePool"
    (ref,) = _ort(op, [x], attrs)
    module, fn = ("op_max_pool", "max_pool") if kind == "max" else ("op_average_pool",
                                                                    "average_pool")  # fmt: skip
    run = _cuda_kernel(module, fn, node_info(op, attrs, [x]))
    (y,) = run(x)
    went_generic = bool(run.cudnn.reasons)
    assert went_generic == isinstance(pool_plan(kind, x.shape, attrs), str)
    np.testing.assert_allclose(y, ref, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("op", ["GlobalAveragePool", "GlobalMaxPool"])
@pytest.mark.parametrize("sp", [(7,), (5, 6), (3, 4, 2)])
def test_cuda_global_pools_match_onnxruntime(fake_cudnn, op, sp):
    x = np.random.default_rng(7).standard_normal((2, 3, *sp)).astype(np.float32)
    (ref,) = _ort(op, [x], {})
    module = "op_global_average_pool" if op == "GlobalAveragePool" else "op_global_max_pool"
    fn = "global_average_pool" if op == "GlobalAveragePool" else "global_max_pool"
    run = _cuda_kernel(module, fn, node_info(op, {}, [x]))
    (y,) = run(x)
    assert not run.cudnn.reasons
    np.testing.assert_allclose(y, ref, rtol=1e-5, atol=1e-6)


def test_max_pool_with_indices_stays_on_the_generic_kernel(fake_cudnn):
    x = np.random.default_rng(8).standard_normal((1, 2, 6, 6)).astype(np.float32)
    attrs = {"kernel_shape": [2, 2], "strides": [2, 2]}
    run = _cuda_kernel("op_max_pool", "max_pool", node_info("MaxPool", attrs, [x], n_out=2))
    assert not hasattr(run, "cudnn")  # the generic kernel itself
    ref = _ort("MaxPool", [x], attrs, n_out=2)
    for got, want in zip(run(x), ref):
        np.testing.assert_array_equal(got, want)


# -- without cuDNN ------------------------------------------------------------------------


def test_without_cudnn_conv_is_the_generic_kernel_and_says_why_it_cannot_be_captured(
    monkeypatch,
):
    from onnxep.providers.kernel import CAPTURE_ATTR

    monkeypatch.setattr(dnn, "unavailable_reason", lambda: "cuDNN not found (test)")
    x = np.zeros((1, 2, 5, 5), np.float32)
    w = np.zeros((3, 2, 3, 3), np.float32)
    node = node_info("Conv", {"kernel_shape": [3, 3]}, [x, w])
    run = _cuda_kernel("op_conv", "conv", node)
    note = getattr(run, CAPTURE_ATTR)
    assert "cuDNN not found (test)" in note and "capture" in note
    assert run(x, w)[0].shape == (1, 3, 3, 3)


def test_loader_names_a_missing_library_file(monkeypatch, tmp_path):
    missing = tmp_path / "libcudnn.so.9"
    monkeypatch.setenv(dnn_library.ENV, str(missing))
    with pytest.raises(dnn_library.DnnLoadError) as info:
        dnn_library.load()
    msg = str(info.value)
    assert str(missing) in msg and dnn_library.ENV in msg and "not a file" in msg


def test_loader_says_where_it_looked_when_nothing_is_found(monkeypatch, tmp_path):
    monkeypatch.delenv(dnn_library.ENV, raising=False)
    monkeypatch.setattr(dnn_library, "_proc_maps_path", lambda: None)
    monkeypatch.setattr(dnn_library, "_search_roots", lambda: [str(tmp_path)])
    monkeypatch.setattr(dnn_library.ctypes.util, "find_library", lambda name: None)
    with pytest.raises(dnn_library.DnnLoadError) as info:
        dnn_library.load()
    msg = str(info.value)
    assert "nvidia/cudnn/lib" in msg and "pip install nvidia-cudnn" in msg


def test_loader_reports_a_file_that_is_not_cudnn(monkeypatch, tmp_path):
    bogus = tmp_path / "libcudnn.so.9"
    bogus.write_bytes(b"not an ELF file")
    monkeypatch.setenv(dnn_library.ENV, str(bogus))
    with pytest.raises(dnn_library.DnnLoadError) as info:
        dnn_library.load()
    assert str(bogus) in str(info.value)


def test_the_provider_line_says_why_cudnn_is_missing(monkeypatch):
    monkeypatch.setattr(dnn_library, "_cached", None)
    monkeypatch.setenv(dnn_library.ENV, "/nonexistent/libcudnn.so.9")
    line = dnn_library.status()
    assert "/nonexistent/libcudnn.so.9" in line and "generic kernels" in line


def test_plan_module_imports_no_cupy():
    import subprocess
    import sys

    code = (
        "import sys, onnxep.providers_cuda.ops.conv_plan, onnxep.providers_cuda.dnn_library;"
        "assert 'cupy' not in sys.modules, 'conv_plan/dnn_library imported CuPy'"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_grids_cover_every_spatial_rank_and_auto_pad():
    ranks = {len(c[0]) for c in CONV_GRID}
    autos = {c[4] for c in CONV_GRID if isinstance(c[4], str)}
    assert ranks == {1, 2, 3} and autos == {"SAME_UPPER", "SAME_LOWER", "VALID"}
    assert any(c[5] == c[6][0] for c in CONV_GRID)  # depthwise


# -- the Conv + activation fusion for float16 (exact, so the CUDA provider may take it) ----


def _conv_act_model(dtype, lo_hi, clip_attrs=False):
    from onnx import numpy_helper

    rng = np.random.default_rng(10)
    tp = helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
    w1 = numpy_helper.from_array(rng.standard_normal((4, 3, 3, 3)).astype(dtype), "w1")
    w2 = numpy_helper.from_array(rng.standard_normal((4, 4, 1, 1)).astype(dtype), "w2")
    lo = numpy_helper.from_array(np.array(lo_hi[0], dtype), "lo")
    hi = numpy_helper.from_array(np.array(lo_hi[1], dtype), "hi")
    graph = helper.make_graph(
        [
            helper.make_node("Conv", ["x", "w1"], ["c1"], pads=[1, 1, 1, 1]),
            helper.make_node("Relu", ["c1"], ["r1"]),
            helper.make_node("Conv", ["r1", "w2"], ["c2"]),
            helper.make_node("Clip", ["c2"], ["y"], min=lo_hi[0], max=lo_hi[1])
            if clip_attrs
            else helper.make_node("Clip", ["c2", "lo", "hi"], ["y"]),
        ],
        "g",
        [helper.make_tensor_value_info("x", tp, [1, 3, 9, 8])],
        [helper.make_tensor_value_info("y", tp, None)],
        [w1, w2] + ([] if clip_attrs else [lo, hi]),
    )
    opset = 10 if clip_attrs else 17
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8
    return model


@pytest.mark.parametrize(
    ("bounds", "attrs", "fired"),
    [((0.0, 6.0), False, 2), ((0.0, 6.0), True, 2), ((0.0, 0.1), True, 1)],
)
def test_float16_conv_relu_and_clip_fuse_exactly(bounds, attrs, fired):
    import onnxep

    model = _conv_act_model(np.float16, bounds, clip_attrs=attrs)
    x = np.random.default_rng(11).standard_normal((1, 3, 9, 8)).astype(np.float16)
    fused = onnxep.InferenceSession(model.SerializeToString(), providers=["cpu"])
    report = {f.name: f for f in fused.placement().fusions}["fuse_conv_activation"]
    # 0.1 as a float attribute is no float16 value: clamping before or after the
    # Conv's rounding could differ, so that Clip stays apart.
    assert report.fired == fired, report
    plain = onnxep.InferenceSession(
        model.SerializeToString(),
        onnxep.SessionOptions(
            graph_optimization_level=onnxep.GraphOptimizationLevel.ORT_DISABLE_ALL
        ),
        providers=["cpu"],
    )
    got, want = fused.run(None, {"x": x})[0], plain.run(None, {"x": x})[0]
    assert got.tobytes() == want.tobytes()
