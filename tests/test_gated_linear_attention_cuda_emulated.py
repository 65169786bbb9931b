"""onnxep::GatedLinearAttention's CUDA kernel, run on the CPU through the g++ kernel emulator.

The cases and the check are the GPU test's own (tests/cuda/test_cuda_gated_linear_attention.py):
the CUDA builder on NumPy arrays, its CUDA C compiled with g++ by tests/cuda_emulator.py (which
reports barrier and shuffle misuse and out-of-bounds writes), compared with the op's generic
CPU kernel within tolerance and with the unfused CUDA kernels bit for bit (d_k <= 256).
"""

from __future__ import annotations

import cuda_emulator as emu
import numpy as np
import pytest

from onnxep.errors import NotSupported

gpu = emu.gpu_test_module("test_cuda_gated_linear_attention")


@pytest.mark.parametrize("case", gpu.CASES, ids=lambda c: c.id)
def test_fused_kernel_matches_the_cpu_and_the_unfused_kernels(case, emulated, fiber_order):
    gpu.check_fused(case, np)


def test_refusals_name_what_is_wrong(emulated):
    node = gpu.gla_node(gpu.Case())
    node.attrs["update_rule"] = "delta"
    with pytest.raises(NotSupported, match="update_rule 'delta'"):
        gpu.fused_op.gated_linear_attention(node, np)
    case = gpu.Case()
    ins = list(gpu.inputs(case))
    ins[5] = ins[5][:1]  # one dt_bias value for two heads
    with pytest.raises(ValueError, match="dt_bias"):
        gpu.fused_op.gated_linear_attention(gpu.gla_node(case), np)(*ins)


def test_present_overwrites_a_donated_past_and_only_then(emulated):
    from onnxep.providers.inplace import array_address, donating

    case = gpu.Case(gpu.F16)
    node = gpu.gla_node(case)
    ins = list(gpu.inputs(case))
    want = gpu.generic.gated_linear_attention(node, np)(*ins)
    run = gpu.fused_op.gated_linear_attention(node, np)
    past = ins[3].copy()
    ins[3] = past
    y, present = run(*ins)
    assert present is not past and np.array_equal(past, gpu.inputs(case)[3])  # left alone
    with donating({node.name: array_address(past)}):
        y2, present2 = run(*ins)
    assert present2 is past  # written over the donated buffer
    np.testing.assert_array_equal(present2, present)
    np.testing.assert_array_equal(y2, y)
    atol, rtol = gpu.TOLERANCES[np.dtype(case.dtype)]
    np.testing.assert_allclose(present, want[1], rtol=rtol, atol=atol)


@pytest.fixture
def hybrid_fused(emulated):
    """``cudaemu``'s hybrid kernels plus the fused op, with the two fusion passes (the rest
    of the CUDA library needs CuPy): the fusions run on the nodes this provider owns."""
    from onnxep.providers.fusions.linear_attention_gates import FuseLinearAttentionGates
    from onnxep.providers.fusions.linear_attention_l2_norm import FuseLinearAttentionL2Norm

    hybrid = emu.gpu_test_module("test_cuda_hybrid")
    ops = hybrid.HYBRID_OPS | set(hybrid.FUSED_HYBRID)
    passes = lambda: [FuseLinearAttentionGates(), FuseLinearAttentionL2Norm()]  # noqa: E731
    with emu.registered_for("glaemu", ops, passes) as name:
        yield name, hybrid


def test_qwen3_5_export_fused_on_the_emulated_device_decodes_the_cpu_tokens(hybrid_fused):
    import json

    import onnxep

    name, hybrid = hybrid_fused
    ref = json.loads((hybrid.DATA / "qwen3_5_tokens.json").read_text())
    path = str(hybrid.DATA / "qwen3_5_fp32" / "model.onnx")
    sess = onnxep.InferenceSession(path, providers=[name, "cpu"])
    fused = [n for n in sess.placement() if n.op_type == "GatedLinearAttention"]
    assert len(fused) == 3 and all(n.provider == name for n in fused)
    assert not hybrid.hybrid_placement_problems(sess, name)
    cpu = onnxep.InferenceSession(path, providers=["cpu"])
    got = hybrid.greedy(sess, ref["prompt"], 8, check_against=cpu)
    assert got == hybrid.greedy(cpu, ref["prompt"], 8)
