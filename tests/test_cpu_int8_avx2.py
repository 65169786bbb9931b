"""The 8-bit tiles on AVX2 (providers_cpu/jit_int8_avx2.py): exact where vpmaddubsw saturates.

onnxruntime's AVX2 kernels multiply uint8 by int8 with ``vpmaddubsw``, whose pair sums
clamp at int16 (two products of 255 * -128 give -32768, not -65280). The AVX2 tiles widen
both operands to int16 and use ``vpmaddwd``, so every int32 result must be the integer
definition: checked here against int64 NumPy on the values that would saturate (0/255
for uint8, -128/127 for int8, long K, odd M/N/K, zero points at the ends of their types,
per row and per column), through sessions with numba (the AVX2 tiles, also on a VNNI
CPU) and without (float BLAS), by the ``compiled`` fixture.
"""

from __future__ import annotations

import re

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import onnxep
from onnxep.providers_cpu import jit, jit_int8, jit_int8_avx2
from onnxep.providers_cpu.ops import vnni_gemm

U8, I8 = np.dtype(np.uint8), np.dtype(np.int8)
_ELEM = {U8: TensorProto.UINT8, I8: TensorProto.INT8}


@pytest.fixture
def avx2(compiled, monkeypatch):
    """With numba: the AVX2 tiles (skipped on a CPU without AVX2), spied so a test can say
    they ran; without: the NumPy/BLAS path. Returns the spy's calls (None without numba)."""
    if not compiled:
        return None
    if not jit_int8.runnable("avx2"):
        pytest.skip("no AVX2 here: the AVX2 tiles do not run")
    monkeypatch.setattr(jit_int8, "_isa", "avx2")
    calls = []
    real = jit_int8.loop

    def spy(name, isa=None):
        calls.append((name, isa or jit_int8.tiles()))
        return real(name, isa)

    monkeypatch.setattr(jit_int8, "loop", spy)
    return calls


def _saturating(rng, shape, dt, ends=0.85):
    """Mostly the ends of ``dt`` (so adjacent products share a sign and a pair passes int16),
    some values anywhere."""
    lo, hi = (0, 255) if dt == U8 else (-128, 127)
    v = np.where(rng.random(shape) < 0.5, lo, hi).astype(np.int64)
    some = rng.random(shape) > ends
    v[some] = rng.integers(lo, hi + 1, size=int(some.sum()))
    return v.astype(dt)


def _ref(a, za, b, zb):
    ai = a.astype(np.int64) - np.asarray(za, np.int64).reshape(-1, 1)
    bi = b.astype(np.int64) - np.asarray(zb, np.int64).reshape(1, -1)
    return (ai @ bi).astype(np.int32)  # int64 cut to int32, as an int32 accumulator wraps


def _session(op, inputs, consts, out_elem=TensorProto.INT32, attrs=None, domain=""):
    node = helper.make_node(op, [n for n, _ in inputs], ["y"], domain=domain, **(attrs or {}))
    feeds = {n: a for n, a in inputs if n not in consts}
    g_in = [helper.make_tensor_value_info(n, _ELEM.get(a.dtype, TensorProto.FLOAT), a.shape)
            for n, a in inputs if n not in consts]  # fmt: skip
    inits = [numpy_helper.from_array(np.asarray(a), n) for n, a in inputs if n in consts]
    graph = helper.make_graph(
        [node], "g", g_in, [helper.make_tensor_value_info("y", out_elem, None)], inits
    )
    opsets = [helper.make_opsetid("", 13), helper.make_opsetid("com.microsoft", 1)]
    model = helper.make_model(graph, opset_imports=opsets, ir_version=10)
    return onnxep.InferenceSession(model, providers=["cpu"]).run(None, feeds)[0]


def _saturated(a, b):
    """What vpmaddubsw + vpmaddwd compute for uint8 ``a`` times int8 ``b`` (no zero points):
    adjacent k's products summed and clamped to int16, then added exactly."""
    k = a.shape[1]
    ap = np.zeros((a.shape[0], k + k % 2), np.int64)
    bp = np.zeros((k + k % 2, b.shape[1]), np.int64)
    ap[:, :k], bp[:k] = a, b
    pairs = ap[:, 0::2, None] * bp[None, 0::2] + ap[:, 1::2, None] * bp[None, 1::2]
    return np.clip(pairs, -32768, 32767).sum(axis=1)


def test_the_cases_here_would_catch_a_saturating_product():
    """The premise: 255 * -128 twice is -65280, which vpmaddubsw clamps to -32768; on these
    tests' values a saturating kernel is off in most outputs."""
    assert 2 * 255 * -128 < np.iinfo(np.int16).min
    rng = np.random.default_rng(0)
    a, b = _saturating(rng, (5, 67), U8), _saturating(rng, (67, 19), I8)
    exact = a.astype(np.int64) @ b.astype(np.int64)
    assert (_saturated(a, b) != exact).mean() > 0.5


@pytest.mark.parametrize(("m", "k", "n"), [(1, 2, 1), (5, 67, 19), (3, 1027, 67), (9, 255, 130)])
@pytest.mark.parametrize(("a_dt", "b_dt"), [(U8, I8), (U8, U8), (I8, I8), (I8, U8)])
@pytest.mark.parametrize("zps", ["none", "ends", "per_row_col"])
def test_matmul_integer_is_exact_where_int16_pairs_saturate(m, k, n, a_dt, b_dt, zps, avx2):
    rng = np.random.default_rng(m * 7 + k + n)
    a = _saturating(rng, (m, k), a_dt)
    b = _saturating(rng, (k, n), b_dt)
    ends = {U8: (0, 255), I8: (-128, 127)}
    if zps == "none":
        za, zb = np.array(0, a_dt), np.array(0, b_dt)
    elif zps == "ends":
        za, zb = np.array(ends[a_dt][1], a_dt), np.array(ends[b_dt][0], b_dt)
    else:
        za = rng.choice(np.array(ends[a_dt]), m).astype(a_dt)
        zb = rng.choice(np.array(ends[b_dt]), n).astype(b_dt)
    got = _session("MatMulInteger", [("a", a), ("b", b), ("za", za), ("zb", zb)], {"b", "zb"})
    np.testing.assert_array_equal(got, _ref(a, za, b, zb))
    if avx2 is not None:
        assert ("gemm_int", "avx2") in avx2 or ("panels_int", "avx2") in avx2


@pytest.mark.parametrize("x_dt", [U8, I8])
@pytest.mark.parametrize("w_dt", [I8, U8])
@pytest.mark.parametrize(
    ("c", "hw", "kernel", "pads"), [(3, 7, 3, 1), (17, 5, 3, 0), (64, 4, 1, 0)]
)
def test_conv_integer_is_exact_where_int16_pairs_saturate(x_dt, w_dt, c, hw, kernel, pads, avx2):
    """ConvInteger (x the windows, w the rows each broadcast): odd channel counts, the zero
    point of x at an end of its type (the padding then adds nothing), per-channel w zero
    points at the ends."""
    rng = np.random.default_rng(c * 10 + hw)
    o = 19
    x = _saturating(rng, (2, c, hw, hw), x_dt)
    w = _saturating(rng, (o, c, kernel, kernel), w_dt)
    ends = {U8: (0, 255), I8: (-128, 127)}
    zx = np.array(ends[x_dt][1], x_dt)
    zw = rng.choice(np.array(ends[w_dt]), o).astype(w_dt)
    attrs = {"pads": [pads] * 4}
    got = _session("ConvInteger", [("x", x), ("w", w), ("zx", zx), ("zw", zw)], {"w", "zw"},
                   attrs=attrs)  # fmt: skip
    xp = np.pad(x.astype(np.int64) - int(zx), ((0, 0), (0, 0), (pads, pads), (pads, pads)))
    wi = w.astype(np.int64) - zw.astype(np.int64).reshape(-1, 1, 1, 1)
    oh = hw + 2 * pads - kernel + 1
    want = np.zeros((2, o, oh, oh), np.int64)
    for dy in range(kernel):
        for dx in range(kernel):
            win = xp[:, :, dy : dy + oh, dx : dx + oh]
            want += np.einsum("nchw,oc->nohw", win, wi[:, :, dy, dx])
    np.testing.assert_array_equal(got, want.astype(np.int32))
    if avx2 is not None:
        assert ("conv_image", "avx2") in avx2


@pytest.mark.parametrize("rows", [1, 2, 3, 4, 5])
def test_panel_tiles_are_exact_for_each_row_count(rows, avx2):
    """The recurrent steps' panel tiles (1 to 4 rows, then 4 + 1) at the saturating ends, K
    odd and past a block, N past a panel: int32 and the float epilogue."""
    if avx2 is None:
        pytest.skip("the panel tiles need numba")
    rng = np.random.default_rng(rows)
    a = _saturating(rng, (rows, 301), U8)
    b = _saturating(rng, (301, 75), I8)
    za, zb = np.full(rows, 255, np.uint8), np.full(75, -128, np.int8)
    packed = vnni_gemm.PackedB(b, zb, panels=True)
    want = _ref(a, za, b, zb)
    np.testing.assert_array_equal(vnni_gemm.matmul(a, za, packed), want)
    mult = np.full(75, 1e-3, np.float32)
    got = vnni_gemm.matmul(a, za, packed, mult)
    assert got.tobytes() == (want.astype(np.float32) * mult + np.float32(-0.0)).tobytes()


@pytest.mark.parametrize("rows", [1, 2, 3, 4])
@pytest.mark.parametrize("vecs", [1, 4])
def test_blocks_cover_the_tile_once_within_the_registers(rows, vecs):
    """Each (row, 16-column vector) of a tile in exactly one block, a block holding at most 8
    accumulators (4 a row and vector) of AVX2's 16 registers."""
    seen = []
    for r0, nr, c0, nc in jit_int8_avx2.blocks(rows, vecs):
        assert 4 * nr * nc <= 8
        seen += [(r, c) for r in range(r0, r0 + nr) for c in range(c0, c0 + nc)]
    assert sorted(seen) == [(r, c) for r in range(rows) for c in range(vecs)]


@pytest.mark.skipif(not jit.ENABLED, reason="numba not installed")
def test_avx2_tiles_compile_to_widening_multiplies():
    """The generated code multiplies with vpmaddwd on widened operands (checked in a copy
    compiled without the disk cache, whose code numba cannot show), and holds no
    vpmaddubsw, the saturating instruction. On a CPU with AVX-512 VNNI or AVX-VNNI, LLVM
    folds vpmaddwd and its vpaddd into vpdpwssd, the same non-saturating sum of products
    (vpdpwssds is the saturating one)."""
    if not jit_int8.runnable("avx2"):
        pytest.skip("no AVX2 here")
    tiles = jit_int8.make_tiles("avx2")
    u24, f14 = tiles["_pu24"], tiles["_f14"]

    def both(x, y, nk4, rs, zr, rc, zc, cc, mult, bias, out, outf, n):
        u24(x, 0, y, 0, nk4, rs, zr, rc, zc, cc, mult, bias, out, n)
        f14(x, 0, y, 0, nk4, rs, zr, rc, zc, cc, mult, bias, outf, n)

    f = jit.nb.njit(cache=False)(both)
    x = np.zeros((2, 8), np.uint8)
    y = np.zeros((2, 256), np.int8)
    i32, f32 = np.zeros(64, np.int32), np.zeros(64, np.float32)
    f(x, y, 2, i32, i32, i32, i32, i32, f32, f32, np.zeros((2, 64), np.int32),
      np.zeros((2, 64), np.float32), 64)  # fmt: skip
    ops = re.findall(r"^\s+(v\w+)", "\n".join(f.inspect_asm().values()), re.MULTILINE)
    assert ("vpmaddwd" in ops or "vpdpwssd" in ops) and "vpmovsxbw" in ops
    assert not {"vpmaddubsw", "vpdpbusd", "vpdpbusds", "vpdpwssds"} & set(ops)


@pytest.mark.parametrize(("m", "k", "n"), [(1, 4, 1), (1, 1028, 67), (3, 68, 19), (5, 260, 130)])
@pytest.mark.parametrize("zps", ["ends", "per_row_col"])
def test_sign_pairs_are_exact(m, k, n, zps, avx2):
    """Symmetric int8 weights (-127..127, here mostly the ends) by uint8 at 0/255 take the
    sign-pair tiles for single rows (vpmaddubsw on |x - 128| and y * sign(x - 128), at most
    2 * 128 * 127 a pair): the integer definition, zero points at the ends."""
    rng = np.random.default_rng(m + k + n)
    a = _saturating(rng, (m, k), U8)
    b = np.clip(_saturating(rng, (k, n), I8), -127, 127).astype(I8)
    if zps == "ends":
        za, zb = np.array(255, U8), np.array(-128, I8)
    else:
        za = rng.choice(np.array([0, 255]), m).astype(U8)
        zb = rng.choice(np.array([-128, 127]), n).astype(I8)
    got = _session("MatMulInteger", [("a", a), ("b", b), ("za", za), ("zb", zb)], {"b", "zb"})
    np.testing.assert_array_equal(got, _ref(a, za, b, zb))
    if avx2 is not None:
        assert ("gemm_int", "avx2s") in avx2
        mult = np.full(n, 1e-3, np.float32)
        for panels in (False, True):
            packed = vnni_gemm.PackedB(b, zb, panels=panels)
            assert packed.isa == "avx2s"
            np.testing.assert_array_equal(vnni_gemm.matmul(a, za, packed), _ref(a, za, b, zb))
            want = _ref(a, za, b, zb).astype(np.float32) * mult + np.float32(-0.0)
            assert vnni_gemm.matmul(a, za, packed, mult).tobytes() == want.tobytes()


def test_which_weights_take_sign_pairs(monkeypatch):
    """On AVX2: no -128 and K a multiple of 4; otherwise (and on VNNI) the ISA's own tiles."""
    monkeypatch.setattr(jit, "ENABLED", True)
    monkeypatch.setattr(jit_int8, "_isa", "avx2")
    assert jit_int8.weights_isa(512, -127) == "avx2s"
    assert jit_int8.weights_isa(512, -128) == "avx2"
    assert jit_int8.weights_isa(510, 0) == "avx2"
    monkeypatch.setattr(jit_int8, "_isa", "vnni")
    assert jit_int8.weights_isa(512, -127) == "vnni"
    monkeypatch.setattr(jit_int8, "_isa", "")
    assert jit_int8.weights_isa(512, -127) == ""
