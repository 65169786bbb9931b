"""The CUDA provider's own kernels: raw elementwise launches, Mod, and the declined DFT/Dropout."""

from __future__ import annotations

import numpy as np
import pytest
from _models import F16, F32, single
from onnx import TensorProto, helper

import onnxep

cupy = pytest.importorskip("cupy", reason="the CUDA tests need CuPy and a GPU")

SHAPES = [
    ((2, 3, 4), (2, 3, 4)),  # same shape
    ((2, 3, 4), ()),  # scalar
    ((2, 3, 4), (4,)),  # a bias
    ((2, 3, 4), (2, 1, 1)),  # per-row
    ((2, 3, 4), (3, 1)),  # a middle block
    ((1, 4), (3, 1)),  # both broadcast: the generic kernel
    ((5,), (5,)),
]


@pytest.mark.parametrize("op", ["Add", "Sub", "Mul", "Div"])
@pytest.mark.parametrize(("sa", "sb"), SHAPES)
@pytest.mark.parametrize("elem", [F32, F16])
def test_binary_matches_cpu(op, sa, sb, elem):
    dt = np.float32 if elem == F32 else np.float16
    m = single(op, [("a", elem, list(sa)), ("b", elem, list(sb))], [("c", elem, None)])
    rng = np.random.default_rng(len(sa) + len(sb))
    f = {"a": rng.standard_normal(sa).astype(dt), "b": (rng.random(sb) + 0.5).astype(dt)}
    gpu = onnxep.InferenceSession(m, onnxep.SessionOptions(disable_fallback=True), ["cuda"])
    want = onnxep.InferenceSession(m, providers=["cpu"]).run(None, f)[0]
    got = gpu.run(None, f)[0]
    assert got.dtype == want.dtype and got.shape == want.shape
    np.testing.assert_array_equal(got, want)  # one rounding of the same float32 result


@pytest.mark.parametrize(
    "op", ["Relu", "Neg", "Abs", "Sqrt", "Exp", "Tanh", "Sigmoid", "Reciprocal"]
)
@pytest.mark.parametrize("elem", [F32, F16])
def test_unary_matches_cpu(op, elem):
    dt = np.float32 if elem == F32 else np.float16
    m = single(op, [("x", elem, [4, 33])], [("y", elem, [4, 33])])
    x = np.random.default_rng(3).standard_normal((4, 33)).astype(dt)
    x[0, :3] = [np.nan, np.inf, -np.inf]
    gpu = onnxep.InferenceSession(m, onnxep.SessionOptions(disable_fallback=True), ["cuda"])
    with np.errstate(all="ignore"):
        want = onnxep.InferenceSession(m, providers=["cpu"]).run(None, {"x": x})[0]
    got = gpu.run(None, {"x": x})[0]
    atol, rtol = (1e-5, 1e-4) if elem == F32 else (2.5e-3, 1e-3)
    np.testing.assert_allclose(got.astype(np.float64), want.astype(np.float64), rtol, atol)


def test_non_contiguous_inputs_fall_back_to_the_generic_kernel():
    # Transpose yields a strided view on the device; Add must still be right.
    nodes = [
        helper.make_node("Transpose", ["a"], ["t"], perm=[1, 0]),
        helper.make_node("Add", ["t", "b"], ["c"]),
    ]
    g = helper.make_graph(
        nodes,
        "g",
        [
            helper.make_tensor_value_info("a", F32, [3, 4]),
            helper.make_tensor_value_info("b", F32, [4, 3]),
        ],
        [helper.make_tensor_value_info("c", F32, [4, 3])],
    )
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    rng = np.random.default_rng(0)
    f = {
        "a": rng.standard_normal((3, 4)).astype(np.float32),
        "b": rng.standard_normal((4, 3)).astype(np.float32),
    }
    got = onnxep.InferenceSession(m, providers=["cuda"]).run(None, f)[0]
    np.testing.assert_allclose(got, f["a"].T + f["b"], rtol=1e-6)


@pytest.mark.parametrize("elem", [F16, F32, TensorProto.DOUBLE])
def test_mod_matches_numpy_at_infinities_and_zeros(elem):
    dt = {F16: np.float16, F32: np.float32, TensorProto.DOUBLE: np.float64}[elem]
    a = np.array([-4, 7, 5, 4, -7, 8, 3, -1, 1, 0, -0.0, 2, np.inf, np.nan], dt)
    b = np.array([2, -3, 8, -2, 3, 5, np.inf, np.inf, -np.inf, 3, -2, 0, 2, 1], dt)
    m = single("Mod", [("a", elem, [14]), ("b", elem, [14])], [("c", elem, [14])], opset=13)
    got = onnxep.InferenceSession(m, onnxep.SessionOptions(disable_fallback=True), ["cuda"]).run(
        None, {"a": a, "b": b}
    )[0]
    with np.errstate(all="ignore"):
        want = np.remainder(a, b)
    np.testing.assert_array_equal(got, want)
    real = ~np.isnan(want)  # a NaN's sign bit is the platform's, not NumPy's rule
    np.testing.assert_array_equal(np.signbit(got[real]), np.signbit(want[real]))


def test_inverse_float32_dft_is_declined_forward_runs():
    def dft(inverse):
        return single(
            "DFT",
            [("x", F32, [1, 8, 1])],
            [("y", F32, [1, 8, 2])],
            {"inverse": inverse, "axis": 1},
            opset=17,
        )

    (fwd,) = list(onnxep.InferenceSession(dft(0), providers=["cuda", "cpu"]).placement())
    (inv,) = list(onnxep.InferenceSession(dft(1), providers=["cuda", "cpu"]).placement())
    assert fwd.provider == "cuda"
    assert inv.provider == "cpu" and "inverse" in dict(inv.declined)["cuda"]


def test_training_dropout_is_declined_inference_dropout_runs():
    def dropout(training):
        t = helper.make_tensor("t", TensorProto.BOOL, [], [training])
        r = helper.make_tensor("r", F32, [], [0.5])
        return single(
            "Dropout",
            [("x", F32, [4]), ("r", F32, []), ("t", TensorProto.BOOL, [])],
            [("y", F32, [4])],
            opset=13,
            inits=[r, t],
        )

    (inf,) = list(onnxep.InferenceSession(dropout(False), providers=["cuda", "cpu"]).placement())
    (tr,) = list(onnxep.InferenceSession(dropout(True), providers=["cuda", "cpu"]).placement())
    assert inf.provider == "cuda"
    assert tr.provider == "cpu" and "training_mode" in dict(tr.declined)["cuda"]


def test_raw_launches_go_through_the_driver():
    from onnxep.providers_cuda import elementwise

    m = single("Add", [("a", F32, [4]), ("b", F32, [4])], [("c", F32, [4])])
    onnxep.InferenceSession(m, providers=["cuda"])
    launchers = elementwise.launchers("add", "pppqqqqq")
    assert all(la.direct for la in launchers.values())
    # the packed-buffer launch computes what the kernel's own CuPy launch computes
    a = cupy.arange(6, dtype=cupy.float32)
    out = cupy.empty(6, cupy.float32)
    la = launchers[np.dtype(np.float32)]
    la(
        1,
        256,
        (a.data.ptr, a.data.ptr, out.data.ptr, 6, 1, 6, 1, 6),
        cupy.cuda.get_current_stream().ptr,
    )
    np.testing.assert_array_equal(out.get(), 2 * np.arange(6, dtype=np.float32))
