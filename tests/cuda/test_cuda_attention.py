"""The CUDA attention kernels (GroupQueryAttention, RotaryEmbedding) against the CPU provider.

Session tests build one-node models and compare ``providers=["cuda"]`` with
``disable_fallback=True`` (so the node provably ran on the GPU) against
``providers=["cpu"]``. Builder tests call the kernel builders directly with
``xp=cupy`` and ``xp=numpy``; the capture test records a step in a CUDA graph
(which fails on any synchronization or device-to-host read) and replays it
with new ``seqlens_k`` values written into the same device buffer.

The CUDA kernels mirror the CPU kernel's semantics for every row, padded query
rows and cache rows included, so whole outputs are compared.
"""

from __future__ import annotations

import numpy as np
import pytest
from onnx import helper

import onnxep
from onnxep.providers.node import NodeInfo, ValueInfo
from onnxep.providers.ops.op_group_query_attention import group_query_attention as cpu_gqa
from onnxep.testing import compare_output

F32, F16 = np.float32, np.float16
#: (atol, rtol): float32 attention may differ by exp ordering, hence 2e-5.
TOL = {F32: (2e-5, 1e-4), F16: (2.5e-3, 1e-3)}
ROPE_TOL = {F32: (1e-5, 1e-4), F16: (2.5e-3, 1e-3)}

GQA_ORDER = [
    "query", "key", "value", "past_key", "past_value", "seqlens_k", "total_sequence_length",
    "cos_cache", "sin_cache", "position_ids", "attention_bias", "head_sink",
    "k_scale", "v_scale", "q_norm_weight", "k_norm_weight", "query_seqlens",
]  # fmt: skip


def contrib_model(op, names, outputs, attrs, feeds, domain="com.microsoft", opset=21):
    node = helper.make_node(op, names, outputs, domain=domain, **attrs)
    ins = [
        helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(feeds[n].dtype), None)
        for n in names
        if n
    ]
    ft = helper.np_dtype_to_tensor_dtype(feeds[names[0]].dtype)
    outs = [helper.make_tensor_value_info(n, ft, None) for n in outputs]
    graph = helper.make_graph([node], op, ins, outs)
    imports = [helper.make_opsetid("", opset), helper.make_opsetid("com.microsoft", 1)]
    m = helper.make_model(graph, opset_imports=imports)
    m.ir_version = 10
    return m


def run_both(model, feeds):
    names = [i.name for i in model.graph.input]
    f = {n: feeds[n] for n in names}
    opts = onnxep.SessionOptions(disable_fallback=True)
    got = onnxep.InferenceSession(model, providers=["cuda"], sess_options=opts).run(None, f)
    want = onnxep.InferenceSession(model, providers=["cpu"]).run(None, f)
    return got, want


def assert_close(got, want, dtype, what, tol=TOL):
    atol, rtol = tol[np.dtype(dtype).type]
    res = compare_output(what, np.asarray(got), np.asarray(want), "cuda", "cpu", rtol, atol)
    bad = [r.describe() for r in res if not r.ok]
    assert not bad, "\n".join(bad)


def rope_cache(max_len, rot, dt):
    inv = 1.0 / (10000 ** (np.arange(0, rot, 2) / rot))
    ang = np.arange(max_len)[:, None] * inv[None, :]
    return np.cos(ang).astype(dt), np.sin(ang).astype(dt)


# ----------------------------------------------------------------------------- GroupQueryAttention


def gqa_feeds(rng, b, s, nh, nkv, hd, past_lens, cap, attrs, extras, dt):
    """Feeds in the CPU tests' conventions: a first prompt is right-padded (row 0 full);
    otherwise every row appends ``s`` tokens to its own past length."""
    r = rng.standard_normal
    first = all(p == 0 for p in past_lens) and cap is None
    if "query_seqlens" in extras:
        qlens = np.array([int(rng.integers(1, s + 1)) for _ in range(b)], np.int32)
        tot = np.array([p + q for p, q in zip(past_lens, qlens, strict=True)], np.int32)
    elif first:
        qlens = np.array([s] + [int(rng.integers(1, s + 1)) for _ in range(b - 1)], np.int32)
        tot = qlens.copy()
    else:
        qlens = np.full(b, s, np.int32)
        tot = np.array([p + s for p in past_lens], np.int32)
    total = cap if "query_seqlens" in extras else int(tot.max())
    past_len = cap if cap is not None else (0 if first else max(past_lens))
    f = {}
    if "packed" in extras:
        f["query"] = r((b, s, (nh + 2 * nkv) * hd)).astype(dt)
    else:
        f["query"] = r((b, s, nh * hd)).astype(dt)
        f["key"] = r((b, s, nkv * hd)).astype(dt)
        f["value"] = r((b, s, nkv * hd)).astype(dt)
    if "nopast" not in extras:
        f["past_key"] = r((b, nkv, past_len, hd)).astype(dt)
        f["past_value"] = r((b, nkv, past_len, hd)).astype(dt)
    f["seqlens_k"] = (tot - 1).astype(np.int32)
    f["total_sequence_length"] = np.array(total, np.int32)
    if attrs.get("do_rotary"):
        # rot_off_chunk: a rotary split that is not whole 16-byte chunks (the scalar staging)
        rot = hd // 2 if "half_rot" in extras else hd - 24 if "rot_off_chunk" in extras else hd
        f["cos_cache"], f["sin_cache"] = rope_cache(max(64, total + s + 4), rot, dt)
    if "position_ids" in extras:
        f["position_ids"] = (tot[:, None] - s + np.arange(s)[None, :] + 2).astype(np.int64)
    if "attention_bias" in extras:
        f["attention_bias"] = r((b, 1, s, total)).astype(dt)
    if "head_sink" in extras:
        f["head_sink"] = r((nh,)).astype(dt)
    if "query_seqlens" in extras:
        f["query_seqlens"] = qlens
    names = [n if n in f else "" for n in GQA_ORDER]
    while not names[-1]:
        names.pop()
    return f, names


GQA_CASES = [
    # name, b, s, nh, nkv, hd, past lens, capacity (shared buffer), attrs, extras
    ("prefill", 2, 37, 4, 2, 16, [0, 0], None, {}, ()),
    ("prefill_short", 2, 3, 4, 2, 16, [0, 0], None, {}, ()),
    ("prefill_no_past", 2, 20, 4, 2, 8, [0, 0], None, {}, ("nopast",)),
    ("prefill_packed", 2, 21, 4, 2, 16, [0, 0], None, {}, ("packed",)),
    ("prefill_shared", 2, 33, 6, 2, 64, [0, 0], 96, {}, ()),
    ("chunk_shared", 2, 9, 4, 2, 8, [5, 2], 24, {}, ()),
    ("decode", 3, 1, 6, 2, 8, [4, 7, 2], None, {}, ()),
    ("decode_shared", 2, 1, 4, 4, 8, [3, 9], 16, {}, ()),
    ("decode_packed", 2, 1, 4, 2, 8, [3, 6], None, {}, ("packed",)),
    ("decode_packed_shared", 2, 1, 14, 2, 64, [30, 5], 64, {}, ("packed",)),
    ("rotary_decode_shared", 2, 1, 4, 2, 16, [3, 5], 10, {"do_rotary": 1}, ()),
    ("rotary_partial", 2, 1, 4, 2, 16, [3, 5], 10, {"do_rotary": 1}, ("half_rot",)),
    (
        "rotary_il_prefill",
        2,
        19,
        4,
        2,
        16,
        [0, 0],
        None,
        {"do_rotary": 1, "rotary_interleaved": 1},
        ("packed",),
    ),
    ("rotary_il_decode", 2, 1, 4, 2, 16, [7, 2], 12, {"do_rotary": 1, "rotary_interleaved": 1}, ()),
    ("pos_ids_decode", 2, 1, 4, 2, 16, [4, 6], 12, {"do_rotary": 1}, ("position_ids",)),
    ("pos_ids_prompt", 2, 14, 4, 2, 16, [0, 0], None, {"do_rotary": 1}, ("position_ids",)),
    ("window_prefill", 2, 23, 4, 2, 8, [0, 0], None, {"local_window_size": 5}, ()),
    ("window_decode", 2, 1, 4, 2, 8, [6, 9], 12, {"local_window_size": 4}, ()),
    ("softcap_scale", 2, 13, 4, 2, 8, [0, 0], None, {"softcap": 2.0, "scale": 0.3}, ()),
    ("smooth_decode", 2, 1, 4, 2, 8, [4, 2], None, {"smooth_softmax": 1}, ()),
    ("head_sink_prefill", 2, 13, 4, 2, 8, [0, 0], None, {}, ("head_sink",)),
    ("head_sink_decode", 2, 1, 4, 1, 8, [5, 2], None, {"local_window_size": 3}, ("head_sink",)),
    ("bias_prefill", 2, 14, 4, 2, 8, [0, 0], None, {}, ("attention_bias",)),
    ("bias_decode", 2, 1, 4, 2, 8, [3, 6], 10, {}, ("attention_bias",)),
    ("bidirectional", 2, 14, 4, 2, 8, [0, 0], None, {"causal": 0}, ()),
    ("query_seqlens", 2, 11, 4, 2, 8, [3, 5], 24, {}, ("query_seqlens",)),
    ("head_size_128", 1, 1, 4, 2, 128, [70], 80, {}, ()),
    ("head_size_256", 1, 9, 2, 1, 256, [0], None, {}, ()),
    ("mqa_32_heads", 1, 1, 32, 1, 8, [50], 64, {}, ()),
]


@pytest.mark.parametrize("dt", [F32, F16], ids=["fp32", "fp16"])
@pytest.mark.parametrize("case", GQA_CASES, ids=[c[0] for c in GQA_CASES])
def test_group_query_attention(case, dt):
    name, b, s, nh, nkv, hd, past_lens, cap, attrs, extras = case
    rng = np.random.default_rng(0)
    f, names = gqa_feeds(rng, b, s, nh, nkv, hd, past_lens, cap, attrs, extras, dt)
    outs = ["output", "present_key", "present_value"]
    attrs = {"num_heads": nh, "kv_num_heads": nkv, **attrs}
    got, want = run_both(contrib_model("GroupQueryAttention", names, outs, attrs, f), f)
    for g, w, o in zip(got, want, outs, strict=True):
        assert g.shape == w.shape, f"{name} {o}: shape {g.shape} != {w.shape}"
        assert_close(g, w, dt, f"{name} {o}")


@pytest.mark.parametrize("dt", [F32, F16], ids=["fp32", "fp16"])
@pytest.mark.parametrize("lens", [[2047], [2047, 900]], ids=["b1", "b2_ragged"])
def test_group_query_attention_long_context_split_k(lens, dt):
    """A single token over 2048 cached rows (Qwen2.5-0.5B heads) takes the split-K path."""
    from onnxep.providers_cuda.ops.attention_cuda import sm_count
    from onnxep.providers_cuda.ops.gqa_geometry import plan_decode

    b, nh, nkv, hd, cap = len(lens), 14, 2, 64, 2048
    geo = plan_decode(b, nh, nkv, hd, cap, sm_count())  # total_sequence_length == cap here
    assert geo.nsplit > 1, f"expected the split-K path, got {geo}"
    rng = np.random.default_rng(1)
    f, names = gqa_feeds(rng, b, 1, nh, nkv, hd, [n - 1 for n in lens], cap, {}, (), dt)
    outs = ["output", "present_key", "present_value"]
    model = contrib_model(
        "GroupQueryAttention", names, outs, {"num_heads": nh, "kv_num_heads": nkv}, f
    )
    got, want = run_both(model, f)
    for g, w, o in zip(got, want, outs, strict=True):
        assert_close(g, w, dt, f"long context {o}")


def gqa_node(f, names, attrs):
    ins = tuple(ValueInfo(n, "tensor", f[n].dtype, tuple(f[n].shape)) if n else None for n in names)
    outs = tuple(ValueInfo(n, "tensor") for n in ("output", "present_key", "present_value"))
    return NodeInfo("GroupQueryAttention", "com.microsoft", "gqa", 1, attrs, ins, outs)


def device_args(cupy, f, names):
    # total_sequence_length is a host input: it stays a NumPy array
    return [
        None if not n else f[n] if n == "total_sequence_length" else cupy.asarray(f[n])
        for n in names
    ]


BUILDER_CASES = [
    ("decode_shared", 2, 1, 14, 2, 64, [1500, 37], 2048, {"do_rotary": 1}, (), True),
    ("decode_growing", 2, 1, 4, 2, 16, [9, 4], None, {}, (), False),
    ("prefill_shared", 2, 40, 4, 2, 32, [0, 0], 64, {"do_rotary": 1}, ("packed",), True),
    ("prefill_growing", 2, 40, 4, 2, 32, [0, 0], None, {"local_window_size": 7}, (), False),
]


@pytest.mark.parametrize("dt", [F32, F16], ids=["fp32", "fp16"])
@pytest.mark.parametrize("case", BUILDER_CASES, ids=[c[0] for c in BUILDER_CASES])
def test_gqa_builder_matches_cpu_kernel(case, dt):
    """The builders called directly; a shared buffer is written in place and returned."""
    import cupy

    from onnxep.providers_cuda.ops.op_group_query_attention import group_query_attention

    name, b, s, nh, nkv, hd, past_lens, cap, attrs, extras, shared = case
    rng = np.random.default_rng(2)
    f, names = gqa_feeds(rng, b, s, nh, nkv, hd, past_lens, cap, attrs, extras, dt)
    attrs = {"num_heads": nh, "kv_num_heads": nkv, **attrs}
    node = gqa_node(f, names, attrs)
    want = cpu_gqa(node, np)(*[f[n] if n else None for n in names])
    args = device_args(cupy, f, names)
    got = group_query_attention(node, cupy)(*args)
    assert len(got) == 3
    past_k = args[names.index("past_key")]
    assert (got[1] is past_k) == shared, f"{name}: present_key shares the past buffer: {shared}"
    for i, o in enumerate(("output", "present_key", "present_value")):
        assert_close(cupy.asnumpy(got[i]), want[i], dt, f"{name} {o}")


@pytest.mark.parametrize("s", [1, 12], ids=["decode", "prefill"])
def test_gqa_step_captures_and_replays_with_new_lengths(s):
    """No step reads device memory on the host: a CUDA graph records it, and replaying the
    graph after writing new seqlens_k into the same buffer gives the new answer."""
    import cupy

    from onnxep.providers_cuda.ops.op_group_query_attention import group_query_attention

    b, nh, nkv, hd, cap = 2, 14, 2, 64, 2048
    rng = np.random.default_rng(3)
    attrs = {"num_heads": nh, "kv_num_heads": nkv, "do_rotary": 1}
    f, names = gqa_feeds(rng, b, s, nh, nkv, hd, [1200, 700], cap, attrs, (), F16)
    # the capacity bound, as onnxruntime-genai feeds it when it captures a graph, and a
    # rotary cache covering it (the replays below reach position 1990)
    f["total_sequence_length"] = np.array(cap, np.int32)
    f["cos_cache"], f["sin_cache"] = rope_cache(cap + s, hd, F16)
    node = gqa_node(f, names, attrs)
    args = device_args(cupy, f, names)
    i_past, i_lens = names.index("past_key"), names.index("seqlens_k")
    pool = cupy.cuda.MemoryPool()  # the graph's temporaries stay out of other allocations
    stream = cupy.cuda.Stream(non_blocking=True)
    with cupy.cuda.using_allocator(pool.malloc), stream:
        run = group_query_attention(node, cupy)
        run(*args)  # warm-up: modules loaded, pool blocks cached
        stream.synchronize()
        stream.begin_capture()
        outs = run(*args)
        graph = stream.end_capture()
    for lens in ([1200, 700], [1990, 3]):
        new = np.array(lens, np.int32) + s - 1
        args[i_lens].set(new, stream=stream)
        stream.synchronize()  # the snapshot below reads on another stream
        host = [a if a is None or isinstance(a, np.ndarray) else cupy.asnumpy(a) for a in args]
        want = cpu_gqa(node, np)(*host)  # from the cache as the replay will find it
        graph.launch(stream)
        stream.synchronize()
        assert outs[1] is args[i_past]
        for i, o in enumerate(("output", "present_key", "present_value")):
            assert_close(cupy.asnumpy(outs[i]), want[i], F16, f"replay {lens} {o}")


# ----------------------------------------------------------------------------- RotaryEmbedding


def _rope_feeds(rng, rank, b, s, nh, hd, rot, pos_kind, dt, max_len=24):
    shape = (b, s, nh * hd) if rank == 3 else (b, nh, s, hd)
    f = {"input": rng.standard_normal(shape).astype(dt)}
    f["cos_cache"], f["sin_cache"] = rope_cache(max_len, rot or hd, dt)
    if pos_kind == "1d":
        f["position_ids"] = np.array([int(rng.integers(0, max_len - s))], np.int64)
    elif pos_kind == "2d":
        f["position_ids"] = rng.integers(0, max_len, size=(b, s)).astype(np.int64)
    else:
        f["position_ids"] = rng.integers(0, max_len, size=(3, b, s)).astype(np.int64)
    return f


ROPE_CASES = [
    # name, op, rank, b, s, nh, hd, rot, interleaved, pos kind, extra attrs
    ("3d_2dpos", "RotaryEmbedding", 3, 2, 5, 3, 16, 0, 0, "2d", {}),
    ("3d_1dpos", "RotaryEmbedding", 3, 2, 4, 2, 8, 0, 1, "1d", {}),
    ("4d_2dpos", "RotaryEmbedding", 4, 2, 3, 4, 8, 0, 0, "2d", {}),
    ("4d_interleaved", "RotaryEmbedding", 4, 1, 6, 2, 16, 0, 1, "2d", {}),
    ("3d_partial", "RotaryEmbedding", 3, 2, 5, 2, 16, 8, 0, "2d", {"num_heads": 2}),
    ("3d_partial_il", "RotaryEmbedding", 3, 2, 5, 2, 16, 8, 1, "1d", {"num_heads": 2}),
    ("3d_mrope_default", "RotaryEmbedding", 3, 2, 4, 2, 64, 0, 0, "3d", {"num_heads": 2}),
    (
        "mrope_sections",
        "MRotaryEmbedding",
        3,
        2,
        5,
        2,
        16,
        0,
        0,
        "3d",
        {"mrope_section": [2, 3, 3], "mrope_layout": 0, "num_heads": 2},
    ),
    (
        "mrope_interleaved",
        "MRotaryEmbedding",
        3,
        2,
        5,
        2,
        24,
        0,
        0,
        "3d",
        {"mrope_section": [4, 4, 4], "mrope_layout": 1, "num_heads": 2},
    ),
    (
        "mrope_partial_4d",
        "MRotaryEmbedding",
        4,
        1,
        6,
        2,
        32,
        16,
        0,
        "3d",
        {"mrope_section": [3, 3, 2], "mrope_layout": 1},
    ),
    (
        "mrope_scaled",
        "MRotaryEmbedding",
        3,
        2,
        3,
        2,
        16,
        0,
        0,
        "3d",
        {"mrope_section": [4, 2, 2], "mrope_layout": 1, "num_heads": 2, "scale": 0.7},
    ),
]


@pytest.mark.parametrize("dt", [F32, F16], ids=["fp32", "fp16"])
@pytest.mark.parametrize("case", ROPE_CASES, ids=[c[0] for c in ROPE_CASES])
def test_rotary_embedding_contrib(case, dt):
    name, op, rank, b, s, nh, hd, rot, il, pos_kind, extra = case
    rng = np.random.default_rng(4)
    f = _rope_feeds(rng, rank, b, s, nh, hd, rot, pos_kind, dt)
    attrs = {"interleaved": il, **extra}
    if rot:
        attrs["rotary_embedding_dim"] = rot
    names = ["input", "position_ids", "cos_cache", "sin_cache"]
    got, want = run_both(contrib_model(op, names, ["output"], attrs, f), f)
    assert_close(got[0], want[0], dt, name, ROPE_TOL)


ONNX_ROPE_CASES = [
    # rank, interleaved, rotary_embedding_dim, position ids given, batch-1 ids/caches
    (3, 0, 0, True, False),
    (3, 1, 0, True, False),
    (4, 0, 0, True, False),
    (4, 1, 8, True, False),
    (3, 0, 8, False, False),
    (4, 1, 0, False, False),
    (4, 0, 0, False, True),
]


@pytest.mark.parametrize("dt", [F32, F16], ids=["fp32", "fp16"])
@pytest.mark.parametrize("case", ONNX_ROPE_CASES, ids=lambda c: "-".join(map(str, c)))
def test_rotary_embedding_onnx23(case, dt):
    rank, il, rot, with_pos, bcast = case
    rng = np.random.default_rng(5)
    b, s, nh, hd = 2, 5, 3, 16
    shape = (b, s, nh * hd) if rank == 3 else (b, nh, s, hd)
    f = {"X": rng.standard_normal(shape).astype(dt)}
    cos, sin = rope_cache(20, rot or hd, dt)
    if with_pos:
        f["cos"], f["sin"] = cos, sin
        f["pos"] = rng.integers(0, 20, size=(1 if bcast else b, s)).astype(np.int64)
        names = ["X", "cos", "sin", "pos"]
    else:
        idx = rng.integers(0, 20, size=(1 if bcast else b, s))
        f["cos"], f["sin"] = cos[idx], sin[idx]
        names = ["X", "cos", "sin"]
    attrs = {"interleaved": il}
    if rank == 3:
        attrs["num_heads"] = nh
    if rot:
        attrs["rotary_embedding_dim"] = rot
    model = contrib_model("RotaryEmbedding", names, ["Y"], attrs, f, domain="", opset=23)
    got, want = run_both(model, f)
    assert_close(got[0], want[0], dt, f"onnx rope {case}", ROPE_TOL)


def test_rotary_builder_is_capture_safe():
    """The rotary kernel reads position ids on the device: a captured call replays
    correctly after the ids change in place."""
    import cupy

    from onnxep.providers.ops.op_rotary_embedding_contrib import rotary_embedding_contrib as cpu
    from onnxep.providers_cuda.ops.op_rotary_embedding_contrib import (
        rotary_embedding_contrib,
    )

    rng = np.random.default_rng(6)
    f = _rope_feeds(rng, 3, 2, 5, 2, 16, 0, "2d", F32)
    names = ["input", "position_ids", "cos_cache", "sin_cache"]
    ins = tuple(ValueInfo(n, "tensor", f[n].dtype, tuple(f[n].shape)) for n in names)
    node = NodeInfo("RotaryEmbedding", "com.microsoft", "r", 1, {"num_heads": 2}, ins,
                    (ValueInfo("output", "tensor"),))  # fmt: skip
    args = [cupy.asarray(f[n]) for n in names]
    pool = cupy.cuda.MemoryPool()
    stream = cupy.cuda.Stream(non_blocking=True)
    with cupy.cuda.using_allocator(pool.malloc), stream:
        run = rotary_embedding_contrib(node, cupy)
        run(*args)
        stream.synchronize()
        stream.begin_capture()
        (out,) = run(*args)
        graph = stream.end_capture()
    for shift in (0, 3):
        pos = (f["position_ids"] + shift) % 24
        args[1].set(pos, stream=stream)
        graph.launch(stream)
        stream.synchronize()
        want = cpu(node, np)(f["input"], pos, f["cos_cache"], f["sin_cache"])[0]
        assert_close(cupy.asnumpy(out), want, F32, f"captured rope shift {shift}", ROPE_TOL)


def test_rotary_position_outside_the_cache_gives_nan():
    """The CPU kernel raises on such an id; the device cannot raise, so the channels it
    rotates become NaN rather than reading another row."""
    import cupy

    from onnxep.providers_cuda.ops.op_rotary_embedding_contrib import (
        rotary_embedding_contrib,
    )

    rng = np.random.default_rng(7)
    f = _rope_feeds(rng, 3, 2, 5, 2, 16, 0, "2d", F32)
    f["position_ids"][0, 3] = 24  # the cache has 24 rows
    names = ["input", "position_ids", "cos_cache", "sin_cache"]
    ins = tuple(ValueInfo(n, "tensor", f[n].dtype, tuple(f[n].shape)) for n in names)
    node = NodeInfo("RotaryEmbedding", "com.microsoft", "r", 1, {"num_heads": 2}, ins, ())
    (y,) = rotary_embedding_contrib(node, cupy)(*[cupy.asarray(f[n]) for n in names])
    y = cupy.asnumpy(y).reshape(2, 5, 2, 16)
    assert np.isnan(y[0, 3]).all()
    assert np.isfinite(np.delete(y.reshape(10, -1), 3, axis=0)).all()
