"""Joined MatMulNBits weights through the CUDA kernel, on the CPU emulator.

``fuse_shared_input_matmuls`` joins MatMulNBits siblings by concatenating
their B, scales, zero points and bias along N. The CUDA kernel must read the
joined tables unchanged: its output for the joined node equals the unfused
nodes' (CPU) outputs side by side. On the GPU the same holds through the
fusion tests of tests/cuda.
"""

from __future__ import annotations

import numpy as np
import pytest
from test_fusions_genai import BLOCK, K, nbits_siblings
from test_fusions_pattern import ALL, fusions_provider, session
from test_nbits_cuda_emulated import gpu_quant, launches  # noqa: F401 - the fixture


@pytest.mark.parametrize(
    "zp_kind, bias, flat",
    [("none", False, False), ("packed", True, False), ("float", False, True)],
)
def test_cuda_kernel_reads_joined_tables_as_one_wider_n(launches, zp_kind, bias, flat):  # noqa: F811
    model = nbits_siblings(sizes=(24, 40), zp_kind=zp_kind, bias=bias, flat=flat)
    with fusions_provider() as register:
        name = register()
        fused, plain = session(model, name), session(model, name, off=ALL)
    (joined,) = [n for n in fused.compiled.model.graph if n.op_type == "MatMulNBits"]
    tables = [None if v is None else v.const_value.numpy() for v in joined.inputs[1:]]
    tables += [None] * (5 - len(tables))
    b, scales, zp, g_idx, joined_bias = tables
    assert g_idx is None and joined.attributes["N"].value == 64
    _, cuda = gpu_quant.builders()
    node = gpu_quant.nbits_node(K, 64, 4, BLOCK, np.float32, b, scales, zp, bias=joined_bias)
    fn = cuda(node, np)
    a = np.random.default_rng(1).standard_normal((3, K)).astype(np.float32)
    want = np.concatenate(plain.run(None, {"a": a}), axis=-1)
    for m in (1, 3):  # GEMV launches of one and of several rows
        (got,) = fn(a[:m], b, scales, zp, None, joined_bias)
        np.testing.assert_allclose(got, want[:m], rtol=1e-4, atol=1e-4)
    assert "nbits_gemv" in launches
