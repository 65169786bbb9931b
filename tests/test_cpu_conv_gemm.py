"""The compiled Conv GEMM (``providers_cpu/ops/conv_gemm.py``) against float64 and onnxruntime.

The kernel alone over odd shapes (M, N, K not multiples of its blocks, ones, empty), its
bits the same for any column split (so for any thread count); convolutions through
sessions with the kernel forced on (``MODE = "1"``) and off, against onnxruntime in the
same test, FusedConv activations, NaN inputs; and the routing: off without numba, on by
the OpenBLAS core where ``auto``.
"""

from __future__ import annotations

import numpy as np
import pytest
from one_thread_runs import ours, theirs
from onnx import TensorProto, helper, numpy_helper

import onnxep
from onnxep.providers_cpu import jit
from onnxep.providers_cpu.ops import conv_direct, conv_gemm


@pytest.fixture(autouse=True)
def _no_direct_conv(monkeypatch):
    # The direct kernel (conv_direct.py) takes the GEMM's non-pointwise shapes on AVX2;
    # these tests are about the GEMM (tests/test_cpu_conv_direct.py compares the two).
    monkeypatch.setattr(conv_direct, "MODE", "0")


ort = pytest.importorskip("onnxruntime")

needs_jit = pytest.mark.skipif(not jit.ENABLED, reason="numba not installed: no compiled GEMM")


def _ref(a, b, bias):
    return a.astype(np.float64) @ b.astype(np.float64) + bias.astype(np.float64)[:, None]


@needs_jit
@pytest.mark.parametrize(
    "m,k,n",
    [
        (1, 1, 1),
        (6, 4, 4),
        (7, 33, 13),
        (13, 5, 9),
        (12, 128, 37),
        (64, 576, 1603),
        (9, 300, 49),
        (5, 3, 2),
        (0, 3, 5),
        (5, 0, 7),
        (5, 3, 0),
    ],
)
def test_kernel_matches_float64(m, k, n):
    rng = np.random.default_rng(m * 1000 + k * 10 + n)
    a = rng.standard_normal((m, k)).astype(np.float32)
    b = rng.standard_normal((k, n)).astype(np.float32)
    bias = rng.standard_normal(m).astype(np.float32)
    c = conv_gemm.product(a, b, bias)
    assert c.shape == (m, n)
    want = _ref(a, b, bias)
    # float32 sums of k terms of unit scale: a few ulps of sqrt(k) each
    np.testing.assert_allclose(c, want, rtol=0, atol=1e-5 * max(1.0, np.sqrt(k)) * 4)


@needs_jit
def test_kernel_bits_do_not_depend_on_the_column_split():
    rng = np.random.default_rng(3)
    m, k, n = 19, 600, 203  # K past one block of 256
    a = rng.standard_normal((m, k)).astype(np.float32)
    b = rng.standard_normal((k, n)).astype(np.float32)
    bias = rng.standard_normal(m).astype(np.float32)
    whole = conv_gemm.product(a, b, bias)
    parts = conv_gemm.product(a, b, bias, panels_per_call=1)  # as the threads take them
    assert np.array_equal(whole.view(np.uint32), parts.view(np.uint32))
    np.testing.assert_allclose(whole, _ref(a, b, bias), rtol=0, atol=1e-4)


@needs_jit
def test_kernel_propagates_nan_and_inf():
    a = np.ones((7, 40), np.float32)
    b = np.ones((40, 9), np.float32)
    b[5, 2] = np.nan
    b[0, 4] = np.inf
    c = conv_gemm.product(a, b, np.zeros(7, np.float32))
    assert np.isnan(c[:, 2]).all() and np.isposinf(c[:, 4]).all()
    assert np.isfinite(np.delete(c, [2, 4], axis=1)).all()


def _conv_model(c, m, hw, k=3, n=1, bias=True, act=None, group=1, **attrs):
    rng = np.random.default_rng(11)
    w = (rng.standard_normal((m, c // group, k, k)) / np.sqrt(k * k * c)).astype(np.float32)
    attrs["group"] = group
    inits = [numpy_helper.from_array(w, "w")]
    names = ["x", "w"]
    if bias:
        inits.append(numpy_helper.from_array(rng.standard_normal(m).astype(np.float32), "b"))
        names.append("b")
    nodes = [helper.make_node("Conv", names, ["y" if act is None else "c"], **attrs)]
    if act is not None:
        nodes.append(helper.make_node(act, ["c"], ["y"]))
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [n, c, *hw])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    x = rng.standard_normal((n, c, *hw)).astype(np.float32)
    return model.SerializeToString(), {"x": x}


CASES = {
    "3x3 pads 1": dict(c=32, m=24, hw=(17, 19), pads=[1, 1, 1, 1]),
    "3x3 no padding, M not a multiple of 6": dict(c=16, m=13, hw=(21, 14)),
    "stride 2": dict(c=32, m=16, hw=(23, 22), strides=[2, 2], pads=[1, 1, 1, 1]),
    "dilation 2, asymmetric pads": dict(
        c=16, m=20, hw=(18, 15), dilations=[2, 2], pads=[2, 0, 1, 3]
    ),
    "5x5 same_upper": dict(c=8, m=16, hw=(20, 20), k=5, auto_pad="SAME_UPPER"),
    "1x1, 128 channels": dict(c=128, m=40, hw=(15, 17), k=1),
    "1x1 stride 2": dict(c=160, m=24, hw=(14, 13), k=1, strides=[2, 2]),
    "batch of three": dict(c=24, m=18, hw=(13, 12), n=3, pads=[1, 1, 1, 1]),
    "no bias": dict(c=32, m=16, hw=(16, 16), bias=False, pads=[1, 1, 1, 1]),
    "relu fused into FusedConv": dict(c=32, m=32, hw=(15, 15), act="Relu", pads=[1, 1, 1, 1]),
    "sigmoid after": dict(c=32, m=12, hw=(10, 30), act="Sigmoid", pads=[1, 1, 1, 1]),
    # strided: the input's phase planes (odd sizes, so planes differ in size)
    "3x3 stride 2, odd size, no padding": dict(c=8, m=16, hw=(21, 19), strides=[2, 2]),
    "3x3 stride 3": dict(c=12, m=14, hw=(23, 26), strides=[3, 3], pads=[1, 1, 1, 1]),
    "stride (2, 1)": dict(c=16, m=16, hw=(17, 18), strides=[2, 1], pads=[1, 1, 1, 1]),
    "stride 2, dilation 2": dict(c=8, m=12, hw=(25, 22), strides=[2, 2], dilations=[2, 2]),
    "stride 2, asymmetric pads": dict(c=10, m=9, hw=(16, 15), strides=[2, 2], pads=[0, 1, 2, 1]),
    "7x7 stride 2 pads 3, 3 channels": dict(
        c=3, m=16, hw=(30, 41), k=7, strides=[2, 2], pads=[3, 3, 3, 3]
    ),
    "5x5 stride 2 same_lower, batch of two": dict(
        c=8, m=8, hw=(19, 20), k=5, strides=[2, 2], auto_pad="SAME_LOWER", n=2
    ),
}


def _spy(monkeypatch) -> list:
    calls = []
    real = conv_gemm.ConvGemm.__call__
    monkeypatch.setattr(
        conv_gemm.ConvGemm, "__call__", lambda s, x, y: calls.append(x.shape) or real(s, x, y)
    )
    return calls


@pytest.mark.parametrize("case", list(CASES), ids=list(CASES))
@pytest.mark.parametrize("mode", ["1", "0"])
def test_conv_matches_onnxruntime_with_the_kernel_on_and_off(case, mode, monkeypatch):
    if mode == "1" and not jit.ENABLED:
        pytest.skip("numba not installed: no compiled GEMM")
    monkeypatch.setattr(conv_gemm, "MODE", mode)
    monkeypatch.setattr(conv_gemm, "_MIN_MACS", 0)  # the cases are small, to stay fast
    calls = _spy(monkeypatch)
    model, feeds = _conv_model(**CASES[case])
    got = ours(model, feeds)
    want = theirs(model, feeds)
    assert got.shape == want.shape
    scale = float(np.abs(want).max())
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-5 * scale)
    assert bool(calls) == (mode == "1")


@needs_jit
@pytest.mark.parametrize("case", ["3x3 pads 1", "batch of three", "1x1, 128 channels"])
@pytest.mark.parametrize("native", [True, False])
def test_two_threads_give_the_bits_of_one(case, native, monkeypatch):
    monkeypatch.setattr(conv_gemm, "MODE", "1")
    monkeypatch.setattr(conv_gemm, "_MIN_MACS", 0)  # also split the small products
    # the compiled split (handoff.py) or the executor's (parallel_rows)
    monkeypatch.setattr("onnxep.providers_cpu.ops.nn_cpu.NATIVE", native)
    monkeypatch.setattr("onnxep.providers_cpu.ops.nn_cpu.COMPILED_MIN", 0)
    monkeypatch.setattr("onnxep.providers_cpu.ops.nn_cpu._PARALLEL_MIN", 0)
    model, feeds = _conv_model(**CASES[case])
    one, two = ours(model, feeds, 1), ours(model, feeds, 2)
    assert np.array_equal(one.view(np.uint32), two.view(np.uint32))


@needs_jit
def test_nan_input_gives_nan_where_the_blas_path_does(monkeypatch):
    model, feeds = _conv_model(**CASES["3x3 pads 1"])
    feeds["x"][0, 3, 5, 7] = np.nan
    monkeypatch.setattr(conv_gemm, "MODE", "0")
    blas = ours(model, feeds)
    monkeypatch.setattr(conv_gemm, "MODE", "1")
    packed = ours(model, feeds)
    assert np.array_equal(np.isnan(packed), np.isnan(blas)) and np.isnan(packed).any()


def test_small_and_other_shapes_keep_blas(monkeypatch):
    monkeypatch.setattr(conv_gemm, "MODE", "1")
    calls = _spy(monkeypatch)
    # K = 4, a product under the size floor, a depthwise conv: BLAS or their own loops
    for model, feeds in (
        _conv_model(c=4, m=16, hw=(64, 64), k=1),
        _conv_model(c=8, m=8, hw=(6, 6), pads=[1, 1, 1, 1]),
        _conv_model(c=16, m=16, hw=(20, 20), group=16, pads=[1, 1, 1, 1]),
    ):
        got, want = ours(model, feeds), theirs(model, feeds)
        np.testing.assert_allclose(got, want, rtol=0, atol=1e-5 * float(np.abs(want).max()))
    assert calls == []


def test_without_numba_it_never_runs(monkeypatch):
    monkeypatch.setattr(jit, "ENABLED", False)
    for mode in ("1", "auto"):
        monkeypatch.setattr(conv_gemm, "MODE", mode)
        assert not conv_gemm.enabled()
        assert "OpenBLAS" in conv_gemm.status()
    calls = _spy(monkeypatch)
    model, feeds = _conv_model(**CASES["3x3 pads 1"])
    got, want = ours(model, feeds), theirs(model, feeds)
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-5 * float(np.abs(want).max()))
    assert calls == []


@pytest.mark.parametrize(
    "arch,flags,want",
    [
        ("Haswell", conv_gemm.AVX512_FLAGS | {"avx2"}, True),
        ("Zen", conv_gemm.AVX512_FLAGS, True),
        ("SkylakeX", conv_gemm.AVX512_FLAGS, False),
        ("Haswell", frozenset({"avx2", "fma"}), False),
        ("Haswell", None, False),
    ],
)
def test_auto_runs_it_where_openblas_runs_avx2_kernels_on_avx512(arch, flags, want, monkeypatch):
    import threadpoolctl

    info = [{"internal_api": "openblas", "architecture": arch}]
    monkeypatch.setattr(threadpoolctl, "threadpool_info", lambda: info)
    monkeypatch.setattr(conv_gemm, "cpu_flags", lambda: flags)
    assert conv_gemm.blas_is_avx2_on_avx512() is want


@pytest.mark.parametrize(
    "arch,flags,rule",
    [
        ("Haswell", conv_gemm.AVX512_FLAGS | {"avx2", "fma"}, "always"),
        ("Haswell", frozenset({"avx2", "fma"}), "threads"),
        ("Zen", frozenset({"avx2", "fma"}), "threads"),
        ("SkylakeX", conv_gemm.AVX512_FLAGS | {"avx2", "fma"}, "threads"),
        ("Haswell", frozenset({"avx", "sse4_2"}), ""),
        ("Haswell", None, ""),
    ],
)
def test_the_auto_rule_by_cpu_and_openblas(arch, flags, rule, monkeypatch):
    import threadpoolctl

    info = [{"internal_api": "openblas", "architecture": arch}]
    monkeypatch.setattr(threadpoolctl, "threadpool_info", lambda: info)
    monkeypatch.setattr(conv_gemm, "cpu_flags", lambda: flags)
    monkeypatch.setattr(conv_gemm, "_auto", None)
    monkeypatch.setattr(conv_gemm, "MODE", "auto")
    assert conv_gemm.auto_rule() == rule
    if jit.ENABLED:
        assert conv_gemm.runs_at(1) == (rule == "always")
        assert conv_gemm.runs_at(2) == bool(rule)


@pytest.mark.parametrize(
    "flags,block", [(frozenset({"avx2", "fma", "avx512f"}), (16, 8, 48, 256)),
                    (frozenset({"avx2", "fma"}), (8, 6, 16, 256))]
)  # fmt: skip
def test_the_block_follows_the_vector_width(flags, block):
    from onnxep.providers_cpu.ops import packed_gemm

    assert packed_gemm.block_for(flags) == block
    assert packed_gemm.fits(flags) and not packed_gemm.fits(frozenset({"avx"}))


@needs_jit
@pytest.mark.parametrize("rule", ["threads", "always"])
def test_the_threads_rule_runs_it_in_sessions_of_two_threads_only(rule, monkeypatch):
    monkeypatch.setattr(conv_gemm, "MODE", "auto")
    monkeypatch.setattr(conv_gemm, "_auto", rule)
    calls = _spy(monkeypatch)
    model, feeds = _conv_model(c=64, m=64, hw=(24, 24), pads=[1, 1, 1, 1])
    want = theirs(model, feeds)
    for threads in (1, 2):
        calls.clear()
        got = ours(model, feeds, threads)
        np.testing.assert_allclose(got, want, rtol=0, atol=1e-5 * float(np.abs(want).max()))
        assert bool(calls) == (rule == "always" or threads == 2)
        notes = (
            onnxep.InferenceSession(
                model, onnxep.SessionOptions(intra_op_num_threads=threads), providers=["cpu"]
            )
            .placement()
            .provider_notes.get("cpu", [])
        )
        assert any("dense Conv GEMM" in n for n in notes) == bool(calls)


def test_the_provider_says_which_gemm_runs(monkeypatch):
    from onnxep.providers_cpu.plugin import CPUPlugin

    desc = CPUPlugin().onnxep_provider_info().description
    assert conv_gemm.status() in desc
    model, feeds = _conv_model(**CASES["3x3 pads 1"])
    for mode in ("1", "0"):
        monkeypatch.setattr(conv_gemm, "MODE", mode)
        notes = onnxep.InferenceSession(model, providers=["cpu"]).placement().provider_notes
        said = any("dense Conv GEMM" in n for n in notes.get("cpu", []))
        assert said == (mode == "1" and not conv_gemm.jit_off())


@needs_jit
@pytest.mark.parametrize(
    "case", ["3x3 pads 1", "batch of three", "relu fused into FusedConv", "no bias"]
)
def test_winograd_with_compiled_products_matches_onnxruntime(case, monkeypatch):
    from onnxep.providers_cpu.ops import winograd

    monkeypatch.setattr(conv_gemm, "MODE", "1")
    monkeypatch.setattr(conv_gemm, "_MIN_MACS", 0)
    monkeypatch.setattr(winograd, "COMPILED", True)
    monkeypatch.setattr("onnxep.providers_cpu.ops.nn_cpu._PARALLEL_MIN", 0)
    calls = []
    real = winograd._compiled_products  # noqa: SLF001
    monkeypatch.setattr(winograd, "_compiled_products", lambda *a: calls.append(1) or real(*a))
    model, feeds = _conv_model(**CASES[case])
    want = theirs(model, feeds)
    two = ours(model, feeds, 2)
    np.testing.assert_allclose(two, want, rtol=0, atol=1e-5 * float(np.abs(want).max()))
    assert calls  # at two threads; one thread keeps the BLAS products
    calls.clear()
    ours(model, feeds, 1)
    assert not calls


def _conv_transpose(rng, c, m, hw, k, strides, n=1, group=1, bias=True, pads=None, fed=False):
    w = rng.standard_normal((c, m // group, *k)).astype(np.float32) * 0.2
    b = rng.standard_normal(m).astype(np.float32)
    inits = [] if fed else [numpy_helper.from_array(w, "w")]
    ins = ["x", "w"] + (["b"] if bias else [])
    if bias:
        inits.append(numpy_helper.from_array(b, "b"))
    attrs = dict(kernel_shape=list(k), strides=list(strides), group=group)
    if pads:
        attrs["pads"] = pads
    graph = helper.make_graph(
        [helper.make_node("ConvTranspose", ins, ["y"], **attrs)],
        "ct",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [n, c, *hw])]
        + ([helper.make_tensor_value_info("w", TensorProto.FLOAT, list(w.shape))] if fed else []),
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    feeds = {"x": rng.standard_normal((n, c, *hw)).astype(np.float32)}
    if fed:
        feeds["w"] = w
    return model.SerializeToString(), feeds


CT_CASES = {
    # kernel == stride: every output one offset's column (a detection neck's upsampling)
    "2x2 stride 2, 24 -> 24": dict(c=24, m=24, hw=(16, 24), k=(2, 2), strides=(2, 2)),
    "2x2 stride 2, odd map, 13 -> 7, batch of two": dict(
        c=13, m=7, hw=(9, 11), k=(2, 2), strides=(2, 2), n=2
    ),
    "3x3 stride 2 pads 1 (phases)": dict(
        c=16, m=12, hw=(10, 13), k=(3, 3), strides=(2, 2), pads=[1, 1, 1, 1]
    ),
    "4x4 stride 2, no bias": dict(c=20, m=8, hw=(7, 9), k=(4, 4), strides=(2, 2), bias=False),
}


@needs_jit
@pytest.mark.parametrize("case", list(CT_CASES), ids=list(CT_CASES))
def test_conv_transpose_product_on_the_kernel_matches_onnxruntime_and_blas(case, monkeypatch):
    # W^T X is a 1x1 convolution of M * prod(k) channels: where conv_gemm runs one (two
    # threads here, or MODE 1), ConvTranspose's product runs there, not on OpenBLAS's split
    model, feeds = _conv_transpose(np.random.default_rng(7), **CT_CASES[case])
    monkeypatch.setattr(conv_gemm, "_MIN_MACS", 0)
    monkeypatch.setattr(conv_gemm, "MODE", "0")
    blas = ours(model, feeds, threads=2)
    monkeypatch.setattr(conv_gemm, "MODE", "1")
    calls = _spy(monkeypatch)
    two = ours(model, feeds, threads=2)
    assert calls, "the product did not run on the compiled kernel"
    monkeypatch.setattr("onnxep.providers_cpu.ops.nn_cpu._PARALLEL_MIN", 0)
    split = ours(model, feeds, threads=2)
    np.testing.assert_array_equal(two, split)  # the kernel's bits on any split
    np.testing.assert_allclose(two, theirs(model, feeds), rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(two, blas, rtol=1e-5, atol=1e-5)


@needs_jit
def test_conv_transpose_keeps_blas_for_fed_weights_groups_and_one_thread(monkeypatch):
    monkeypatch.setattr(conv_gemm, "_MIN_MACS", 0)
    rng = np.random.default_rng(3)
    calls = _spy(monkeypatch)
    monkeypatch.setattr(conv_gemm, "MODE", "1")
    for kw in (dict(fed=True), dict(group=2, m=8)):
        args = dict(c=8, m=6, hw=(5, 6), k=(2, 2), strides=(2, 2)) | kw
        model, feeds = _conv_transpose(rng, **args)
        np.testing.assert_allclose(ours(model, feeds, 2), theirs(model, feeds), 1e-4, 1e-5)
    assert not calls
    monkeypatch.setattr(conv_gemm, "MODE", "auto")
    monkeypatch.setattr(conv_gemm, "_auto", "threads")
    model, feeds = _conv_transpose(rng, c=24, m=24, hw=(16, 24), k=(2, 2), strides=(2, 2))
    ours(model, feeds, 1)
    assert not calls  # one thread: OpenBLAS, which does not split
    ours(model, feeds, 2)
    assert calls


@needs_jit
@pytest.mark.parametrize("hw", [(2, 3), (4, 6), (1, 1), (6, 8)])
def test_pointwise_on_few_positions_keeps_its_kernel_on_two_threads(hw, monkeypatch):
    # the GEMM's 16-column panels would be mostly padding: the few-position pointwise
    # kernel (conv_pointwise.py) runs these at any thread count
    from onnxep.providers_cpu.ops import conv_pointwise

    monkeypatch.setattr(conv_gemm, "MODE", "1")
    calls = _spy(monkeypatch)
    model, feeds = _conv_model(c=96, m=80, hw=hw, k=1)
    got = ours(model, feeds, threads=2)
    assert not calls
    np.testing.assert_allclose(got, theirs(model, feeds), rtol=1e-4, atol=1e-5)
    assert conv_pointwise.applies(96, 80, hw[0] * hw[1], np.float32, True)
    # past the kernel's positions (48, 64 with AVX-512) the GEMM runs again
    assert not conv_pointwise.applies(96, 80, 9 * 8, np.float32, True)
    model, feeds = _conv_model(c=96, m=80, hw=(9, 8), k=1)
    ours(model, feeds, threads=2)
    assert calls
