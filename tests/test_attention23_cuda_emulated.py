"""The CUDA kernel of ONNX Attention (providers_cuda/ops/op_attention.py) run on the CPU.

The kernel's CUDA C runs on the thread emulator (tests/cuda_emulation.py),
its real launch code on NumPy arrays: per feature against the CPU provider's
kernel, and ONNX's own node cases ``test_attention_*`` through a session on
``cudaemu`` (the CUDA provider's kernel library on NumPy), where every case
the kernel accepts must be placed on it and match the recorded outputs and
every other case must be declined with its reason. The default run takes a
subset covering every path in both dtypes; ``-m slow`` runs them all.
"""

from __future__ import annotations

import types

import cuda_emulator as emu
import numpy as np
import pytest
from cuda_emulation import Emulator, available, nan_empty

from onnxep.errors import InvalidArgument, NotSupported
from onnxep.providers.ops.op_attention import attention as cpu_attention

_WHY_NOT = available()
pytestmark = [pytest.mark.skipif(bool(_WHY_NOT), reason=f"cannot emulate CUDA: {_WHY_NOT}")]

F32, F16 = np.float32, np.float16
gpu = emu.gpu_test_module("test_cuda_attention23")
#: The emulated default run: every path once in both dtypes (the rest under -m slow).
QUICK = {"4d_gqa_causal_dv", "3d_gqa_softcap_scale", "3d_bool_mask_2d", "past_causal_mask",
         "nonpad_decode_causal", "window_both_fp16", "fully_masked_rows",
         "split_keys_decode_mask", "split_keys_past_fp16"}  # fmt: skip


@pytest.fixture(scope="module")
def emulator():
    return Emulator()


@pytest.fixture
def cuda_attention(emulator, monkeypatch):
    """providers_cuda's Attention module wired to the emulator, on an 8-SM device of compute
    capability 7.5, so every case runs the tiled kernel (the tensor-core one, which sm_80
    devices take for float16, has its own tests: tests/test_flash_prefill_emulated.py)."""
    from onnxep.providers_cuda import nvrtc
    from onnxep.providers_cuda.ops import _flash_prefill, op_attention

    monkeypatch.setattr(nvrtc, "function", emulator.function)
    monkeypatch.setattr(op_attention, "sm_count", lambda: 8)
    monkeypatch.setattr(_flash_prefill, "device_facts", lambda: (75, 64 * 1024))
    return op_attention


def _xp():
    xp = types.SimpleNamespace(**{k: getattr(np, k) for k in dir(np) if not k.startswith("_")})
    xp.empty = nan_empty  # an element the kernel never writes shows as NaN
    return xp


@pytest.mark.parametrize(
    "case",
    [pytest.param(c, id=c[0], marks=() if c[0] in QUICK else pytest.mark.slow) for c in gpu.CASES],
)
def test_kernel_matches_the_cpu_kernel(case, cuda_attention, emulator):
    feeds = gpu.case_feeds(case, np.random.default_rng(0))
    before = emulator.launches()
    got = cuda_attention.attention(gpu.node_info(case[1], feeds, case[2]), _xp())(*feeds)
    ran = {k: n - before.get(k, 0) for k, n in emulator.launches().items()}
    has_past = len(feeds) > 4 and feeds[4] is not None
    assert ran.get(f"att_prefill<{'float' if case[3] == F32 else '__half'}>") == 1, ran
    assert sum(n for k, n in ran.items() if "att_concat" in k) == (2 if has_past else 0), ran
    split = case[0].startswith("split_keys")  # 8 SMs: these leave the device idle unsplit
    assert sum(n for k, n in ran.items() if "att_reduce" in k) == int(split), ran
    gpu.check_against_cpu(case, feeds, got)


def test_a_signature_is_planned_once_and_reused(cuda_attention, emulator):
    rng = np.random.default_rng(1)
    feeds = [rng.standard_normal(s).astype(F32) for s in ((1, 2, 3, 8), (1, 2, 4, 8), (1, 2, 4, 8))]
    run = cuda_attention.attention(gpu.node_info({"is_causal": 1}, feeds), _xp())
    first = run(*feeds)[0]
    again = run(*[f * 2 for f in feeds])[0]
    want = cpu_attention(gpu.node_info({"is_causal": 1}, feeds), np)(*[f * 2 for f in feeds])[0]
    np.testing.assert_allclose(again, want, atol=2e-5, rtol=1e-4)
    assert not np.allclose(first, again)


# ----------------------------------------------------------------------------- declines, errors

_DECLINES = [
    ({}, ("y", None, None, "qk"), F32, "qk_matmul_output"),
    ({"softmax_precision": 10}, ("y",), F16, "softmax_precision=10"),
    ({}, ("y",), "mixed", "mix dtypes"),
]


@pytest.mark.parametrize("attrs,outputs,dt,reason", _DECLINES, ids=[d[3] for d in _DECLINES])
def test_builder_declines_with_the_reason(attrs, outputs, dt, reason, cuda_attention):
    dts = (F32, F16, F32) if dt == "mixed" else (dt,) * 3
    feeds = [np.zeros((1, 2, 3, 8), d) for d in dts]
    with pytest.raises(NotSupported, match=reason):
        cuda_attention.attention(gpu.node_info(attrs, feeds, outputs=outputs), _xp())


_ERRORS = [
    ({"q_num_heads": 2}, ((1, 3, 16), (1, 3, 16), (1, 3, 16)), None, "kv_num_heads"),
    ({}, ((1, 3, 4, 8), (1, 2, 5, 8), (1, 2, 5, 8)), None, "not a multiple"),
    ({}, ((1, 2, 4, 8), (1, 2, 5, 8), (1, 2, 5, 8)), (3, 5), "does not broadcast"),
    ({}, ((1, 2, 4, 8), (1, 2, 5, 8), (1, 2, 5, 8)), (4, 6), "does not broadcast"),
]


@pytest.mark.parametrize("attrs,shapes,mask,reason", _ERRORS, ids=[e[3] for e in _ERRORS])
def test_bad_shapes_raise_a_clear_error(attrs, shapes, mask, reason, cuda_attention):
    feeds = [np.zeros(s, F32) for s in shapes] + ([np.ones(mask, bool)] if mask else [])
    run = cuda_attention.attention(gpu.node_info(attrs, feeds), _xp())
    with pytest.raises(InvalidArgument, match=reason):
        run(*feeds)


def test_registered_for_onnx_and_onnxep_domains_and_capture_safe():
    from onnxep.providers_cuda.declines import CUPY_BLAS_OPS
    from onnxep.providers_cuda.library import cuda_library

    specs = [s for s in cuda_library() if s.op_type == "Attention" and s.domain in ("", "onnxep")]
    got = {(s.domain, s.since_version): s for s in specs}
    assert set(got) == {("", 23), ("", 24), ("", 25), ("onnxep", 1)}
    assert all(s.capture_safe for s in specs)
    assert all(s.builder.__module__.endswith("providers_cuda.ops.op_attention") for s in specs)
    assert ("", "Attention") not in CUPY_BLAS_OPS  # no generic CuPy kernel stands behind it


# ----------------------------------------------------------------------------- ONNX node cases


_QUICK_NODE = ("test_attention_3d_gqa", "test_attention_4d_attn_mask_bool_4d",
               "test_attention_4d_gqa_with_past_and_present_fp16",
               "test_attention_4d_causal_nonpad_negative_offset_structural_empty",
               "test_attention_local_window_ext_cache_rank3_head_mask",
               "test_attention_4d_with_qk_matmul")  # fmt: skip


@pytest.mark.parametrize(
    "name",
    [pytest.param(n, marks=() if n in _QUICK_NODE else pytest.mark.slow) for n in gpu.ONNX_CASES],
)
def test_onnx_node_cases(name, provider, cuda_attention, emulator):
    """ONNX's own Attention cases: accepted ones run the kernel and match the recorded
    outputs; the others are declined, naming why, and run on the CPU provider."""
    before = sum(emulator.launches().values())
    gpu.check_node_case(
        gpu.ONNX_CASES[name], provider, lambda: sum(emulator.launches().values()) > before
    )
