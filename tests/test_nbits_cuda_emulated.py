"""The CUDA MatMulNBits GEMV (up to 8 rows of A) run on the CPU through the kernel emulator.

The cases are the GPU tests' own (tests/cuda/test_cuda_quant.py: 2-, 4- and
8-bit weights, blocks of 16 to 256, no, packed and float zero points, K past
whole blocks and chunks, odd N, float32 and float16, bias, accuracy_level 4),
compared with the CPU provider's kernel with the same tolerances, on NumPy
arrays. The CUDA C is compiled with g++ by tests/cuda_emulator.py with
:data:`HOST_SHIMS` standing in for the CUDA built-ins it uses; the emulated
device has 4 SMs, so narrow products split K across blocks (merged in the same launch).
"""

from __future__ import annotations

import types

import cuda_emulator as emu
import numpy as np
import pytest

from onnxep.providers_cuda.ops import nbits_cuda as K_
from onnxep.providers_cuda.ops import op_matmul_nbits

gpu_quant = emu.gpu_test_module("test_cuda_quant")

#: Host versions of the CUDA built-ins the MatMulNBits source uses beyond the emulator's own.
HOST_SHIMS = r"""
#define __launch_bounds__(...)
struct float4 { float x, y, z, w; };
struct uint2 { unsigned x, y; };
static inline float4 make_float4(float x, float y, float z, float w) { return {x, y, z, w}; }
static inline float __uint_as_float(unsigned u) { float f; memcpy(&f, &u, 4); return f; }
// Byte i of the result is byte (s >> 4i) & 7 of the 8 bytes y:x (x the low four).
static inline unsigned __byte_perm(unsigned x, unsigned y, unsigned s) {
  const unsigned long long v = ((unsigned long long)y << 32) | x;
  unsigned r = 0;
  for (int i = 0; i < 4; ++i) r |= (unsigned)((v >> (8 * ((s >> (4 * i)) & 7))) & 0xFF) << (8 * i);
  return r;
}
template <typename T> static inline T __ldg(const T* p) {
  if (sizeof(T) == 16) emu::check_aligned(p);
  return *p;
}
static inline float __shfl_xor_sync(unsigned, float v, int lane_mask) {
  return emu::shfl_xor(v, lane_mask);
}
template <typename T> static inline T min(T a, T b) { return b < a ? b : a; }
// Dynamic shared memory: one block runs at a time, so one buffer serves every block.
static float4 emu_dyn_smem[48 * 1024 / 16];
"""


def host_source() -> str:
    src = K_.SOURCE.replace("#include <cuda_fp16.h>", "")
    dyn = "extern __shared__ float4 oq_smem_a[];"
    assert dyn in src, "the GEMV's dynamic shared memory declaration changed"
    return HOST_SHIMS + src.replace(dyn, "float4* oq_smem_a = emu_dyn_smem;")


class _DynamicShared:
    """An emulated kernel launched with dynamic shared memory (the shims' static buffer)."""

    def __init__(self, fn, launches):
        self.fn, self.launches = fn, launches

    def __call__(self, grid, block, args, shared_mem=0):
        if shared_mem > 48 * 1024:
            raise emu.EmulatorError(f"{self.fn.name}: {shared_mem} bytes of shared memory")
        self.launches.append(self.fn.name.split("<")[0])
        self.fn(grid, block, args)


@pytest.fixture
def launches(monkeypatch):
    """The builders' ``nbits_cuda`` launches by kernel name; the nodes the tensor-core GEMV
    would take run this GEMV too (test_nbits_mma_cuda_emulated.py tests that one)."""
    why = emu.why_unavailable()
    if why:
        pytest.skip(why)
    monkeypatch.setattr(op_matmul_nbits, "MMA_GEMV", False)
    body = host_source()
    seen: list[str] = []

    def module(exprs):
        fns = emu.compile_kernels(body, exprs)
        return types.SimpleNamespace(get_function=lambda n: _DynamicShared(fns[n], seen))

    monkeypatch.setattr(K_, "module", module)
    monkeypatch.setattr(op_matmul_nbits, "sm_count", lambda: emu.EMULATED_SMS)
    host = types.SimpleNamespace(asarray=np.asarray, asnumpy=np.asarray)
    monkeypatch.setattr(gpu_quant, "device_cupy", lambda: host)
    monkeypatch.setattr(gpu_quant, "device_xp", lambda: np)
    return seen


GEMV_ROWS = (1, 2, 3, 5, 8)
#: The default run's cases: every width and zero-point kind and a K past one shared-memory
#: segment, chosen so they share few kernel builds (each costs seconds of g++ when the cache
#: is cold); the rest run with ``-m slow``.
QUICK = {
    ((4, 32, "packed", 200, 37), np.float16),
    ((4, 32, "packed", 1100, 50), np.float16),
    ((4, 16, "packed", 72, 19), np.float32),
    ((8, 64, "float", 160, 17), np.float32),
}


def _params():
    cases = [(c, np.float32) for c in gpu_quant.NBITS_CASES]
    cases += [(c, np.float16) for c in gpu_quant.NBITS_FP16]
    return [
        pytest.param(
            c, dt, id=f"{'-'.join(map(str, c))}-{np.dtype(dt).name}",
            marks=() if (c, dt) in QUICK else pytest.mark.slow,
        )
        for c, dt in cases
    ]  # fmt: skip


@pytest.mark.parametrize(("case", "dtype"), _params())
def test_gemv_matches_cpu_builder(case, dtype, launches):
    gpu_quant.check_nbits(*case, dtype, rows=GEMV_ROWS)
    assert set(launches) == {"nbits_gemv"}


# Every GEMV splits K three ways (the emulated device is too small to ask for it).
split_k = gpu_quant.split_k


SPLIT_CASES = [
    ((4, 32, "packed", 200, 37), np.float16),
    ((4, 16, "packed", 72, 19), np.float32),  # two blocks per 16-byte chunk
    ((8, 64, "float", 160, 17), np.float32),
    pytest.param((2, 32, "none", 100, 11), np.float32, marks=pytest.mark.slow),
    pytest.param((4, 128, "none", 8960, 24), np.float16, marks=pytest.mark.slow),
]


@pytest.fixture
def runners(monkeypatch):
    """Every MatMulNBits runner built in the test (to look at its split tickets)."""
    built = []
    real = op_matmul_nbits.NBitsRunner.__init__

    def init(self, *args, **kw):
        real(self, *args, **kw)
        built.append(self)

    monkeypatch.setattr(op_matmul_nbits.NBitsRunner, "__init__", init)
    return built


@pytest.mark.parametrize(("case", "dtype"), SPLIT_CASES, ids=str)
def test_split_k_matches_cpu_builder(case, dtype, launches, split_k, runners):
    gpu_quant.check_nbits(*case, dtype, rows=(1, 3, 8))
    # The last split of each block's tasks merges in the same launch: one launch per product,
    # and every ticket back at zero for the next launch (a CUDA graph replays on them).
    assert launches == ["nbits_gemv"] * 3
    assert runners and all(r.geoms[mt].splits > 1 for r in runners for mt in r.geoms)
    for r in runners:
        for mt, done in r.done.items():
            assert done.shape == (r.geoms[mt].bps,) and not done.any()


def test_split_k_repeats_bit_for_bit(launches, split_k, runners):
    """Splits are added in split order whichever block merges: run to run the same bits."""
    gpu_quant.check_nbits(4, 32, "packed", 200, 37, np.float16, rows=(3,))
    (run,) = runners
    rng = np.random.default_rng(7)
    a = rng.standard_normal((3, 200)).astype(np.float16)
    first = run(a)[0]
    emu.EmulatedKernel.reverse = True  # the other fiber order: a missing barrier would show
    try:
        again = run(a)[0]
    finally:
        emu.EmulatedKernel.reverse = False
    np.testing.assert_array_equal(first.view(np.uint16), again.view(np.uint16))


def test_split_k_segments_of_a(launches, split_k):
    """A split longer than one shared-memory segment of A (8 rows of 8960 values)."""
    gpu_quant.check_nbits(4, 32, "packed", 4000, 5, np.float16, rows=(8,))
    geometry = K_.gemv_geometry(5, 125, 4, 8, 4)
    assert geometry.cps > geometry.seg_chunks and geometry.splits == 3
    assert launches == ["nbits_gemv"]


@pytest.mark.parametrize(
    "dtype", [pytest.param(np.float32, marks=pytest.mark.slow), np.float16], ids=["fp32", "fp16"]
)
@pytest.mark.parametrize("bias_kind", ["const", "input"])
def test_gemv_bias(bias_kind, dtype, launches):
    gpu_quant.check_nbits(4, 32, "packed", 96, 37, dtype, bias_kind=bias_kind, rows=GEMV_ROWS)


@pytest.mark.parametrize("bias_kind", ["const", "input"])
def test_split_k_adds_the_bias_once(bias_kind, launches, split_k):
    gpu_quant.check_nbits(4, 32, "packed", 200, 37, np.float16, bias_kind=bias_kind, rows=(2,))


@pytest.mark.parametrize(
    "case",
    [(4, 32, "packed", 200, 37), (8, 64, "none", 160, 17)],
    ids=str,
)
@pytest.mark.slow  # the int8 rounding kernel is unchanged by the GEMV's work; one build each
def test_gemv_accuracy_level_4(case, launches):
    gpu_quant.check_nbits(*case, np.float16, accuracy_level=4, rows=(1, 3))


# ----------------------------------------------------------------------------- geometry


@pytest.mark.parametrize(
    ("k", "n", "bits"),
    [(896, 1152, 4), (896, 896, 4), (896, 4864, 4), (4864, 896, 4), (896, 9728, 4),
     (896, 151936, 4), (1536, 1536, 4), (8960, 1536, 4), (1536, 151936, 4), (4864, 896, 8),
     (100, 3, 2)],
)  # fmt: skip
@pytest.mark.parametrize("mt", [1, 8])
def test_geometry_covers_every_chunk_once_and_splits_only_when_short(k, n, bits, mt):
    chunks = -(-k // (128 // bits))
    g = K_.gemv_geometry(n, chunks, bits, mt, 132)
    lanes_per_task = 1 << g.log2g
    assert g.splits * g.cps >= chunks > (g.splits - 1) * g.cps  # no empty split
    assert g.blocks == g.bps * g.splits
    assert g.bps * (K_.BLOCK_THREADS // lanes_per_task) * g.r >= n or g.bps == 132 * 64
    assert g.smem <= K_.SMEM_BUDGET and g.seg_chunks % 8 == 0
    tasks = -(-n // g.r)
    if g.splits > 1:  # only when one launch's lanes fall short of the device
        assert tasks * lanes_per_task < 132 * K_.RESIDENT_THREADS_PER_SM
        assert g.cps >= lanes_per_task * K_.MIN_SPLIT_CHUNKS


def test_geometry_splits_the_narrow_down_projection_not_the_lm_head():
    assert K_.gemv_geometry(896, 4864 // 32, 4, 1, 132).splits > 1
    assert K_.gemv_geometry(151936, 896 // 32, 4, 1, 132).splits == 1


def test_rows_past_one_launch_run_one_launch_per_eight(launches):
    """Up to :func:`gemv_rows` rows, the GEMV runs once per 8 rows (beyond, the GEMM)."""
    bits, block, zp, k, n = 4, 16, "packed", 72, 19
    most = op_matmul_nbits.gemv_rows(k, n, bits, block, 4, 4)  # float32 A and scales
    assert most == 16, most  # (1140 packed + 2 x 5472 dense bytes) / 1140 x 0.25: 2 launches
    gpu_quant.check_nbits(bits, block, zp, k, n, np.float32, rows=(9, most))
    assert launches == ["nbits_gemv"] * 4


@pytest.mark.parametrize(
    "k,n,bits,act,scale,rows",
    [(896, 4864, 4, 2, 2, 16), (896, 4864, 4, 4, 4, 24), (4864, 896, 8, 2, 2, 8),
     (896, 151936, 4, 2, 2, 16)],
)  # fmt: skip
def test_gemv_rows_from_the_bytes_each_path_moves(k, n, bits, act, scale, rows):
    """Qwen2.5-0.5B's MLP and LM head: wider activations make the dequantised copy dearer."""
    assert op_matmul_nbits.gemv_rows(k, n, bits, 32, act, scale) == rows


@pytest.fixture
def numpy_gemm(monkeypatch):
    """cuBLAS's GEMM as NumPy (float32 products, ``beta`` times what ``out`` holds, rounded to
    ``out``'s type), so the prefill path's dequantisation runs in the emulator; and the
    ``vec`` flag of every dequantisation launch, in order."""
    from onnxep.providers_cuda import blas

    def gemm(a, b, trans_b=False, beta=0.0, out=None):
        prod = a.astype(np.float32) @ (b.T if trans_b else b).astype(np.float32)
        if beta:
            prod += beta * out.astype(np.float32)
        out[...] = prod.astype(out.dtype)
        return out

    monkeypatch.setattr(blas, "gemm", gemm)
    flags: list[int] = []
    real = op_matmul_nbits.NBitsRunner.__init__

    def init(self, *args, **kw):
        real(self, *args, **kw)
        dequant = self.dequant
        self.dequant = lambda grid, block, args: (
            flags.append(int(args[-1])) or dequant(grid, block, args)
        )

    monkeypatch.setattr(op_matmul_nbits.NBitsRunner, "__init__", init)
    return flags


#: (case, dtype, whether K is whole packed words, so the dequantisation stores vectors)
GEMM_CASES = [
    ((4, 32, "packed", 200, 37), np.float16, True),  # 16-byte stores
    ((4, 16, "packed", 72, 19), np.float32, True),  # 32 bytes: two 16-byte stores
    ((8, 64, "float", 160, 17), np.float16, True),  # 8 bytes: one 8-byte store
    ((8, 64, "float", 160, 17), np.float32, True),
    ((4, 32, "packed", 1100, 50), np.float16, False),  # K ends mid-word: one value at a time
    ((2, 32, "none", 100, 11), np.float32, False),
]


@pytest.mark.parametrize(("case", "dtype", "vec"), GEMM_CASES)
def test_gemm_path_dequantises_tiles_as_the_cpu_does(case, dtype, vec, launches, numpy_gemm,
                                                     monkeypatch):  # fmt: skip
    """Past the GEMV's rows the weight is dequantised a tile at a time (three or more here)
    and multiplied; whole words leave in vector stores, a ragged K one value at a time."""
    bits, _, _, k, n = case
    itemsize = np.dtype(dtype).itemsize
    monkeypatch.setattr(op_matmul_nbits, "GEMM_TILE_BYTES", k * itemsize * max(1, n // 3))
    monkeypatch.setattr(op_matmul_nbits, "GEMM_TILE_ALIGN", 4)
    gpu_quant.check_nbits(*case, dtype, rows=(40,))
    assert "nbits_dequant" in launches and len(numpy_gemm) >= 3
    assert set(numpy_gemm) == {int(vec)}


def test_gemm_tiles_that_split_n_start_on_128_rows():
    """The LM head of Qwen2.5-1.5B (K = 1536, N = 151936, float16): 64 MiB is 21845 rows,
    cut to 21760; a weight whose dequantised copy fits takes one tile of all N."""
    assert op_matmul_nbits.gemm_tile(151936, 1536, 2) == 21760
    assert op_matmul_nbits.gemm_tile(1536, 8960, 2) == 1536
    assert op_matmul_nbits.gemm_tile(10, 1 << 26, 4) == 1  # a row beyond the budget: one row
