"""The CUDA Resize/Upsample kernels (providers_cuda/ops/op_resize.py) on the CPU, emulated.

The CUDA C is compiled with g++ by tests/cuda_emulator.py (every argument
copied between guard bytes: a read past a table or the input poisons the
result, a write past the output fails the launch); a provider running the
CUDA op modules on NumPy arrays serves the sessions. Each case is checked
against the CPU provider and, where the node suite recorded one, the ONNX
output; our own cases also against onnxruntime. Launches are counted: one
for nearest whatever the axes, one per resized axis for linear and cubic
(plus one where tf_crop_and_resize extrapolates).
"""

from __future__ import annotations

import math
from collections import Counter

import cuda_emulator as emu
import numpy as np
import onnx
import pytest
import test_capture_plan as capture_test
from emulated_provider import registered
from onnx import TensorProto, helper
from test_cuda_index_emulated import HOST_PRIMITIVES, EmulatedDevice

import onnxep
from onnxep.providers import CaptureConfig, KernelLibrary, Provider, ProviderInfo, hookimpl
from onnxep.providers.kernel import CAPTURE_ATTR
from onnxep.providers_cuda.library import cuda_library
from onnxep.providers_cuda.ops import index_cuda
from onnxep.providers_cuda.ops import op_resize as cuda_resize
from onnxep.providers_cuda.ops import op_upsample as cuda_upsample

cases = emu.gpu_test_module("resize_cases")

NAME = "rsemu"


class ResizeDevice(EmulatedDevice):
    """The emulated device, with table uploads and launches counted by kernel family."""

    def __init__(self) -> None:
        self.counts: Counter = Counter()
        self.uploads = 0

    def kernels(self, body, names, signature):
        emu.ALL_NAMES.setdefault(HOST_PRIMITIVES + body, cuda_resize.NAMES)
        inner = super().kernels(body, names, signature)

        def counted(name, fn):
            def launch(*a):
                self.counts[name[: name.index("<")]] += 1
                fn(*a)

            return launch

        return {n: counted(n, f) for n, f in inner.items()}

    def upload(self, host):
        self.uploads += 1
        out = np.array(host)
        out.flags.writeable = False  # a kernel writing into its tables fails the launch
        return out


@pytest.fixture(scope="module")
def available():
    why = emu.why_unavailable()
    if why:
        pytest.skip(why)


@pytest.fixture
def device(available, monkeypatch):
    dev = ResizeDevice()
    monkeypatch.setattr(index_cuda, "device_for", lambda xp: dev if xp is np else None)
    return dev


@pytest.fixture(scope="module")
def provider(available):
    with registered(NAME, ("op_resize", "op_upsample"), flag=False) as name:
        yield name


def _run_both(model, feeds, provider):
    opts = onnxep.SessionOptions(disable_fallback=True)
    sess = onnxep.InferenceSession(model, opts, [provider])
    (got,) = sess.run(None, feeds)
    (want,) = onnxep.InferenceSession(model, providers=["cpu"]).run(None, feeds)
    return got, want


def _check_counts(device, model, x_shape, y_shape):
    node = model.graph.node[-1]
    attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    mode = attrs.get("mode", b"nearest")
    resized = sum(a != b for a, b in zip(x_shape, y_shape))
    if not math.prod(y_shape):
        assert not device.counts, device.counts
        return
    if mode == b"nearest":
        assert dict(device.counts) == ({"rs_nearest": 1} if resized else {}), device.counts
        return
    taps = device.counts.pop("rs_taps", 0)
    assert taps >= resized and set(device.counts) <= {"rs_fill"}, device.counts
    assert device.counts["rs_fill"] <= 1
    if attrs.get("coordinate_transformation_mode") != b"tf_crop_and_resize":
        assert not device.counts


# ----------------------------------------------------------------------------- node suite


ONNX_NODE_CASES = cases.onnx_node_cases()


def test_the_node_suite_has_the_resize_cases():
    assert len(ONNX_NODE_CASES) >= 40, sorted(ONNX_NODE_CASES)


@pytest.mark.parametrize("name", sorted(ONNX_NODE_CASES))
def test_onnx_node_cases_match_cpu_and_onnx(name, provider, device):
    from onnxep.testing import compare_output
    from onnxep.tools.conformance import case_data, case_model

    case = ONNX_NODE_CASES[name]
    model = case_model(case)
    ins, outs = case_data(case)[0]
    feeds = dict(zip([i.name for i in model.graph.input], ins))
    got, want = _run_both(model, feeds, provider)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    bad = [r.describe() for r in compare_output("y", got, outs[0], provider, "onnx") if not r.ok]
    assert not bad, "\n".join(bad)
    _check_counts(device, model, ins[0].shape, got.shape)


# ----------------------------------------------------------------------------- own cases


#: The dtypes onnxruntime's CPU Resize has kernels for (float64 and int64 it lacks).
ORT_DTYPES = {np.dtype(t) for t in (np.float32, np.float16, np.int8, np.uint8, np.int32)}


#: Own cases onnxruntime's CPU Resize cannot run.
ORT_FAILS = {"i8-cubic-x2": "int8 cubic: 'Tensor type mismatch' inside its kernel"}


def _ort(model, feeds):
    import onnxruntime as ort

    s = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return s.run(None, feeds)[0]


@pytest.mark.parametrize("case", cases.OWN, ids=lambda c: c[0])
def test_own_cases_match_cpu_and_onnxruntime(case, provider, device):
    _, shape, dtype, attrs, inputs = case
    model = cases.resize_model(shape, dtype, attrs, **inputs)
    x = cases.data(shape, dtype)
    got, want = _run_both(model, {"x": x}, provider)
    assert got.dtype == want.dtype and got.shape == want.shape
    tol = {np.float16: 2e-3, np.uint8: 1, np.int8: 1}.get(dtype, 1e-5)  # 8 bits: a .5 tie
    np.testing.assert_allclose(got.astype(np.float64), want.astype(np.float64), rtol=tol,
                               atol=tol)  # fmt: skip
    if got.size and np.dtype(dtype) in ORT_DTYPES and case[0] not in ORT_FAILS:
        ref = _ort(model, {"x": x})
        np.testing.assert_allclose(got.astype(np.float64), ref.astype(np.float64),
                                   rtol=tol * 5, atol=tol * 5)  # fmt: skip
    _check_counts(device, model, shape, got.shape)


def test_fp16_accumulates_in_float32(provider, device):
    """Two half-precision axes: the middle result stays float32, rounded once at the end."""
    _, shape, dtype, attrs, inputs = next(c for c in cases.OWN if c[0] == "f16-bilinear-x2")
    model = cases.resize_model(shape, dtype, attrs, **inputs)
    x = cases.data(shape, dtype, 3)
    got, want = _run_both(model, {"x": x}, provider)
    np.testing.assert_array_equal(got, want)
    assert device.counts == {"rs_taps": 2}


def _upsample(opset, mode, scales):
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 4, 5])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
    if opset == 7:
        node = helper.make_node("Upsample", ["x"], ["y"], mode=mode, scales=scales)
        inits = []
    else:
        node = helper.make_node("Upsample", ["x", "s"], ["y"], mode=mode)
        inits = [onnx.numpy_helper.from_array(np.array(scales, np.float32), "s")]
    g = helper.make_graph([node], "up", [x], [y], inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])


@pytest.mark.parametrize("opset", [7, 9])
@pytest.mark.parametrize("mode", ["nearest", "linear"])
def test_upsample(opset, mode, provider, device):
    model = _upsample(opset, mode, [1.0, 1.0, 2.0, 3.0])
    x = cases.data((1, 3, 4, 5), np.float32)
    got, want = _run_both(model, {"x": x}, provider)
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)
    assert device.counts == ({"rs_nearest": 1} if mode == "nearest" else {"rs_taps": 2})


def test_tables_upload_once_per_plan(provider, device):
    """Tables are uploaded when a shape is first met and reused on every later run."""
    model = cases.resize_model((1, 2, 5, 5), np.float32, {"mode": "cubic"}, scales=[1, 1, 2, 2])
    sess = onnxep.InferenceSession(model, onnxep.SessionOptions(disable_fallback=True),
                                   [provider])  # fmt: skip
    for seed in range(3):
        sess.run(None, {"x": cases.data((1, 2, 5, 5), np.float32, seed)})
    assert device.uploads == 4  # offsets and weights of two axes
    assert device.counts == {"rs_taps": 6}


# ----------------------------------------------------------------------------- capture


def _node(op, attrs, dtype, since=19, n_inputs=4):
    from onnxep.providers.node import NodeInfo, ValueInfo

    ins = (ValueInfo("x", "tensor", np.dtype(dtype), None),) + tuple(
        ValueInfo(f"i{k}", "tensor", None, None) for k in range(1, n_inputs)
    )
    return NodeInfo(op_type=op, domain="", name="n", attrs=attrs, inputs=ins,
                    outputs=(ValueInfo("y", "tensor", np.dtype(dtype), None),),
                    opset=since)  # fmt: skip


def test_cuda_library_declares_resize_capture_safe():
    specs = [s for s in cuda_library() if s.op_type in ("Resize", "Upsample")]
    assert {s.since_version for s in specs if s.op_type == "Resize"} == {10, 11, 13, 18, 19}
    assert {s.since_version for s in specs if s.op_type == "Upsample"} == {7, 9, 10}
    mine = (cuda_resize.resize, cuda_resize.resize_10, cuda_upsample.upsample_7,
            cuda_upsample.upsample_9)  # fmt: skip
    assert all(s.capture_safe and s.builder in mine for s in specs)


@pytest.mark.parametrize(
    ("mode", "dtype", "claimed"),
    [("nearest", np.int32, True), ("nearest", np.float16, True), ("linear", np.float32, True),
     ("cubic", np.uint8, True), ("linear", np.int32, False), ("cubic", np.int16, False),
     ("nearest", np.complex128, False)],
)  # fmt: skip
def test_what_the_kernel_leaves_to_the_generic_kernel_is_a_seam_with_a_reason(
    mode, dtype, claimed, device
):
    fn = cuda_resize.resize(_node("Resize", {"mode": mode}, dtype), np)
    note = getattr(fn, CAPTURE_ATTR, None)
    if claimed:
        assert note is None
    else:
        assert note.startswith(f"Resize: {mode} ") and "generic kernel" in note, note


def test_a_plan_used_in_a_capture_is_kept(device, monkeypatch):
    fn = cuda_resize.resize(_node("Resize", {"mode": "nearest"}, np.float32), np)
    scales = np.array([1, 1, 2, 2], np.float32)
    fn(cases.data((1, 1, 2, 2), np.float32), None, scales)
    monkeypatch.setattr(cuda_resize, "capturing", lambda xp: True)
    fn(cases.data((1, 1, 2, 2), np.float32), None, scales)  # recorded: pinned
    with pytest.raises(RuntimeError, match="new input shape inside a CUDA graph capture"):
        fn(cases.data((1, 1, 3, 2), np.float32), None, scales)
    monkeypatch.setattr(cuda_resize, "capturing", lambda xp: False)
    uploads = device.uploads
    for n in range(cuda_resize.MAX_PLANS + 2):  # ever-new shapes drop the unpinned plans
        fn(cases.data((1, 1, 1, n + 3), np.float32), None, scales)
    before = device.uploads
    fn(cases.data((1, 1, 2, 2), np.float32), None, scales)
    assert device.uploads == before > uploads  # the pinned plan was not rebuilt


@pytest.mark.parametrize("bad", [3, -1])
def test_an_index_outside_the_axis_is_refused_on_the_host(bad):
    with pytest.raises(AssertionError, match=f"axis 2 index {bad} outside"):
        cuda_resize._checked(np.array([0, bad]), 3, "axis 2")  # noqa: SLF001


# ----------------------------------------------------------------------------- exported


def _exported(kind: str, opset: int) -> bytes:
    """A torch module with a Conv, ``F.interpolate`` of ``kind`` and a Conv, as
    ``torch.onnx.export`` writes it (the forms detectors and segmenters ship)."""
    import io

    torch = pytest.importorskip("torch")
    nn, F = torch.nn, torch.nn.functional

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.a = nn.Conv2d(3, 6, 3, padding=1)
            self.b = nn.Conv2d(6, 4, 3, padding=1)

        def forward(self, x):
            h = self.a(x)
            if kind == "nearest":
                h = nn.Upsample(scale_factor=2, mode="nearest")(h)
            elif kind == "bilinear":
                h = F.interpolate(h, size=(13, 21), mode="bilinear", align_corners=False)
            elif kind == "bilinear-corners":
                # sizes, not a fractional scale: with scales onnxruntime resizes align_corners
                # over the rounded output length, the ONNX reference (and we) over the exact one
                h = F.interpolate(h, size=(14, 16), mode="bilinear", align_corners=True)
            elif kind == "bicubic":
                h = F.interpolate(h, scale_factor=2, mode="bicubic", align_corners=False)
            else:  # a downscale (torch's exporter writes no antialiased Resize)
                h = F.interpolate(h, size=(4, 5), mode="bilinear", align_corners=False)
            return self.b(h)

    torch.manual_seed(0)
    buf = io.BytesIO()
    with torch.no_grad():
        torch.onnx.export(Net().eval(), (torch.randn(1, 3, 9, 11),), buf, input_names=["x"],
                          opset_version=opset, dynamo=False)  # fmt: skip
    return buf.getvalue()


@pytest.mark.parametrize(
    ("kind", "opset"),
    [("nearest", 11), ("nearest", 17), ("bilinear", 13), ("bilinear-corners", 17),
     ("bicubic", 17), ("down", 18)],
)  # fmt: skip
def test_torch_exported_resizes_match_onnxruntime(kind, opset, provider, device):
    model = _exported(kind, opset)
    proto = onnx.load_from_string(model)
    assert [n.op_type for n in proto.graph.node].count("Resize") == 1
    x = np.random.default_rng(2).standard_normal((1, 3, 9, 11)).astype(np.float32)
    sess = onnxep.InferenceSession(model, providers=[provider, "cpu"])
    resize_on = [n.provider for n in sess.placement() if n.op_type == "Resize"]
    assert resize_on == [provider]
    (got,) = sess.run(None, {"x": x})
    want = _ort(proto, {"x": x})
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * np.abs(want).max())
    assert device.counts == ({"rs_nearest": 1} if kind == "nearest" else {"rs_taps": 2})


# ----------------------------------------------------------------------------- captured

CAP = "rscap"


class _CaptureDevice(ResizeDevice):
    """Outputs are the capture test's fake device arrays, so the runner sees device values."""

    @staticmethod
    def empty(shape, dtype):
        return EmulatedDevice.empty(shape, dtype).view(capture_test.Dev)


class _CapturingProvider(Provider):
    def __init__(self, options):
        super().__init__(CAP, options, device=CAP, xp=np)

    def from_host(self, value):
        return value if isinstance(value, capture_test.Dev) else capture_test._dev(value)  # noqa: SLF001

    def to_host(self, value):
        return np.array(value, copy=True) if isinstance(value, capture_test.Dev) else value


class _CapturingPlugin:
    @hookimpl
    def onnxep_provider_info(self):
        return ProviderInfo(name=CAP, device=CAP)

    @hookimpl
    def onnxep_create_provider(self, options):
        return _CapturingProvider(options)

    @hookimpl
    def onnxep_kernels(self, provider):
        if provider.name != CAP:
            return None
        libs = [KernelLibrary.from_module(m) for m in (cuda_resize, cuda_upsample)]
        return [*libs[0], *libs[1], *capture_test.relu.__onnxep_kernels__]

    @hookimpl
    def onnxep_capture_policy(self, provider, options):
        if provider.name != CAP:
            return None
        return CaptureConfig(mode=options.get("capture", "auto"), backend=capture_test.FakeBackend,
                             capturing=frozenset({CAP}), warmup=2, cache_size=8)  # fmt: skip


@pytest.fixture
def capturing_provider(available, monkeypatch):
    from onnxep.plugins.host import unregister_plugin

    dev = _CaptureDevice()
    monkeypatch.setattr(index_cuda, "device_for", lambda xp: dev if xp is np else None)
    plugin = _CapturingPlugin()
    onnxep.register_provider(plugin, name="resize-capture")
    yield dev
    unregister_plugin(plugin)


def _relu_resize_chain(elem):
    """Relu -> Resize nearest x2 -> Relu -> Resize linear to sizes -> Relu."""
    s = onnx.numpy_helper.from_array(np.array([1, 1, 2, 2], np.float32), "s")
    z = onnx.numpy_helper.from_array(np.array([1, 2, 7, 9], np.int64), "z")
    nodes = [
        helper.make_node("Relu", ["x"], ["a"], name="relu1"),
        helper.make_node("Resize", ["a", "", "s"], ["b"], name="nearest", mode="nearest"),
        helper.make_node("Relu", ["b"], ["c"], name="relu2"),
        helper.make_node("Resize", ["c", "", "", "z"], ["d"], name="linear", mode="linear"),
        helper.make_node("Relu", ["d"], ["y"], name="relu3"),
    ]
    g = helper.make_graph(nodes, "chain", [helper.make_tensor_value_info("x", elem, [1, 2, 3, 4])],
                          [helper.make_tensor_value_info("y", elem, None)], [s, z])  # fmt: skip
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 19)])


def test_resizes_between_device_kernels_capture_as_one_graph(capturing_provider):
    model = _relu_resize_chain(TensorProto.FLOAT)
    sess = onnxep.InferenceSession(model, providers=[(CAP, {"capture": "whole"}), "cpu"])
    plan = sess.capture_plan()
    assert plan.mode == "whole" and not plan.seams and len(plan.segments) == 1, plan.format()
    cpu = onnxep.InferenceSession(model, providers=["cpu"])
    for seed in range(6):
        x = cases.data((1, 2, 3, 4), np.float32, seed)
        np.testing.assert_allclose(sess.run(None, {"x": x})[0], cpu.run(None, {"x": x})[0],
                                   rtol=1e-6, atol=1e-6)  # fmt: skip
    s = sess.capture_stats()
    assert (s["captures"], s["segments"], s["fallbacks"]) == (1, 1, 0) and s["replays"] == 3, s
    assert capturing_provider.uploads == 1 + 4  # nearest: its geometry; linear: 2 axes x 2


def test_an_integer_linear_resize_is_the_one_seam(capturing_provider):
    model = _relu_resize_chain(TensorProto.INT32)
    sess = onnxep.InferenceSession(model, providers=[(CAP, {"capture": "auto"}), "cpu"])
    plan = sess.capture_plan()
    assert [r.name for r in plan.seams] == ["linear"], plan.format()
    assert (
        "linear interpolates float16, float32, float64, uint8 and int8, not int32"
        in plan.seams[0].reason
    )
    assert plan.mode == "segmented" and len(plan.segments) == 2
    x = np.arange(-12, 12, dtype=np.int32).reshape(1, 2, 3, 4)
    for _ in range(4):
        (got,) = sess.run(None, {"x": x})
    np.testing.assert_array_equal(got, onnxep.InferenceSession(model, providers=["cpu"]).run(
        None, {"x": x})[0])  # fmt: skip


# ----------------------------------------------------------------------------- random

_CTMS = ("half_pixel", "half_pixel_symmetric", "pytorch_half_pixel", "align_corners",
         "asymmetric", "tf_crop_and_resize")  # fmt: skip
_NEAREST = ("round_prefer_floor", "round_prefer_ceil", "floor", "ceil")
_DTYPES = (np.float32, np.float16, np.float64, np.uint8, np.int8, np.int32, np.bool_)


def _random_case(rng):
    """Rank 1-5, dims 1-6, any mode, transformation, rounding, antialias, exclude_outside,
    axes (in any order), aspect policy, dtype, scales or sizes, roi for tf_crop_and_resize."""
    r = int(rng.integers(1, 6))
    shape = tuple(int(v) for v in rng.integers(1, 7, r))
    mode = ("nearest", "linear", "cubic")[rng.integers(3)]
    dt = _DTYPES[rng.integers(len(_DTYPES))] if mode == "nearest" else _DTYPES[rng.integers(5)]
    attrs = {"mode": mode, "coordinate_transformation_mode": _CTMS[rng.integers(len(_CTMS))]}
    if mode == "nearest":
        attrs["nearest_mode"] = _NEAREST[rng.integers(4)]
    else:
        attrs["antialias"] = int(rng.integers(2))
        attrs["exclude_outside"] = int(rng.integers(2))
    axes = list(range(r))
    if rng.random() < 0.4:
        axes = [int(a) for a in rng.permutation(r)[: int(rng.integers(1, r + 1))]]
        attrs["axes"] = [a - r if rng.random() < 0.3 else a for a in axes]
    n = len(axes)
    sizes = scales = roi = None
    if rng.random() < 0.5:
        sizes = np.array([int(rng.integers(1, 9)) for _ in axes], np.int64)
        if n > 1 and rng.random() < 0.3:
            attrs["keep_aspect_ratio_policy"] = ("not_larger", "not_smaller")[rng.integers(2)]
    else:
        scales = rng.choice([0.5, 0.6, 1.0, 1.5, 2.0, 3.0], n).astype(np.float32)
    if attrs["coordinate_transformation_mode"] == "tf_crop_and_resize":
        lo = rng.uniform(-0.3, 0.4, n)
        roi = np.concatenate([lo, lo + rng.uniform(0.2, 1.0, n)]).astype(np.float32)
        attrs["extrapolation_value"] = float(rng.choice([0.0, -2.5, 1.0]))
    x = (rng.standard_normal(shape) * 3).astype(dt)
    return shape, dt, attrs, (x, roi, scales, sizes)


@pytest.mark.parametrize("seed", range(3))
def test_random_cases_match_the_generic_kernel(seed, device):
    """A hundred random Resize nodes each, built on the emulated device and on NumPy."""
    from onnxep.providers.ops import op_resize as generic

    rng = np.random.default_rng(seed)
    for i in range(100):
        shape, dt, attrs, ins = _random_case(rng)
        node = _node("Resize", attrs, dt)
        (want,) = generic.resize(node, np)(*ins)
        device.counts.clear()
        (got,) = cuda_resize.resize(node, np)(*ins)
        where = f"case {i}: {shape} {np.dtype(dt)} {attrs} {ins[1:]}"
        assert got.shape == want.shape and got.dtype == want.dtype, where
        # float16 rounds once more than float32; an 8-bit result may land on the other side
        # of a .5 where the two kernels sum their float32 products in another order
        tol = {np.float16: 2e-3, np.uint8: 1, np.int8: 1}.get(dt, 1e-5)
        np.testing.assert_allclose(got.astype(np.float64), want.astype(np.float64), rtol=1e-5,
                                   atol=tol, err_msg=where)  # fmt: skip
        assert sum(device.counts.values()) <= max(len(shape), 1) + 1, (where, device.counts)
