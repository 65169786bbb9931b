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


@pytest.fixture(scope="module")
def provider():
    with emu.registered() as name:
        yield name


@pytest.fixture
def emulated(provider, monkeypatch):
    emu.install(monkeypatch)


@pytest.fixture(params=[False, True], ids=["threads-in-order", "threads-reversed"])
def fiber_order(request, monkeypatch):
    monkeypatch.setattr(emu.EmulatedKernel, "reverse", request.param)


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
