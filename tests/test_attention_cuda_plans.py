"""The CUDA attention kernels' host side, checked without a GPU.

What runs here: the op modules import without CuPy and register what they
claim; the builders decline what the kernels cannot run, with the reason,
before touching CuPy; the launch geometry fits the hardware limits for every
head size the kernels take; and, where nvcc is installed, the CUDA source
compiles. The numerics run in tests/cuda/test_cuda_attention.py on a GPU.
"""

from __future__ import annotations

import itertools
import re
import shutil
import subprocess

import numpy as np
import pytest

from onnxep.errors import InvalidArgument, NotSupported
from onnxep.providers import KernelLibrary
from onnxep.providers.node import NodeInfo, ValueInfo
from onnxep.providers_cuda.ops import gqa_cuda as gqa_src
from onnxep.providers_cuda.ops import gqa_geometry as gqa
from onnxep.providers_cuda.ops.gqa_cuda import LANE_CHANNELS
from onnxep.providers_cuda.ops.op_group_query_attention import group_query_attention
from onnxep.providers_cuda.ops.op_rotary_embedding import rotary_embedding
from onnxep.providers_cuda.ops.op_rotary_embedding_contrib import rotary_embedding_contrib
from onnxep.providers_cuda.ops.rotary_cuda import ROPE_SOURCE

_MSFT = "com.microsoft"


def _specs():
    lib = KernelLibrary.from_package("onnxep.providers_cuda.ops")
    return {(s.domain, s.op_type, s.since_version): s for s in lib}


def test_attention_kernels_are_claimed_without_cupy():
    specs = _specs()
    gqa_spec = specs[(_MSFT, "GroupQueryAttention", 1)]
    # total_sequence_length sizes present on the host; seqlens_k stays on the device
    assert gqa_spec.host_inputs == (6,)
    assert gqa_spec.capture_safe
    assert gqa_spec.dtype_refusal("GroupQueryAttention", [np.dtype("float16")]) is None
    for dt in ("float64", "bfloat16"):
        refusal = gqa_spec.dtype_refusal("GroupQueryAttention", [np.dtype(dt)])
        assert refusal and "not supported" in refusal, dt
    for key in [(_MSFT, "RotaryEmbedding", 1), (_MSFT, "MRotaryEmbedding", 1),
                ("", "RotaryEmbedding", 23)]:  # fmt: skip
        assert specs[key].capture_safe, key
        assert specs[key].host_inputs == ()


def gqa_node(attrs, extra=(), outputs=3, width=64):
    """Inputs 0-6 wired, plus the optional ones in ``extra``."""
    ins = [
        ValueInfo(f"in{i}", "tensor", np.dtype(np.float32)) if i < 7 or i in extra else None
        for i in range(max(7, *extra, 0) + 1 if extra else 7)
    ]
    ins[0] = ValueInfo("query", "tensor", np.dtype(np.float32), (1, "s", width))
    outs = tuple(ValueInfo(f"out{i}", "tensor") for i in range(outputs))
    return NodeInfo("GroupQueryAttention", _MSFT, "gqa", 1, attrs, tuple(ins), outs)


GQA_DECLINES = [
    ({"num_heads": 6, "kv_num_heads": 4}, {}, "multiple of kv_num_heads"),
    ({"num_heads": 4, "kv_num_heads": 2, "sliding_window_cache": 1}, {}, "sliding_window_cache"),
    ({"num_heads": 4, "kv_num_heads": 2, "k_quant_type": "PER_TENSOR"}, {}, "k_quant_type"),
    ({"num_heads": 4, "kv_num_heads": 2}, {"extra": (12,)}, "k_scale"),
    ({"num_heads": 4, "kv_num_heads": 2}, {"extra": (14, 16)}, "q_norm_weight"),
    ({"num_heads": 4, "kv_num_heads": 2, "qk_output": 1}, {"outputs": 4}, "output_qk"),
    ({"num_heads": 2, "kv_num_heads": 1}, {"width": 2 * 512}, "head size 512"),
]


@pytest.mark.parametrize("attrs,shape,reason", GQA_DECLINES, ids=[c[2] for c in GQA_DECLINES])
def test_group_query_attention_declines_with_reason(attrs, shape, reason):
    with pytest.raises(NotSupported, match=reason):
        group_query_attention(gqa_node(attrs, **shape), None)


def test_group_query_attention_needs_its_head_counts():
    with pytest.raises(NotSupported, match="num_heads"):
        group_query_attention(gqa_node({"kv_num_heads": 2}), None)


def _rope_node(op, domain, attrs, rank=3):
    ins = (ValueInfo("x", "tensor", np.dtype(np.float32), (1,) * rank),)
    return NodeInfo(op, domain, "rope", 23 if domain == "" else 1, attrs, ins, ())


@pytest.mark.parametrize(
    "op,attrs,reason",
    [
        ("MRotaryEmbedding", {}, "mrope_section attribute is required"),
        ("RotaryEmbedding", {"mrope_section": [4, 4]}, "3 values"),
        ("RotaryEmbedding", {"mrope_section": [4, 4, 4], "mrope_layout": 2}, "0 or 1"),
    ],
)
def test_rotary_contrib_declines_with_reason(op, attrs, reason):
    with pytest.raises(NotSupported, match=reason):
        rotary_embedding_contrib(_rope_node(op, _MSFT, attrs), None)


def test_rotary_onnx_declines_3d_input_without_num_heads():
    with pytest.raises(NotSupported, match="num_heads"):
        rotary_embedding(_rope_node("RotaryEmbedding", "", {}, rank=3), None)


HEAD_SIZES = [1, 8, 16, 32, 48, 64, 80, 96, 112, 128, 160, 192, 256]


_DECODE_BOUND = int(re.search(r"__launch_bounds__\((\d+)\) gqa_decode", gqa_src.GQA_SOURCE)[1])


def test_decode_blocks_fit_the_kernels_launch_bound():
    assert 32 * gqa.DECODE_MAX_ROWS == _DECODE_BOUND


@pytest.mark.parametrize("d", HEAD_SIZES)
def test_decode_geometry_fits_and_covers(d):
    for (nh, nkv), ctx, b, sms in itertools.product(
        [(14, 2), (32, 1), (8, 8), (40, 8), (28, 4), (12, 2)], [0, 1, 31, 2000, 32768], [1, 8],
        [16, 132],
    ):  # fmt: skip
        g = gqa.plan_decode(b, nh, nkv, d, ctx, sms)
        where = f"d={d} heads={nh}/{nkv} ctx={ctx} b={b} sms={sms}: {g}"
        floats = g.rows * d + g.ktile * (d + 1) + g.ktile * d + g.rows * g.ktile
        assert g.smem == 4 * floats <= gqa.SMEM_LIMIT, where  # what the kernel carves
        assert g.rows <= gqa.DECODE_MAX_ROWS and g.rows * g.nrg >= nh // nkv, where
        assert g.threads <= _DECODE_BOUND and d <= 32 * LANE_CHANNELS, where  # acc[] per lane
        assert g.ktile in (8, 16, 32) and g.nsplit <= max(1, -(-ctx // g.ktile)), where
        assert nkv * g.nrg <= 65535, where
        assert b * nkv * g.nrg * g.nsplit <= max(b * nkv * g.nrg, 2 * 2 * sms), where
        for kv_end in {0, 1, ctx // 3, ctx}:  # the keys a row attends, up to the context
            chunk, n = gqa.decode_splits(g, kv_end)
            assert chunk % g.ktile == 0 and 1 <= n <= g.nsplit, (kv_end, where)
            assert chunk * n >= kv_end and chunk * (n - 1) < max(kv_end, 1), (kv_end, where)


def test_decode_splits_follow_the_context_and_the_device():
    """Qwen2.5-0.5B heads on 132 SMs: a long context fills the device (2 KV heads x splits
    ~ two blocks per SM), fewer SMs get fewer splits; in a fixed-capacity cache (total =
    capacity) a row attending few keys uses one split, so its block writes the output."""
    long_ = gqa.plan_decode(1, 14, 2, 64, 8000, 132)
    assert 0.9 * 2 * 132 <= 2 * gqa.decode_splits(long_, 8000)[1] <= 2 * 132
    assert gqa.plan_decode(1, 14, 2, 64, 8000, 16).nsplit < long_.nsplit
    assert gqa.plan_decode(1, 14, 2, 64, 16, 132).nsplit == 1
    fixed = gqa.plan_decode(1, 14, 2, 64, 4096, 132)
    assert gqa.decode_splits(fixed, 16)[1] == 1
    assert gqa.decode_splits(fixed, 2000)[1] > 1


@pytest.mark.parametrize("d", HEAD_SIZES)
def test_prefill_geometry_fits(d):
    g = gqa.plan_prefill(d)
    floats = g.bq * d + g.bk * (d + 1) + g.bk * d + g.bq * g.bk + g.bq * d + 3 * g.bq
    assert g.smem == 4 * floats <= gqa.SMEM_LIMIT


@pytest.mark.parametrize("plan", [lambda d: gqa.plan_decode(1, 2, 1, d, 64, 8), gqa.plan_prefill])
def test_head_size_outside_the_kernels_is_an_error(plan):
    with pytest.raises(InvalidArgument, match="head size 257"):
        plan(gqa.MAX_HEAD_SIZE + 1)


def test_decode_path_only_for_single_token_steps():
    assert gqa.uses_decode(1)
    assert not gqa.uses_decode(2) and not gqa.uses_decode(0)


def _force_instantiation(source: str, names) -> str:
    refs = "".join(f"  p[{i}] = (void*)&{n};\n" for i, n in enumerate(names))
    return f"{source}\n__global__ void onnxep_instantiate(void** p) {{\n{refs}}}\n"


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not installed here")
@pytest.mark.parametrize("which", ["gqa", "rope"])
def test_cuda_source_compiles(which, tmp_path):
    """nvcc (not NVRTC, but the same front end) builds every template instantiation."""
    if which == "gqa":
        source, names = gqa_src.GQA_SOURCE, gqa_src.NAME_EXPRESSIONS
    else:
        source, names = ROPE_SOURCE, ("rope_apply<float>", "rope_apply<__half>")
    src = _force_instantiation(source, names)
    cu = tmp_path / f"{which}.cu"
    cu.write_text(src)
    cmd = ["nvcc", "-std=c++17", "-arch=sm_90", "-cubin", "-Xptxas", "-v", "-o",
           str(tmp_path / f"{which}.cubin"), str(cu)]  # fmt: skip
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-4000:]
    built = set(re.findall(r"Compiling entry function '(\w+)'", res.stderr))
    assert len(built) == len(names) + 1, res.stderr[-4000:]


@pytest.mark.skipif(shutil.which("g++") is None, reason="g++ is not installed here")
def test_parameter_blocks_match_the_c_layout(tmp_path):
    """Each kernel parameter struct: NumPy's field offsets and size are the C compiler's
    (nvcc lays out these plain structs as the host compiler does)."""
    from onnxep.providers_cuda.ops.gqa_cuda import ATTN, DECODE, FILL, PREPARE
    from onnxep.providers_cuda.ops.rotary_cuda import ROPE

    structs = (PREPARE, FILL, ATTN, DECODE, ROPE)
    lines = ["#include <stdio.h>", "#include <stddef.h>", *(p.source for p in structs)]
    lines.append("int main() {")
    for p in structs:
        lines.append(f'  printf("{p.name} size %zu\\n", sizeof({p.name}));')
        for name, _ in p.fields:
            lines.append(f'  printf("{p.name} {name} %zu\\n", offsetof({p.name}, {name}));')
    lines.append("  return 0;\n}")
    src, exe = tmp_path / "layout.cpp", tmp_path / "layout"
    src.write_text("\n".join(lines))
    subprocess.run(["g++", "-o", str(exe), str(src)], check=True, timeout=120)
    out = subprocess.run([str(exe)], capture_output=True, text=True, check=True).stdout
    c_layout = {tuple(line.split()[:2]): int(line.split()[2]) for line in out.splitlines()}
    for p in structs:
        assert c_layout[(p.name, "size")] == p.dtype.itemsize, p.name
        for name, _ in p.fields:
            assert c_layout[(p.name, name)] == p.dtype.fields[name][1], (p.name, name)
