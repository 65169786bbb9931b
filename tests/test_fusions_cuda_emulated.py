"""The fused ops' CUDA kernels (``providers_cuda/ops/fused_cuda.py``) on the CPU emulator.

The exact fusions (Rsqrt, SiLU, SwiGLU) must give, byte for byte, what the CUDA kernels of
the nodes they replace give. Those kernels are ``providers_cuda/elementwise.py``'s; their C
expressions are compiled here into one-op reference kernels and run on the same emulator,
so the comparison is between the same float32 operations as the GPU would run them (the
GPU tests in tests/cuda/test_cuda_fusions.py repeat it on the device). The GELU kernels are
tolerance-level and are compared with the generic kernels. The runners' fallbacks (dtypes
and layouts the kernels do not take) are checked too.
"""

from __future__ import annotations

import cuda_emulator as emu
import numpy as np
import pytest

from onnxep.providers.node import NodeInfo, ValueInfo
from onnxep.providers.ops import op_bias_gelu, op_fast_gelu, op_gelu_contrib
from onnxep.providers_cuda import elementwise as EW
from onnxep.providers_cuda.ops import fused_cuda as FC
from onnxep.testing import TOLERANCES

F32, F16 = np.float32, np.float16
BITS = {F32: np.uint32, F16: np.uint16}
CT = {F32: "float", F16: "__half"}

#: The unfused nodes' CUDA kernels: elementwise.py's expressions, one op per kernel.
UNFUSED_BODY = (
    "".join(
        f"""
template <typename T>
__global__ void {op}_ref(const T* a, T* out, i64 n) {{
  const i64 step = (i64)blockDim.x * gridDim.x;
  for (i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += step) {{
    float x = to_f(a[i]);
    out[i] = from_f<T>({EW.UNARY[op]});
  }}
}}
"""
        for op in ("sigmoid", "sqrt", "reciprocal")
    )
    + f"""
template <typename T>
__global__ void mul_ref(const T* a, const T* b, T* out, i64 n) {{
  const i64 step = (i64)blockDim.x * gridDim.x;
  for (i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += step) {{
    float x = to_f(a[i]);
    float y = to_f(b[i]);
    out[i] = from_f<T>({EW.BINARY["mul"]});
  }}
}}
"""
)
REF_NAMES = tuple(
    f"{k}_ref<{c}>" for k in ("sigmoid", "sqrt", "reciprocal", "mul") for c in CT.values()
)


@pytest.fixture
def emulated(monkeypatch):
    why = emu.why_unavailable()
    if why:
        pytest.skip(why)
    emu.ALL_NAMES.setdefault(FC.FUSED_BODY, FC.FUSED_NAMES)
    emu.ALL_NAMES.setdefault(UNFUSED_BODY, REF_NAMES)
    emu.install(monkeypatch)
    return emu.compile_kernels(UNFUSED_BODY, REF_NAMES)


def _ref(kernels, op, dt, *args):
    out = np.empty(args[0].shape, dt)
    n = args[0].size
    kernels[f"{op}_ref<{CT[dt]}>"](FC.grid(n), (FC.BLOCK,), (*args, out, np.int64(n)))
    return out


def _node(op, dt, n_inputs=1, domain="onnxep"):
    vi = ValueInfo("x", "tensor", np.dtype(dt))
    return NodeInfo(op, domain=domain, inputs=(vi,) * n_inputs)


def _never(*_):
    raise AssertionError("the fused kernel should have run, not the fallback")


def _values(dt, n=1000, seed=0):
    """Ordinary values, and the edges: huge, tiny, zero, +-inf, NaN."""
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal(n) * 4).astype(dt)
    edges = [0.0, -0.0, 1e-7, -1e-7, 30.0, -30.0, 90.0, -90.0, np.inf, -np.inf, np.nan, 65504.0]
    x[: len(edges)] = np.array(edges, np.float64).astype(dt)
    return x


def _same_bits(got, want):
    """Byte-identical, except that any NaN equals any NaN: which NaN a product of two NaNs
    keeps depends on the operand order the compiler picks (a GPU returns one canonical NaN)."""
    assert got.dtype == want.dtype and got.shape == want.shape
    nan = np.isnan(want)
    np.testing.assert_array_equal(np.isnan(got), nan)
    bits = BITS[got.dtype.type]
    np.testing.assert_array_equal(got[~nan].view(bits), want[~nan].view(bits))


@pytest.mark.parametrize("dt", [F32, F16])
def test_rsqrt_is_sqrt_then_reciprocal(emulated, dt):
    x = _values(dt)
    (got,) = FC.unary_runner("rsqrt_k", _node("Rsqrt", dt), np, _never)(x)
    want = _ref(emulated, "reciprocal", dt, _ref(emulated, "sqrt", dt, x))
    _same_bits(got, want)


@pytest.mark.parametrize("dt", [F32, F16])
def test_silu_is_sigmoid_then_mul(emulated, dt):
    x = _values(dt)
    (got,) = FC.unary_runner("silu_k", _node("SiLU", dt), np, _never)(x)
    want = _ref(emulated, "mul", dt, x, _ref(emulated, "sigmoid", dt, x))
    _same_bits(got, want)


def _swiglu_ref(kernels, dt, g, u):
    act = _ref(kernels, "mul", dt, g, _ref(kernels, "sigmoid", dt, g))
    return _ref(kernels, "mul", dt, act, u)


@pytest.mark.parametrize("dt", [F32, F16])
def test_swiglu_is_sigmoid_mul_mul(emulated, dt):
    g, u = _values(dt).reshape(10, 100), _values(dt, seed=1).reshape(10, 100)
    (got,) = FC.swiglu_runner(_node("SwiGLU", dt, 2), np, _never)(g, u)
    _same_bits(got, _swiglu_ref(emulated, dt, g, u))


@pytest.mark.parametrize("dt", [F32, F16])
def test_packed_swiglu_reads_gate_then_up_in_place(emulated, dt):
    gu = _values(dt, 2 * 3 * 2 * 40).reshape(2, 3, 80)
    (got,) = FC.swiglu_runner(_node("SwiGLU", dt), np, _never)(gu)
    g, u = np.ascontiguousarray(gu[..., :40]), np.ascontiguousarray(gu[..., 40:])
    assert got.shape == (2, 3, 40)
    _same_bits(got, _swiglu_ref(emulated, dt, g, u))


@pytest.fixture
def swiglu_kernels(monkeypatch):
    """The SwiGLU kernels each launch ran, by name (``swiglu_k`` or the 16-byte ``swiglu_v``)."""
    ran: list[str] = []
    real = FC.kernels_for

    def recorded(kernel, fn):
        return lambda *args: ran.append(kernel) or fn(*args)

    def recording(kernel, dtype):
        return {dt: recorded(kernel, fn) for dt, fn in real(kernel, dtype).items()}

    monkeypatch.setattr(FC, "kernels_for", recording)
    return ran


@pytest.mark.parametrize("dt", [F32, F16])
@pytest.mark.parametrize(
    ("cols", "offset", "vector"),
    [(48, 0, {F32: True, F16: True}), (12, 0, {F32: True, F16: False}),
     (48, 1, {F32: False, F16: False}), (7, 0, {F32: False, F16: False})],
    ids=["whole-chunks", "f16-half-chunk", "misaligned", "odd"],
)  # fmt: skip
def test_swiglu_in_16_byte_chunks_only_where_widths_and_addresses_allow(
    emulated, swiglu_kernels, dt, cols, offset, vector
):
    """Packed [gate | up] rows: 16-byte chunks when both halves' widths are whole chunks and
    every address aligned, else one element at a time; the same bits either way."""
    rows = 5
    flat = _values(dt, rows * 2 * cols + offset, seed=2)
    gu = flat[offset:].reshape(rows, 2 * cols)  # offset 1: every row one element off
    (got,) = FC.swiglu_runner(_node("SwiGLU", dt), np, _never)(gu)
    g, u = np.ascontiguousarray(gu[:, :cols]), np.ascontiguousarray(gu[:, cols:])
    assert swiglu_kernels == ["swiglu_v" if vector[dt] else "swiglu_k"]
    _same_bits(got, _swiglu_ref(emulated, dt, g, u))


@pytest.mark.parametrize(
    ("op", "generic", "tanh", "bias"),
    [
        ("Gelu", op_gelu_contrib.gelu, False, False),
        ("BiasGelu", op_bias_gelu.bias_gelu, False, True),
        ("FastGelu", op_fast_gelu.fast_gelu, True, False),
        ("FastGelu", op_fast_gelu.fast_gelu, True, True),
    ],
)
@pytest.mark.parametrize("dt", [F32, F16])
def test_gelu_kernels_match_the_generic_ones(emulated, op, generic, tanh, bias, dt):
    node = _node(op, dt, 1 + bias, domain="com.microsoft")
    x = (np.random.default_rng(2).standard_normal((6, 32)) * 3).astype(dt)
    args = (x, np.linspace(-1, 1, 32).astype(dt)) if bias else (x,)
    (got,) = FC.gelu_runner(node, np, _never, tanh_form=tanh)(*args)
    (want,) = generic(node, np)(*args)
    atol, rtol = TOLERANCES[np.dtype(dt)]
    np.testing.assert_allclose(got.astype(F32), want.astype(F32), rtol=rtol, atol=atol)


def test_layouts_and_dtypes_the_kernels_do_not_take_go_to_the_fallback(emulated):
    calls = []

    def fallback(*args):
        calls.append(len(args))
        return (args[0],)

    run = FC.unary_runner("silu_k", _node("SiLU", F32), np, fallback)
    run(np.ones((4, 6), F32)[:, ::2])  # strided
    run(np.ones(4, np.float64))  # a dtype the kernels lack
    swiglu = FC.swiglu_runner(_node("SwiGLU", F32, 2), np, fallback)
    swiglu(np.ones((2, 4), F32), np.ones(4, F32))  # broadcast up
    swiglu(np.ones((2, 5), F32))  # packed with an odd last axis
    gelu = FC.gelu_runner(_node("BiasGelu", F32, 2), np, fallback, tanh_form=False)
    gelu(np.ones((2, 4), F32), np.ones((2, 4), F32))  # a bias that is not one row
    assert calls == [1, 1, 2, 1, 2]
    assert FC.unary_runner("silu_k", _node("SiLU", np.float64), np, fallback) is fallback


def test_empty_inputs_launch_nothing(emulated):
    (y,) = FC.unary_runner("rsqrt_k", _node("Rsqrt", F16), np, _never)(np.ones((0, 3), F16))
    assert y.shape == (0, 3) and y.dtype == F16
