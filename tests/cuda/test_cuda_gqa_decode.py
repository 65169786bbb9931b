"""The split-K decode kernels (GroupQueryAttention, ONNX Attention) against the CPU provider.

The route a single-token step takes (tensor cores for fp16 at head sizes 64, 128 and 256 on
compute capability 8.0 and up, the CUDA-core kernel otherwise) is checked per case; the
split and unsplit paths, ragged ``seqlens_k`` in a batch (rows whose keys fill few of the
grid's splits leave the others empty), causal and not, windows, sinks, biases, rotary and
row groups of 8 and 16 heads, against the CPU kernel. The capture test records one step of a
fixed-capacity cache in a CUDA graph and replays it at 16 and at capacity - 1 tokens: one
graph for every length. ONNX Attention (and onnxep::Attention) with a single query row
takes the tensor-core kernel too, with past caches, an external cache (nonpad_kv_seqlen),
masks, windows and softcap. tests/test_gqa_decode_emulated.py runs the same cases on the CPU
emulator (without a GPU).
"""

from __future__ import annotations

import numpy as np
import pytest
from test_cuda_attention import (
    F16,
    F32,
    assert_close,
    device_args,
    gqa_feeds,
    gqa_node,
    rope_cache,
)

from onnxep.providers.ops.op_group_query_attention import group_query_attention as cpu_gqa

att = pytest.importorskip("test_cuda_attention23")

DECODE_CASES = [
    # name, b, nh, nkv, hd, past lens, capacity (None: a fresh cache), attrs, extras
    ("h64_g7_unsplit", 1, 14, 2, 64, [40], 64, {}, ("fp16",)),
    ("h64_g7_split_rotary", 1, 14, 2, 64, [299], 320, {"do_rotary": 1}, ("fp16",)),
    # ragged rows: the short ones use one split of the grid, their others are empty
    ("h64_g7_ragged", 3, 14, 2, 64, [299, 3, 130], 320, {"do_rotary": 1}, ("fp16",)),
    ("h128_g6_split", 1, 12, 2, 128, [200], 256, {"do_rotary": 1}, ("fp16",)),
    ("h128_g6_ragged_packed", 2, 12, 2, 128, [250, 17], 256, {}, ("fp16", "packed")),
    ("h256_g8_split", 1, 8, 1, 256, [150], 192, {"do_rotary": 1}, ("fp16",)),
    ("h256_g2_ragged", 2, 4, 2, 256, [100, 9], 128, {}, ("fp16",)),
    ("h64_g16_rows16", 2, 16, 1, 64, [100, 20], 128, {}, ("fp16",)),
    ("h128_g12_rows16", 1, 12, 1, 128, [90], 128, {"do_rotary": 1}, ("fp16",)),
    ("h64_g32_row_groups", 1, 32, 1, 64, [70], 96, {}, ("fp16",)),
    ("h64_noncausal_window_softcap_sink_bias", 2, 8, 2, 64, [180, 60], 192,
     {"causal": 0, "local_window_size": 50, "softcap": 3.0}, ("fp16", "head_sink",
                                                               "attention_bias")),  # fmt: skip
    ("h64_smooth_pos_ids_interleaved", 2, 4, 2, 64, [90, 33], 128,
     {"do_rotary": 1, "rotary_interleaved": 1, "smooth_softmax": 1},
     ("fp16", "position_ids")),  # fmt: skip
    ("h64_g7_total_is_capacity", 2, 14, 2, 64, [10, 200], 512, {"do_rotary": 1},
     ("fp16", "total_is_capacity")),  # fmt: skip
    ("h128_fresh_cache", 2, 4, 2, 128, [70, 5], None, {}, ("fp16",)),
    ("h64_g7_rotary_off_chunks", 2, 14, 2, 64, [40, 7], 64, {"do_rotary": 1},
     ("fp16", "rot_off_chunk")),  # fmt: skip
    ("h64_query_seqlens", 2, 4, 2, 64, [90, 0], 128, {}, ("fp16", "query_seqlens")),
    # the CUDA-core kernel: float32, and a head size the tensor-core kernel does not take
    ("fp32_h64_split", 1, 14, 2, 64, [299], 320, {"do_rotary": 1}, ()),
    ("h80_cuda_core", 1, 4, 2, 80, [100], 128, {}, ("fp16",)),
]  # fmt: skip


def case_feeds(case, seed=4):
    """(feeds, input names, node, whether the tensor-core route is expected)."""
    name, b, nh, nkv, hd, past_lens, cap, attrs, extras = case
    dt = F16 if "fp16" in extras else F32
    f, names = gqa_feeds(np.random.default_rng(seed), b, 1, nh, nkv, hd, past_lens, cap, attrs,
                          extras, dt)  # fmt: skip
    if "total_is_capacity" in extras:
        f["total_sequence_length"] = np.array(cap, np.int32)
    node = gqa_node(f, names, {"num_heads": nh, "kv_num_heads": nkv, **attrs})
    g = nh // nkv
    tc = dt == F16 and hd in (64, 128, 256) and not (hd == 256 and g > 8)
    return f, names, node, tc


def assert_matches_cpu(got, want, dtype, what):
    for g, w, o in zip(got, want[:3], ("output", "present_key", "present_value"), strict=True):
        assert g.shape == w.shape, f"{what} {o}"
        assert_close(g, w, dtype, f"{what} {o}")


@pytest.mark.parametrize("case", DECODE_CASES, ids=[c[0] for c in DECODE_CASES])
def test_decode_routes_and_matches_cpu(case):
    """Each case's route, and its step (run twice over the same buffers, as a graph
    replays it) against the CPU kernel."""
    import cupy

    from onnxep.providers_cuda.ops.op_group_query_attention import group_query_attention

    f, names, node, tc = case_feeds(case)
    want = cpu_gqa(node, np)(*[f[n] if n else None for n in names])
    run = group_query_attention(node, cupy)
    run(*device_args(cupy, f, names))
    got = run(*device_args(cupy, f, names))
    (route,) = run.routes.values()
    assert route.kernel == ("tensor-core" if tc else "cuda-core"), route.describe()
    dt = f["query"].dtype.type
    assert_matches_cpu([cupy.asnumpy(g) for g in got], want, dt, case[0])


@pytest.mark.parametrize("hd,nh", [(64, 14), (128, 12), (256, 8)])
def test_one_graph_serves_every_length(hd, nh):
    """A fixed-capacity decode step captured once, replayed at 16 tokens and at the
    capacity less one after writing the lengths into the same seqlens_k buffer."""
    import cupy

    from onnxep.providers_cuda.ops.op_group_query_attention import group_query_attention

    b, nkv, cap = 2, 2 if nh != 8 else 1, 4096
    attrs = {"num_heads": nh, "kv_num_heads": nkv, "do_rotary": 1}
    f, names = gqa_feeds(np.random.default_rng(5), b, 1, nh, nkv, hd, [15, 900], cap, attrs,
                          ("fp16",), F16)  # fmt: skip
    f["total_sequence_length"] = np.array(cap, np.int32)
    f["cos_cache"], f["sin_cache"] = rope_cache(cap, hd, F16)  # every position a replay takes
    node = gqa_node(f, names, attrs)
    args = device_args(cupy, f, names)
    i_lens = names.index("seqlens_k")
    pool = cupy.cuda.MemoryPool()
    stream = cupy.cuda.Stream(non_blocking=True)
    with cupy.cuda.using_allocator(pool.malloc), stream:
        run = group_query_attention(node, cupy)
        run(*args)
        stream.synchronize()
        stream.begin_capture()
        outs = run(*args)
        graph = stream.end_capture()
    (route,) = run.routes.values()
    assert route.kernel == "tensor-core", route.describe()
    for lens in ([16, 900], [cap, 2], [3000, cap - 7]):
        args[i_lens].set(np.array(lens, np.int32) - 1, stream=stream)
        stream.synchronize()
        host = [a if a is None or isinstance(a, np.ndarray) else cupy.asnumpy(a) for a in args]
        want = cpu_gqa(node, np)(*host)
        graph.launch(stream)
        stream.synchronize()
        assert_matches_cpu([cupy.asnumpy(o) for o in outs], want, F16, f"replay {lens}")


# name, attrs, opset, dtype, Q shape, K shape, V shape, extras (tests/cuda/test_cuda_attention23)
ATT_DECODE_CASES = [
    ("att_4d_gqa_nonpad_causal_h64", {"is_causal": 1}, 24, F16, (2, 8, 1, 64), (2, 2, 300, 64),
     (2, 2, 300, 64), (("nonpad", [300, 37]),)),
    ("att_4d_past_h128", {}, 23, F16, (1, 12, 1, 128), (1, 2, 1, 128), (1, 2, 1, 128),
     (("past", 250),)),
    ("att_3d_keys_strided_h128", {"q_num_heads": 12, "kv_num_heads": 2, "is_causal": 1}, 23,
     F16, (1, 1, 1536), (1, 300, 256), (1, 300, 256), ()),
    ("att_4d_bool_mask_softcap_h64", {"softcap": 3.0}, 23, F16, (2, 4, 1, 64), (2, 2, 200, 64),
     (2, 2, 200, 64), (("mask", (2, 1, 1, 200), "bool"),)),
    ("att_half_mask_window_h256", {"is_causal": 1, "left_window_size": 90}, 25, F16,
     (1, 8, 1, 256), (1, 1, 150, 256), (1, 1, 150, 256), (("mask", (1, 8, 1, 150), "float16"),)),
    ("att_rows16_short_mask_h64", {}, 23, F16, (1, 16, 1, 64), (1, 1, 100, 64), (1, 1, 100, 64),
     (("mask", (1, 1, 1, 70), "float32"),)),
    # the CUDA-core kernel: V's head size differs, and float32
    ("att_dv_differs", {}, 23, F16, (1, 4, 1, 64), (1, 2, 90, 64), (1, 2, 90, 32), ()),
    ("att_fp32_h64", {"is_causal": 1}, 24, F32, (1, 4, 1, 64), (1, 2, 90, 64), (1, 2, 90, 64),
     (("nonpad", [90]),)),
]  # fmt: skip


def att_tensor_core(case) -> bool:
    _, _, _, dt, qs, ks, vs, _ = case
    return dt == F16 and ks[-1] == vs[-1]


@pytest.mark.parametrize("case", ATT_DECODE_CASES, ids=[c[0] for c in ATT_DECODE_CASES])
def test_attention_decode_routes_and_matches_cpu(case):
    import cupy

    from onnxep.providers_cuda.ops.op_attention import attention

    feeds = att.case_feeds(case, np.random.default_rng(0))
    run = attention(att.node_info(case[1], feeds, case[2]), cupy)
    got = run(*[None if f is None else cupy.asarray(f) for f in feeds])
    (route,) = run.routes.values()
    assert route.kernel == ("tensor-core" if att_tensor_core(case) else "cuda-core"), route
    att.check_against_cpu(case, feeds, [cupy.asnumpy(g) for g in got[:3]])


def test_attention_one_graph_serves_every_length():
    """ONNX Attention over an external fixed-capacity cache (opset 24's nonpad_kv_seqlen, the
    static-cache form): one captured call on tensor cores, replayed at 16 tokens and at the
    capacity after the lengths are written into the same buffer."""
    import cupy

    from onnxep.providers_cuda.ops.op_attention import attention

    rng = np.random.default_rng(6)
    b, hq, hkv, cap, d = 2, 14, 2, 4096, 64
    feeds = [rng.standard_normal(s).astype(F16)
             for s in ((b, hq, 1, d), (b, hkv, cap, d), (b, hkv, cap, d))]  # fmt: skip
    feeds += [None, None, None, np.array([16, 900], np.int64)]
    node = att.node_info({"is_causal": 1}, feeds, 24)
    args = [None if f is None else cupy.asarray(f) for f in feeds]
    pool = cupy.cuda.MemoryPool()
    stream = cupy.cuda.Stream(non_blocking=True)
    with cupy.cuda.using_allocator(pool.malloc), stream:
        run = attention(node, cupy)
        run(*args)
        stream.synchronize()
        stream.begin_capture()
        outs = run(*args)
        graph = stream.end_capture()
    (route,) = run.routes.values()
    assert route.kernel == "tensor-core", route
    for lens in ([16, 900], [cap, 3], [2500, cap - 1]):
        feeds[6] = np.array(lens, np.int64)
        args[6].set(feeds[6], stream=stream)
        graph.launch(stream)
        stream.synchronize()
        case = ("captured", {"is_causal": 1}, 24, F16)
        att.check_against_cpu(case, feeds, [cupy.asnumpy(o) for o in outs[:3]])
