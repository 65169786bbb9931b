"""The tensor-core split-K decode (GroupQueryAttention, ONNX Attention) on the CPU emulator.

The kernels' CUDA C (``providers_cuda/ops/decode_tc_cuda.py``) runs on the thread
emulator (tests/cuda_emulation.py, whose ``tc_mma`` computes mma.m16n8k16 from every lane's
fragments as the PTX ISA places them), with the real routing and launch code, against the
CPU kernel: the GPU tests' cases (tests/cuda/test_cuda_gqa_decode.py) on an 8-SM device of
compute capability 9.0, each run twice over the same buffers as a graph replays it; the
route of every case, including those left to the CUDA-core kernels; the splits the cases
reach; the device bounds check of the tensor-core kernel; ONNX Attention's single-row cases.
"""

from __future__ import annotations

import re

import numpy as np
import pytest
from cuda_emulation import Emulator, available, emulated_xp
from cuda_emulator import gpu_test_module

from onnxep.errors import BoundsError
from onnxep.providers import bounds
from onnxep.providers.ops.op_group_query_attention import group_query_attention as cpu_gqa
from onnxep.providers_cuda import error_flag
from onnxep.providers_cuda.ops import gqa_geometry as geo

_WHY_NOT = available()
pytestmark = [pytest.mark.skipif(bool(_WHY_NOT), reason=f"cannot emulate CUDA: {_WHY_NOT}")]

gpu = gpu_test_module("test_cuda_gqa_decode")
SMS = 8


@pytest.fixture(scope="module")
def emulator():
    return Emulator()


@pytest.fixture
def cuda_gqa(emulator, monkeypatch):
    """providers_cuda's GroupQueryAttention builder on the emulator: 8 SMs, sm_90."""
    from onnxep.providers_cuda import nvrtc
    from onnxep.providers_cuda.ops import attention_cuda, flash_prefill
    from onnxep.providers_cuda.ops import op_group_query_attention as gqa

    monkeypatch.setattr(nvrtc, "function", emulator.function)
    for mod in (gqa, attention_cuda):
        monkeypatch.setattr(mod, "sm_count", lambda: SMS)
    monkeypatch.setattr(gqa, "compute_capability", lambda: 90)
    # the H200's prefill route too (the tensor-core prefill, sm_90's opt-in shared memory)
    monkeypatch.setattr(flash_prefill, "device_facts", lambda: (90, 227 * 1024))
    return gqa.group_query_attention


def _launched(emulator, before) -> dict[str, int]:
    return {k.split("<")[0]: n - before.get(k, 0) for k, n in emulator.launches().items()
            if n > before.get(k, 0)}  # fmt: skip


@pytest.mark.parametrize("case", gpu.DECODE_CASES, ids=[c[0] for c in gpu.DECODE_CASES])
def test_decode_matches_cpu_emulated(case, cuda_gqa, emulator):
    f, names, node, tc = gpu.case_feeds(case)
    want = cpu_gqa(node, np)(*[f[n] if n else None for n in names])
    run = cuda_gqa(node, emulated_xp())
    run(*[f[n].copy() if n else None for n in names])
    before = emulator.launches()
    got = run(*[f[n].copy() if n else None for n in names])
    (route,) = run.routes.values()
    assert route.kernel == ("tensor-core" if tc else "cuda-core"), route.describe()
    ran = _launched(emulator, before)
    if tc:  # the merge is in the graph whenever the grid has splits (it reads the lengths)
        merged = int(_nsplit(case) > 1)
        assert ran.get("gqa_decode_tc") == 1 and ran.get("gqa_decode_merge", 0) == merged
    else:
        assert ran.get("gqa_decode") == 1 and "gqa_decode_tc" not in ran
    gpu.assert_matches_cpu(got, want, f["query"].dtype.type, case[0])


def _nsplit(case) -> int:
    _, b, nh, nkv, hd, past_lens, cap, _, _ = case
    total = cap if cap is not None else max(past_lens) + 1
    return geo.plan_decode_tc(b, nh, nkv, hd, total, SMS).nsplit


def test_the_cases_reach_one_split_many_splits_and_empty_ones():
    """Rows held by one split (written by the decode kernel), rows merged from several, and
    grid blocks past a short row's keys (returning at once), at both row widths."""
    one = many = empty = False
    widths = set()
    for case in gpu.DECODE_CASES:
        _, b, nh, nkv, hd, past_lens, cap, _, extras = case
        if "fp16" not in extras or hd not in geo.TC_HEAD_SIZES:
            continue
        total = cap if cap is not None else max(past_lens) + 1
        g = geo.plan_decode_tc(b, nh, nkv, hd, total, SMS)
        widths.add(g.tile_rows)
        for p in past_lens:
            used = geo.tc_splits(g, p + 1)[1]
            one |= used == 1
            many |= used > 1
            empty |= used < g.nsplit
    assert one and many and empty and widths == {8, 16}


def test_routes_follow_dtype_head_size_group_and_device():
    assert geo.route_decode("float16", 64, 7, 90).kernel == "tensor-core"
    assert geo.route_decode("float16", 256, 8, 80).kernel == "tensor-core"
    for args, why in [
        (("float32", 64, 7, 90), "float32"),
        (("float16", 96, 7, 90), "head size 96"),
        (("float16", 128, 6, 75), "compute capability 7.5"),
        (("float16", 256, 12, 90), "12 query heads per KV head at head size 256"),
    ]:
        route = geo.route_decode(*args)
        assert route.kernel == "cuda-core" and why in route.reason, route


def test_the_grid_is_sized_for_the_capacity_and_the_splits_for_the_length():
    """One graph for every length: the grid depends on the capacity alone; a row uses the
    splits its own length needs, 64 keys or more each."""
    g = geo.plan_decode_tc(1, 14, 2, 64, 32768, 132)
    assert g.nsplit == geo.TC_BLOCKS_PER_SM * 132 // 2
    assert geo.tc_splits(g, 16) == (64, 1)
    chunk, used = geo.tc_splits(g, 32000)
    assert chunk % 64 == 0 and used <= g.nsplit and chunk * used >= 32000
    assert geo.plan_decode_tc(1, 14, 2, 64, 100, 132).nsplit == 2  # no more than 64-key pieces


def test_the_tensor_core_kernel_reports_a_position_past_the_cache(cuda_gqa):
    case = ("bad_position", 2, 14, 2, 64, [40, 300], 320, {"do_rotary": 1}, ("fp16",))
    f, names, node, tc = gpu.case_feeds(case)
    assert tc
    f["cos_cache"], f["sin_cache"] = f["cos_cache"][:200], f["sin_cache"][:200]
    flag = error_flag.ErrorFlag.on_host()
    with error_flag.building(flag):
        run = cuda_gqa(node, emulated_xp())
    run(*[f[n].copy() if n else None for n in names])
    flag.before_sync()
    with pytest.raises(BoundsError) as info:
        flag.after_sync()
    text = bounds.position_text(300, 200, bounds.token_where((1, 0)))
    assert str(info.value) == f"GroupQueryAttention node 'gqa': {text}"


def test_a_cache_off_16_bytes_takes_the_cuda_core_kernel(cuda_gqa, emulator):
    """The tensor-core kernel's 16-byte loads need 16-byte aligned cache rows: a cache that a
    view starts 8 bytes into runs on the CUDA-core kernel instead (same results)."""
    case = ("misaligned", 1, 14, 2, 64, [100], 128, {}, ("fp16",))
    f, names, node, tc = gpu.case_feeds(case)
    want = cpu_gqa(node, np)(*[f[n] if n else None for n in names])
    run = cuda_gqa(node, emulated_xp())
    args = [f[n].copy() if n else None for n in names]
    for name in ("past_key", "past_value"):
        a = args[names.index(name)]
        buf = np.empty(a.size + 16, np.float16)
        start = 4 + (-buf.ctypes.data // 2) % 8  # 8 bytes past a 16-byte boundary
        view = buf[start : start + a.size].reshape(a.shape)
        view[...] = a
        args[names.index(name)] = view
    before = emulator.launches()
    got = run(*args)
    ran = _launched(emulator, before)
    assert ran.get("gqa_decode") == 1 and "gqa_decode_tc" not in ran, ran
    assert next(iter(run.routes.values())).kernel == "tensor-core"  # the planned route
    gpu.assert_matches_cpu(got, want, np.float16, "misaligned")


@pytest.fixture
def cuda_attention(emulator, monkeypatch):
    """providers_cuda's Attention builder on the emulator: 8 SMs, sm_90."""
    from onnxep.providers_cuda import nvrtc
    from onnxep.providers_cuda.ops import flash_prefill, op_attention

    monkeypatch.setattr(nvrtc, "function", emulator.function)
    monkeypatch.setattr(op_attention, "sm_count", lambda: SMS)
    monkeypatch.setattr(op_attention, "compute_capability", lambda: 90)
    # the H200's prefill route too (the tensor-core prefill, sm_90's opt-in shared memory)
    monkeypatch.setattr(flash_prefill, "device_facts", lambda: (90, 227 * 1024))
    return op_attention.attention


@pytest.mark.parametrize("case", gpu.ATT_DECODE_CASES, ids=[c[0] for c in gpu.ATT_DECODE_CASES])
def test_attention_decode_matches_cpu_emulated(case, cuda_attention, emulator):
    feeds = gpu.att.case_feeds(case, np.random.default_rng(0))
    run = cuda_attention(gpu.att.node_info(case[1], feeds, case[2]), emulated_xp())
    before = emulator.launches()
    got = run(*[None if f is None else f.copy() for f in feeds])
    (route,) = run.routes.values()
    tc = gpu.att_tensor_core(case)
    assert route.kernel == ("tensor-core" if tc else "cuda-core"), route
    ran = _launched(emulator, before)
    assert ("att_decode_tc" in ran) == tc and ("att_prefill" in ran) != tc, ran
    gpu.att.check_against_cpu(case, feeds, got[:3])


def test_one_planned_step_serves_every_length(cuda_gqa, emulator):
    """What a captured graph replays: the step planned once for a fixed-capacity cache (its
    grid sized for the capacity), run again with new lengths written into the same buffers:
    one split, several, all of them."""
    from test_cuda_attention import rope_cache

    b, nh, nkv, hd, cap = 2, 14, 2, 64, 512
    attrs = {"num_heads": nh, "kv_num_heads": nkv, "do_rotary": 1}
    f, names = gpu.gqa_feeds(np.random.default_rng(8), b, 1, nh, nkv, hd, [15, 300], cap,
                              attrs, ("fp16",), np.float16)  # fmt: skip
    f["total_sequence_length"] = np.array(cap, np.int32)
    f["cos_cache"], f["sin_cache"] = rope_cache(cap, hd, np.float16)
    node = gpu.gqa_node(f, names, attrs)
    args = [f[n].copy() if n else None for n in names]
    run = cuda_gqa(node, emulated_xp())
    i_lens, i_k, i_v = (names.index(n) for n in ("seqlens_k", "past_key", "past_value"))
    for lens in ([16, 300], [cap, 2], [200, cap - 70]):
        args[i_lens][:] = np.array(lens, np.int32) - 1
        want = cpu_gqa(node, np)(*[a.copy() if a is not None else None for a in args])
        got = run(*args)
        assert got[1] is args[i_k] and got[2] is args[i_v]  # written in place, as replays do
        gpu.assert_matches_cpu(got, want, np.float16, f"lengths {lens}")
    assert len(run.routes) == 1  # planned once


@pytest.mark.parametrize(("nh", "hd"), [(14, 64), (8, 256)])
def test_many_splits_merge_in_groups(nh, hd, cuda_gqa, emulator, monkeypatch):
    """A long row over many splits (64 here, as an H200 gives 132): the merge sums the
    splits in groups of threads with four accumulators each (head size 64: two groups of 64
    channels; 256: one group, each thread two channels), against the CPU."""
    from test_cuda_attention import rope_cache

    from onnxep.providers_cuda.ops import attention_cuda
    from onnxep.providers_cuda.ops import op_group_query_attention as gqa

    for mod in (gqa, attention_cuda):
        monkeypatch.setattr(mod, "sm_count", lambda: 64)
    b, nkv, cap = 1, 2, 4096
    attrs = {"num_heads": nh, "kv_num_heads": nkv, "do_rotary": 1}
    f, names = gpu.gqa_feeds(np.random.default_rng(9), b, 1, nh, nkv, hd, [cap - 30], cap,
                              attrs, ("fp16",), np.float16)  # fmt: skip
    f["total_sequence_length"] = np.array(cap, np.int32)
    f["cos_cache"], f["sin_cache"] = rope_cache(cap, hd, np.float16)
    node = gpu.gqa_node(f, names, attrs)
    assert geo.tc_splits(geo.plan_decode_tc(b, nh, nkv, hd, cap, 64), cap - 29)[1] >= 60
    want = cpu_gqa(node, np)(*[f[n].copy() if n else None for n in names])
    got = cuda_gqa(node, emulated_xp())(*[f[n].copy() if n else None for n in names])
    gpu.assert_matches_cpu(got, want, np.float16, f"{nh} heads of {hd}")


@pytest.mark.parametrize(
    ("d", "threads", "sink"), [(64, 64, False), (128, 512, True), (64, 512, False)]
)
def test_merge_over_many_splits_matches_float64(d, threads, sink, emulator):
    """gqa_decode_merge alone over 300 splits of synthetic partials: groups read eight splits
    a batch and rescale their own softmax between batches (64 threads at head size 64: four
    groups, ten batches each), splits that saw no key (max -inf) weigh nothing, a sink's
    logit joins the denominator; against the merge in float64."""
    from onnxep.providers_cuda.ops import decode_tc_cuda as tc
    from onnxep.providers_cuda.ops.gqa_cuda import DECODE

    rng = np.random.default_rng(d + threads)
    nh, nsplit, ktile = 3, 300, 64
    kv_end = nsplit * ktile  # every split used
    m = rng.uniform(-4, 4, (nh, nsplit)).astype(np.float32)
    m[0, :40] = -np.inf  # row 0: its first splits saw no key (whole batches of -inf)
    m[1, 7::13] = -np.inf
    ls = rng.uniform(0.5, 3.0, (nh, nsplit)).astype(np.float32)
    acc = rng.standard_normal((nh, nsplit, d)).astype(np.float32)
    part = np.concatenate([acc.ravel(), m.ravel(), ls.ravel()]).astype(np.float32)
    sk = rng.uniform(-1, 1, nh).astype(np.float16)
    zeros = dict.fromkeys(
        "k_off v_off q_row k_row v_row bsb bsh bsj rows nrg rot interleaved pos_mode "
        "cache_rows smooth window causal node scale softcap".split(),
        0,
    )
    prm = DECODE.to_device(
        np, B=1, nh=nh, nkv=1, D=d, C=kv_end, kv_limit=kv_end, nsplit=nsplit, ktile=ktile,
        **zeros,
    )  # fmt: skip
    _, merge_name = tc.tc_names(d, 8)
    source = f"#define ONNXEP_TC_DOUBLE_MAX {tc.TC_DOUBLE_MAX}\n" + tc.DECODE_TC_SOURCE
    fn = emulator.function(source, merge_name, (merge_name,))
    y = np.full((nh, d), np.nan, np.float16)
    seqlens = np.array([kv_end - 1], np.int32)
    smem = 4 * (3 * (threads // 16) + 1 + 4 * threads)
    fn((nh,), (threads,), (seqlens, sk if sink else None, part, y, prm), shared_mem=smem)
    m64, l64, a64 = m.astype(np.float64), ls.astype(np.float64), acc.astype(np.float64)
    top = m64.max(axis=1, keepdims=True)
    if sink:
        top = np.maximum(top, sk.astype(np.float64)[:, None])
    w = np.exp(m64 - top)
    den = (w * l64).sum(axis=1) + (np.exp(sk.astype(np.float64) - top[:, 0]) if sink else 0)
    want = (w[:, :, None] * a64).sum(axis=1) / den[:, None]
    np.testing.assert_allclose(y.astype(np.float64), want, rtol=2e-3, atol=2e-3)


def test_driver_launch_signatures_match_the_kernels(emulator, monkeypatch):
    """On a GPU the decode and merge kernels go through ``launch.Launcher`` as programmatic
    dependents, which packs 8-byte arguments by a signature string: it must be the kernels'
    own (the emulator reads it from the C parameters)."""
    import types

    from onnxep.providers_cuda import elementwise, launch, nvrtc
    from onnxep.providers_cuda.ops import decode_tc_cuda as tc

    made = []

    class Recorder:
        def __init__(self, fn, signature, dependent=False):
            codes = {"long long": "q", "int": "i", "float": "f", "double": "d"}
            real = "".join("p" if t.endswith("*") else codes[t] for t, _ in fn.params)
            made.append((fn.name, real, signature))
            assert dependent, "the decode kernels wait (tc_pdl_wait): launched as dependents"

    monkeypatch.setattr(nvrtc, "function", emulator.function)
    monkeypatch.setattr(launch, "Launcher", Recorder)
    monkeypatch.setattr(elementwise, "stream_ptr_fn", lambda: lambda: 0)
    cupy_like = types.SimpleNamespace(__name__="cupy")
    for names in (tc.tc_names(128, 16), tc.att_names(64, 8)):
        calls = tc.tc_kernels(names, cupy_like)
        assert all(callable(c) for c in calls)
    assert len(made) == 4
    for name, real, packed in made:
        assert packed == real, name


def _kernel_body(source: str, name: str) -> tuple[list[str], str]:
    """A ``__global__`` kernel's parameter names and its body, from the source."""
    head = re.search(rf"__global__ void __launch_bounds__\(\w+\) {name}\(", source)
    params = source[head.end() : source.index(") {", head.end())]
    names = [re.findall(r"(\w+)\s*$", p.strip())[0] for p in params.split(",")]
    body = source[source.index(") {", head.end()) :]
    return names, body[: body.index("\n}\n")]


@pytest.mark.parametrize(
    "name", ["gqa_decode_tc", "att_decode_tc", "gqa_decode_merge", "att_decode_merge"]
)
def test_the_decode_kernels_wait_before_they_touch_what_earlier_kernels_write(name):
    """Launched as programmatic dependents, the decode kernels and their merges may start while
    the kernel before them (the Q/K/V GEMV, the decode kernel) still runs: before
    ``tc_pdl_wait`` they may only read the parameter block, which the host wrote when the node
    was built. No other parameter (Q, K, V, caches, lengths, positions, partials, outputs) is
    named before the wait, and the trigger comes first."""
    from onnxep.providers_cuda.ops import decode_tc_cuda as tc

    params, body = _kernel_body(tc.DECODE_TC_SOURCE, name)
    wait = body.index("tc_pdl_wait();")
    before = body[:wait]
    assert "tc_pdl_trigger();" in before
    named = {p for p in params if p != "prm" and re.search(rf"\b{p}\b", before)}
    assert not named, f"{name} uses {sorted(named)} before tc_pdl_wait"
    assert "[" not in before.replace("smem[]", ""), "no memory but prm's before the wait"
