"""The CPU Conv's Winograd F(2x2, 3x3) path against onnxruntime and against im2col + GEMM.

3x3, stride-1, undilated, ungrouped 2-D convolutions with at least 8 input and output
channels run through Winograd tiles when numba is installed and the run has one thread;
every other form keeps the im2col path. Each case runs on onnxep ``["cpu"]`` with the
path on and off (``winograd._ON``) and on onnxruntime in the same test: odd sizes (a
half tile at the edges), batches, asymmetric and ``auto_pad`` padding, weights and bias
as graph inputs, no bias, float64 and float16, Conv + Relu fused into FusedConv, and a
torch export of a small YOLO-style block.
"""

from __future__ import annotations

import io
import threading

import numpy as np
import onnx
import pytest
from one_thread_runs import ours, theirs
from onnx import TensorProto, helper, numpy_helper

import onnxep
from onnxep.providers_cpu import jit
from onnxep.providers_cpu.ops import conv_direct, conv_gemm, op_conv
from onnxep.providers_cpu.ops import winograd as wino

ort = pytest.importorskip("onnxruntime")

pytestmark = pytest.mark.skipif(not jit.ENABLED, reason="numba not installed: no Winograd path")


@pytest.fixture(autouse=True)
def _no_conv_gemm(monkeypatch):
    # The compiled Conv GEMM (conv_gemm.py) takes wide 3x3 convolutions before Winograd
    # where OpenBLAS runs AVX2 kernels, the direct kernel (conv_direct.py) small ones at
    # one thread; these tests are about the Winograd path.
    monkeypatch.setattr(conv_gemm, "MODE", "0")
    monkeypatch.setattr(conv_direct, "MODE", "0")


_TYPES = {
    np.float32: TensorProto.FLOAT,
    np.float64: TensorProto.DOUBLE,
    np.float16: TensorProto.FLOAT16,
}
# float32: ort's own Conv differs from im2col by about 1e-6 of the output's scale.
_TOL = {np.float32: 1e-5, np.float64: 1e-12, np.float16: 4e-3}


def _conv_model(c, m, hw, dtype=np.float32, n=1, const_w=True, bias="const", act=None, **attrs):
    rng = np.random.default_rng(7)
    w = (rng.standard_normal((m, c, 3, 3)) / np.sqrt(9 * c)).astype(dtype)
    b = rng.standard_normal(m).astype(dtype)
    t = _TYPES[dtype]
    inputs = [helper.make_tensor_value_info("x", t, [n, c, *hw])]
    inits = []
    names = ["x", "w"]
    if const_w:
        inits.append(numpy_helper.from_array(w, "w"))
    else:
        inputs.append(helper.make_tensor_value_info("w", t, list(w.shape)))
    if bias == "const":
        inits.append(numpy_helper.from_array(b, "b"))
        names.append("b")
    elif bias == "input":
        inputs.append(helper.make_tensor_value_info("b", t, [m]))
        names.append("b")
    nodes = [helper.make_node("Conv", names, ["y" if act is None else "c"], **attrs)]
    if act is not None:
        nodes.append(helper.make_node(act, ["c"], ["y"]))
    graph = helper.make_graph(
        nodes, "g", inputs, [helper.make_tensor_value_info("y", t, None)], inits
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    feeds = {"x": rng.standard_normal((n, c, *hw)).astype(dtype)}
    if not const_w:
        feeds["w"] = w
    if bias == "input":
        feeds["b"] = b
    return model.SerializeToString(), feeds


def _spy(monkeypatch) -> list:
    calls = []
    real = op_conv.wino.winograd
    monkeypatch.setattr(op_conv.wino, "winograd", lambda *a: calls.append(a[2].shape) or real(*a))
    return calls


CASES = {
    "even 16x16": dict(c=8, m=8, hw=(16, 16), pads=[1, 1, 1, 1]),
    "odd height and width": dict(c=16, m=24, hw=(13, 9), pads=[1, 1, 1, 1]),
    "no padding, odd output": dict(c=8, m=16, hw=(12, 11)),
    "asymmetric pads": dict(c=8, m=8, hw=(10, 14), pads=[0, 2, 1, 0]),
    "same_upper": dict(c=12, m=8, hw=(7, 8), auto_pad="SAME_UPPER"),
    "same_lower": dict(c=12, m=8, hw=(7, 8), auto_pad="SAME_LOWER"),
    "valid, one output row": dict(c=8, m=8, hw=(3, 20), auto_pad="VALID"),
    "batch of three": dict(c=8, m=12, hw=(9, 10), n=3, pads=[1, 1, 1, 1]),
    "weights and bias as inputs": dict(
        c=8, m=8, hw=(11, 11), const_w=False, bias="input", pads=[1, 1, 1, 1]
    ),
    "no bias": dict(c=8, m=8, hw=(6, 6), bias=None, pads=[1, 1, 1, 1]),
    "float64": dict(c=8, m=8, hw=(9, 12), dtype=np.float64, pads=[1, 1, 1, 1]),
    "float16": dict(c=8, m=8, hw=(9, 12), dtype=np.float16, pads=[1, 1, 1, 1]),
    "relu fused into FusedConv": dict(c=16, m=16, hw=(15, 15), act="Relu", pads=[1, 1, 1, 1]),
    "wide channels": dict(c=64, m=80, hw=(20, 20), pads=[1, 1, 1, 1]),
}


@pytest.mark.parametrize("case", list(CASES))
def test_winograd_matches_onnxruntime_and_im2col(case, monkeypatch):
    kw = dict(CASES[case])
    dtype = kw.pop("dtype", np.float32)
    model, feeds = _conv_model(dtype=dtype, kernel_shape=[3, 3], **kw)
    calls = _spy(monkeypatch)
    got = ours(model, feeds)
    assert calls, "the Winograd path did not run"
    monkeypatch.setattr(wino, "_ON", False)
    calls.clear()
    im2col = ours(model, feeds)
    assert not calls
    assert got.dtype == im2col.dtype == dtype and got.shape == im2col.shape
    scale = float(np.abs(im2col.astype(np.float64)).max())
    np.testing.assert_allclose(got, im2col, rtol=0, atol=_TOL[dtype] * scale)
    if dtype == np.float64:
        # onnxruntime has no float64 Conv: its float32 run of the same values, at float32's
        # tolerance.
        model, feeds = _conv_model(kernel_shape=[3, 3], **kw)
        dtype = np.float32
    want = theirs(model, feeds)
    assert want.shape == got.shape
    np.testing.assert_allclose(got, want, rtol=0, atol=_TOL[dtype] * scale)


OTHERS = {
    "stride 2": dict(c=8, m=8, hw=(12, 12), strides=[2, 2], pads=[1, 1, 1, 1]),
    "dilation 2": dict(c=8, m=8, hw=(12, 12), dilations=[2, 2], pads=[2, 2, 2, 2]),
    "groups 2": dict(c=8, m=8, hw=(12, 12), group=2, pads=[1, 1, 1, 1]),
    "3 input channels": dict(c=3, m=16, hw=(12, 12), pads=[1, 1, 1, 1]),
    "4 output channels": dict(c=16, m=4, hw=(12, 12), pads=[1, 1, 1, 1]),
}


@pytest.mark.parametrize("case", list(OTHERS))
def test_other_forms_keep_im2col(case, monkeypatch):
    kw = dict(OTHERS[case])
    group = kw.get("group", 1)
    model, feeds = _conv_model(kernel_shape=[3, 3], **kw)
    if group > 1:  # grouped weights are (M, C / group, 3, 3)
        proto = onnx.load_from_string(model)
        w = numpy_helper.to_array(proto.graph.initializer[0])[:, : kw["c"] // group]
        proto.graph.initializer[0].CopyFrom(numpy_helper.from_array(np.ascontiguousarray(w), "w"))
        model = proto.SerializeToString()
    calls = _spy(monkeypatch)
    got = ours(model, feeds)
    assert not calls
    want = theirs(model, feeds)
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-5 * float(np.abs(want).max()))


def test_a_torch_yolo_block_matches_onnxruntime(monkeypatch):
    """A torch export of a C2f-style bottleneck (Conv+BN+SiLU, 3x3 then 3x3, + x)."""
    torch = pytest.importorskip("torch")
    nn = torch.nn

    class Bottleneck(nn.Module):
        def __init__(self, c):
            super().__init__()
            self.a = nn.Sequential(nn.Conv2d(c, c, 3, 1, 1), nn.BatchNorm2d(c), nn.SiLU())
            self.b = nn.Sequential(nn.Conv2d(c, c, 3, 1, 1), nn.BatchNorm2d(c), nn.SiLU())

        def forward(self, x):
            return x + self.b(self.a(x))

    torch.manual_seed(0)
    module = nn.Sequential(nn.Conv2d(3, 16, 3, 2, 1), Bottleneck(16), Bottleneck(16)).eval()
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(torch.randn_like(p) * 0.3)
    buf = io.BytesIO()
    shape = (1, 3, 42, 38)
    torch.onnx.export(module, (torch.randn(*shape),), buf, input_names=["x"], dynamo=False)
    model = buf.getvalue()
    feeds = {"x": np.random.default_rng(2).standard_normal(shape).astype(np.float32)}
    calls = _spy(monkeypatch)
    got = ours(model, feeds)
    assert len(calls) == 4  # the stem is strided and has 3 input channels
    want = theirs(model, feeds)
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-5 * float(np.abs(want).max()))


def test_on_two_threads_im2col_stays(monkeypatch):
    """With two BLAS threads each of the 16 products would pay a hand-off: im2col runs."""
    calls = _spy(monkeypatch)
    model, feeds = _conv_model(64, 64, (40, 40), pads=[1, 1, 1, 1], kernel_shape=[3, 3])
    got = ours(model, feeds, threads=2)
    assert not calls
    want = theirs(model, feeds)
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-5 * float(np.abs(want).max()))
    ours(model, feeds, threads=1)
    assert calls


def test_concurrent_runs_equal_serial_runs():
    """Per-thread scratch buffers: runs from several threads give the serial run's bits."""
    model, _ = _conv_model(16, 16, (17, 19), pads=[1, 1, 1, 1], kernel_shape=[3, 3])
    sess = onnxep.InferenceSession(
        model, onnxep.SessionOptions(intra_op_num_threads=1), providers=["cpu"]
    )
    rng = np.random.default_rng(5)
    xs = [rng.standard_normal((1, 16, 17, 19)).astype(np.float32) for _ in range(6)]
    serial = [sess.run(None, {"x": x})[0] for x in xs]
    got: list = [None] * len(xs)

    def work(i):
        for _ in range(3):
            got[i] = sess.run(None, {"x": xs[i]})[0]

    threads = [threading.Thread(target=work, args=(i,)) for i in range(len(xs))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for a, b in zip(got, serial):
        assert a.tobytes() == b.tobytes()
