"""GroupQueryAttention's prefill preparation (rotary, KV append, Q to its buffer) 16 bytes at
a time (``gqa_prepare_v``) against the element-wise ``gqa_prepare`` on the CPU emulator: the
same bits in every output, and the vector kernel only where rows, offsets, strides and the
rotary split are whole 16-byte chunks and the arrays aligned."""

from __future__ import annotations

import numpy as np
import pytest
from cuda_emulation import available
from test_attention_cuda_emulated import cuda_ops, emulator, gqa_feeds  # noqa: F401

from onnxep.providers.node import NodeInfo, ValueInfo
from onnxep.providers_cuda.ops import gqa_step

_WHY_NOT = available()
pytestmark = [pytest.mark.skipif(bool(_WHY_NOT), reason=f"cannot emulate CUDA: {_WHY_NOT}")]

CASES = [
    # name, b, s, nh, nkv, hd, past lens, capacity, attrs, extras, whether the vector kernel runs
    ("rotary_fp32", 2, 9, 4, 2, 8, [5, 2], 24, {"do_rotary": 1}, (), True),
    ("rotary_fp16_packed", 1, 6, 2, 1, 32, [0], 16, {"do_rotary": 1}, ("fp16", "packed"), True),
    ("interleaved_pos_ids", 2, 5, 4, 2, 16, [0, 0], None,
     {"do_rotary": 1, "rotary_interleaved": 1}, ("position_ids",), True),
    ("half_rotary", 1, 7, 2, 1, 32, [3], 16, {"do_rotary": 1}, ("fp16", "half_rot"), True),
    ("ragged_queries", 2, 6, 4, 2, 8, [3, 5], 16, {}, ("query_seqlens",), True),
    # a head of 12 float16 channels is not whole 16-byte chunks
    ("head_12_fp16", 1, 5, 2, 1, 12, [0], None, {"do_rotary": 1}, ("fp16",), False),
]  # fmt: skip


def _run(case, ops):
    name, b, s, nh, nkv, hd, past_lens, cap, attrs, extras, _ = case
    dt = np.float16 if "fp16" in extras else np.float32
    f, names = gqa_feeds(np.random.default_rng(3), b, s, nh, nkv, hd, past_lens, cap, attrs,
                         extras, dt)  # fmt: skip
    attrs = {"num_heads": nh, "kv_num_heads": nkv, **attrs}
    ins = tuple(ValueInfo(n, "tensor", f[n].dtype, f[n].shape) if n else None for n in names)
    outs = tuple(ValueInfo(n, "tensor") for n in ("output", "present_key", "present_value"))
    node = NodeInfo("GroupQueryAttention", "com.microsoft", name, 1, attrs, ins, outs)
    before = ops.emulator.launches()
    got = ops.gqa(node, ops.xp)(*[f[n].copy() if n else None for n in names])
    ran = {k for k, n in ops.emulator.launches().items() if n > before.get(k, 0)}
    return [np.array(g) for g in got], ran


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_vector_preparation_gives_the_element_wise_bits(case, cuda_ops, monkeypatch):  # noqa: F811
    vec, ran_vec = _run(case, cuda_ops)
    assert any("gqa_prepare_v" in k for k in ran_vec) == case[-1], sorted(ran_vec)
    monkeypatch.setattr(gqa_step, "all_aligned", lambda arrays: False)
    flat, ran_flat = _run(case, cuda_ops)
    assert not any("gqa_prepare_v" in k for k in ran_flat)
    assert any("gqa_prepare<" in k for k in ran_flat), sorted(ran_flat)
    for a, b_, what in zip(vec, flat, ("output", "present_key", "present_value"), strict=True):
        np.testing.assert_array_equal(a.view(np.uint8), b_.view(np.uint8), err_msg=what)
