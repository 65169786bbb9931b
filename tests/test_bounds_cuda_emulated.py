"""The CUDA attention kernels' device bounds checks, run on the CPU emulator.

GroupQueryAttention's decode and prepare kernels and the rotary kernel check
the values they index tables with on the device and write a bad one into the
provider's error record; the record is decoded into the very sentence the CPU
kernel raises (tests/test_bounds.py's cases). Here each kernel runs on the
thread emulator (tests/cuda_emulation.py) with a host error record, as the
provider's synchronization would read it: the bad step raises the CPU's
sentence, the record is cleared, and the next good step matches the CPU.
On a GPU, tests/cuda/test_cuda_bounds.py checks the same eager and captured.
"""

from __future__ import annotations

import numpy as np
import pytest
from cuda_emulation import Emulator, available, emulated_xp
from test_bounds import ATTRS, NAMES, REFUSED, gqa_feeds

from onnxep.errors import BoundsError
from onnxep.providers.bounds import OutOfBounds
from onnxep.providers.node import NodeInfo, ValueInfo
from onnxep.providers.ops.op_group_query_attention import group_query_attention as cpu_gqa
from onnxep.providers.ops.op_rotary_embedding import rotary_embedding as cpu_rope23
from onnxep.providers.ops.op_rotary_embedding_contrib import rotary_embedding_contrib as cpu_rope
from onnxep.providers_cuda import error_flag
from onnxep.providers_cuda.ops.op_group_query_attention import group_query_attention as cuda_gqa

_WHY_NOT = available()
pytestmark = [pytest.mark.skipif(bool(_WHY_NOT), reason=f"cannot emulate CUDA: {_WHY_NOT}")]


@pytest.fixture(scope="module")
def emulator():
    return Emulator()


@pytest.fixture
def cuda(emulator, monkeypatch):
    """The CUDA attention modules on the emulator (an 8-SM device) and a host error record
    their builders report to."""
    from onnxep.providers_cuda import nvrtc
    from onnxep.providers_cuda.ops import attention_cuda, flash_prefill, rotary_cuda
    from onnxep.providers_cuda.ops import op_group_query_attention as gqa

    monkeypatch.setattr(nvrtc, "function", emulator.function)
    for mod in (gqa, rotary_cuda, attention_cuda):
        monkeypatch.setattr(mod, "sm_count", lambda: 8)
    monkeypatch.setattr(gqa, "compute_capability", lambda: 90)
    # the H200's prefill route too (the tensor-core prefill, sm_90's opt-in shared memory)
    monkeypatch.setattr(flash_prefill, "device_facts", lambda: (90, 227 * 1024))
    return error_flag.ErrorFlag.on_host()


def _node(op, domain, feeds, names, attrs, opset=1, name="gqa"):
    ins = tuple(ValueInfo(n, "tensor", feeds[n].dtype, feeds[n].shape) if n else None
                for n in names)  # fmt: skip
    return NodeInfo(op, domain, name, opset, attrs, ins, (ValueInfo("y", "tensor"),))


def _cpu_sentence(label, run, args) -> str:
    with pytest.raises(OutOfBounds) as info:
        run(*args)
    return f"{label}: {info.value}"


def _raised(flag) -> str:
    """What the provider's next synchronization raises (the record is cleared after)."""
    flag.before_sync()
    with pytest.raises(BoundsError) as info:
        flag.after_sync()
    assert not flag.words.any()
    return str(info.value)


def _clean(flag) -> None:
    flag.before_sync()
    flag.after_sync()


@pytest.mark.parametrize("case", REFUSED, ids=[c[0] for c in REFUSED])
def test_gqa_device_check_raises_the_cpu_sentence(case, cuda):
    name, feeds, _, _ = case
    names = NAMES if "position_ids" in feeds else NAMES[:9]
    node = _node("GroupQueryAttention", "com.microsoft", feeds, names, ATTRS)
    args = [feeds[n] for n in names]
    want = _cpu_sentence("GroupQueryAttention node 'gqa'", cpu_gqa(node, np), args)
    with error_flag.building(cuda):
        run = cuda_gqa(node, emulated_xp())
    run(*[a.copy() for a in args])
    assert _raised(cuda) == want
    # the same step again with good values: nothing raised, the CPU's result
    (b, s, _), cap = feeds["query"].shape, feeds["past_key"].shape[2]
    pos = np.full((b, s), 2) if "position_ids" in feeds else None
    total, rows = int(feeds["total_sequence_length"]), feeds["cos_cache"].shape[0] + 8
    good = gqa_feeds(b, s, cap, seqlens=(max(2, s - 1),) * b, total=total, rows=rows, pos=pos)
    gargs = [good[n] for n in names]
    got = run(*[a.copy() for a in gargs])
    _clean(cuda)
    want_out = cpu_gqa(node, np)(*gargs)
    np.testing.assert_allclose(got[0], want_out[0], atol=2e-5, rtol=1e-4)


ROPE = [
    # name, op, position ids, cache rows, bad entry
    ("contrib_ids", "RotaryEmbedding", [[0, 3, 24, 25]], 24),
    ("contrib_offset", "RotaryEmbedding", [21], 24),
    ("contrib_negative", "RotaryEmbedding", [[0, -2, 1, 1]], 24),
    ("mrope_height", "MRotaryEmbedding", [[[0, 1, 2, 3]], [[0, 1, 30, 3]], [[0, 1, 2, 3]]], 24),
]


@pytest.mark.parametrize("case", ROPE, ids=[c[0] for c in ROPE])
def test_rotary_device_check_raises_the_cpu_sentence(case, cuda):
    from onnxep.providers_cuda.ops.op_rotary_embedding_contrib import rotary_embedding_contrib

    name, op, ids, rows = case
    rng = np.random.default_rng(3)
    pos = np.array(ids, np.int64)
    s = 4
    x = rng.standard_normal((1, s, 2 * 16)).astype(np.float32)
    ang = np.arange(rows)[:, None] * (1.0 / 10000 ** (np.arange(0, 16, 2) / 16))[None]
    cos, sin = np.cos(ang).astype(np.float32), np.sin(ang).astype(np.float32)
    attrs = {"num_heads": 2}
    if op == "MRotaryEmbedding":
        attrs.update(mrope_section=[3, 3, 2], mrope_layout=1)
    feeds = {"x": x, "p": pos, "c": cos, "s": sin}
    node = _node(op, "com.microsoft", feeds, "xpcs", attrs, name="rope")
    want = _cpu_sentence(f"{op} node 'rope'", cpu_rope(node, np), (x, pos, cos, sin))
    with error_flag.building(cuda):
        run = rotary_embedding_contrib(node, emulated_xp())
    run(x, pos, cos, sin)
    assert _raised(cuda) == want
    good = np.clip(pos, 0, rows - s)  # an offset counts on s tokens
    got = run(x, good, cos, sin)[0]
    _clean(cuda)
    np.testing.assert_array_equal(got, cpu_rope(node, np)(x, good, cos, sin)[0])


def test_onnx_rotary_device_check_raises_the_cpu_sentence(cuda):
    from onnxep.providers_cuda.ops.op_rotary_embedding import rotary_embedding

    rng = np.random.default_rng(4)
    x = rng.standard_normal((2, 2, 3, 16)).astype(np.float32)  # (B, N, S, H)
    ang = np.arange(10)[:, None] * (1.0 / 10000 ** (np.arange(0, 16, 2) / 16))[None]
    cos, sin = np.cos(ang).astype(np.float32), np.sin(ang).astype(np.float32)
    pos = np.array([[0, 1, 2], [9, 10, 11]], np.int64)
    feeds = {"x": x, "c": cos, "s": sin, "p": pos}
    node = _node("RotaryEmbedding", "", feeds, "xcsp", {}, opset=23, name="rope")
    want = _cpu_sentence("RotaryEmbedding node 'rope'", cpu_rope23(node, np), (x, cos, sin, pos))
    assert "position 10 (position_ids[1, 1])" in want
    with error_flag.building(cuda):
        run = rotary_embedding(node, emulated_xp())
    run(x, cos, sin, pos)
    assert _raised(cuda) == want
    good = pos % 10
    got = run(x, cos, sin, good)[0]
    _clean(cuda)
    np.testing.assert_array_equal(got, cpu_rope23(node, np)(x, cos, sin, good)[0])
