"""The tensor-core attention prefill (providers_cuda/ops/_flash_cuda.py) on the GPU.

First the warp-level instructions alone: the probes of ``flash_cases`` run
``mma.sync``, ``ldmatrix`` and ``cp.async`` on the hardware against NumPy, the
same probes tests/test_flash_prefill_emulated.py runs on the emulator, so the
emulator is checked against the device. Then the emulator-sized cases through
the op builders, and real sizes: GroupQueryAttention one-node sessions on
``["cuda"]`` with fallback forbidden against the CPU provider, for Qwen2.5's
0.5B and 1.5B heads and head size 256, causal and bidirectional, 128 to 2000
tokens, ragged batches; bfloat16 through a direct launch (CuPy has no
bfloat16 dtype: the arrays travel as uint16 bits); and a prefill captured in a
CUDA graph and replayed.
"""

from __future__ import annotations

import flash_cases as fc
import numpy as np
import pytest
from test_cuda_attention import _assert_close, _gqa_feeds, _model, _run_both
from test_cuda_attention23 import case_feeds, check_against_cpu, node_info

F16 = np.float16


def _cupy():
    import cupy

    return cupy


def _function(name):
    from onnxep.providers_cuda import nvrtc

    return nvrtc.function(fc.PROBE_SOURCE, name, (name,))


def _dev(x):
    """A NumPy array on the device; bfloat16 as its bits (CuPy has no bfloat16)."""
    cupy = _cupy()
    return cupy.asarray(x.view(np.uint16) if x.dtype == fc.BF16 else x)


# ------------------------------------------------------------------------- the instructions


@pytest.mark.parametrize("acc", [0, 1], ids=["from_zero", "accumulating"])
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_mma_on_the_device_matches_the_documented_layout(dtype, acc):
    a, bt, d0 = fc.probe_inputs(dtype, np.random.default_rng(0))
    d = _dev(d0)
    _function(f"probe_mma<{fc.PROBE_TYPES[dtype]}, {acc}>")((1,), (32,), (_dev(a), _dev(bt), d))
    np.testing.assert_array_equal(d.get(), fc.mma_expected(a, bt, d0, bool(acc)))


@pytest.mark.parametrize("trans", [0, 1], ids=["rows", "transposed"])
def test_ldmatrix_on_the_device_matches_the_documented_distribution(trans):
    cupy = _cupy()
    m = np.random.default_rng(1).standard_normal((16, 16)).astype(F16)
    out = cupy.zeros((32, 4), np.uint32)
    _function(f"probe_ldsm<__half, {trans}>")((1,), (32,), (_dev(m), out), shared_mem=768)
    np.testing.assert_array_equal(out.get(), fc.ldsm_expected(m, bool(trans)))


def test_cp_async_on_the_device_copies_and_zero_fills():
    cupy = _cupy()
    src = np.random.default_rng(2).standard_normal(256).astype(F16)
    dst = cupy.full(256, np.nan, F16)
    _function("probe_cp_async<__half, 21>")((1,), (32,), (_dev(src), dst), shared_mem=512)
    np.testing.assert_array_equal(dst.get(), fc.cp_async_expected(src, 21))


# ------------------------------------------------------------- the emulator's cases, on a GPU


def _routes(run):
    return list(run.routes.values())


@pytest.mark.parametrize("case", fc.GQA_CASES, ids=[c[0] for c in fc.GQA_CASES])
def test_group_query_attention_cases(case):
    from onnxep.providers_cuda.ops.op_group_query_attention import group_query_attention

    cupy = _cupy()
    name, b, s, nh, nkv, hd, past_lens, cap, attrs, extras = case
    f, names = _gqa_feeds(np.random.default_rng(0), b, s, nh, nkv, hd, past_lens, cap, attrs,
                          extras, F16)  # fmt: skip
    node = fc.gqa_node(name, nh, nkv, attrs, f, names)
    want = fc.cpu_gqa(node, np)(*[f[n] if n else None for n in names])
    run = group_query_attention(node, cupy)
    args = [None if not n else f[n] if n == "total_sequence_length" else cupy.asarray(f[n])
            for n in names]  # fmt: skip
    got = run(*args)
    (route,) = _routes(run)
    assert route.flash, route
    for g, w, o in zip(got, want[:3], ("output", "present_key", "present_value"), strict=True):
        _assert_close(cupy.asnumpy(g), w, F16, f"{name} {o}")


@pytest.mark.parametrize("case", fc.ATTENTION_CASES, ids=[c[0] for c in fc.ATTENTION_CASES])
def test_attention_cases(case):
    from onnxep.providers_cuda.ops.op_attention import attention

    cupy = _cupy()
    feeds = case_feeds(case, np.random.default_rng(0))
    run = attention(node_info(case[1], feeds, case[2]), cupy)
    got = run(*[None if x is None else cupy.asarray(x) for x in feeds])
    (route,) = _routes(run)
    assert route.flash, route
    check_against_cpu(case, feeds, [None if g is None else cupy.asnumpy(g) for g in got])


@pytest.mark.parametrize("case", fc.DIRECT_CASES, ids=[c[0] for c in fc.DIRECT_CASES])
def test_bfloat16_cases(case):
    _bf16_direct(case, np.random.default_rng(3))


def _bf16_direct(case, rng, tiles=None):
    from onnxep.providers_cuda.ops import _flash_prefill as fp

    cupy = _cupy()
    name, b, s, nh, nkv, hd = case[:6]
    q, k, v, seqlens = fc.direct_feeds(case, fc.BF16, rng)
    want = fc.direct_expected(case, q, k, v, seqlens)
    run = fc.plan_flash_direct(fp.Kernels("test"), cupy, case, fc.BF16, tiles)
    y = cupy.empty((b, s, nh * hd), np.uint16)
    qb, kb, vb = (_dev(fc.heads_first(x, n)) for x, n in ((q, nh), (k, nkv), (v, nkv)))
    assert run(qb, kb, vb, cupy.asarray(seqlens), None, None, None, None, None, None, None, y)
    got = y.get().view(fc.BF16).astype(np.float64)
    atol, rtol = fc.TOL["bfloat16"]
    np.testing.assert_allclose(got, want, atol=atol, rtol=rtol, err_msg=name)


# ------------------------------------------------------------------------------ real sizes

#: name, b, s, nh, nkv, hd, attrs (lengths: a first prompt, rows after the first shorter)
REAL = [
    ("qwen0.5b_128", 1, 128, 14, 2, 64, {"do_rotary": 1}),
    ("qwen0.5b_512_ragged", 2, 512, 14, 2, 64, {"do_rotary": 1}),
    ("qwen0.5b_2000", 1, 2000, 14, 2, 64, {"do_rotary": 1}),
    ("qwen1.5b_2000_ragged", 2, 2000, 12, 2, 128, {"do_rotary": 1}),
    ("qwen1.5b_512_bidirectional", 1, 512, 12, 2, 128, {"causal": 0}),
    ("h256_1000_g4", 1, 1000, 8, 2, 256, {}),
    ("h256_777_bidirectional_ragged", 2, 777, 4, 4, 256, {"causal": 0}),
]
GQA_NAMES = ["query", "key", "value", "past_key", "past_value", "seqlens_k",
             "total_sequence_length", "cos_cache", "sin_cache"]  # fmt: skip


@pytest.mark.parametrize("case", REAL, ids=[c[0] for c in REAL])
def test_real_size_prefill_sessions(case):
    """One-node GroupQueryAttention models on ["cuda"] (no fallback) against the CPU provider."""
    name, b, s, nh, nkv, hd, attrs = case
    f, names = _gqa_feeds(np.random.default_rng(5), b, s, nh, nkv, hd, [0] * b, None, attrs,
                          ("packed",), F16)  # fmt: skip
    outs = ["output", "present_key", "present_value"]
    attrs = {"num_heads": nh, "kv_num_heads": nkv, **attrs}
    got, want = _run_both(_model("GroupQueryAttention", names, outs, attrs, f), f)
    for g, w, o in zip(got, want, outs, strict=True):
        assert g.shape == w.shape, f"{name} {o}"
        _assert_close(g, w, F16, f"{name} {o}")


@pytest.mark.parametrize("hd,tiles", [(64, 1), (64, 2), (128, None), (256, None)])
def test_real_size_bfloat16(hd, tiles):
    case = (f"bf16_h{hd}_ragged", 2, 700, 8, 2, hd, True, True)
    _bf16_direct(case, np.random.default_rng(hd), tiles)


def test_real_size_attention_with_past_and_mask():
    case = ("att_real", {"is_causal": 1}, 23, F16, (1, 14, 600, 64), (1, 2, 600, 64),
            (1, 2, 600, 64), (("mask", (1, 1, 600, 1000), "bool"), ("past", 400)))  # fmt: skip
    test_attention_cases(case)


def test_flash_prefill_captures_and_replays():
    """The prefill step records in a CUDA graph (no host sync, no device read) and a replay
    after new values are written into the same input buffer gives the new answer."""
    from onnxep.providers_cuda.ops.op_group_query_attention import group_query_attention

    cupy = _cupy()
    b, s, nh, nkv, hd = 1, 300, 14, 2, 64
    attrs = {"num_heads": nh, "kv_num_heads": nkv, "do_rotary": 1}
    f, names = _gqa_feeds(np.random.default_rng(6), b, s, nh, nkv, hd, [0], None, attrs,
                          ("packed",), F16)  # fmt: skip
    node = fc.gqa_node("capture", nh, nkv, attrs, f, names)
    args = [None if not n else f[n] if n == "total_sequence_length" else cupy.asarray(f[n])
            for n in names]  # fmt: skip
    pool = cupy.cuda.MemoryPool()
    stream = cupy.cuda.Stream(non_blocking=True)
    with cupy.cuda.using_allocator(pool.malloc), stream:
        run = group_query_attention(node, cupy)
        run(*args)
        stream.synchronize()
        stream.begin_capture()
        outs = run(*args)
        graph = stream.end_capture()
    assert _routes(run)[0].flash
    for seed in (7, 8):
        new = np.random.default_rng(seed).standard_normal(f["query"].shape).astype(F16)
        args[0].set(new, stream=stream)
        f["query"] = new
        want = fc.cpu_gqa(node, np)(*[f[n] if n else None for n in names])
        graph.launch(stream)
        stream.synchronize()
        _assert_close(cupy.asnumpy(outs[0]), want[0], F16, f"replay {seed}")
