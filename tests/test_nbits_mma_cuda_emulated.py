"""The tensor-core int4 MatMulNBits GEMV (``nbits_mma_cuda``) on the CPU kernel emulator.

The kernel's CUDA C runs on tests/cuda_emulator.py with :data:`HOST_MMA_PRIMS` standing in
for its f16x2 and ``mma.sync`` instructions: the f16x2 operations round as the GPU's do,
and the MMA is computed from the 32 lanes' fragments laid out as PTX's m16n8k16 tables
place them, so a fragment built in the wrong lane or register gives a wrong product here.
Products are checked against the CPU provider's MatMulNBits (the GPU tests' own cases
and tolerances, tests/cuda/test_cuda_quant.py), the SwiGLU epilogue byte for byte against
the unfused SwiGLU kernel on the kernel's own plain output, and the launch geometry as a
function. The emulated device has 4 SMs, so small shapes share tiles between warps.
"""

from __future__ import annotations

import cuda_emulator as emu
import numpy as np
import pytest
from test_gemv_nt_cuda_emulated import swiglu_k

from onnxep.providers_cuda.ops import nbits_mma_cuda as M
from onnxep.providers_cuda.ops import op_matmul_nbits
from onnxep.providers_cuda.ops.nbits_weights import Weights

gpu_quant = emu.gpu_test_module("test_cuda_quant")

#: Host versions of the names in ``nbits_mma_cuda.MMA_PRIMS`` (and the CUDA built-ins the
#: kernel uses beyond the emulator's own).
HOST_MMA_PRIMS = r"""
#define __launch_bounds__(...)
static inline uint4 make_uint4(unsigned x, unsigned y, unsigned z, unsigned w) {
  return {x, y, z, w};
}
template <typename T> static inline T min(T a, T b) { return b < a ? b : a; }
static inline double h_val(unsigned bits) {
  _Float16 f; const uint16_t b = (uint16_t)bits; memcpy(&f, &b, 2); return (double)f;
}
// One correct rounding of an exactly computed value, as an f16x2 instruction rounds.
static inline unsigned h_bits(double v) {
  const _Float16 f = (_Float16)v; uint16_t b; memcpy(&b, &f, 2); return b;
}
static inline unsigned h2_sub(unsigned a, unsigned b) {
  return h_bits(h_val(a & 0xFFFFu) - h_val(b & 0xFFFFu)) |
         (h_bits(h_val(a >> 16) - h_val(b >> 16)) << 16);
}
static inline unsigned h2_fma(unsigned a, unsigned b, unsigned c) {
  return h_bits(h_val(a & 0xFFFFu) * h_val(b & 0xFFFFu) + h_val(c & 0xFFFFu)) |
         (h_bits(h_val(a >> 16) * h_val(b >> 16) + h_val(c >> 16)) << 16);
}
// mma.sync.m16n8k16.row.col f32.f16.f16.f32: every lane of the warp deposits its fragments,
// then each computes its four D values from the whole A (16 x 16) and B (16 x 8).
static unsigned mma_frag[32][32][6];
static inline void mma_16816(float (&d)[4], const unsigned (&a)[4], unsigned b0, unsigned b1) {
  const int lane = emu::current & 31, warp = emu::current >> 5;
  for (int i = 0; i < 4; ++i) mma_frag[warp][lane][i] = a[i];
  mma_frag[warp][lane][4] = b0;
  mma_frag[warp][lane][5] = b1;
  emu::park(emu::AT_WARP);
  double A[16][16], B[16][8];
  for (int l = 0; l < 32; ++l) {
    const int g = l >> 2, t = l & 3;
    const unsigned* f = mma_frag[warp][l];
    for (int h = 0; h < 2; ++h) {
      const int sh = 16 * h;
      A[g][2 * t + h] = h_val(f[0] >> sh);
      A[g + 8][2 * t + h] = h_val(f[1] >> sh);
      A[g][2 * t + 8 + h] = h_val(f[2] >> sh);
      A[g + 8][2 * t + 8 + h] = h_val(f[3] >> sh);
      B[2 * t + h][g] = h_val(f[4] >> sh);
      B[2 * t + 8 + h][g] = h_val(f[5] >> sh);
    }
  }
  const int g = lane >> 2, t = lane & 3;
  float out[4];
  for (int i = 0; i < 4; ++i) {
    const int row = g + 8 * (i >> 1), col = 2 * t + (i & 1);
    float acc = d[i];
    for (int k = 0; k < 16; ++k) acc += (float)(A[row][k] * B[k][col]);  // exact products
    out[i] = acc;
  }
  emu::park(emu::AT_WARP);  // every lane has read the fragments before any deposits again
  for (int i = 0; i < 4; ++i) d[i] = out[i];
}
static inline uint4 ldg16(const void* p) {
  emu::check_aligned(p); uint4 u; memcpy(&u, p, 16); return u;
}
// Byte i of the result is byte (s >> 4i) & 7 of the 8 bytes b:a (a the low four).
static inline unsigned perm(unsigned a, unsigned b, unsigned s) {
  const unsigned long long v = ((unsigned long long)b << 32) | a;
  unsigned r = 0;
  for (int i = 0; i < 4; ++i) r |= (unsigned)((v >> (8 * ((s >> (4 * i)) & 7))) & 0xFF) << (8 * i);
  return r;
}
static inline unsigned hbits(__half h) { return h.bits; }
// Dynamic shared memory: one block runs at a time, so one buffer serves every block.
static uint4 nm_smem[48 * 1024 / 16];
"""


def _every_name() -> tuple[str, ...]:
    """The instantiations these tests build, in one g++ build (and cache) of the source."""
    h, f = "__half", "float"
    combos = [(h, h, zp, sub, 0, 0, 0) for zp in (0, 1) for sub in (0, 1)]
    combos += [(h, h, 1, 0, sw, nm, 0) for sw, nm in ((1, 0), (0, 1), (1, 1))]
    combos += [(h, f, 0, 0, 0, 0, 0)]  # float32 scales
    # accuracy_level 4: float32 A (and float16 A) rounded to int8 in the staging
    combos += [(f, f, zp, sub, 0, 0, 1) for zp in (0, 1) for sub in (0, 1)]
    combos += [(h, h, zp, sub, 0, 0, 1) for zp in (0, 1) for sub in (0, 1)]
    combos += [(ta, ta, 1, 0, sw, nm, 1) for ta in (h, f) for sw, nm in ((1, 0), (0, 1), (1, 1))]
    return tuple(
        M.kernel_name(ta, ts, zp, sub, mt, sw, nm, q8)
        for ta, ts, zp, sub, sw, nm, q8 in combos
        for mt in M.ROW_TILES
    )


def install(monkeypatch) -> None:
    """The MMA kernel's compiler, device queries and instructions pointed at the emulator."""
    why = emu.why_unavailable()
    if why:
        pytest.skip(why)
    emu.install(monkeypatch)
    monkeypatch.setattr(M, "MMA_PRIMS", HOST_MMA_PRIMS)
    emu.ALL_NAMES.setdefault(M.source(), _every_name())


@pytest.fixture
def mma(monkeypatch):
    """Launches of the MMA kernel by name (the op builders' other kernels are not emulated
    here: a test that reaches them fails)."""
    install(monkeypatch)
    seen: list[str] = []
    real = M.NbitsMma.emulated

    def counted(self, name, grid, smem, ptrs, ints):
        seen.append(name)
        return real(self, name, grid, smem, ptrs, ints)

    monkeypatch.setattr(M.NbitsMma, "emulated", counted)
    monkeypatch.setattr(op_matmul_nbits, "sm_count", lambda: emu.EMULATED_SMS)
    monkeypatch.setattr(op_matmul_nbits.K_, "module", no_old_kernels)
    host = type("Host", (), {"asarray": staticmethod(np.asarray), "asnumpy": np.asarray})
    monkeypatch.setattr(gpu_quant, "device_cupy", lambda: host)
    monkeypatch.setattr(gpu_quant, "device_xp", lambda: np)
    return seen


class _Unbuilt:
    def get_function(self, name):
        return _unreachable


def _unreachable(*args, **kw):
    raise AssertionError("the case ran nbits_cuda's kernels, not the MMA GEMV")


def no_old_kernels(exprs):
    return _Unbuilt()


F16, F32 = np.float16, np.float32
ROWS = (1, 2, 3, 5, 8)
F16_TOL = {"rtol": 2e-3, "atol": 3e-3}
#: float16 4-bit cases of the GPU tests the MMA GEMV takes (not the float zero points).
CASES = [c for c in gpu_quant.NBITS_CASES if c[0] == 4 and c[2] != "float"]


@pytest.mark.parametrize("case", CASES, ids=lambda c: "-".join(map(str, c)))
def test_matches_cpu_builder(case, mma):
    gpu_quant.check_nbits(*case, np.float16, rows=ROWS)
    assert mma and all(n.startswith("nbits_mma<__half") for n in mma)
    assert {n.split(", ")[4] for n in mma} == {"1", "2", "4", "8"}  # every row tile


@pytest.mark.parametrize("bias_kind", ["const", "input"])
def test_bias(bias_kind, mma):
    gpu_quant.check_nbits(4, 32, "packed", 96, 37, np.float16, bias_kind=bias_kind, rows=(1, 5))


def test_one_warp_a_tile_and_blocks_walking_units(mma):
    """K of one k-step leaves each tile one warp (P = 1), and 33 units for a 32-block grid
    make block 0 walk two."""
    p = M.plan(1, 2100, 2, emu.EMULATED_SMS)
    assert p.log2p == 0 and p.units == 33 and p.grid == 32
    gpu_quant.check_nbits(4, 32, "none", 40, 2100, np.float16, rows=(1, 3))


def test_misaligned_and_odd_k_stage_element_by_element(mma):
    gpu_quant.check_nbits(4, 32, "packed", 37, 19, np.float16, rows=(1, 2))
    rng = np.random.default_rng(2)
    k, n = 64, 24
    b, scales, zp = gpu_quant.nbits_consts(rng, k, n, 4, 32, "packed", np.float16)
    node = gpu_quant.nbits_node(k, n, 4, 32, np.float16, b, scales, zp)
    cpu, cuda = gpu_quant.builders()
    buf = np.empty(k + 1, np.float16)
    a = buf[1:].reshape(1, k)  # 2 bytes off the 16-byte boundary
    a[...] = rng.standard_normal((1, k))
    (want,) = cpu(node, np)(a, b, scales, zp)
    (got,) = cuda(node, np)(a, b, scales, zp)
    np.testing.assert_allclose(got.astype(np.float64), want.astype(np.float64), **F16_TOL)


def test_float32_scales(mma):
    """bfloat16 or float64 scales reach the kernel as float32 (``nbits_weights``)."""
    rng = np.random.default_rng(4)
    k, n = 96, 21
    b, _, _ = gpu_quant.nbits_consts(rng, k, n, 4, 32, "none", np.float16)
    scales = (rng.random((n, 3)) * 0.1 + 0.01).astype(np.float64)
    node = gpu_quant.nbits_node(k, n, 4, 32, np.float16, b, scales, None)
    cpu, cuda = gpu_quant.builders()
    a = rng.standard_normal((2, k)).astype(np.float16)
    (want,) = cpu(node, np)(a, b, scales)
    (got,) = cuda(node, np)(a, b, scales)
    np.testing.assert_allclose(got.astype(np.float64), want.astype(np.float64), **F16_TOL)
    assert mma[0].startswith("nbits_mma<__half, float,")


#: accuracy_level 4 cases (bits, block, zero points, K, N): blocks of 16 (two a chunk) and
#: past one chunk, K past whole blocks, odd N.
LEVEL4 = [(4, 32, "packed", 200, 37), (4, 16, "packed", 72, 19), (4, 128, "none", 300, 23),
          (4, 32, "none", 1100, 50)]  # fmt: skip


@pytest.mark.parametrize("dtype", [F32, F16], ids=["f32", "f16"])
@pytest.mark.parametrize("case", LEVEL4, ids=lambda c: "-".join(map(str, c)))
def test_accuracy_level_4_rounds_in_the_staging(case, dtype, mma):
    """A rounded to int8 per block of K as the CPU rounds it, in the same launch: the CPU
    provider's results within the usual tolerances (the GPU tests' own check)."""
    gpu_quant.check_nbits(*case, dtype, accuracy_level=4, rows=ROWS)
    assert mma and all(n.endswith(", 1>") for n in mma)  # the Q8 instantiations
    assert all(n.startswith(f"nbits_mma<{M.CT[np.dtype(dtype)]}") for n in mma)


def test_float32_a_at_accuracy_level_0_runs_the_other_gemv():
    assert not M.NbitsMma.takes(4, F32, M.ZP_PACKED, False, 32, np)
    assert M.NbitsMma.takes(4, F32, M.ZP_PACKED, True, 32, np)


def test_repeats_bit_for_bit_in_both_fiber_orders(mma):
    rng = np.random.default_rng(7)
    k, n = 520, 37  # tiles shared by several warps, added in warp order
    b, scales, zp = gpu_quant.nbits_consts(rng, k, n, 4, 32, "packed", np.float16)
    node = gpu_quant.nbits_node(k, n, 4, 32, np.float16, b, scales, zp)
    run = op_matmul_nbits.matmul_nbits(node, np)
    a = rng.standard_normal((3, k)).astype(np.float16)
    first = run(a, b, scales, zp)[0]
    emu.EmulatedKernel.reverse = True
    try:
        again = run(a, b, scales, zp)[0]
    finally:
        emu.EmulatedKernel.reverse = False
    np.testing.assert_array_equal(first.view(np.uint16), again.view(np.uint16))
    assert M.plan(3, n, -(-k // 32), emu.EMULATED_SMS).log2p > 0


# --------------------------------------------------------------- the SwiGLU epilogue


def weight_tables(rng, k, n, block=32, zp_kind="packed", dtype=F16):
    """Random weights of a node, as the kernel reads them: (B, scales, zero points), layout."""
    b, scales, zp = gpu_quant.nbits_consts(rng, k, n, 4, block, zp_kind, dtype)
    node = gpu_quant.nbits_node(k, n, 4, block, dtype, b, scales, zp)
    w = Weights(node, k, n, 4, block, np)
    zp8 = w.b.get(b) if w.zp8 is None else w.zp8.get(zp)  # not read without zero points
    return (w.b.get(b), w.scales.get(scales), zp8), (w.kb, w.rs, w.zs, w.chunks)


@pytest.mark.parametrize(("m", "k", "h"), [(1, 64, 24), (3, 300, 11), (8, 96, 40)])
@pytest.mark.parametrize("with_bias", [False, True], ids=["", "bias"])
@pytest.mark.parametrize("dtype", [F16, F32], ids=["f16", "f32-level4"])
def test_swiglu_epilogue_rounds_as_the_unfused_swiglu(m, k, h, with_bias, dtype, mma):
    rng = np.random.default_rng(m + k)
    tables, layout = weight_tables(rng, k, 2 * h, dtype=dtype)
    bias = rng.standard_normal(2 * h).astype(dtype) if with_bias else None
    a = rng.standard_normal((m, k)).astype(dtype)
    q8 = dtype == F32
    plain = M.NbitsMma(np, dtype, dtype, M.ZP_PACKED, 32, q8=q8)
    want = swiglu_k(plain(a, m, 2 * h, k, tables, layout, bias), dtype)
    fused = M.NbitsMma(np, dtype, dtype, M.ZP_PACKED, 32, q8=q8, swiglu=True)
    got = fused(a, m, h, k, tables, layout, bias)
    np.testing.assert_array_equal(got.view(np.uint8), want.view(np.uint8))


# ------------------------------------------------------------------------ geometry


@pytest.mark.parametrize(
    ("n", "k"),
    [(1152, 896), (896, 896), (4864, 896), (896, 4864), (9728, 896), (151936, 896),
     (2048, 1536), (1536, 8960), (8960, 1536), (151936, 1536), (7, 40)],
)  # fmt: skip
@pytest.mark.parametrize("m", [1, 8])
def test_plan_covers_every_tile_and_shares_only_short_ones(m, n, k):
    chunks = -(-k // 32)
    sms = 132
    p = M.plan(m, n, chunks, sms)
    warps_per_tile = 1 << p.log2p
    tiles = -(-n // 8)
    assert p.units * (M.WARPS // warps_per_tile) >= tiles
    assert p.grid <= p.units and p.grid <= sms * M.BLOCKS_PER_SM
    assert warps_per_tile <= max(1, p.ksteps)  # every warp of a tile has k-steps
    if warps_per_tile > 1:  # only when one warp a tile leaves the device short
        assert tiles * warps_per_tile // 2 < sms * M.FILL_WARPS_PER_SM
    assert p.smem == M.smem_bytes(p.mt, chunks)


def test_plan_shares_the_narrow_down_projection_not_the_lm_head():
    assert M.plan(1, 896, 4864 // 32, 132).log2p == 3
    assert M.plan(1, 151936, 896 // 32, 132).log2p == 0


def test_fits_follows_the_shared_memory_budget():
    assert M.fits(1, 8960 // 32) and M.fits(8, 896 // 32)
    assert not M.fits(8, 8960 // 32) and not M.fits(9, 10) and not M.fits(0, 10)
    assert M.smem_bytes(1, 28) == 7 * 256 + 64


def test_takes_only_what_the_kernel_computes():
    takes = M.NbitsMma.takes
    assert takes(4, np.float16, M.ZP_PACKED, False, 32, np)
    assert takes(4, np.float16, M.ZP_NONE, False, 16, np)
    assert not takes(8, np.float16, M.ZP_NONE, False, 32, np)  # 8-bit
    assert not takes(4, np.float32, M.ZP_NONE, False, 32, np)  # float32 A at level 0
    assert takes(4, np.float32, M.ZP_NONE, True, 32, np)  # rounded to int8: level 4
    assert not takes(4, np.float16, 2, False, 32, np)  # float zero points
    assert not takes(4, np.float16, M.ZP_NONE, False, 24, np)  # not a power of two


def test_driver_launch_signature_matches_the_kernels(monkeypatch):
    """On a GPU the launches go through ``launch.Launcher``, which packs 8-byte arguments by
    a signature string: it must be the kernels' own (g++ reads it from the C parameters)."""
    from onnxep.providers_cuda import elementwise, launch

    install(monkeypatch)
    made = []

    class Recorder:
        def __init__(self, fn, signature, dependent=False):
            made.append((fn.name, fn.signature, signature))
            assert dependent, "nbits_mma waits (pdl_wait) and is launched as a dependent kernel"

    monkeypatch.setattr(launch, "Launcher", Recorder)
    monkeypatch.setattr(elementwise, "stream_ptr_fn", lambda: lambda: 0)
    for swiglu, norm in ((False, False), (True, True)):
        M.NbitsMma(np, F16, F16, M.ZP_PACKED, 32, swiglu=swiglu, norm=norm).driver()
    assert len(made) == 2 * len(M.ROW_TILES)
    for name, real, packed in made:
        assert packed == real, name


def test_nbits_mma_waits_before_it_touches_what_an_earlier_kernel_writes():
    """Launched with programmatic dependent launch, nbits_mma may start while the kernel that
    writes A still runs: before ``pdl_wait`` it may only prefetch its (constant) packed
    weights and scales. The staging of A (plain, normalised or rounded to int8), every load of
    the weights and every store come after the wait."""
    body = M.MMA_BODY.split("nbits_mma(")[1]
    body = body[body.index(") {") :]  # past the parameters
    wait = body.index("pdl_wait();")
    assert body.index("pdl_trigger();") < wait
    for use in ("stage_general<", "stage_plain(", "ldg16(", "y[(i64)m * N + n] =", "red[(warp"):
        assert body.index(use) > wait, use
    before = body[:wait]
    for touched in ("a[", "y[", "sum_out", "ldg16", "zp8[", "scales["):
        assert touched not in before, touched
    assert "prefetch_range(" in before
