"""The CUDA attention kernels run on the CPU emulator (tests/cuda_emulation.py) against the
CPU provider's kernels: the real kernel source and the real launch code, with NumPy
arrays for device memory. Slow (one OS thread per CUDA thread), so ``-m slow``; on a
GPU, tests/cuda/test_cuda_attention.py checks the same on the hardware.
"""

from __future__ import annotations

import itertools
import types

import numpy as np
import pytest
from cuda_emulation import Emulator, available, nan_empty
from cuda_emulator import gpu_test_module

from onnxep.providers.node import NodeInfo, ValueInfo
from onnxep.providers.ops.op_group_query_attention import group_query_attention as cpu_gqa
from onnxep.providers.ops.op_rotary_embedding import rotary_embedding as cpu_rope23
from onnxep.providers.ops.op_rotary_embedding_contrib import rotary_embedding_contrib as cpu_rope

pytestmark = [pytest.mark.slow]
_WHY_NOT = available()
if _WHY_NOT:
    pytestmark.append(pytest.mark.skip(reason=f"cannot emulate CUDA kernels: {_WHY_NOT}"))

# the GPU tests' feeds, so the emulated cases are the GPU cases' inputs
gpu = gpu_test_module("test_cuda_attention")
_rope_cache, _gqa_feeds = gpu._rope_cache, gpu._gqa_feeds


@pytest.fixture(scope="module")
def emulator():
    return Emulator()


@pytest.fixture(params=[8, 132], ids=["8sm", "132sm"])
def cuda_ops(request, emulator, monkeypatch):
    """The CUDA op modules wired to the emulator, on a device of ``param`` SMs and compute
    capability 7.5, so prefills run the tiled kernel (the tensor-core one, which sm_80
    devices take for float16, has its own tests: tests/test_flash_prefill_emulated.py)."""
    from onnxep.providers_cuda import nvrtc
    from onnxep.providers_cuda.ops import _attention_cuda, _flash_prefill, _rotary_cuda
    from onnxep.providers_cuda.ops import op_group_query_attention as gqa
    from onnxep.providers_cuda.ops import op_rotary_embedding as rope23
    from onnxep.providers_cuda.ops import op_rotary_embedding_contrib as rope

    monkeypatch.setattr(nvrtc, "function", emulator.function)
    for mod in (gqa, _rotary_cuda, _attention_cuda):
        monkeypatch.setattr(mod, "sm_count", lambda: request.param)
    monkeypatch.setattr(_flash_prefill, "device_facts", lambda: (75, 64 * 1024))
    xp = types.SimpleNamespace(**{k: getattr(np, k) for k in dir(np) if not k.startswith("_")})
    xp.empty = nan_empty
    xp.empty_like = lambda a: nan_empty(a.shape, a.dtype)
    return types.SimpleNamespace(
        xp=xp, gqa=gqa.group_query_attention, rope=rope.rotary_embedding_contrib,
        rope23=rope23.rotary_embedding, emulator=emulator,
    )  # fmt: skip


GQA_CASES = [
    # name, b, s, nh, nkv, hd, past lens, capacity, attrs, extras, kernel expected
    ("prefill_padded", 3, 21, 4, 1, 16, [0, 0, 0], None, {}, (), "prefill"),
    ("prefill_nopast_packed", 2, 20, 4, 2, 8, [0, 0], None, {}, ("nopast", "packed"), "prefill"),
    ("chunk_shared", 2, 9, 4, 2, 8, [5, 2], 24, {"do_rotary": 1}, (), "prefill"),
    ("decode_growing", 3, 1, 6, 2, 8, [4, 7, 2], None, {}, (), "decode"),
    ("decode_split_k", 2, 1, 14, 2, 64, [300, 17], 320, {}, ("fp16",), "decode"),
    ("three_tokens_prefill", 1, 3, 40, 1, 8, [50], 64, {}, (), "prefill"),
    ("rotary_il_partial", 2, 1, 4, 2, 16, [7, 2], 12,
     {"do_rotary": 1, "rotary_interleaved": 1}, ("half_rot",), "decode"),
    ("pos_ids_prompt", 2, 14, 4, 2, 16, [0, 0], None, {"do_rotary": 1}, ("position_ids",),
     "prefill"),
    ("window_softcap", 2, 23, 4, 2, 8, [0, 0], None,
     {"local_window_size": 5, "softcap": 2.0, "scale": 0.3}, (), "prefill"),
    ("sink_bias_decode", 2, 1, 4, 1, 32, [200, 3], 256, {"local_window_size": 90},
     ("head_sink", "attention_bias"), "decode"),
    ("smooth_bidirectional", 2, 13, 4, 2, 8, [0, 0], None,
     {"smooth_softmax": 1, "causal": 0}, (), "prefill"),
    ("query_seqlens", 2, 11, 4, 2, 8, [3, 5], 24, {}, ("query_seqlens",), "prefill"),
    ("head_size_256", 1, 9, 2, 1, 256, [0], None, {}, ("fp16",), "prefill"),
]  # fmt: skip


@pytest.mark.parametrize("case", GQA_CASES, ids=[c[0] for c in GQA_CASES])
def test_gqa_emulated_matches_cpu_kernel(case, cuda_ops):
    name, b, s, nh, nkv, hd, past_lens, cap, attrs, extras, kind = case
    dt = np.float16 if "fp16" in extras else np.float32
    f, names = _gqa_feeds(np.random.default_rng(0), b, s, nh, nkv, hd, past_lens, cap, attrs,
                          extras, dt)  # fmt: skip
    attrs = {"num_heads": nh, "kv_num_heads": nkv, **attrs}
    ins = tuple(ValueInfo(n, "tensor", f[n].dtype, f[n].shape) if n else None for n in names)
    outs = tuple(ValueInfo(n, "tensor") for n in ("output", "present_key", "present_value"))
    node = NodeInfo("GroupQueryAttention", "com.microsoft", name, 1, attrs, ins, outs)
    want = cpu_gqa(node, np)(*[f[n] if n else None for n in names])
    args = [f[n].copy() if n else None for n in names]
    before = cuda_ops.emulator.launches()
    got = cuda_ops.gqa(node, cuda_ops.xp)(*args)
    ran = {k for k, n in cuda_ops.emulator.launches().items() if n > before.get(k, 0)}
    assert any(kind in n for n in ran), f"{name}: expected a {kind} launch, ran {sorted(ran)}"
    if "past_key" in f:
        shared = cap is not None
        assert (got[1] is args[names.index("past_key")]) == shared
    atol, rtol = (2.5e-3, 1e-3) if dt == np.float16 else (2e-5, 1e-4)
    for g, w, o in zip(got, want[:3], ("output", "present_key", "present_value"), strict=True):
        assert g.shape == w.shape, f"{name} {o}"
        np.testing.assert_allclose(g.astype(np.float64), w, atol=atol, rtol=rtol, err_msg=o)


DECODE_CASES = [
    # name, b, nh, nkv, hd, past lens, capacity (None: a fresh cache), attrs, extras
    ("h64_g7_ctx300_rot", 1, 14, 2, 64, [299], 320, {"do_rotary": 1}, ("fp16",)),
    ("h64_g7_ctx300_fp32", 2, 14, 2, 64, [299, 40], 320, {}, ()),
    ("h128_g2_ctx17_rot", 2, 4, 2, 128, [16, 5], 24, {"do_rotary": 1}, ()),
    ("h128_g7_ctx17_fresh", 1, 7, 1, 128, [16], None, {}, ("fp16",)),
    ("h64_g1_ctx1_rot", 2, 2, 2, 64, [0, 0], 8, {"do_rotary": 1}, ("fp16",)),
    ("h128_g1_ctx300_packed", 1, 2, 2, 128, [299], 304, {}, ("packed", "fp16")),
    ("h64_g2_pos_ids_il", 2, 4, 2, 64, [30, 12], 40,
     {"do_rotary": 1, "rotary_interleaved": 1}, ("position_ids",)),
    ("h40_scalar_loads", 2, 6, 2, 40, [20, 7], 32, {"do_rotary": 1}, ("fp16", "half_rot")),
    ("h64_g7_window_sink", 1, 7, 1, 64, [299], 300, {"local_window_size": 100, "softcap": 3.0},
     ("head_sink",)),
    ("h64_g20_row_groups", 1, 20, 1, 64, [40], 48, {}, ()),
    ("h256_g2_ctx40", 1, 4, 2, 256, [39], 40, {"do_rotary": 1}, ("fp16",)),
    ("qseqlens_bias_smooth", 2, 4, 2, 64, [17, 3], 24, {"smooth_softmax": 1},
     ("query_seqlens", "attention_bias")),
    ("mqa_32_heads_ragged", 3, 32, 1, 64, [60, 2, 33], None, {}, ()),
    # more splits than a warp has lanes: the merge takes the weights 32 at a time
    ("h64_g2_ctx1200_many_splits", 1, 2, 1, 64, [1199], 1200, {"do_rotary": 1}, ("fp16",)),
    # onnxep.generate's shared buffers: total_sequence_length is the capacity
    ("h64_g7_total_is_capacity", 2, 14, 2, 64, [10, 200], 512, {"do_rotary": 1},
     ("fp16", "total_is_capacity")),
]  # fmt: skip


@pytest.mark.parametrize("case", DECODE_CASES, ids=[c[0] for c in DECODE_CASES])
def test_gqa_decode_is_one_fused_launch_matching_cpu(case, cuda_ops):
    """A single-token step is one launch (plus a fresh cache's fill), split or not; run twice,
    as a graph replays it, so the split counters must be back at zero after a step."""
    from onnxep.providers_cuda.ops import op_group_query_attention as gqa_mod
    from onnxep.providers_cuda.ops._gqa_geometry import plan_decode

    name, b, nh, nkv, hd, past_lens, cap, attrs, extras = case
    dt = np.float16 if "fp16" in extras else np.float32
    f, names = _gqa_feeds(np.random.default_rng(4), b, 1, nh, nkv, hd, past_lens, cap, attrs,
                          extras, dt)  # fmt: skip
    if "total_is_capacity" in extras:
        f["total_sequence_length"] = np.array(cap, np.int32)
    attrs = {"num_heads": nh, "kv_num_heads": nkv, **attrs}
    ins = tuple(ValueInfo(n, "tensor", f[n].dtype, f[n].shape) if n else None for n in names)
    outs = tuple(ValueInfo(n, "tensor") for n in ("output", "present_key", "present_value"))
    node = NodeInfo("GroupQueryAttention", "com.microsoft", name, 1, attrs, ins, outs)
    want = cpu_gqa(node, np)(*[f[n] if n else None for n in names])
    args = [f[n].copy() if n else None for n in names]
    run = cuda_ops.gqa(node, cuda_ops.xp)
    run(*[a.copy() if a is not None else None for a in args])
    before = cuda_ops.emulator.launches()
    got = run(*args)
    ran = {}
    for k, n in cuda_ops.emulator.launches().items():
        if n > before.get(k, 0):
            ran[k.split("<")[0]] = n - before.get(k, 0)
    geo = plan_decode(b, nh, nkv, hd, int(f["total_sequence_length"]), gqa_mod.sm_count())
    expect = {"gqa_decode": 1}
    if cap is None:
        expect["gqa_kv_fill"] = 1
    assert ran == expect, f"{name}: {geo}"
    atol, rtol = (2.5e-3, 1e-3) if dt == np.float16 else (2e-5, 1e-4)
    for g, w, o in zip(got, want[:3], ("output", "present_key", "present_value"), strict=True):
        assert g.shape == w.shape, f"{name} {o}"
        np.testing.assert_allclose(g.astype(np.float64), w, atol=atol, rtol=rtol, err_msg=o)


@pytest.mark.parametrize("sms", [8, 132])
def test_decode_cases_take_one_split_and_many(sms):
    """The cases above reach both ends: rows whose block writes the output, rows merged
    from several splits."""
    from onnxep.providers_cuda.ops._gqa_geometry import decode_splits, plan_decode

    used = set()
    for _, b, nh, nkv, hd, past_lens, cap, _, extras in DECODE_CASES:
        total = cap if "total_is_capacity" in extras else max(past_lens) + 1
        geo = plan_decode(b, nh, nkv, hd, total, sms)
        used |= {decode_splits(geo, p + 1)[1] > 1 for p in past_lens}
    assert used == {False, True}


ROPE_CASES = [
    # name, op, rank, b, s, nh, hd, rot, interleaved, pos kind, extra attrs
    ("3d_2dpos_il", "RotaryEmbedding", 3, 2, 5, 3, 16, 0, 1, "2d", {}),
    ("4d_1dpos_partial", "RotaryEmbedding", 4, 2, 5, 2, 16, 8, 0, "1d", {}),
    ("mrope_default", "RotaryEmbedding", 3, 2, 4, 2, 64, 0, 0, "3d", {"num_heads": 2}),
    ("mrope_sections", "MRotaryEmbedding", 3, 2, 5, 2, 16, 0, 1, "3d",
     {"mrope_section": [2, 3, 3], "mrope_layout": 0, "num_heads": 2, "scale": 0.7}),
]  # fmt: skip


@pytest.mark.parametrize("dt", [np.float32, np.float16], ids=["fp32", "fp16"])
@pytest.mark.parametrize("case", ROPE_CASES, ids=[c[0] for c in ROPE_CASES])
def test_rotary_contrib_emulated_is_bit_exact(case, dt, cuda_ops):
    name, op, rank, b, s, nh, hd, rot, il, pos_kind, extra = case
    rng = np.random.default_rng(1)
    x = rng.standard_normal((b, s, nh * hd) if rank == 3 else (b, nh, s, hd)).astype(dt)
    cos, sin = _rope_cache(24, rot or hd, dt)
    pos = {
        "1d": np.array([3], np.int64),
        "2d": rng.integers(0, 24, size=(b, s)),
        "3d": rng.integers(0, 24, size=(3, b, s)),
    }[pos_kind].astype(np.int64)
    attrs = {"interleaved": il, **extra, **({"rotary_embedding_dim": rot} if rot else {})}
    ins = tuple(ValueInfo(n, "tensor", a.dtype, a.shape) for n, a in
                zip("xpcs", (x, pos, cos, sin), strict=True))  # fmt: skip
    node = NodeInfo(op, "com.microsoft", name, 1, attrs, ins, (ValueInfo("y", "tensor"),))
    want = cpu_rope(node, np)(x, pos, cos, sin)[0]
    got = cuda_ops.rope(node, cuda_ops.xp)(x, pos, cos, sin)[0]
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("rank,il,with_pos", list(itertools.product([3, 4], [0, 1], [0, 1])))
def test_rotary_onnx23_emulated_is_bit_exact(rank, il, with_pos, cuda_ops):
    rng = np.random.default_rng(2)
    b, s, nh, hd = 2, 5, 3, 16
    x = rng.standard_normal((b, s, nh * hd) if rank == 3 else (b, nh, s, hd)).astype(np.float32)
    cos, sin = _rope_cache(20, hd, np.float32)
    pos = rng.integers(0, 20, size=(b, s)).astype(np.int64)
    feeds = (x, cos, sin, pos) if with_pos else (x, cos[pos], sin[pos])
    attrs = {"interleaved": il, **({"num_heads": nh} if rank == 3 else {})}
    ins = tuple(ValueInfo(f"i{i}", "tensor", a.dtype, a.shape) for i, a in enumerate(feeds))
    node = NodeInfo("RotaryEmbedding", "", "r", 23, attrs, ins, (ValueInfo("y", "tensor"),))
    want = cpu_rope23(node, np)(*feeds)[0]
    got = cuda_ops.rope23(node, cuda_ops.xp)(*feeds)[0]
    np.testing.assert_array_equal(got, want)


def test_rotary_position_outside_the_cache_gives_nan(cuda_ops):
    """The CPU kernel raises; the device cannot, so the rotated channels become NaN."""
    rng = np.random.default_rng(3)
    b, s, nh, hd = 2, 4, 2, 16
    x = rng.standard_normal((b, s, nh * hd)).astype(np.float32)
    cos, sin = _rope_cache(24, hd // 2, np.float32)
    pos = rng.integers(0, 24, size=(b, s)).astype(np.int64)
    pos[1, 2] = 24
    attrs = {"num_heads": nh, "rotary_embedding_dim": hd // 2}
    ins = tuple(ValueInfo(n, "tensor", a.dtype, a.shape) for n, a in
                zip("xpcs", (x, pos, cos, sin), strict=True))  # fmt: skip
    node = NodeInfo("RotaryEmbedding", "com.microsoft", "r", 1, attrs, ins, ())
    with pytest.raises(IndexError):
        cpu_rope(node, np)(x, pos, cos, sin)
    got = cuda_ops.rope(node, cuda_ops.xp)(x, pos, cos, sin)[0].reshape(b, s, nh, hd)
    assert np.isnan(got[1, 2, :, : hd // 2]).all()
    np.testing.assert_array_equal(
        got[1, 2, :, hd // 2 :], x.reshape(b, s, nh, hd)[1, 2, :, hd // 2 :]
    )
    assert np.isfinite(np.delete(got.reshape(b * s, -1), 1 * s + 2, axis=0)).all()
