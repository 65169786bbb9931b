"""The hybrid decode kernels' CUDA C run on the CPU through the kernel emulator.

The cases are the GPU tests' own (tests/cuda/test_cuda_hybrid.py): the same
one-node models, the same expected kernel, the same comparison with the CPU
provider, with the provider ``cudaemu`` (the CUDA provider's kernel library on
NumPy arrays) and the CUDA C compiled with g++ by tests/cuda_emulator.py, which
reports barrier and shuffle misuse, out-of-bounds writes, writes into inputs
and wrongly typed arguments. The default run takes a subset covering every
kernel path in both dtypes; ``-m slow`` runs them all. Also here: the
builders' declines and run-time errors (no kernel is compiled for them), the
LinearAttention launch geometry, and the tiny Qwen3.5 export decoding with
only these five ops on the emulated device.
"""

from __future__ import annotations

import importlib
import json
import sys
from pathlib import Path

import cuda_emulator as emu
import ml_dtypes
import numpy as np
import pytest

import onnxep
from onnxep.errors import NotSupported
from onnxep.providers.node import NodeInfo, ValueInfo
from onnxep.providers_cuda.ops import _linear_attention_cuda as LA
from onnxep.providers_cuda.ops import op_causal_conv_with_state as conv_op
from onnxep.providers_cuda.ops import op_gated_rms_norm as norm_op
from onnxep.providers_cuda.ops import op_linear_attention as la_op
from onnxep.providers_cuda.ops import op_linear_attention_gate as gate_op

CUDA_TESTS = Path(__file__).resolve().parent / "cuda"
if str(CUDA_TESTS) not in sys.path:
    sys.path.insert(0, str(CUDA_TESTS))
gpu = importlib.import_module("test_cuda_hybrid")
F32, F16 = np.float32, np.float16


@pytest.fixture(scope="module")
def provider():
    from onnxep.providers.discovery import unregister_plugin

    why = emu.why_unavailable()
    if why:
        pytest.skip(why)
    plugin = emu.make_plugin()
    onnxep.register_provider(plugin, name="cuda-emulator")
    yield emu.NAME
    unregister_plugin(plugin)


@pytest.fixture
def emulated(provider, monkeypatch):
    emu.install(monkeypatch)
    return provider


@pytest.fixture
def launches(emulated, monkeypatch):
    return gpu.count_launches(monkeypatch)


@pytest.fixture(params=[False, True], ids=["threads-in-order", "threads-reversed"])
def fiber_order(request, monkeypatch):
    monkeypatch.setattr(emu.EmulatedKernel, "reverse", request.param)


def _quick_la(c) -> bool:
    """Every rule and head layout once, float16 where the kernel's paths are the same."""
    return c.dtype == F16 or c.heads[3] == 128 or c.t in (0, 70) or c.window or c.onnx


def _params(cases, quick):
    return [pytest.param(c, id=c.id, marks=() if quick(c) else pytest.mark.slow) for c in cases]


@pytest.mark.parametrize("case", _params(gpu.LA_CASES, _quick_la))
def test_linear_attention(case, emulated, launches):
    gpu.check_linear_attention(case, emulated, launches)


@pytest.mark.parametrize("case", _params(gpu.CONV_CASES, lambda c: c.dtype == F16 or c.onnx))
def test_causal_conv(case, emulated, launches):
    gpu.check_conv(case, emulated, launches)


@pytest.mark.parametrize("case", gpu.GATE_CASES, ids=lambda c: c.id)
def test_gate(case, emulated, launches):
    gpu.check_gate(case, emulated, launches)


@pytest.mark.parametrize("case", gpu.GATED_NORM_CASES, ids=lambda c: c.id)
def test_gated_norm(case, emulated, launches):
    gpu.check_gated_norm(case, emulated, launches)


@pytest.mark.parametrize("case", gpu.LP_CASES, ids=lambda c: c.id)
def test_lp_normalization(case, emulated, launches):
    gpu.check_lp(case, emulated, launches)


def test_lp_normalization_float64_runs_the_generic_kernel(emulated, launches):
    model, feeds = gpu.lp_model(gpu.LpCase((2, 3, 5), dtype=np.float64))
    gpu.check_model(model, feeds, emulated, launches, set(), "lp float64")


_ORDER_CASES = [
    gpu.LaCase((2, 4, 2, 128, 128), 3, batch=1, dtype=F16),
    gpu.LaCase((2, 2, 2, 8, 8), 5, window=3),
]


@pytest.mark.parametrize("case", _ORDER_CASES, ids=lambda c: c.id)
def test_linear_attention_barriers_hold_in_either_thread_order(case, fiber_order, launches):
    """A missing barrier around the shared tile or the token stage shows in one order."""
    gpu.check_linear_attention(case, emu.NAME, launches)


# ----------------------------------------------------------------------------- declines, errors


def _node(op, domain, attrs, dtypes, shapes=None, outputs=("y", "present_state"), opset=17):
    shapes = shapes or [None] * len(dtypes)
    ins = tuple(
        None if dt is None else ValueInfo(f"i{k}", "tensor", np.dtype(dt), s)
        for k, (dt, s) in enumerate(zip(dtypes, shapes, strict=True))
    )
    outs = tuple(ValueInfo(o, "tensor") for o in outputs)
    return NodeInfo(op, domain, op, opset, attrs, ins, outs)


LA_ATTRS = {"q_num_heads": 2, "kv_num_heads": 2}
_DECLINES = [
    (la_op.linear_attention, dict(LA_ATTRS, update_rule="mamba"), [F32] * 3, None, "update_rule"),
    (la_op.linear_attention, dict(LA_ATTRS, kv_num_heads=3), [F32] * 3, None, "divide"),
    (la_op.linear_attention, dict(LA_ATTRS, state_window=-1), [F32] * 3, None, "state_window"),
    (la_op.onnx_linear_attention, dict(LA_ATTRS, q_num_heads=1), [F32] * 3, None, "multiple"),
    (la_op.linear_attention, LA_ATTRS, [F32, F32, F32, np.float64], None, "past_state is float64"),
    (la_op.linear_attention, LA_ATTRS, [F32] * 3, [(1, 1, 2 * 1024)] + [None] * 2, "d_k 1024"),
    (gate_op.linear_attention_gate, {}, [F16, ml_dtypes.bfloat16, F32], None, "dt_bias"),
    (norm_op.gated_rms_norm, {"activation": "gelu"}, [F32] * 3, None, "activation"),
    (conv_op.causal_conv_with_state, {"ndim": 2}, [F32] * 2, None, "ndim=2"),
    (conv_op.causal_conv_with_state, {"dilation": 0}, [F32] * 2, None, "dilation"),
    (conv_op.causal_conv_with_state, {"input_channels": -1}, [F32] * 2, None, ">= 0"),
    (conv_op.onnx_causal_conv_with_state, {"activation": "relu"}, [F32] * 2, None, "relu"),
]


@pytest.mark.parametrize("builder,attrs,dtypes,shapes,reason", _DECLINES,
                         ids=[f"{d[0].__name__}-{d[4]}" for d in _DECLINES])  # fmt: skip
def test_builders_decline_with_the_reason(builder, attrs, dtypes, shapes, reason):
    """Declines come before any compilation, so they need neither a GPU nor the emulator."""
    node = _node("Op", "", attrs, dtypes, shapes)
    with pytest.raises(NotSupported, match=reason):
        builder(node, np)


def _run_error(emulated, builder, node, *args):
    run = builder(node, np)
    with pytest.raises(ValueError) as info:
        run(*args)
    return str(info.value)


def test_linear_attention_run_time_errors_name_the_input(emulated):
    q = np.zeros((1, 2, 16), F32)
    node = _node("LinearAttention", gpu.MSFT, LA_ATTRS, [F32] * 3)
    msg = _run_error(emulated, la_op.linear_attention, node, q, q, q)
    assert "decay is required for update_rule=gated_delta" in msg
    node = _node("LinearAttention", gpu.MSFT, dict(LA_ATTRS, update_rule="linear"), [F32] * 3)
    msg = _run_error(emulated, la_op.linear_attention, node, q, q[:, :1], q)
    assert "must agree in batch and sequence length" in msg
    past = np.zeros((1, 2, 8, 4), F32)  # d_v 8, not 4
    msg = _run_error(emulated, la_op.linear_attention, node, q, q, q, past)
    assert "past_state (1, 2, 8, 4) must be (batch, H_kv, d_k, d_v) = (1, 2, 8, 8)" in msg


def test_causal_conv_run_time_errors_name_the_input(emulated):
    x, w = np.zeros((1, 4, 3), F32), np.zeros((5, 1, 4), F32)
    node = _node("CausalConvWithState", gpu.MSFT, {}, [F32] * 2)
    msg = _run_error(emulated, conv_op.causal_conv_with_state, node, x, w)
    assert "weight (5, 1, 4) must hold 4 channels" in msg
    node = _node("CausalConvWithState", "", {}, [F32] * 2, opset=27)
    past = np.zeros((1, 4, 2), F32)
    msg = _run_error(emulated, conv_op.onnx_causal_conv_with_state, node, x, w[:4], None, past)
    assert "past_state (1, 4, 2) must hold batch 1, 4 channels and length 3" in msg


def test_gate_without_b_for_its_beta_output_is_an_error(emulated):
    a = np.zeros((1, 1, 4), F32)
    node = _node("LinearAttentionGate", gpu.MSFT, {}, [F32] * 3, outputs=("decay", "beta"))
    msg = _run_error(emulated, gate_op.linear_attention_gate, node, a, a[0, 0], a[0, 0])
    assert "input b is required for the beta output" in msg


# ----------------------------------------------------------------------------- launch geometry


@pytest.mark.parametrize(
    "dk,dv,heads,sms,lanes,cols",
    [
        (128, 128, 32, 132, 8, 16),  # enough heads: full 128-thread blocks
        (128, 128, 4, 132, 8, 4),  # a few heads: narrower tiles until the SMs fill
        (16, 8, 2, 1, 1, 32),  # one lane per column; a block is at least a warp
        (512, 64, 2, 1, 32, 4),
        (4, 1000, 64, 132, 1, 128),
    ],
)
def test_linear_attention_geometry(dk, dv, heads, sms, lanes, cols):
    geo = LA.la_geometry(1, heads, dk, dv, 2, dk, True, True, sms)
    assert (geo.lanes, geo.columns) == (lanes, cols)
    assert geo.block == lanes * cols and geo.block % 32 == 0 and geo.block <= LA.LA_THREADS
    assert geo.grid == heads * -(-dv // cols)
    assert dk <= lanes * LA.LA_ROWS and dk * (cols + 1) <= LA.LA_TILE
    assert 1 <= geo.tokens <= LA.LA_MAX_TOKENS
    per_token = dk * 3 + dk + 1 + cols
    assert geo.tokens * per_token <= LA.LA_STAGE


def test_linear_attention_geometry_refuses_what_does_not_fit():
    assert "above the CUDA kernel's 512" in LA.la_geometry(1, 1, 513, 8, 1, 1, True, True, 1)
    assert "exceed the kernel's" in LA.la_geometry(1, 1, 128, 8, 64, 1, True, True, 1)


# ----------------------------------------------------------------------------- the Qwen3.5 export


@pytest.fixture
def hybrid_only(emulated):
    """``cudaemu`` claiming only the hybrid ops (the rest of the CUDA library needs CuPy), so
    a whole decoder runs with these kernels emulated and every other node on the CPU."""
    from onnxep.providers import Decline, Provider, ProviderInfo, hookimpl
    from onnxep.providers.discovery import unregister_plugin
    from onnxep.providers_cuda.library import cuda_library

    name = "hybridemu"

    class _Hybrid(Provider):
        def __init__(self, options):
            super().__init__(name, options, device=name, xp=np)

        def claim(self, node):
            if (node.domain.replace("ai.onnx", ""), node.op_type) not in gpu.HYBRID_OPS:
                return Decline("only the hybrid ops are emulated")
            return super().claim(node)

    class _Plugin:
        @hookimpl
        def onnxep_provider_info(self):
            return ProviderInfo(name=name, device=name)

        @hookimpl
        def onnxep_create_provider(self, options):
            return _Hybrid(options)

        @hookimpl
        def onnxep_kernels(self, provider):
            return cuda_library() if provider.name == name else None

    plugin = _Plugin()
    onnxep.register_provider(plugin, name="hybrid-emulator")
    yield name
    unregister_plugin(plugin)


def test_qwen3_5_export_decodes_the_cpu_tokens_with_emulated_kernels(hybrid_only, launches):
    ref = json.loads((gpu.DATA / "qwen3_5_tokens.json").read_text())
    path = str(gpu.DATA / "qwen3_5_fp32" / "model.onnx")
    sess = onnxep.InferenceSession(path, providers=[hybrid_only, "cpu"])
    cpu = onnxep.InferenceSession(path, providers=["cpu"])
    placed = {n.op_type for n in sess.placement() if n.provider == hybrid_only}
    assert placed == {op for _, op in gpu.HYBRID_OPS}
    got = gpu.greedy(sess, ref["prompt"], 8, check_against=cpu)
    assert got == gpu.greedy(cpu, ref["prompt"], 8)
    assert set(launches) == {"linear_attention", "la_gate", "causal_conv_state",
                             "gated_rms_norm", "lp_normalize"}  # fmt: skip
