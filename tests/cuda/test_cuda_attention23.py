"""ONNX Attention's CUDA kernel (providers_cuda/ops/op_attention.py) against the CPU provider.

The builder tests call the kernel with ``xp=cupy`` on each feature case and
compare every output with the CPU kernel; the node-case tests run ONNX's own
``test_attention_*`` cases through a ``["cuda", "cpu"]`` session: the cases
the kernel accepts must be placed on CUDA and match the recorded outputs, the
others must be declined with their reason. The capture test records a call
in a CUDA graph (which fails on any synchronization, device-to-host read or
CuPy cuBLAS call) and replays it after new ``nonpad_kv_seqlen`` values are
written into the same buffer. The cases are shared with
tests/test_attention23_cuda_emulated.py, which runs the same CUDA C on the
CPU emulator.
"""

from __future__ import annotations

import importlib
import warnings

import numpy as np
import pytest

import onnxep
from onnxep.providers.node import NodeInfo, ValueInfo
from onnxep.providers.ops.op_attention import attention as cpu_attention
from onnxep.testing import compare_output

F32, F16 = np.float32, np.float16
#: (atol, rtol): float32 attention may differ by exp ordering, hence 2e-5.
TOL = {F32: (2e-5, 1e-4), F16: (2.5e-3, 1e-3)}


def node_info(attrs, feeds, opset=23, outputs=("y", "present_key", "present_value")):
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
    ("split_keys_decode_mask", {"is_causal": 1}, 24, F32, (2, 4, 1, 16), (2, 2, 300, 16),
     (2, 2, 300, 8), (("mask", (2, 1, 1, 300), "bool"), ("nonpad", [300, 140]))),
    ("split_keys_past_fp16", {"is_causal": 1, "q_num_heads": 2, "kv_num_heads": 1}, 23, F16,
     (1, 2, 16), (1, 2, 8), (1, 2, 8), (("past", 290),)),
    ("fully_masked_rows", {}, 23, F32, (1, 2, 2, 8), (1, 2, 3, 8), (1, 2, 3, 8),
     (("mask", (2, 3), "none_in_row_0"),)),
]  # fmt: skip


def case_feeds(case, rng):
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


def check_against_cpu(case, feeds, got) -> None:
    """The kernel's outputs (host arrays) against the CPU kernel's, for one case."""
    name, attrs, opset, dt = case[:4]
    with np.errstate(all="ignore"):
        want = cpu_attention(node_info(attrs, feeds, opset), np)(*feeds)
    atol, rtol = TOL[dt]
    for g, w, what in zip(got[:3], want[:3], ("Y", "present_key", "present_value"), strict=True):
        assert g.shape == w.shape and g.dtype == w.dtype, (name, what, g.shape, w.shape)
        np.testing.assert_allclose(
            g.astype(np.float64), w, atol=atol, rtol=rtol, err_msg=f"{name} {what}"
        )
    if name == "fully_masked_rows":
        assert not got[0][0, :, 0].any()  # no key: zeros, not NaN


def onnx_node_cases() -> dict:
    """ONNX's Attention node cases, generated by importing only their case module."""
    from onnx.backend.test.case import node

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        importlib.import_module("onnx.backend.test.case.node.attention")
    return {
        c.name: c
        for c in node._NodeTestCases  # noqa: SLF001 - onnx collects them there; its public collector imports every op
        if c.name.startswith("test_attention") and not c.name.endswith("_expanded")
    }


#: Node cases the CUDA provider declines, by a part of their name, and the reason it gives.
DECLINED = {
    "qk_matmul": "qk_matmul_output",
    "bf16": "bfloat16",
    "softmax_precision": "qk_matmul_output",
    "gqa_rank4_mask": "qk_matmul_output",
}


def declined_reason(name: str) -> str | None:
    return next((why for key, why in DECLINED.items() if key in name), None)


def check_node_case(case, provider: str, ran) -> None:
    """Run one node case on ``[provider, "cpu"]``; ``ran()`` says whether the kernel launched."""
    from onnxep.tools.conformance import case_data, case_model

    model = case_model(case)
    ins, outs = case_data(case)[0]
    sess = onnxep.InferenceSession(model, providers=[provider, "cpu"])
    placed = [p for p in sess.placement() if p.op_type == "Attention" and p.role == "compute"]
    assert len(placed) == 1
    why = declined_reason(case.name)
    if why is not None:
        assert placed[0].provider == "cpu" and why in str(placed[0].declined), placed[0]
        return
    assert placed[0].provider == provider, placed[0].declined
    with np.errstate(all="ignore"):
        got = sess.run(None, dict(zip([i.name for i in model.graph.input], ins, strict=True)))
    assert ran()
    bad = []
    for arg, g, w in zip(sess.get_outputs(), got, outs, strict=True):
        bad += [r.describe() for r in compare_output(arg.name, g, w, provider, "onnx") if not r.ok]
    assert not bad, "\n".join(bad)


ONNX_CASES = onnx_node_cases()


# ----------------------------------------------------------------------------- on the GPU


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_builder_matches_cpu_kernel(case):
    import cupy

    from onnxep.providers_cuda.ops.op_attention import attention

    feeds = case_feeds(case, np.random.default_rng(0))
    node = node_info(case[1], feeds, case[2])
    got = attention(node, cupy)(*[None if f is None else cupy.asarray(f) for f in feeds])
    check_against_cpu(case, feeds, [cupy.asnumpy(g) for g in got[:3]])


@pytest.mark.parametrize("name", sorted(ONNX_CASES))
def test_onnx_node_cases(name):
    check_node_case(ONNX_CASES[name], "cuda", lambda: True)


def test_call_captures_and_replays_with_new_lengths():
    """Nothing on the run path synchronizes or calls CuPy's cuBLAS: a CUDA graph records a
    call with past caches and nonpad_kv_seqlen, and replays it after new lengths are written."""
    import cupy

    from onnxep.providers_cuda.ops.op_attention import attention

    rng = np.random.default_rng(3)
    b, hq, hkv, sq, past, new, d = 2, 8, 2, 3, 600, 3, 64  # long: the keys split
    feeds = [
        rng.standard_normal(s).astype(F16)
        for s in ((b, hq, sq, d), (b, hkv, new, d), (b, hkv, new, d))
    ]
    feeds += [rng.random((b, 1, sq, past + new)) > 0.2]
    feeds += [rng.standard_normal((b, hkv, past, d)).astype(F16) for _ in range(2)]
    feeds += [np.array([past + new, 20], np.int64)]
    node = node_info({"is_causal": 1}, feeds, 24)
    args = [cupy.asarray(f) for f in feeds]
    pool = cupy.cuda.MemoryPool()
    stream = cupy.cuda.Stream(non_blocking=True)
    with cupy.cuda.using_allocator(pool.malloc), stream:
        run = attention(node, cupy)
        run(*args)  # warm-up: the call is planned, pool blocks cached
        stream.synchronize()
        stream.begin_capture()
        outs = run(*args)
        graph = stream.end_capture()
    for lens in ([past + new, 20], [7, past + new - 1]):
        feeds[6] = np.array(lens, np.int64)
        args[6].set(feeds[6], stream=stream)
        graph.launch(stream)
        stream.synchronize()
        case = ("captured", {"is_causal": 1}, 24, F16)
        check_against_cpu(case, feeds, [cupy.asnumpy(o) for o in outs[:3]])
