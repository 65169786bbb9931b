"""The tensor-core attention prefill (providers_cuda/ops/_flash_cuda.py) run on the CPU.

Its CUDA C runs on the thread emulator (tests/cuda_emulation.py), whose host
``mma.sync``/``ldmatrix``/``cp.async`` follow the PTX ISA's fragment layouts,
and its real launch code on NumPy arrays: first the instructions themselves
against NumPy (the probes the GPU tests run on the hardware too), then
GroupQueryAttention and ONNX Attention through their CUDA op builders against
the CPU provider's kernels (causal and not, head sizes 16 to 256, GQA groups
1, 2 and 7, ragged batches, windows, soft-cap, masks, bias, sinks, past
caches), and bfloat16 through a direct launch. tests/cuda/test_cuda_flash_prefill.py
runs the same cases, and real sizes, on a GPU.
"""

from __future__ import annotations

import types

import numpy as np
import pytest
from cuda_emulation import Emulator, available, nan_empty
from cuda_emulator import gpu_test_module

_WHY_NOT = available()
pytestmark = [pytest.mark.skipif(bool(_WHY_NOT), reason=f"cannot emulate CUDA: {_WHY_NOT}")]

fc = gpu_test_module("flash_cases")
gqa_gpu = gpu_test_module("test_cuda_attention")
att_gpu = gpu_test_module("test_cuda_attention23")
#: The default run: one case per feature family (the rest under -m slow).
QUICK = {"h64_causal_g7_ragged_packed_rotary", "h128_causal_g1", "h256_causal_g2",
         "h64_chunk_after_past_shared", "h16_bias_sink", "4d_causal_h64_gqa",
         "half_mask_past_h64", "nonpad_causal_h64", "windows_both_h256",
         "h64_g7_causal_ragged", "h256_g1_causal"}  # fmt: skip
#: An sm_90 device with an H200's opt-in shared memory, and 8 SMs.
FACTS, SMS = (90, 227 * 1024), 8


def _param(cases):
    slow = pytest.mark.slow
    return [pytest.param(c, id=c[0], marks=() if c[0] in QUICK else slow) for c in cases]


@pytest.fixture(scope="module")
def emulator():
    return Emulator()


@pytest.fixture
def cuda_ops(emulator, monkeypatch):
    """The CUDA attention op modules wired to the emulator on an sm_90 device of 8 SMs."""
    from onnxep.providers_cuda import nvrtc
    from onnxep.providers_cuda.ops import _attention_cuda, _flash_prefill, op_attention
    from onnxep.providers_cuda.ops import op_group_query_attention as gqa

    monkeypatch.setattr(nvrtc, "function", emulator.function)
    for mod in (gqa, op_attention, _attention_cuda):
        monkeypatch.setattr(mod, "sm_count", lambda: SMS)
    monkeypatch.setattr(_flash_prefill, "device_facts", lambda: FACTS)
    xp = types.SimpleNamespace(**{k: getattr(np, k) for k in dir(np) if not k.startswith("_")})
    xp.empty = nan_empty  # an element the kernel never writes shows as NaN
    xp.empty_like = lambda a: nan_empty(a.shape, a.dtype)
    return types.SimpleNamespace(
        xp=xp, gqa=gqa.group_query_attention, attention=op_attention.attention, flash=_flash_prefill
    )


def _ran(emulator, before):
    return {k: n - before.get(k, 0) for k, n in emulator.launches().items() if n > before.get(k, 0)}


# ------------------------------------------------------------------------- the instructions


@pytest.mark.parametrize("acc", [0, 1], ids=["from_zero", "accumulating"])
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_mma_follows_the_ptx_fragment_layout(dtype, acc, emulator):
    a, bt, d0 = fc.probe_inputs(dtype, np.random.default_rng(0))
    fn = emulator.function(fc.PROBE_SOURCE, f"probe_mma<{fc.PROBE_TYPES[dtype]}, {acc}>")
    d = d0.copy()
    fn((1,), (32,), (a, bt, d))
    np.testing.assert_array_equal(d, fc.mma_expected(a, bt, d0, bool(acc)))


@pytest.mark.parametrize("trans", [0, 1], ids=["rows", "transposed"])
def test_ldmatrix_follows_the_ptx_distribution(trans, emulator):
    m = np.random.default_rng(1).standard_normal((16, 16)).astype(np.float16)
    out = np.zeros((32, 4), np.uint32)
    fn = emulator.function(fc.PROBE_SOURCE, f"probe_ldsm<__half, {trans}>")
    fn((1,), (32,), (m, out), shared_mem=16 * 24 * 2)
    np.testing.assert_array_equal(out, fc.ldsm_expected(m, bool(trans)))


def test_cp_async_copies_and_zero_fills(emulator):
    src = np.random.default_rng(2).standard_normal(256).astype(np.float16)
    dst = nan_empty(256, np.float16)
    fn = emulator.function(fc.PROBE_SOURCE, "probe_cp_async<__half, 21>")
    fn((1,), (32,), (src, dst), shared_mem=512)
    np.testing.assert_array_equal(dst, fc.cp_async_expected(src, 21))


def test_emulator_reports_a_read_past_an_argument(emulator):
    """A copy whose source runs past every argument array is reported, not performed."""
    src = np.zeros(128, np.float16)  # 16 chunks; lanes 16.. read past it
    fn = emulator.function(fc.PROBE_SOURCE, "probe_cp_async<__half, 32>")
    with pytest.raises(RuntimeError, match="source outside every argument array"):
        fn((1,), (32,), (src, nan_empty(256, np.float16)), shared_mem=512)


# ------------------------------------------------------------------------ GroupQueryAttention


@pytest.mark.parametrize("case", _param(fc.GQA_CASES))
def test_group_query_attention_prefill_on_tensor_cores(case, cuda_ops, emulator):
    name, b, s, nh, nkv, hd, past_lens, cap, attrs, extras = case
    f, names = gqa_gpu._gqa_feeds(np.random.default_rng(0), b, s, nh, nkv, hd, past_lens, cap,
                                  attrs, extras, np.float16)  # fmt: skip
    node = fc.gqa_node(name, nh, nkv, attrs, f, names)
    want = fc.cpu_gqa(node, np)(*[f[n] if n else None for n in names])
    run = cuda_ops.gqa(node, cuda_ops.xp)
    before = emulator.launches()
    got = run(*[f[n].copy() if n else None for n in names])
    ran = _ran(emulator, before)
    assert any(k.startswith("flash_prefill<__half") for k in ran), ran
    assert not any(k.startswith("gqa_prefill") for k in ran), ran
    (route,) = run.routes.values()
    assert route.flash and f"head size {hd}" in route.reason
    atol, rtol = fc.TOL["float16"]
    for g, w, o in zip(got, want[:3], ("output", "present_key", "present_value"), strict=True):
        assert g.shape == w.shape, f"{name} {o}"
        np.testing.assert_allclose(g.astype(np.float64), w, atol=atol, rtol=rtol, err_msg=o)


def test_misaligned_cache_runs_the_tiled_kernel(cuda_ops, emulator):
    """16-byte copies need aligned rows: a cache starting 2 bytes off takes gqa_prefill."""
    case = ("misaligned", 1, 9, 2, 1, 16, [4], 16, {}, ())
    name, b, s, nh, nkv, hd, past_lens, cap, attrs, extras = case
    f, names = gqa_gpu._gqa_feeds(np.random.default_rng(1), b, s, nh, nkv, hd, past_lens, cap,
                                  attrs, extras, np.float16)  # fmt: skip
    node = fc.gqa_node(name, nh, nkv, attrs, f, names)
    want = fc.cpu_gqa(node, np)(*[f[n] if n else None for n in names])
    args = [f[n].copy() if n else None for n in names]
    for i in (3, 4):  # past key, past value: same values, one element off a 16-byte boundary
        buf = np.empty(args[i].size + 8, np.float16)
        off = (-(buf.ctypes.data // 2) + 1) % 8
        view = buf[off : off + args[i].size].reshape(args[i].shape)
        view[...] = args[i]
        args[i] = view
    before = emulator.launches()
    got = cuda_ops.gqa(node, cuda_ops.xp)(*args)
    ran = _ran(emulator, before)
    assert any(k.startswith("gqa_prefill") for k in ran), ran
    atol, rtol = fc.TOL["float16"]
    np.testing.assert_allclose(got[0].astype(np.float64), want[0], atol=atol, rtol=rtol)


# ---------------------------------------------------------------------------- ONNX Attention


@pytest.mark.parametrize("case", _param(fc.ATTENTION_CASES))
def test_attention_on_tensor_cores(case, cuda_ops, emulator):
    feeds = att_gpu.case_feeds(case, np.random.default_rng(0))
    run = cuda_ops.attention(att_gpu.node_info(case[1], feeds, case[2]), cuda_ops.xp)
    before = emulator.launches()
    got = run(*feeds)
    ran = _ran(emulator, before)
    assert ran.get(next((k for k in ran if k.startswith("flash_prefill<__half")), ""), 0) == 1, ran
    assert not any(k.startswith(("att_prefill", "att_reduce")) for k in ran), ran
    att_gpu.check_against_cpu(case, feeds, got)


# ---------------------------------------------------------------------------- routes


@pytest.mark.parametrize(
    "dtype,d,dv,arch,why",
    [
        (np.float32, 64, 64, 90, "float32: tensor cores take float16 and bfloat16"),
        (np.float16, 64, 64, 75, "compute capability 7.5 lacks"),
        (np.float16, 72, 72, 90, "head size 72 is not a multiple of 16"),
        (np.float16, 272, 272, 90, "head size 272 is not a multiple of 16 up to 256"),
        (np.float16, 64, 32, 90, "V's head size 32 differs"),
        (fc.BF16, 256, 256, 80, None),
        (np.float16, 256, 256, 86, None),
    ],
)
def test_route_from_dtype_head_size_and_device(dtype, d, dv, arch, why):
    from onnxep.providers_cuda.ops import _flash_prefill as fp

    r = fp.route(dtype, d, dv, arch, 99 * 1024)
    assert r.flash == (why is None), r
    if why:
        assert why in r.reason
    assert fp.route(np.float16, 256, 256, 90, 48 * 1024).reason.startswith("head size 256 needs")


def test_keys_split_stay_on_the_tiled_kernel_and_the_route_says_why(cuda_ops, emulator):
    """A few query rows over many keys: the tiled kernel splits the keys across blocks."""
    case = next(c for c in att_gpu.CASES if c[0] == "split_keys_past_fp16")
    feeds = att_gpu.case_feeds(case, np.random.default_rng(0))
    run = cuda_ops.attention(att_gpu.node_info(case[1], feeds, case[2]), cuda_ops.xp)
    got = run(*feeds)
    (route,) = run.routes.values()
    assert not route.flash  # head size 8 first; 16 would still split
    att_gpu.check_against_cpu(case, feeds, got)
    r = cuda_ops.flash.plan_attention(
        cuda_ops.flash.Kernels("Attention"), cuda_ops.xp, np.float16,
        types.SimpleNamespace(causal=True, softcap=0.0, left=-1, right=-1), b=1, hq=2, hkv=1,
        d=16, dv=16, sq=2, total=292, past=290, split=3, strides=((0,) * 3,) * 4, mask=None,
        nonpad_offset=False, scale=0.25, sms=SMS,
    )[0]  # fmt: skip
    assert not r.flash and "splits the keys 3 ways" in r.reason


def test_local_window_zero_stays_on_the_tiled_kernel(cuda_ops):
    cfg = types.SimpleNamespace(window=0, num_heads=2, kv_num_heads=1)
    r, run = cuda_ops.flash.plan_gqa(
        cuda_ops.flash.Kernels("GroupQueryAttention"), cuda_ops.xp, np.float16, cfg, b=1, s=4,
        d=16, cap=4, kv_limit=4, bias_strides=(0, 0, 0, 0), scale=0.25, sms=SMS,
    )  # fmt: skip
    assert run is None and "local_window_size 0" in r.reason


# ---------------------------------------------------------------------------- bfloat16


def _direct(case, dtype, cuda_ops, tiles=None):
    name, b, s, nh, nkv, hd = case[:6]
    q, k, v, seqlens = fc.direct_feeds(case, dtype, np.random.default_rng(3))
    want = fc.direct_expected(case, q, k, v, seqlens)
    run = fc.plan_flash_direct(cuda_ops.flash.Kernels("test"), cuda_ops.xp, case, dtype, tiles)
    y = nan_empty((b, s, nh * hd), dtype)
    qb, kb, vb = fc.heads_first(q, nh), fc.heads_first(k, nkv), fc.heads_first(v, nkv)
    assert run(qb, kb, vb, seqlens, None, None, None, None, None, None, None, y)
    atol, rtol = fc.TOL[np.dtype(dtype).name]
    np.testing.assert_allclose(y.astype(np.float64), want, atol=atol, rtol=rtol, err_msg=name)
    return run.geometry


@pytest.mark.parametrize("case", _param(fc.DIRECT_CASES))
def test_bfloat16_prefill(case, cuda_ops):
    _direct(case, fc.BF16, cuda_ops)


@pytest.mark.parametrize("tiles", [1, 2])
@pytest.mark.parametrize("dtype", [np.float16, fc.BF16], ids=["fp16", "bf16"])
def test_one_and_two_m16_tiles_per_warp(dtype, tiles, cuda_ops):
    """Both tile shapes of head size 64: 64 query rows per block, or 128 (two tiles of
    70 rows' blocks, the second mostly past the prompt)."""
    geo = _direct(fc.DIRECT_CASES[0], dtype, cuda_ops, tiles)
    assert (geo.m_tiles, geo.bq) == (tiles, 64 * tiles)


# ------------------------------------------------------------------------------ a whole model


def test_tiny_fp16_decoder_greedy_tokens_equal_the_cpu_providers(cuda_ops, emulator, tmp_path):
    """The factory's tiny genai decoder in float16 (head size 32), GroupQueryAttention on the
    emulated CUDA kernels (the prefill on tensor cores), every other node on the CPU: a
    100-token prompt decodes the CPU provider's greedy tokens."""
    import sys
    from pathlib import Path

    import cuda_emulator as emu

    import onnxep

    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from bench.factory import build_genai_decoder

    path = tmp_path / "tiny" / "model.onnx"
    build_genai_decoder("tiny", seed=3, dtype="fp16", out_path=path)
    prompt = np.random.default_rng(11).integers(0, 512, 100)
    cpu = onnxep.InferenceSession(str(path), providers=["cpu"])
    want = onnxep.generate(cpu, prompt, 5, progress=False).tokens
    with emu.registered_for("gqaemu", {("com.microsoft", "GroupQueryAttention")}) as name:
        sess = onnxep.InferenceSession(str(path), providers=[name, "cpu"])
        placed = {n.op_type: n.provider for n in sess.placement()}
        assert placed["GroupQueryAttention"] == name
        before = emulator.launches()
        got = onnxep.generate(sess, prompt, 5, progress=False).tokens
    ran = _ran(emulator, before)
    assert sum(n for k, n in ran.items() if k.startswith("flash_prefill<__half, 32")) == 2, ran
    assert got == want
