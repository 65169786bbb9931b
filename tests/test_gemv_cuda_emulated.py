"""The CUDA GEMV (``gemv_cuda.Gemv``, which MatMulBias runs for few rows of A) on the CPU.

The kernels are the GEMV itself and the provider's MatMulBias builder on NumPy
arrays, with ``reduce_cuda``'s compiler and SM count pointed at
tests/cuda_emulator.py (4 SMs, so modest shapes split K across blocks). Each
product is compared with NumPy in float64; the emulator also reports
misaligned 16-byte loads, out-of-bounds writes and barrier misuse.
"""

from __future__ import annotations

import cuda_emulator as emu
import numpy as np
import pytest

from onnxep.providers.node import NodeInfo, ValueInfo
from onnxep.providers.ops import op_add as generic_add
from onnxep.providers_cuda.ops import gemv_cuda as G
from onnxep.providers_cuda.ops import op_matmul_bias

F32, F16 = np.float32, np.float16
TOL = {F32: (2e-5, 2e-5), F16: (2e-3, 2e-3)}


@pytest.fixture
def emulated(monkeypatch):
    why = emu.why_unavailable()
    if why:
        pytest.skip(why)
    emu.install(monkeypatch)
    emu.ALL_NAMES.setdefault(G.GEMV_BODY, G.GEMV_NAMES)
    # MatMulBias builds the CUDA Add for the cases it hands on; its raw kernel needs CuPy.
    monkeypatch.setattr(op_matmul_bias.op_add, "add", generic_add.add)


def _node(op: str, domain: str, dtype) -> NodeInfo:
    n_in = 3 if op == "MatMulBias" else 2
    ins = tuple(ValueInfo(f"x{i}", "tensor", np.dtype(dtype)) for i in range(n_in))
    return NodeInfo(op, domain, "n", 13, {}, ins, (ValueInfo("y"),))


def _launches(monkeypatch):
    counts: dict[str, int] = {}
    real = G.Gemv.__init__

    def init(self, xp, dtype=None):
        real(self, xp, dtype)
        for fns in self.fns.values():
            for name, fn in fns.items():
                fns[name] = _Counted(fn, name, counts)

    monkeypatch.setattr(G.Gemv, "__init__", init)
    return counts


class _Counted:
    def __init__(self, fn, name, counts):
        self.fn, self.name, self.counts = fn, name, counts

    def __call__(self, *args, **kw):
        self.counts[self.name.split("<")[0]] = self.counts.get(self.name.split("<")[0], 0) + 1
        return self.fn(*args, **kw)


def _operands(a_shape, k, n, dtype, seed=0):
    rng = np.random.default_rng(seed)
    a = rng.standard_normal((*a_shape, k)).astype(dtype)
    b = (rng.standard_normal((k, n)) / np.sqrt(k)).astype(dtype)
    bias = rng.standard_normal(n).astype(dtype)
    return a, b, bias


def _check(got, a, b, bias, dtype):
    ref = a.astype(np.float64) @ b.astype(np.float64)
    if bias is not None:
        ref = ref + bias.astype(np.float64)
    assert got.shape == ref.shape and got.dtype == np.dtype(dtype)
    rtol, atol = TOL[dtype]
    np.testing.assert_allclose(got.astype(np.float64), ref, rtol=rtol, atol=atol)


# (A's leading dims, K, N): rows 1..8, N with and without 16-byte rows, K tails; on 4 SMs
# the narrow ones split K (checked below), the wide ones do not.
CASES = [
    ((1,), 16, 8),
    ((1,), 300, 64),
    ((2,), 37, 24),
    ((3,), 1000, 40),
    ((4,), 129, 13),
    ((5,), 520, 7),
    ((2, 3), 64, 264),
    ((7,), 40, 1030),
    ((8,), 600, 96),
    ((), 33, 17),
]


@pytest.mark.parametrize("dtype", [F16, F32], ids=["f16", "f32"])
@pytest.mark.parametrize(("lead", "k", "n"), CASES)
def test_gemv_matches_numpy_in_one_launch(lead, k, n, dtype, emulated, monkeypatch):
    launches = _launches(monkeypatch)
    gemv = G.Gemv(np, dtype)
    a, b, _ = _operands(lead, k, n, dtype)
    assert gemv.takes(a, b)
    _check(gemv(a, b), a, b, None, dtype)
    # A split K merges in the kernel's last block per tile: one launch either way, and the
    # tickets are back at zero for the next launch (a CUDA graph replays on them).
    assert launches == {"gemv_kn": 1}
    for p, done in gemv.plans.plans.values():
        assert not done.any() and (p.splits == 1 or done.size == p.tiles)


@pytest.mark.parametrize("dtype", [F16, F32], ids=["f16", "f32"])
@pytest.mark.parametrize(("lead", "k", "n"), [((1,), 300, 64), ((3,), 45, 21), ((6,), 64, 600)])
def test_matmul_bias_adds_the_bias_before_the_one_rounding(lead, k, n, dtype, emulated):
    run = op_matmul_bias.matmul_bias(_node("MatMulBias", "onnxep", dtype), np)
    a, b, bias = _operands(lead, k, n, dtype, seed=1)
    (got,) = run(a, b, bias)
    _check(got, a, b, bias, dtype)
    # One rounding: the float32 sum with the bias in it, rounded once (not product, then sum).
    if dtype == F16:
        exact = (a.astype(np.float64) @ b.astype(np.float64) + bias.astype(np.float64)).astype(F16)
        assert np.mean(got == exact) > 0.95


def test_split_and_unsplit_agree_and_repeat_bit_for_bit(emulated, monkeypatch):
    a, b, bias = _operands((2,), 1000, 64, F16, seed=2)
    launches = _launches(monkeypatch)
    run = op_matmul_bias.matmul_bias(_node("MatMulBias", "onnxep", F16), np)
    (split,) = run(a, b, bias)
    (again,) = run(a, b, bias)  # the same plan and tickets, as a graph replay uses them
    assert G.plan(2, 64, 1000, 2, True, 4).splits > 1
    assert launches == {"gemv_kn": 2}
    np.testing.assert_array_equal(split.view(np.uint16), again.view(np.uint16))
    monkeypatch.setattr(G, "FILL_PER_SM", 0)  # no block target: one split
    assert G.plan(2, 64, 1000, 2, True, 4).splits == 1
    (whole,) = op_matmul_bias.matmul_bias(_node("MatMulBias", "onnxep", F16), np)(a, b, bias)
    np.testing.assert_allclose(whole.astype(F32), split.astype(F32), rtol=2e-3, atol=2e-3)
    _check(whole, a, b, bias, F16)


def test_float16_sums_in_float32(emulated):
    k = 2048
    a = np.full((1, k), 1.0009765625, F16)  # 1 + 2**-10: a float16 sum would lose whole units
    b = np.ones((k, 16), F16)
    got = G.Gemv(np, F16)(a, b)
    want = k * 1.0009765625
    assert np.all(np.abs(got.astype(np.float64) - want) <= want * 1e-3)


def test_misaligned_weight_reads_one_column_at_a_time(emulated):
    a, b, _ = _operands((1,), 50, 32, F32, seed=3)
    base = np.zeros(b.size + 1, F32)
    base[1:] = b.reshape(-1)
    shifted = base[1:].reshape(b.shape)  # 4 bytes off 16: a vector load would be reported
    assert shifted.ctypes.data % 16
    gemv = G.Gemv(np, F32)
    assert gemv.takes(a, shifted)
    got = gemv(a, shifted)
    _check(got, a, b, None, F32)


def test_strided_activations_are_read_after_a_copy(emulated):
    a, b, _ = _operands((2,), 48, 16, F16, seed=4)
    wide = np.zeros((2, 96), F16)
    wide[:, ::2] = a
    got = G.Gemv(np, F16)(wide[:, ::2], b)
    _check(got, a, b, None, F16)


def test_fiber_order_does_not_change_results(emulated, monkeypatch):
    """A missing barrier would let one thread read what another has not written yet."""
    a, b, bias = _operands((3,), 700, 48, F16, seed=5)
    run = op_matmul_bias.matmul_bias(_node("MatMulBias", "onnxep", F16), np)
    (fwd,) = run(a, b, bias)
    monkeypatch.setattr(emu.EmulatedKernel, "reverse", True)
    (rev,) = run(a, b, bias)
    np.testing.assert_array_equal(fwd.view(np.uint16), rev.view(np.uint16))


# ----------------------------------------------------------------------------- routing and plans


def test_routing_takes_few_rows_of_a_2d_float_weight_only(emulated):
    gemv = G.Gemv(np, None)
    b = np.zeros((16, 8), F16)
    assert gemv.takes(np.zeros((8, 16), F16), b)
    assert gemv.takes(np.zeros((2, 4, 16), F16), b)
    assert gemv.takes(np.zeros(16, F16), b)
    assert not gemv.takes(np.zeros((9, 16), F16), b)  # prefill: cuBLAS
    assert not gemv.takes(np.zeros((3, 3, 16), F16), b)
    assert not gemv.takes(np.zeros((1, 16), F16), np.zeros((2, 16, 8), F16))  # batched B
    assert not gemv.takes(np.zeros((1, 16), F16), b.T.copy().T)  # a transposed view
    assert not gemv.takes(np.zeros((1, 16), F32), b)  # mixed dtypes
    assert not gemv.takes(np.zeros((1, 16)), np.zeros((16, 8)))  # float64
    assert not gemv.takes(np.zeros((1, 0), F16), np.zeros((0, 8), F16))  # empty K
    assert not gemv.takes(np.zeros((0, 16), F16), b)  # no rows


@pytest.mark.parametrize(
    ("m", "n", "k", "itemsize", "sms"),
    [(1, 896, 896, 2, 132), (1, 4864, 896, 2, 132), (1, 896, 4864, 2, 132),
     (1, 151936, 896, 2, 132), (8, 1536, 8960, 4, 132), (3, 7, 5, 2, 4), (1, 1, 1, 4, 132)],
)  # fmt: skip
def test_plan_covers_the_product_and_splits_only_to_fill_the_device(m, n, k, itemsize, sms):
    for vec in (True, False):
        p = G.plan(m, n, k, itemsize, vec, sms)
        tx = 1 << p.log2tx
        assert p.tiles * tx * p.v >= n > (p.tiles - 1) * tx * p.v
        assert p.splits * p.kc >= k > (p.splits - 1) * p.kc  # every row once, no empty split
        assert p.mt >= m
        if p.splits > 1:
            assert p.tiles < sms * G.FILL_PER_SM
            assert p.kc >= (G.BLOCK // tx) * G.UNROLL  # a thread keeps its loads in flight
    lm_head = G.plan(1, 151936, 896, 2, True, 132)
    assert lm_head.splits == 1  # N alone fills the device
    assert G.plan(1, 896, 4864, 2, True, 132).splits > 1  # the down projection cannot


def test_driver_launch_signatures_match_the_kernels(emulated, monkeypatch):
    """On a GPU the launches go through ``launch.Launcher``, which packs 8-byte arguments by
    a signature string: it must be the kernels' own (g++ reads it from the C parameters)."""
    from onnxep.providers_cuda import elementwise, launch

    made = []

    class Recorder:
        def __init__(self, fn, signature):
            made.append((fn.name, fn.signature, signature))

    monkeypatch.setattr(launch, "Launcher", Recorder)
    monkeypatch.setattr(elementwise, "stream_ptr_fn", lambda: lambda: 0)
    gemv = G.Gemv(np, None)
    gemv.driver(list(gemv.fns))
    assert len(made) == len(G.GEMV_NAMES)
    for name, real, packed in made:
        assert packed == real, name
