"""The direct convolution kernel (``providers_cpu/ops/conv_direct.py``): 8 output channels a
vector, the input broadcast from its (phase) planes.

Its sums are the compiled GEMM's (the bias, then one fused multiply-add a kernel term in
term order), so the kernel is held to ``conv_gemm.ConvGemm`` byte for byte over odd
shapes, tails and K blocks, and whole sessions to onnxruntime and to the unfused graph.
"""

from __future__ import annotations

import numpy as np
import pytest
from one_thread_runs import ours, theirs
from onnx import TensorProto, helper, numpy_helper

import onnxep
from onnxep.providers_cpu import jit
from onnxep.providers_cpu.ops import conv_direct, conv_gemm

ort = pytest.importorskip("onnxruntime")

needs_jit = pytest.mark.skipif(not jit.ENABLED, reason="numba not installed: no direct kernel")

# (N, C, M, (H, W), (KH, KW), strides, dilations, pads begin, pads end)
SHAPES = {
    "16 -> 16 3x3": (1, 16, 16, (32, 32), (3, 3), (1, 1), (1, 1), (1, 1), (1, 1)),
    "one output channel": (1, 5, 1, (9, 11), (3, 3), (1, 1), (1, 1), (1, 1), (1, 1)),
    "M 5, C 1": (1, 1, 5, (7, 13), (3, 3), (1, 1), (1, 1), (0, 0), (0, 0)),
    "M 9 (a block and one lane)": (2, 7, 9, (6, 17), (3, 3), (1, 1), (1, 1), (1, 1), (1, 1)),
    "M 18 (3 blocks, 2 lanes)": (1, 12, 18, (10, 10), (3, 3), (1, 1), (1, 1), (1, 1), (1, 1)),
    "M 40 (5 blocks: 2 + 3)": (1, 16, 40, (13, 13), (5, 5), (1, 1), (1, 1), (2, 2), (2, 2)),
    "M 72 (9 blocks: 3 groups)": (1, 8, 72, (5, 23), (3, 3), (1, 1), (1, 1), (1, 1), (1, 1)),
    "K past one block (128 channels)": (
        1,
        128,
        32,
        (6, 7),
        (3, 3),
        (1, 1),
        (1, 1),
        (1, 1),
        (1, 1),
    ),  # fmt: skip
    "K past one block, 24 channels out": (
        1,
        160,
        24,
        (5, 14),
        (3, 3),
        (1, 1),
        (1, 1),
        (1, 1),
        (1, 1),
    ),  # fmt: skip
    "M 32 (4 blocks), every tail width": (
        1,
        8,
        32,
        (3, 29),
        (3, 3),
        (1, 1),
        (1, 1),
        (1, 1),
        (1, 1),
    ),
    # 6-wide tiles ending 4 past a multiple of 6 (the 4-wide tile)
    "M 16, 28 wide": (1, 8, 16, (3, 28), (3, 3), (1, 1), (1, 1), (1, 1), (1, 1)),
    "M 32, 28 wide": (1, 8, 32, (4, 28), (3, 3), (1, 1), (1, 1), (1, 1), (1, 1)),
    "M 32, K past a 96 KB slab": (1, 96, 32, (5, 13), (3, 3), (1, 1), (1, 1), (1, 1), (1, 1)),
    "width 1": (1, 8, 16, (9, 1), (3, 3), (1, 1), (1, 1), (1, 1), (1, 1)),
    "every tail width": (1, 4, 8, (3, 29), (3, 3), (1, 1), (1, 1), (1, 1), (1, 1)),
    "stride 2": (1, 16, 32, (32, 32), (3, 3), (2, 2), (1, 1), (1, 1), (1, 1)),
    "stride 2, odd, no padding": (1, 8, 16, (21, 19), (3, 3), (2, 2), (1, 1), (0, 0), (0, 0)),
    "stride 3": (1, 12, 14, (23, 26), (3, 3), (3, 3), (1, 1), (1, 1), (1, 1)),
    "stride (2, 1)": (1, 16, 16, (17, 18), (3, 3), (2, 1), (1, 1), (1, 1), (1, 1)),
    "dilation 2, asymmetric pads": (
        1,
        16,
        20,
        (18, 15),
        (3, 3),
        (1, 1),
        (2, 2),
        (2, 0),
        (1, 3),
    ),  # fmt: skip
    "stride 2, dilation 2": (1, 8, 12, (25, 22), (3, 3), (2, 2), (2, 2), (0, 0), (0, 0)),
    "7x7 stride 2, 3 channels": (1, 3, 16, (30, 41), (7, 7), (2, 2), (1, 1), (3, 3), (3, 3)),
    "1x3 kernel": (1, 10, 24, (8, 20), (1, 3), (1, 1), (1, 1), (0, 1), (0, 1)),
    "2x2 stride 2": (2, 6, 16, (12, 14), (2, 2), (2, 2), (1, 1), (0, 0), (0, 0)),
    "batch of three": (3, 24, 18, (13, 12), (3, 3), (1, 1), (1, 1), (1, 1), (1, 1)),
}


def _out(hw, k, s, d, pb, pe):
    return tuple((hw[i] + pb[i] + pe[i] - d[i] * (k[i] - 1) - 1) // s[i] + 1 for i in range(2))


def _both(shape, seed=0, x=None):
    n, c, m, hw, k, s, d, pb, pe = shape
    rng = np.random.default_rng(seed)
    w = rng.standard_normal((m, c, *k)).astype(np.float32)
    bias = rng.standard_normal(m).astype(np.float32)
    if x is None:
        x = rng.standard_normal((n, c, *hw)).astype(np.float32)
    out = _out(hw, k, s, d, pb, pe)
    lsz = out[0] * out[1]
    cg = conv_gemm.ConvGemm(x.shape, conv_gemm.pack_weights(w), bias, k, s, d, pb, pe, out)
    y_gemm = np.full((n, m, lsz), np.nan, np.float32)
    cg(x, y_gemm)
    dc = conv_direct.DirectConv(x.shape, *conv_direct.pack_blocks(w), bias, k, s, d, pb, pe, out)
    y_direct = np.full((n, m, lsz), np.nan, np.float32)
    dc(x, y_direct)
    return y_gemm, y_direct, (x, w, bias, dc)


# (accumulators, slab bytes): AVX2's tiles and K blocks, AVX-512VL's (``_WIDE``)
TILE_SETS = {"12 sums, 24 KB": (12, 24 << 10), "24 sums, 96 KB": (24, 96 << 10)}


@pytest.fixture(params=list(TILE_SETS), ids=list(TILE_SETS))
def tile_set(request, monkeypatch):
    nacc, slab = TILE_SETS[request.param]
    monkeypatch.setattr(conv_direct, "ACCUMULATORS", nacc)
    monkeypatch.setattr(conv_direct, "_SLAB", slab)
    return nacc


@needs_jit
@pytest.mark.parametrize("case", list(SHAPES), ids=list(SHAPES))
def test_kernel_equals_the_compiled_gemm_bit_for_bit(case, tile_set):
    y_gemm, y_direct, (x, w, bias, _) = _both(SHAPES[case])
    assert np.isfinite(y_direct).all()  # every output written
    assert np.array_equal(y_gemm.view(np.uint32), y_direct.view(np.uint32))
    # and the convolution it claims to be (float64 reference)
    n, c, m, hw, k, s, d, pb, pe = SHAPES[case]
    xp = np.pad(x.astype(np.float64), ((0, 0), (0, 0), (pb[0], pe[0]), (pb[1], pe[1])))
    out = _out(hw, k, s, d, pb, pe)
    want = np.zeros((n, m, *out)) + bias[None, :, None, None]
    for r in range(k[0]):
        for q in range(k[1]):
            win = xp[:, :, r * d[0] :: s[0], q * d[1] :: s[1]][:, :, : out[0], : out[1]]
            want += np.einsum("nchw,mc->nmhw", win, w[:, :, r, q].astype(np.float64))
    scale = np.abs(want).max()
    np.testing.assert_allclose(
        y_direct.reshape(want.shape), want, rtol=0, atol=1e-5 * scale * np.sqrt(c)
    )


@needs_jit
def test_kernel_propagates_nan_and_inf_as_the_gemm():
    shape = (1, 8, 16, (9, 10), (3, 3), (1, 1), (1, 1), (1, 1), (1, 1))
    x = np.random.default_rng(1).standard_normal((1, 8, 9, 10)).astype(np.float32)
    x[0, 2, 4, 4] = np.nan
    x[0, 5, 0, 9] = np.inf
    x[0, 6, 8, 0] = -np.inf
    y_gemm, y_direct, _ = _both(shape, x=x)
    np.testing.assert_array_equal(y_gemm, y_direct)  # NaN where NaN
    assert np.isnan(y_direct).any() and np.isinf(y_direct).any()


@needs_jit
@pytest.mark.parametrize(
    "n,c,hw,s,pb,pe",
    [
        (1, 3, (10, 16), (2, 2), (1, 1), (1, 1)),  # even width: 64-bit pairs, both halves
        (2, 5, (9, 14), (2, 2), (0, 1), (0, 1)),  # a batch, no leading pad: low halves first
        (1, 4, (7, 13), (2, 2), (1, 1), (1, 1)),  # odd width: the strided loop
        (1, 2, (8, 12), (1, 2), (0, 3), (2, 0)),  # column stride only, asymmetric pads
        (1, 3, (9, 18), (3, 3), (1, 1), (1, 1)),  # stride 3
        (1, 2, (6, 10), (1, 1), (1, 1), (1, 1)),  # stride 1
    ],
)
def test_compiled_fill_equals_the_numpy_planes_bit_for_bit(n, c, hw, s, pb, pe):
    """The phase planes the kernel reads: its compiled fill (64-bit pairs on even widths at
    column stride 2) against ``PhasePlanes.fill``'s strided NumPy copies, every bit of
    NaN payloads, -0 and infinities included."""
    rng = np.random.default_rng(3)
    x = rng.standard_normal((n, c, *hw)).astype(np.float32)
    bits = x.reshape(-1).view(np.uint32)
    bits[::5] = 0x7FC01234  # a NaN with a payload
    bits[1::7] = 0x80000000  # -0
    bits[2::11] = 0xFF800000  # -inf
    out = _out(hw, (3, 3), s, (1, 1), pb, pe)
    w = np.ones((8, c, 3, 3), np.float32)
    dc = conv_direct.DirectConv(
        x.shape, *conv_direct.pack_blocks(w), np.zeros(8, np.float32), (3, 3), s, (1, 1), pb,
        pe, out,
    )  # fmt: skip
    dc(x, np.empty((n, 8, out[0] * out[1]), np.float32))  # compiles and fills every image
    ref = conv_gemm.PhasePlanes(x.shape, (3, 3), s, (1, 1), pb, pe, out, out[1])
    for i in range(n):
        ref.fill(x[i])
        got = dc.b[i * dc.bsize : (i + 1) * dc.bsize]
        assert got.view(np.uint32).tobytes() == ref.b[: dc.bsize].view(np.uint32).tobytes()


@needs_jit
@pytest.mark.parametrize(
    "case",
    ["K past one block (128 channels)", "M 72 (9 blocks: 3 groups)", "M 32, K past a 96 KB slab"],
)
def test_kernel_bits_do_not_depend_on_the_work_split(case, tile_set):
    _, y_whole, (x, _, _, dc) = _both(SHAPES[case])
    oh, ow = dc.out
    parts = np.full_like(y_whole, np.nan)
    fill, table, (sh, sw, wq, cs) = dc.fill_jit, dc.table, dc.geo
    fill(x[0].reshape(-1), *x.shape[1:], dc.b, table, sh, sw, wq, cs)
    for u in reversed(range(dc.units)):  # one unit a call, last first, as threads may
        dc.run(dc.wb, dc.kt, dc.bias, dc.b, dc.bsize, dc.koff, dc.wq, oh, ow, dc.acc,
               dc.accsize, parts.reshape(-1), dc.m, dc.rows, dc.units, dc.slab_terms, dc.nacc,
               u, u + 1,
               *dc.act, *dc.post, np.zeros(1, np.float32), False)  # fmt: skip
    assert np.array_equal(parts[0].view(np.uint32), y_whole[0].view(np.uint32))


def _model(c, m, hw, k=3, n=1, bias=True, acts=(), dynamic=False, **attrs):
    rng = np.random.default_rng(11)
    w = (rng.standard_normal((m, c, k, k)) / np.sqrt(k * k * c)).astype(np.float32)
    inits = [numpy_helper.from_array(w, "w")]
    names = ["x", "w"]
    if bias:
        inits.append(numpy_helper.from_array(rng.standard_normal(m).astype(np.float32), "b"))
        names.append("b")
    nodes = [helper.make_node("Conv", names, ["c0"], **attrs)]
    prev = "c0"
    for i, (op, kw) in enumerate(acts):
        kw = dict(kw)
        extra = []
        if op == "Clip":
            lo, hi = kw.pop("bounds")
            inits += [
                numpy_helper.from_array(np.array(lo, np.float32), f"lo{i}"),
                numpy_helper.from_array(np.array(hi, np.float32), f"hi{i}"),
            ]
            extra = [f"lo{i}", f"hi{i}"]
        nodes.append(helper.make_node(op, [prev, *extra], [f"c{i + 1}"], **kw))
        prev = f"c{i + 1}"
    nodes.append(helper.make_node("Identity", [prev], ["y"]))
    graph = helper.make_graph(
        nodes,
        "g",
        [
            helper.make_tensor_value_info(
                "x", TensorProto.FLOAT, ["n", c, "h", "w"] if dynamic else [n, c, *hw]
            )
        ],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    x = rng.standard_normal((n, c, *hw)).astype(np.float32)
    x[0, 0, 0, :2] = [np.nan, -0.0]
    return model.SerializeToString(), {"x": x}


CASES = {
    "3x3 pads 1": dict(c=16, m=16, hw=(32, 32), pads=[1, 1, 1, 1]),
    "M 13, no padding": dict(c=16, m=13, hw=(21, 14)),
    "stride 2": dict(c=16, m=32, hw=(23, 22), strides=[2, 2], pads=[1, 1, 1, 1]),
    "5x5 same_upper": dict(c=8, m=16, hw=(20, 20), k=5, auto_pad="SAME_UPPER"),
    "batch of three": dict(c=24, m=18, hw=(13, 12), n=3, pads=[1, 1, 1, 1]),
    "no bias": dict(c=32, m=16, hw=(16, 16), bias=False, pads=[1, 1, 1, 1]),
    "relu (fused, in the kernel)": dict(
        c=32, m=32, hw=(15, 15), acts=[("Relu", {})], pads=[1, 1, 1, 1]
    ),
    "relu6 clip (fused, in the kernel)": dict(
        c=16, m=24, hw=(12, 15), acts=[("Clip", {"bounds": (0.0, 6.0)})], pads=[1, 1, 1, 1]
    ),
    "leaky relu (fused, after the kernel)": dict(
        c=16, m=16, hw=(11, 19), acts=[("LeakyRelu", {"alpha": 0.1})], pads=[1, 1, 1, 1]
    ),
    "sigmoid after": dict(c=8, m=16, hw=(14, 14), acts=[("Sigmoid", {})], pads=[1, 1, 1, 1]),
}


def _spy(monkeypatch) -> list:
    calls = []
    real = conv_direct.DirectConv.__call__
    monkeypatch.setattr(
        conv_direct.DirectConv,
        "__call__",
        lambda s, x, y, z=None: calls.append(x.shape) or real(s, x, y, z),
    )
    return calls


@needs_jit
@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("case", list(CASES), ids=list(CASES))
def test_sessions_match_onnxruntime_and_the_gemm(case, threads, monkeypatch):
    monkeypatch.setattr(conv_direct, "MODE", "1")
    calls = _spy(monkeypatch)
    model, feeds = _model(**CASES[case])
    got = ours(model, feeds, threads)
    assert calls, "the direct kernel did not run"
    want = theirs(model, feeds)
    assert got.shape == want.shape
    ok = np.isfinite(want)
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    scale = float(np.abs(want[ok]).max())
    np.testing.assert_allclose(got[ok], want[ok], rtol=0, atol=1e-5 * scale)
    # the compiled GEMM's bits, activation included
    monkeypatch.setattr(conv_direct, "MODE", "0")
    monkeypatch.setattr(conv_gemm, "MODE", "1")
    monkeypatch.setattr(conv_gemm, "_MIN_MACS", 0)
    gemm = ours(model, feeds, threads)
    assert np.array_equal(got.view(np.uint32), gemm.view(np.uint32))


@needs_jit
def test_fused_activations_give_the_unfused_graphs_bits(monkeypatch):
    monkeypatch.setattr(conv_direct, "MODE", "1")
    for acts in ([("Relu", {})], [("Clip", {"bounds": (-0.5, 0.25)})]):
        model, feeds = _model(c=16, m=24, hw=(9, 13), acts=list(acts), pads=[1, 1, 1, 1])
        fused = ours(model, feeds)
        so = onnxep.SessionOptions(intra_op_num_threads=1)
        so.disabled_rewrites = ["fuse_conv_activation"]
        unfused = onnxep.InferenceSession(model, so, providers=["cpu"]).run(None, feeds)[0]
        assert np.array_equal(fused.view(np.uint32), unfused.view(np.uint32))


@needs_jit
def test_planned_runs_equal_the_first(monkeypatch):
    monkeypatch.setattr(conv_direct, "MODE", "1")
    model, feeds = _model(
        c=16, m=16, hw=(12, 12), acts=[("Relu", {})], pads=[1, 1, 1, 1], dynamic=True
    )
    sess = onnxep.InferenceSession(model, onnxep.SessionOptions(intra_op_num_threads=1))

    def same(a, b):
        return np.array_equal(a.view(np.uint32), b.view(np.uint32))

    first = sess.run(None, feeds)[0]
    for _ in range(3):
        assert same(sess.run(None, feeds)[0], first)
    other = {"x": feeds["x"][..., :11].copy()}  # a new shape, planned on its own
    a = sess.run(None, other)[0]
    assert a.shape == (1, 16, 12, 11)
    assert same(sess.run(None, other)[0], a)
    assert same(sess.run(None, feeds)[0], first)


def test_the_rule(monkeypatch):
    monkeypatch.setattr(conv_direct, "MODE", "auto")
    monkeypatch.setattr(conv_direct, "_avx2_cpu", lambda: True)
    if not jit.ENABLED:
        assert not conv_direct.enabled()
        return
    f32 = np.float32
    # one thread: small convolutions, not 1x1, not grouped, float32 constant weights
    assert conv_direct.applies((3, 3), 1, 16, 144, 1024, f32, True, False, 1)
    assert conv_direct.applies((3, 3), 1, 256, 2304, 4096, f32, True, False, 1)  # strided
    assert conv_direct.applies((3, 3), 1, 64, 576, 1600, f32, True, False, 1, 64)
    # Winograd's with 128 channels or more
    assert not conv_direct.applies((3, 3), 1, 128, 1152, 400, f32, True, False, 1, 128)
    assert not conv_direct.applies((1, 1), 1, 16, 16, 1024, f32, True, True, 1)
    assert not conv_direct.applies((3, 3), 2, 16, 72, 1024, f32, True, False, 1)
    assert not conv_direct.applies((3, 3), 1, 16, 144, 1024, np.float64, True, False, 1)
    assert not conv_direct.applies((3, 3), 1, 16, 144, 1024, f32, False, False, 1)
    assert not conv_direct.applies((3,), 1, 16, 48, 1024, f32, True, False, 1)
    # outputs narrower than a useful tile keep the GEMM's panels across rows
    assert not conv_direct.applies((5, 1), 1, 512, 1280, 512, f32, True, False, 2, 0, 1)
    # more threads: the same shapes (Winograd runs at one thread only: it passes 0)
    assert conv_direct.applies((3, 3), 1, 256, 2304, 4096, f32, True, False, 2)
    assert conv_direct.applies((3, 3), 1, 6, 36, 81, f32, True, False, 2)  # under the GEMM's
    monkeypatch.setattr(conv_direct, "MODE", "0")
    assert not conv_direct.enabled()
    assert not conv_direct.applies((3, 3), 1, 16, 144, 1024, f32, True, False, 1)
    assert "ONNXEP_CPU_CONV_DIRECT=0" in conv_direct.status()
    monkeypatch.setattr(conv_direct, "MODE", "auto")
    monkeypatch.setattr(conv_direct, "_avx2_cpu", lambda: False)
    assert not conv_direct.enabled()


@pytest.mark.parametrize(
    "flags,family,want",
    [
        ({"avx2", "fma"}, ("AuthenticAMD", 0x19), True),  # Zen 3
        ({"avx2", "fma", "avx512f"}, ("AuthenticAMD", 0x19), True),  # Zen 4: 256-bit FMA units
        ({"avx2", "fma", "avx512f"}, ("AuthenticAMD", 0x1A), False),  # Zen 5
        ({"avx2", "fma", "avx512f"}, ("GenuineIntel", 6), False),
        ({"avx2", "fma"}, ("GenuineIntel", 6), True),
        ({"avx2"}, ("AuthenticAMD", 0x19), False),  # no FMA
        (None, None, False),  # no /proc/cpuinfo
    ],
)
def test_the_cpu_rule(flags, family, want):
    assert conv_direct.fits_cpu(None if flags is None else frozenset(flags), family) is want


def test_winograd_keeps_fewer_channels_on_avx512(monkeypatch):
    monkeypatch.setattr(conv_direct, "cpu_flags", lambda: frozenset({"avx2", "fma", "avx512f"}))
    assert conv_direct.winograd_bound.__wrapped__() == 96
    monkeypatch.setattr(conv_direct, "cpu_flags", lambda: frozenset({"avx2", "fma"}))
    assert conv_direct.winograd_bound.__wrapped__() == 128
    monkeypatch.setattr(conv_direct, "cpu_flags", lambda: None)
    assert conv_direct.winograd_bound.__wrapped__() == 128
    if not jit.ENABLED:
        return
    monkeypatch.setattr(conv_direct, "MODE", "auto")
    monkeypatch.setattr(conv_direct, "_avx2_cpu", lambda: True)
    monkeypatch.setattr(conv_direct, "winograd_bound", lambda: 96)
    f32 = np.float32
    assert conv_direct.applies((3, 3), 1, 96, 864, 2704, f32, True, False, 1, 96) is False
    assert conv_direct.applies((3, 3), 1, 64, 576, 1600, f32, True, False, 1, 64) is True


def test_no_kernel_without_numba(monkeypatch):
    monkeypatch.setattr(jit, "ENABLED", False)
    monkeypatch.setattr(conv_direct, "MODE", "1")
    assert not conv_direct.enabled()
    model, feeds = _model(c=8, m=16, hw=(10, 10), acts=[("Relu", {})], pads=[1, 1, 1, 1])
    got = ours(model, feeds)
    want = theirs(model, feeds)
    ok = np.isfinite(want)
    np.testing.assert_allclose(got[ok], want[ok], rtol=0, atol=1e-5 * np.abs(want[ok]).max())


def test_tile_widths():
    # AVX2: 12 sums a tile; 24 (AVX-512VL) widen only four blocks, 6 positions
    assert [conv_direct.positions(fb) for fb in (1, 2, 3, 4)] == [12, 6, 4, 3]
    assert [conv_direct.positions(fb, 24) for fb in (1, 2, 3, 4)] == [12, 6, 4, 6]
    assert conv_direct.sizes(4, 24) == (6, 4, 3, 2)
    assert conv_direct.sizes(2) == (6, 4, 3, 2)
    assert conv_direct.sizes(4) == (3, 2, 1)
    assert conv_direct.k_block(4, 96 << 10) == 768


@needs_jit
def test_empty_batch():
    w = np.ones((16, 8, 3, 3), np.float32)
    dc = conv_direct.DirectConv(
        (0, 8, 10, 10), *conv_direct.pack_blocks(w), np.zeros(16, np.float32),
        (3, 3), (1, 1), (1, 1), (1, 1), (1, 1), (10, 10),
    )  # fmt: skip
    dc(np.zeros((0, 8, 10, 10), np.float32), np.empty((0, 16, 100), np.float32))


def _residual_model(z_shape, z_first=False, bias=True):
    """x -> Conv -> Add(conv, z) -> Relu, z a second input."""
    rng = np.random.default_rng(5)
    c, m, hw = 8, 16, (11, 13)
    w = (rng.standard_normal((m, c, 3, 3)) / np.sqrt(9 * c)).astype(np.float32)
    inits = [numpy_helper.from_array(w, "w")]
    names = ["x", "w"]
    if bias:
        inits.append(numpy_helper.from_array(rng.standard_normal(m).astype(np.float32), "b"))
        names.append("b")
    nodes = [
        helper.make_node("Conv", names, ["c"], pads=[1, 1, 1, 1]),
        helper.make_node("Add", ["z", "c"] if z_first else ["c", "z"], ["s"]),
        helper.make_node("Relu", ["s"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes,
        "g",
        [
            helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, c, *hw]),
            helper.make_tensor_value_info("z", TensorProto.FLOAT, list(z_shape)),
        ],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    x = rng.standard_normal((2, c, *hw)).astype(np.float32)
    x[0, 0, 0, :2] = [np.nan, -0.0]
    z = rng.standard_normal(z_shape).astype(np.float32)
    return model.SerializeToString(), {"x": x, "z": z}


def _counts(sess) -> str:
    return next(
        line for line in str(sess.placement()).splitlines() if "cpu/fuse_conv_activation" in line
    )


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("mode", ["1", "0"])
@pytest.mark.parametrize("z_first", [False, True])
@pytest.mark.parametrize("bias", [True, False])
def test_residual_add_relu_fuses_with_the_unfused_bits(threads, mode, z_first, bias, monkeypatch):
    if mode == "1" and not jit.ENABLED:
        pytest.skip("numba not installed: no direct kernel")
    monkeypatch.setattr(conv_direct, "MODE", mode)
    model, feeds = _residual_model((2, 16, 11, 13), z_first, bias)
    so = onnxep.SessionOptions(intra_op_num_threads=threads)
    sess = onnxep.InferenceSession(model, so, providers=["cpu"])
    assert "conv_add_relu 1" in _counts(sess)
    calls = _spy(monkeypatch)
    got = sess.run(None, feeds)[0]
    assert bool(calls) == (mode == "1")
    so = onnxep.SessionOptions(intra_op_num_threads=threads)
    so.disabled_rewrites = ["fuse_conv_activation"]
    unfused = onnxep.InferenceSession(model, so, providers=["cpu"]).run(None, feeds)[0]
    assert np.array_equal(got.view(np.uint32), unfused.view(np.uint32))
    want = theirs(model, feeds)
    ok = np.isfinite(want)
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    np.testing.assert_allclose(got[ok], want[ok], rtol=0, atol=1e-5 * np.abs(want[ok]).max())


def _fused_residual(z_dims):
    """FusedConv(x, w, b, z) with Relu, z of dims ``z_dims``, and its unfused graph."""
    rng = np.random.default_rng(6)
    w = (rng.standard_normal((16, 8, 3, 3)) / np.sqrt(72)).astype(np.float32)
    inits = [
        numpy_helper.from_array(w, "w"),
        numpy_helper.from_array(rng.standard_normal(16).astype(np.float32), "b"),
    ]
    vi = helper.make_tensor_value_info
    ins = [vi("x", TensorProto.FLOAT, [2, 8, 11, 13]), vi("z", TensorProto.FLOAT, z_dims)]
    out = [vi("y", TensorProto.FLOAT, None)]
    fused = helper.make_node(
        "FusedConv", ["x", "w", "b", "z"], ["y"], domain="com.microsoft", activation="Relu",
        pads=[1, 1, 1, 1],
    )  # fmt: skip
    nodes = [
        helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1]),
        helper.make_node("Add", ["c", "z"], ["s"]),
        helper.make_node("Relu", ["s"], ["y"]),
    ]
    ops = [helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)]
    return [
        helper.make_model(
            helper.make_graph(g, "g", ins, out, inits), opset_imports=ops
        ).SerializeToString()
        for g in ([fused], nodes)
    ]


@needs_jit
@pytest.mark.parametrize("threads", [1, 2])
def test_fused_conv_with_z_runs_from_its_plan(threads, monkeypatch):
    """A FusedConv with a Z (a residual block's Conv + Add + Relu) runs from the plan of its
    input and Z shapes after its first run (no route look-up), with the unfused graph's
    bits; a Z of another shape is not the plan's and takes the general route."""
    monkeypatch.setattr(conv_direct, "MODE", "1")
    fused, plain = _fused_residual(["n", "m", "h", "w"])
    so = onnxep.SessionOptions(intra_op_num_threads=threads)
    sess = onnxep.InferenceSession(fused, so, providers=["cpu"])
    so = onnxep.SessionOptions(intra_op_num_threads=threads)
    so.disabled_rewrites = ["fuse_conv_activation"]
    unfused = onnxep.InferenceSession(plain, so, providers=["cpu"])
    rng = np.random.default_rng(9)
    x = rng.standard_normal((2, 8, 11, 13)).astype(np.float32)
    x[0, 0, 0, :2] = [np.nan, -0.0]

    def feeds(z_shape):
        return {"x": x, "z": rng.standard_normal(z_shape).astype(np.float32)}

    first = feeds((2, 16, 11, 13))
    sess.run(None, first)
    unfused.run(None, first)
    looked_up = []
    real = conv_direct.applies

    def applies(*a, **k):
        looked_up.append(1)
        return real(*a, **k)

    monkeypatch.setattr(conv_direct, "applies", applies)
    for _ in range(2):
        f = feeds((2, 16, 11, 13))
        got, want = sess.run(None, f)[0], unfused.run(None, f)[0]
        assert np.array_equal(got.view(np.uint32), want.view(np.uint32))
    assert not looked_up
    f = feeds((1, 16, 1, 13))  # broadcast: the general route adds it after the conv
    got = sess.run(None, f)[0]
    assert looked_up
    want = unfused.run(None, f)[0]
    assert np.array_equal(got.view(np.uint32), want.view(np.uint32))


def test_residual_add_relu_refuses_a_broadcast_z():
    model, feeds = _residual_model((1, 16, 1, 1))
    sess = onnxep.InferenceSession(model, providers=["cpu"])
    assert "conv_add_relu" not in _counts(sess)
    want = theirs(model, feeds)
    got = sess.run(None, feeds)[0]
    ok = np.isfinite(want)
    np.testing.assert_allclose(got[ok], want[ok], rtol=0, atol=1e-5 * np.abs(want[ok]).max())


def test_residual_add_relu_refuses_a_sum_used_elsewhere():
    rng = np.random.default_rng(0)
    w = rng.standard_normal((16, 8, 3, 3)).astype(np.float32)
    nodes = [
        helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
        helper.make_node("Add", ["c", "z"], ["s"]),
        helper.make_node("Relu", ["s"], ["y"]),
    ]
    vi = helper.make_tensor_value_info
    graph = helper.make_graph(
        nodes,
        "g",
        [vi("x", TensorProto.FLOAT, [1, 8, 10, 10]), vi("z", TensorProto.FLOAT, [1, 16, 10, 10])],
        [vi("y", TensorProto.FLOAT, None), vi("s", TensorProto.FLOAT, None)],  # the sum too
        [numpy_helper.from_array(w, "w")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    sess = onnxep.InferenceSession(model.SerializeToString(), providers=["cpu"])
    assert "conv_add_relu" not in _counts(sess)
    feeds = {
        "x": rng.standard_normal((1, 8, 10, 10)).astype(np.float32),
        "z": rng.standard_normal((1, 16, 10, 10)).astype(np.float32),
    }
    y, s = sess.run(None, feeds)
    assert np.array_equal(y, np.maximum(s, 0))


@needs_jit
def test_a_fused_conv_only_model_has_its_unfused_bits():
    """The thread policy gives a FusedConv-only session two threads, the unfused Conv +
    Sigmoid one; a small conv (under the GEMM's size) must take the same route in both."""
    rng = np.random.default_rng(0)
    w = (rng.standard_normal((6, 4, 3, 3)) * 0.5).astype(np.float32)
    b = rng.standard_normal(6).astype(np.float32)
    inits = [numpy_helper.from_array(w, "w"), numpy_helper.from_array(b, "b")]
    vi = helper.make_tensor_value_info
    x_info, y_info = vi("x", TensorProto.FLOAT, [2, 4, 9, 9]), vi("y", TensorProto.FLOAT, None)
    fused = helper.make_node(
        "FusedConv", ["x", "w", "b"], ["y"], domain="com.microsoft", activation="Relu",
        pads=[1, 1, 1, 1],
    )  # fmt: skip
    models = [
        helper.make_model(
            helper.make_graph(nodes, "g", [x_info], [y_info], inits),
            opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)],
        ).SerializeToString()
        for nodes in (
            [fused],
            [
                helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1]),
                helper.make_node("Relu", ["c"], ["y"]),
            ],
        )
    ]
    x = {"x": (np.random.default_rng(1).standard_normal((2, 4, 9, 9)) * 3).astype(np.float32)}
    for threads in (1, 2):
        outs = []
        for model in models:
            so = onnxep.SessionOptions(intra_op_num_threads=threads)
            so.disabled_rewrites = ["fuse_conv_activation"]
            outs.append(onnxep.InferenceSession(model, so, providers=["cpu"]).run(None, x)[0])
        assert np.array_equal(outs[0].view(np.uint32), outs[1].view(np.uint32))
    one = onnxep.InferenceSession(models[0], onnxep.SessionOptions(intra_op_num_threads=1))
    two = onnxep.InferenceSession(models[0], onnxep.SessionOptions(intra_op_num_threads=2))
    assert np.array_equal(one.run(None, x)[0], two.run(None, x)[0])
