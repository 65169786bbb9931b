"""The CPU provider's convolution and pooling kernels against onnxruntime on torch exports.

Every model is a ``torch.onnx.export`` of ``torch.nn`` layers (the forms exporters write:
1-D/2-D/3-D, groups, depthwise with and without a channel multiplier, dilations, strides,
explicit and ``same`` padding, ConvTranspose with output_padding and groups, pools with
ceil_mode and count_include_pad), run by onnxep ``["cpu"]`` and by onnxruntime in the same
test; each runs with the compiled loops (numba, when installed) and with the pure-NumPy
path, which must agree with onnxruntime alike.
"""

from __future__ import annotations

import io

import numpy as np
import onnx
import pytest

import onnxep
from onnxep.providers_cpu import jit
from onnxep.testing import compare_output

torch = pytest.importorskip("torch")
ort = pytest.importorskip("onnxruntime")
nn = torch.nn


def _export(module, *shape, opset=17) -> bytes:
    torch.manual_seed(0)
    module.eval()
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(torch.randn_like(p) * 0.3)
    buf = io.BytesIO()
    torch.onnx.export(
        module, (torch.randn(*shape),), buf, input_names=["x"], opset_version=opset, dynamo=False
    )
    return buf.getvalue()


def _check(model: bytes, shape, monkeypatch, compiled: bool) -> onnx.ModelProto:
    if compiled and not jit.ENABLED:
        pytest.skip("numba not installed: only the NumPy path runs here")
    monkeypatch.setattr(jit, "ENABLED", compiled)
    x = np.random.default_rng(1).standard_normal(shape).astype(np.float32)
    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    want = ort.InferenceSession(model, so, providers=["CPUExecutionProvider"]).run(None, {"x": x})
    sess = onnxep.InferenceSession(model, providers=["cpu"])
    got = sess.run(None, {"x": x})
    for i, (g, w) in enumerate(zip(got, want)):
        for r in compare_output(f"y{i}", g, w, "cpu", "onnxruntime", atol=1e-4 * np.abs(w).max()):
            assert r.ok, r
    return onnx.load_from_string(model)


class _Block(nn.Module):
    """A MobileNetV2 inverted residual: 1x1 expand, 3x3 depthwise, 1x1 project, + x."""

    def __init__(self, c, expand, stride):
        super().__init__()
        h = c * expand
        self.body = nn.Sequential(
            nn.Conv2d(c, h, 1, bias=False),
            nn.BatchNorm2d(h),
            nn.ReLU6(),
            nn.Conv2d(h, h, 3, stride, 1, groups=h, bias=False),
            nn.BatchNorm2d(h),
            nn.ReLU6(),
            nn.Conv2d(h, c, 1, bias=False),
            nn.BatchNorm2d(c),
        )
        self.residual = stride == 1

    def forward(self, x):
        y = self.body(x)
        return x + y if self.residual else y


CASES = {
    "conv1d groups dilation": (
        nn.Sequential(
            nn.Conv1d(8, 16, 5, padding=2),
            nn.Conv1d(16, 16, 3, padding=2, dilation=2, groups=4),
            nn.Conv1d(16, 16, 3, stride=2, padding=1, groups=16),
            nn.Conv1d(16, 8, 4, padding="same"),
        ),
        (2, 8, 37),
    ),
    "conv2d depthwise strides": (
        nn.Sequential(
            nn.Conv2d(3, 12, 3, stride=2, padding=1),
            nn.Conv2d(12, 12, 3, padding=1, groups=12),
            nn.Conv2d(12, 12, 5, stride=2, padding=2, groups=12),
            nn.Conv2d(12, 12, 3, stride=(2, 1), padding=(0, 1), dilation=(1, 2), groups=12),
            nn.Conv2d(12, 24, 3, padding=1, groups=12),  # depthwise, channel multiplier 2
            nn.Conv2d(24, 24, (3, 5), stride=3, padding=(1, 2), groups=24, bias=False),
        ),
        (2, 3, 41, 29),
    ),
    "conv2d grouped dilated dense": (
        nn.Sequential(
            nn.Conv2d(8, 16, 3, padding=2, dilation=2, groups=2),
            nn.Conv2d(16, 16, 3, stride=2, groups=4),
            nn.Conv2d(16, 8, 1),
            nn.Conv2d(8, 8, 3, padding="same", bias=False),
            nn.Conv2d(8, 4, 2, padding="valid"),
        ),
        (1, 8, 23, 19),
    ),
    "conv3d": (
        nn.Sequential(
            nn.Conv3d(3, 8, 3, padding=1),
            nn.Conv3d(8, 8, 3, stride=2, padding=1, groups=8),
            nn.Conv3d(8, 8, (1, 3, 3), dilation=(1, 2, 2), groups=2),
        ),
        (1, 3, 9, 17, 15),
    ),
    "mobilenet block": (
        nn.Sequential(nn.Conv2d(3, 16, 3, 2, 1), _Block(16, 6, 1), _Block(16, 4, 2)),
        (1, 3, 48, 48),
    ),
    "conv transpose": (
        nn.Sequential(
            nn.ConvTranspose2d(4, 8, 3, stride=2, padding=1, output_padding=1),
            nn.ConvTranspose2d(8, 8, 4, stride=2, padding=1, groups=4),
            nn.ConvTranspose2d(8, 6, 3, stride=(1, 2), dilation=2, bias=False),
        ),
        (1, 4, 11, 13),
    ),
    "conv transpose 1d 3d": (
        nn.Sequential(
            nn.ConvTranspose1d(4, 6, 4, stride=3, padding=1, output_padding=2),
            nn.ConvTranspose1d(6, 6, 3, groups=6),
        ),
        (2, 4, 17),
    ),
    "conv transpose tiles": (
        # kernel == stride, no padding: each offset's columns tile the output
        nn.Sequential(
            nn.ConvTranspose2d(4, 6, 2, stride=2),
            nn.ConvTranspose2d(6, 3, (3, 2), stride=(3, 2), groups=3, bias=False),
            nn.ConvTranspose2d(3, 1, 2, stride=2),
        ),
        (2, 4, 5, 7),
    ),
    "conv transpose tiles 1d": (nn.Sequential(nn.ConvTranspose1d(4, 6, 4, stride=4)), (1, 4, 9)),
    "conv transpose 3d": (
        nn.Sequential(nn.ConvTranspose3d(3, 4, 3, stride=2, padding=1, output_padding=1)),
        (1, 3, 5, 6, 7),
    ),
    "pools": (
        nn.Sequential(
            nn.Conv2d(3, 6, 3),
            nn.MaxPool2d(3, 2, 1, ceil_mode=True),
            nn.AvgPool2d(3, 2, 1, ceil_mode=True, count_include_pad=False),
            nn.AvgPool2d(2, 1, 1, count_include_pad=True),
            nn.LPPool2d(2, 2),
            nn.MaxPool2d(2, 1, dilation=2),
        ),
        (1, 3, 40, 37),
    ),
    "pools 1d 3d global": (
        nn.Sequential(
            nn.Conv3d(2, 4, 3, padding=1),
            nn.MaxPool3d(2, ceil_mode=True),
            nn.AvgPool3d(3, 1, 1, count_include_pad=False),
            nn.AdaptiveAvgPool3d(1),
        ),
        (1, 2, 7, 9, 11),
    ),
}


@pytest.mark.parametrize("compiled", [True, False], ids=["compiled", "numpy"])
@pytest.mark.parametrize("case", list(CASES))
def test_torch_export_matches_onnxruntime(case, compiled, monkeypatch):
    module, shape = CASES[case]
    model = _check(_export(module, *shape), shape, monkeypatch, compiled)
    ops = {n.op_type for n in model.graph.node}
    assert ops & {"Conv", "ConvTranspose", "MaxPool", "AveragePool", "LpPool"}


@pytest.mark.parametrize("compiled", [True, False], ids=["compiled", "numpy"])
def test_depthwise_kernel_sees_every_form(compiled, monkeypatch):
    """The depthwise path, not the grouped GEMM, runs the exported depthwise convs: with
    numba the 2-D compiled loop (``depthwise_2d_runner``), else the flat-plane sums."""
    from onnxep.providers_cpu.ops import depthwise as dw
    from onnxep.providers_cpu.ops import op_conv

    calls = []
    name = "depthwise_2d_runner" if compiled else "depthwise"
    real = getattr(dw, name)

    def spy(*args):
        w, strides = args[2 if compiled else 1], args[5 if compiled else 3]
        calls.append((w.shape, tuple(strides)))
        return real(*args)

    monkeypatch.setattr(op_conv, name, spy)
    module, shape = CASES["conv2d depthwise strides"]
    _check(_export(module, *shape), shape, monkeypatch, compiled)
    assert len(calls) == 5  # every conv but the first (group 1)
    assert ((12, 2, 9), (1, 1)) in calls  # the channel multiplier
    assert ((24, 1, 15), (3, 3)) in calls


def test_providers_report_names_the_loops():
    status = jit.jit_status()
    assert status.startswith("compiled loops: ")
    assert ("numba" in status) == jit.ENABLED


def test_conv_relu_and_clip_fuse_exactly():
    """Conv -> Relu and Conv -> Clip (ReLU6, constant bounds) become FusedConv on the CPU,
    with outputs byte-identical to the unfused nodes (float32), and agree with onnxruntime."""
    module = nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1),
        nn.ReLU(),
        nn.Conv2d(8, 8, 3, padding=1, groups=8),
        nn.ReLU6(),
        nn.Conv2d(8, 8, 1),
        nn.Hardtanh(-0.5, 0.25),
    )
    shape = (1, 3, 17, 19)
    model = _export(module, *shape)
    x = np.random.default_rng(1).standard_normal(shape).astype(np.float32)
    fused = onnxep.InferenceSession(model, providers=["cpu"])
    report = {f.name: f for f in fused.placement().fusions}["fuse_conv_activation"]
    assert report.fired == 3, report
    assert [n.op_type for n in fused.placement().nodes] == ["FusedConv"] * 3
    plain = onnxep.InferenceSession(
        model,
        onnxep.SessionOptions(
            graph_optimization_level=onnxep.GraphOptimizationLevel.ORT_DISABLE_ALL
        ),
        providers=["cpu"],
    )
    got, want = fused.run(None, {"x": x})[0], plain.run(None, {"x": x})[0]
    assert got.tobytes() == want.tobytes()
    ref = ort.InferenceSession(model, providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-5)


def test_conv_clip_with_computed_bounds_is_refused_with_reason():
    from onnx import TensorProto, helper

    w = helper.make_tensor("w", TensorProto.FLOAT, [2, 1, 1, 1], [1.0, -1.0])
    graph = helper.make_graph(
        [
            helper.make_node("Conv", ["x", "w"], ["c"]),
            helper.make_node("Clip", ["c", "lo"], ["y"]),
        ],
        "g",
        [
            helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 1, 2, 2]),
            helper.make_tensor_value_info("lo", TensorProto.FLOAT, []),
        ],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [w],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    sess = onnxep.InferenceSession(model.SerializeToString(), providers=["cpu"])
    report = {f.name: f for f in sess.placement().fusions}["fuse_conv_activation"]
    assert report.fired == 0
    assert any("not a constant" in str(r) for r in report.refused), report.refused
    x = np.arange(4, dtype=np.float32).reshape(1, 1, 2, 2)
    y = sess.run(None, {"x": x, "lo": np.float32(1.5)})[0]
    np.testing.assert_array_equal(y, np.maximum(np.concatenate([x, -x], axis=1), 1.5))


@pytest.mark.parametrize("dtype", [np.float16, np.float64])
def test_pools_in_other_float_types(dtype, monkeypatch):
    """MaxPool / AveragePool on float16 (NumPy path; against onnxruntime) and float64
    (compiled path; onnxruntime has no float64 AveragePool: against the NumPy path, exactly)."""
    from onnx import TensorProto, helper

    elem = {np.float16: TensorProto.FLOAT16, np.float64: TensorProto.DOUBLE}[dtype]
    graph = helper.make_graph(
        [
            helper.make_node(
                "MaxPool",
                ["x"],
                ["m"],
                kernel_shape=[3, 3],
                strides=[2, 2],
                pads=[1, 1, 1, 1],
                ceil_mode=1,
            ),  # fmt: skip
            helper.make_node("AveragePool", ["m"], ["y"], kernel_shape=[2, 3], strides=[1, 2]),
        ],
        "g",
        [helper.make_tensor_value_info("x", elem, [1, 2, 11, 13])],
        [helper.make_tensor_value_info("y", elem, None)],
    )
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 19)]
    ).SerializeToString()
    x = np.random.default_rng(0).standard_normal((1, 2, 11, 13)).astype(dtype)
    got = onnxep.InferenceSession(model, providers=["cpu"]).run(None, {"x": x})[0]
    assert got.dtype == dtype
    if dtype == np.float16:
        want = ort.InferenceSession(model, providers=["CPUExecutionProvider"]).run(None, {"x": x})
        np.testing.assert_allclose(got, want[0], rtol=2e-3)
    else:
        monkeypatch.setattr(jit, "ENABLED", False)
        want = onnxep.InferenceSession(model, providers=["cpu"]).run(None, {"x": x})[0]
        assert got.tobytes() == want.tobytes()


def test_large_im2col_runs_in_row_blocks_on_one_thread(monkeypatch):
    """With intra_op_num_threads=1 a conv past the im2col limit runs in blocks of output
    rows, within rounding of the whole-buffer GEMM (BLAS may add in another order for
    another column count) and of onnxruntime."""
    from onnxep.providers_cpu.ops import conv_direct, op_conv

    monkeypatch.setattr(conv_direct, "MODE", "0")  # it would take this small conv
    calls = []
    real = op_conv.im2col_tiled
    monkeypatch.setattr(op_conv, "im2col_tiled", lambda *a: calls.append(1) or real(*a))
    monkeypatch.setattr(op_conv, "_TILE_OVER", 1 << 12)
    monkeypatch.setattr(op_conv, "_TILE_BYTES", 1 << 14)  # several blocks
    module = nn.Sequential(nn.Conv2d(8, 6, 3, padding=1))
    shape = (2, 8, 21, 17)
    model = _export(module, *shape)
    x = np.random.default_rng(3).standard_normal(shape).astype(np.float32)
    one = onnxep.SessionOptions(intra_op_num_threads=1)
    tiled = onnxep.InferenceSession(model, one, providers=["cpu"]).run(None, {"x": x})[0]
    assert calls
    monkeypatch.setattr(op_conv, "_TILE_OVER", 1 << 60)
    whole = onnxep.InferenceSession(model, one, providers=["cpu"]).run(None, {"x": x})[0]
    np.testing.assert_allclose(tiled, whole, rtol=1e-6, atol=1e-6)
    ref = ort.InferenceSession(model, providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    np.testing.assert_allclose(tiled, ref, rtol=1e-4, atol=1e-4)


@pytest.mark.skipif(not jit.ENABLED, reason="numba not installed: no compiled 2-D MaxPool")
@pytest.mark.parametrize(
    "shape,k,s,d,pads,ceil",
    [
        ((1, 8, 20, 20), (5, 5), (1, 1), (1, 1), (2, 2, 2, 2), 0),  # YOLO's SPPF pool
        ((2, 3, 17, 13), (3, 3), (2, 2), (1, 1), (1, 1, 1, 1), 1),
        ((1, 4, 9, 11), (2, 3), (1, 2), (2, 1), (0, 1, 1, 0), 0),
        ((1, 2, 7, 7), (3, 2), (3, 2), (1, 1), (1, 0, 1, 1), 1),
        ((1, 1, 1, 1), (3, 3), (1, 1), (1, 1), (1, 1, 1, 1), 0),
        # strided rows split into phases: captcha-crnn's 3x3/2 pool, rapidocr-cls's 2x2/2,
        # a stride above the window (columns skipped), a dilated window at stride 3
        ((2, 8, 30, 80), (3, 3), (2, 2), (1, 1), (0, 0, 0, 0), 1),
        ((2, 6, 2, 96), (2, 2), (2, 2), (1, 1), (0, 0, 0, 0), 0),
        ((1, 3, 11, 23), (2, 2), (3, 3), (1, 1), (0, 1, 0, 1), 1),
        ((1, 2, 13, 29), (3, 3), (3, 3), (2, 2), (1, 2, 1, 2), 0),
    ],
)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_compiled_max_pool_2d_equals_the_numpy_path(shape, k, s, d, pads, ceil, dtype, monkeypatch):
    """The compiled 2-D MaxPool (no padded copy) gives the NumPy path's values, NaN included."""
    from onnx import TensorProto, helper

    from onnxep.providers_cpu.ops import op_max_pool

    elem = {np.float32: TensorProto.FLOAT, np.float64: TensorProto.DOUBLE}[dtype]
    node = helper.make_node(
        "MaxPool", ["x"], ["y"], kernel_shape=list(k), strides=list(s), dilations=list(d),
        pads=list(pads), ceil_mode=ceil,
    )  # fmt: skip
    graph = helper.make_graph(
        [node], "g", [helper.make_tensor_value_info("x", elem, shape)],
        [helper.make_tensor_value_info("y", elem, None)],
    )  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 12)])
    x = np.random.default_rng(0).standard_normal(shape).astype(dtype)
    x.flat[:: max(1, x.size // 3)] = np.nan
    calls = []
    real = op_max_pool.max_pool_2d
    monkeypatch.setattr(op_max_pool, "max_pool_2d", lambda *a: calls.append(1) or real(*a))
    got = onnxep.InferenceSession(model.SerializeToString(), providers=["cpu"]).run(None, {"x": x})
    assert calls
    monkeypatch.setattr(jit, "ENABLED", False)
    want = onnxep.InferenceSession(model.SerializeToString(), providers=["cpu"]).run(None, {"x": x})
    np.testing.assert_array_equal(got[0], want[0])
    if dtype == np.float32:
        ref = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
        finite = ~np.isnan(want[0])  # onnxruntime's MaxPool does not propagate NaN
        np.testing.assert_array_equal(got[0][finite], ref.run(None, {"x": x})[0][finite])


@pytest.mark.skipif(not jit.ENABLED, reason="numba not installed: no compiled 2-D MaxPool")
@pytest.mark.parametrize(
    "shape,k,s,pads",
    [
        ((1, 16, 10, 10), (5, 5), (1, 1), (2, 2, 2, 2)),  # SPPF on a 10x10 map
        ((1, 3, 40, 40), (2, 2), (1, 1), (0, 0, 1, 1)),  # SAME_UPPER 2x2
        ((2, 5, 2, 96), (2, 2), (2, 2), (0, 0, 0, 0)),  # phases
        ((1, 2, 33, 70), (3, 3), (1, 1), (1, 1, 1, 1)),  # rows past one vector, a remainder
    ],
)
def test_compiled_max_pool_2d_keeps_first_of_ties_and_nan(shape, k, s, pads):
    """The vectorised select (two selects, each stored) is the old one value for value: a
    NaN anywhere in the window wins, a tie (-0 against +0) keeps the value met first (window
    rows in order, then columns), and infinities pass through."""
    from onnxep.providers_cpu.ops import op_max_pool

    rng = np.random.default_rng(1)
    x = rng.choice(
        np.array([0.0, -0.0, 1.0, -1.0, np.inf, -np.inf, np.nan, 0.5], np.float32), size=shape
    )
    kh, kw = k
    sh, sw = s
    pt, pl, pb, pr = pads
    oh = (shape[2] + pt + pb - kh) // sh + 1
    ow = (shape[3] + pl + pr - kw) // sw + 1
    got = op_max_pool.max_pool_2d(x, list(k), list(s), [1, 1], [pt, pl], [oh, ow])
    xp = np.full((*shape[:2], shape[2] + pt + pb, shape[3] + pl + pr), -np.inf, np.float32)
    xp[:, :, pt : pt + shape[2], pl : pl + shape[3]] = x
    want = np.empty_like(got)
    for n in range(shape[0]):
        for c in range(shape[1]):
            for oy in range(oh):
                # the rows inside the plane, in order, then the columns, as the loop does
                rows = [oy * sh + i for i in range(kh) if 0 <= oy * sh + i - pt < shape[2]]
                for ox in range(ow):
                    cols = [ox * sw + j for j in range(kw)]
                    acc = []
                    for j in cols:
                        m = xp[n, c, rows[0], j] if rows else np.float32(-np.inf)
                        for r in rows[1:]:
                            v = xp[n, c, r, j]
                            m = v if (v > m or v != v) else m
                        acc.append(m)
                    m = acc[0]
                    for v in acc[1:]:
                        m = v if (v > m or v != v) else m
                    want[n, c, oy, ox] = m
    assert got.tobytes() == want.tobytes()


@pytest.mark.parametrize(
    "k,sp", [((2, 2), (16, 24)), ((3, 2), (5, 7)), ((4,), (6,)), ((2, 1, 2), (3, 4, 5))]
)
def test_conv_transpose_tiles_equal_the_phase_planes(k, sp):
    """Kernel == stride: the per-offset strided copies place what the phase planes sum."""
    from onnxep.providers_cpu.ops import op_conv_transpose as ct

    cols = np.random.default_rng(0).standard_normal((2, 3, int(np.prod(k)), *sp))
    out = [v * kk for v, kk in zip(sp, k)]
    assert ct.offsets_tile(k, k, [1] * len(k), [0] * len(k), [0] * len(k), sp, out)
    assert not ct.offsets_tile(k, k, [1] * len(k), [1] + [0] * (len(k) - 1), [0] * len(k), sp, out)
    got = ct.depth_to_space(cols, k, sp, out)
    want = ct.col2im_phases(cols, k, k, [1] * len(k), sp, out, [0] * len(k), out)
    assert got.tobytes() == want.tobytes()


@pytest.mark.skipif(not jit.ENABLED, reason="numba not installed: no compiled depth-to-space")
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize(
    "k,sp", [((2, 2), (16, 24)), ((2, 2), (3, 5)), ((3, 2), (5, 7)), ((1, 3), (4, 1))]
)
@pytest.mark.parametrize("bias", [False, True])
def test_compiled_depth_to_space_equals_the_strided_copies(k, sp, bias, dtype):
    """The compiled kernel == stride placement (two stores a value for 2-wide kernels), with
    the bias added as each value is placed, gives the strided copies' bits plus the bias
    added after; NaN, -0 and infinities placed as they are."""
    from onnxep.providers_cpu.ops import op_conv_transpose as ct

    rng = np.random.default_rng(0)
    cols = rng.standard_normal((2, 3, int(np.prod(k)), *sp)).astype(dtype)
    cols.reshape(-1)[:4] = [np.nan, -0.0, np.inf, -np.inf]
    out = [v * kk for v, kk in zip(sp, k)]
    b = rng.standard_normal(3).astype(dtype) if bias else None
    want = ct.depth_to_space(cols, k, sp, out)
    if bias:
        want += b.reshape(1, 3, 1, 1)
    got = ct.depth_to_space_2d(cols, k, out, b)
    assert got.dtype == want.dtype and got.tobytes() == want.tobytes()


@pytest.mark.parametrize("threads", [1, 2])
def test_conv_transpose_2x2_stride_2_with_bias_against_onnxruntime(threads):
    """rapidocr-v6-det's upsampling shape through a session (the compiled placement where
    numba runs) against onnxruntime."""
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(1)
    w = rng.standard_normal((24, 24, 2, 2)).astype(np.float32) * 0.1
    b = rng.standard_normal(24).astype(np.float32)
    node = helper.make_node(
        "ConvTranspose", ["x", "W", "B"], ["y"], kernel_shape=[2, 2], strides=[2, 2]
    )
    graph = helper.make_graph(
        [node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 24, 16, 24])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [numpy_helper.from_array(w, "W"), numpy_helper.from_array(b, "B")],
    )  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 9
    x = rng.standard_normal((1, 24, 16, 24)).astype(np.float32)
    so = onnxep.SessionOptions(intra_op_num_threads=threads)
    got = onnxep.InferenceSession(model.SerializeToString(), so, providers=["cpu"]).run(
        None, {"x": x}
    )[0]
    ref = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    np.testing.assert_allclose(got, ref.run(None, {"x": x})[0], rtol=1e-5, atol=1e-5)
