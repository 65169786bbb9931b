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

import importlib
import types
import warnings

import cuda_emulator as emu
import numpy as np
import pytest
from cuda_emulation import Emulator, available, nan_empty

import onnxep
from onnxep.errors import InvalidArgument, NotSupported
from onnxep.providers.node import NodeInfo, ValueInfo
from onnxep.providers.ops.op_attention import attention as cpu_attention

_WHY_NOT = available()
pytestmark = [pytest.mark.skipif(bool(_WHY_NOT), reason=f"cannot emulate CUDA: {_WHY_NOT}")]

F32, F16 = np.float32, np.float16


@pytest.fixture(scope="module")
def emulator():
    return Emulator()


@pytest.fixture
def cuda_attention(emulator, monkeypatch):
    """providers_cuda's Attention module wired to the emulator, on an 8-SM device."""
    from onnxep.providers_cuda import nvrtc
    from onnxep.providers_cuda.ops import op_attention

    monkeypatch.setattr(nvrtc, "function", emulator.function)
    monkeypatch.setattr(op_attention, "sm_count", lambda: 8)
    return op_attention


def _xp():
    xp = types.SimpleNamespace(**{k: getattr(np, k) for k in dir(np) if not k.startswith("_")})
    xp.empty = nan_empty  # an element the kernel never writes shows as NaN
    return xp


def _node(attrs, feeds, opset=23, outputs=("y", "present_key", "present_value")):
    ins = tuple(
        None if a is None else ValueInfo(f"i{i}", "tensor", a.dtype, a.shape)
        for i, a in enumerate(feeds)
    )
    outs = tuple(None if o is None else ValueInfo(o, "tensor") for o in outputs)
    return NodeInfo("Attention", "", "attention", opset, attrs, ins, outs)


# name, attrs, opset, dtype, Q shape, K shape, V shape, extras
# extras: ("mask", shape, kind) with kind bool|float32|float16|int64; ("past", length);
# ("nonpad", [lengths])
CASES = [
    ("4d_mha", {}, 23, F32, (2, 3, 4, 8), (2, 3, 6, 8), (2, 3, 6, 8), ()),
    ("4d_gqa_causal_dv", {"is_causal": 1}, 23, F16, (2, 6, 5, 8), (2, 2, 7, 8), (2, 2, 7, 12),
     ()),
    ("3d_gqa_softcap_scale", {"q_num_heads": 6, "kv_num_heads": 2, "softcap": 2.0,
                              "scale": 0.3}, 23, F32, (2, 5, 48), (2, 7, 16), (2, 7, 12), ()),
    ("3d_bool_mask_2d", {"q_num_heads": 4, "kv_num_heads": 4}, 23, F16, (2, 5, 32), (2, 9, 32),
     (2, 9, 32), (("mask", (5, 9), "bool"),)),
    ("float_mask_4d_heads", {}, 23, F32, (2, 4, 3, 8), (2, 2, 6, 8), (2, 2, 6, 8),
     (("mask", (2, 4, 3, 6), "float32"),)),
    ("half_mask_rank3", {"is_causal": 1}, 23, F16, (2, 3, 4, 16), (2, 3, 4, 16),
     (2, 3, 4, 16), (("mask", (3, 4, 4), "float16"),)),
    ("int_mask_rank1_short", {}, 23, F32, (1, 2, 3, 8), (1, 2, 7, 8), (1, 2, 7, 8),
     (("mask", (5,), "int64"),)),
    ("past_causal_mask", {"is_causal": 1}, 23, F32, (2, 4, 3, 8), (2, 2, 3, 8), (2, 2, 3, 8),
     (("mask", (2, 1, 3, 8), "float32"), ("past", 5))),
    ("3d_past_dv_fp16", {"q_num_heads": 2, "kv_num_heads": 1}, 23, F16, (2, 3, 32),
     (2, 3, 16), (2, 3, 8), (("past", 4),)),
    ("nonpad_decode_causal", {"is_causal": 1}, 24, F32, (3, 4, 1, 8), (3, 2, 9, 8),
     (3, 2, 9, 8), (("nonpad", [9, 3, 0]),)),
    ("nonpad_negative_offset", {"is_causal": 1}, 24, F16, (1, 2, 5, 8), (1, 2, 6, 8),
     (1, 2, 6, 8), (("nonpad", [3]),)),
    ("window_left_multi_tile", {"is_causal": 1, "left_window_size": 5}, 25, F32,
     (1, 2, 40, 8), (1, 2, 40, 8), (1, 2, 40, 8), ()),
    ("window_both_fp16", {"left_window_size": 2, "right_window_size": 1}, 25, F16,
     (2, 2, 9, 16), (2, 1, 9, 16), (2, 1, 9, 16), ()),
    ("long_keys_bool_causal", {"is_causal": 1}, 23, F32, (1, 2, 33, 16), (1, 2, 70, 16),
     (1, 2, 70, 16), (("mask", (1, 1, 33, 70), "bool"),)),
    ("head_size_256", {}, 23, F16, (1, 1, 3, 256), (1, 1, 5, 256), (1, 1, 5, 200), ()),
    ("fully_masked_rows", {}, 23, F32, (1, 2, 2, 8), (1, 2, 3, 8), (1, 2, 3, 8),
     (("mask", (2, 3), "none_in_row_0"),)),
]  # fmt: skip
#: The default run: every path once in both dtypes (the rest under -m slow).
QUICK = {"4d_gqa_causal_dv", "3d_gqa_softcap_scale", "3d_bool_mask_2d", "past_causal_mask",
         "nonpad_decode_causal", "window_both_fp16", "fully_masked_rows"}  # fmt: skip


def _feeds(case, rng):
    _, _, _, dt, qs, ks, vs, extras = case
    r = lambda shape: rng.standard_normal(shape).astype(dt)  # noqa: E731
    q, k, v = r(qs), r(ks), r(vs)
    mask = past_k = past_v = nonpad = None
    for extra in extras:
        if extra[0] == "mask":
            shape, kind = extra[1], extra[2]
            if kind == "bool":
                mask = rng.random(shape) > 0.3
            elif kind == "none_in_row_0":
                mask = np.ones(shape, bool)
                mask[0] = False
            elif kind == "int64":
                mask = rng.integers(-3, 1, size=shape)
            else:
                mask = np.where(rng.random(shape) > 0.2, rng.standard_normal(shape), -np.inf)
                mask = mask.astype(kind)
        elif extra[0] == "past":
            hkv = ks[1] if len(ks) == 4 else 1
            d = ks[-1] // (1 if len(ks) == 4 else hkv)
            dv = vs[-1] // (1 if len(vs) == 4 else hkv)
            past_k, past_v = r((ks[0], hkv, extra[1], d)), r((vs[0], hkv, extra[1], dv))
        elif extra[0] == "nonpad":
            nonpad = np.array(extra[1], np.int64)
    feeds = [q, k, v, mask, past_k, past_v, nonpad]
    while feeds[-1] is None:
        feeds.pop()
    return feeds


@pytest.mark.parametrize(
    "case",
    [pytest.param(c, id=c[0], marks=() if c[0] in QUICK else pytest.mark.slow) for c in CASES],
)
def test_kernel_matches_the_cpu_kernel(case, cuda_attention, emulator):
    name, attrs, opset, dt = case[:4]
    feeds = _feeds(case, np.random.default_rng(0))
    node = _node(attrs, feeds, opset)
    with np.errstate(all="ignore"):
        want = cpu_attention(node, np)(*feeds)
    before = emulator.launches()
    got = cuda_attention.attention(node, _xp())(*feeds)
    ran = {k: n - before.get(k, 0) for k, n in emulator.launches().items()}
    has_past = len(feeds) > 4 and feeds[4] is not None
    assert ran.get(f"att_prefill<{'float' if dt == F32 else '__half'}>") == 1, ran
    assert sum(n for k, n in ran.items() if "att_concat" in k) == (2 if has_past else 0), ran
    atol, rtol = (2.5e-3, 1e-3) if dt == F16 else (2e-5, 1e-4)
    for g, w, what in zip(got[:3], want[:3], ("Y", "present_key", "present_value"), strict=True):
        assert g.shape == w.shape and g.dtype == w.dtype, (what, g.shape, w.shape)
        np.testing.assert_allclose(g.astype(np.float64), w, atol=atol, rtol=rtol, err_msg=what)
    if name == "fully_masked_rows":
        assert not got[0][0, :, 0].any()  # no key: zeros, not NaN


def test_a_signature_is_planned_once_and_reused(cuda_attention, emulator):
    rng = np.random.default_rng(1)
    feeds = [rng.standard_normal(s).astype(F32) for s in ((1, 2, 3, 8), (1, 2, 4, 8), (1, 2, 4, 8))]
    run = cuda_attention.attention(_node({"is_causal": 1}, feeds), _xp())
    first = run(*feeds)[0]
    again = run(*[f * 2 for f in feeds])[0]
    want = cpu_attention(_node({"is_causal": 1}, feeds), np)(*[f * 2 for f in feeds])[0]
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
        cuda_attention.attention(_node(attrs, feeds, outputs=outputs), _xp())


_ERRORS = [
    ({"q_num_heads": 2}, ((1, 3, 16), (1, 3, 16), (1, 3, 16)), None, "kv_num_heads"),
    ({}, ((1, 3, 4, 8), (1, 2, 5, 8), (1, 2, 5, 8)), None, "not a multiple"),
    ({}, ((1, 2, 4, 8), (1, 2, 5, 8), (1, 2, 5, 8)), (3, 5), "does not broadcast"),
    ({}, ((1, 2, 4, 8), (1, 2, 5, 8), (1, 2, 5, 8)), (4, 6), "does not broadcast"),
]


@pytest.mark.parametrize("attrs,shapes,mask,reason", _ERRORS, ids=[e[3] for e in _ERRORS])
def test_bad_shapes_raise_a_clear_error(attrs, shapes, mask, reason, cuda_attention):
    feeds = [np.zeros(s, F32) for s in shapes] + ([np.ones(mask, bool)] if mask else [])
    run = cuda_attention.attention(_node(attrs, feeds), _xp())
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


def _onnx_node_cases() -> dict:
    from onnx.backend.test.case import node

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        importlib.import_module("onnx.backend.test.case.node.attention")
    return {
        c.name: c
        for c in node._NodeTestCases
        if c.name.startswith("test_attention") and not c.name.endswith("_expanded")
    }


ONNX_CASES = _onnx_node_cases()
#: Cases the kernel declines and why (the rest must run on it).
DECLINED = {
    "qk_matmul": "qk_matmul_output",
    "bf16": "bfloat16",
    "fullymasked_qk_matmul_output": "qk_matmul_output",
    "softmax_precision": "qk_matmul_output",
    "gqa_rank4_mask": "qk_matmul_output",
}
_QUICK_NODE = ("test_attention_3d_gqa", "test_attention_4d_attn_mask_bool_4d",
               "test_attention_4d_gqa_with_past_and_present_fp16",
               "test_attention_4d_causal_nonpad_negative_offset_structural_empty",
               "test_attention_local_window_ext_cache_rank3_head_mask",
               "test_attention_4d_with_qk_matmul")  # fmt: skip


def _declined_reason(name: str) -> str | None:
    return next((why for key, why in DECLINED.items() if key in name), None)


@pytest.fixture(scope="module")
def provider():
    with emu.registered() as name:
        yield name


@pytest.mark.parametrize(
    "name",
    [pytest.param(n, marks=() if n in _QUICK_NODE else pytest.mark.slow) for n in ONNX_CASES],
)
def test_onnx_node_cases(name, provider, cuda_attention, emulator):
    """ONNX's own Attention cases: accepted ones run the kernel and match the recorded
    outputs; the others are declined, naming why, and run on the CPU provider."""
    from onnxep.conformance import _case_data, _case_model
    from onnxep.testing import compare_output

    case = ONNX_CASES[name]
    model = _case_model(case)
    ins, outs = _case_data(case)[0]
    sess = onnxep.InferenceSession(model, providers=[provider, "cpu"])
    placed = [p for p in sess.placement() if p.op_type == "Attention" and p.role == "compute"]
    assert len(placed) == 1
    why = _declined_reason(name)
    if why is not None:
        assert placed[0].provider == "cpu" and why in str(placed[0].declined), placed[0]
        return
    assert placed[0].provider == provider, placed[0].declined
    before = sum(emulator.launches().values())
    with np.errstate(all="ignore"):
        got = sess.run(None, dict(zip([i.name for i in model.graph.input], ins, strict=True)))
    assert sum(emulator.launches().values()) > before
    bad = []
    for arg, g, w in zip(sess.get_outputs(), got, outs, strict=True):
        bad += [r.describe() for r in compare_output(arg.name, g, w, provider, "onnx") if not r.ok]
    assert not bad, "\n".join(bad)
