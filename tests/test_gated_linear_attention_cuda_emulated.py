"""onnxep::GatedLinearAttention's CUDA kernel, run on the CPU through the g++ kernel emulator.

Each case runs the CUDA builder (NumPy arrays, the CUDA C compiled by
tests/cuda_emulator.py, which reports barrier and shuffle misuse and
out-of-bounds writes) and compares it with the op's generic CPU kernel at the
project's per-dtype tolerances; and with the unfused CUDA kernels run one after
the other (``la_gate``, ``lp_normalize``, the q scale, ``linear_attention``),
which it must equal bit for bit where the norm's warp path applies (d_k <= 256).
"""

from __future__ import annotations

from dataclasses import dataclass

import cuda_emulator as emu
import numpy as np
import pytest

from onnxep.providers.node import NodeInfo, ValueInfo
from onnxep.providers.ops import op_onnxep_gated_linear_attention as generic
from onnxep.providers_cuda.ops import op_linear_attention as la_op
from onnxep.providers_cuda.ops import op_linear_attention_gate as gate_op
from onnxep.providers_cuda.ops import op_lp_normalization as lp_op
from onnxep.providers_cuda.ops import op_onnxep_gated_linear_attention as fused_op
from onnxep.testing import TOLERANCES

F32, F16 = np.float32, np.float16


@dataclass(frozen=True)
class Case:
    dtype: type = F32
    rule: str = "gated_delta"
    t: int = 3
    hq: int = 2
    hkv: int = 2
    dk: int = 16
    dv: int = 8
    per_key: bool = False  # decay per key dimension (H_kv * d_k) instead of per head
    qnorm: bool = True
    knorm: bool = True
    qscale: float = 0.25
    past: bool = True

    @property
    def id(self) -> str:
        norms = ("q" if self.qnorm else "") + ("k" if self.knorm else "") or "none"
        return (
            f"{np.dtype(self.dtype).name}-{self.rule}-t{self.t}-h{self.hq}x{self.hkv}-dk{self.dk}"
            f"-dv{self.dv}-{'gk' if self.per_key else 'gh'}-norm_{norms}-s{self.qscale}"
            f"{'' if self.past else '-nopast'}"
        )


CASES = [
    Case(),
    Case(F16),
    Case(F16, "gated", t=1),
    Case(t=1, hq=4, hkv=2, per_key=True),
    Case(F16, t=37, dk=32, dv=64),  # more tokens than one stage holds
    Case(qnorm=False, knorm=False, qscale=1.0, past=False),
    Case(F16, qnorm=True, knorm=False, qscale=1.0, hq=2, hkv=4),  # inverse GQA
]


def _node(case: Case) -> NodeInfo:
    attrs = {"q_num_heads": case.hq, "kv_num_heads": case.hkv, "update_rule": case.rule,
             "scale": 1.0, "q_l2_norm": int(case.qnorm), "k_l2_norm": int(case.knorm),
             "q_scale": case.qscale}  # fmt: skip
    return NodeInfo("GatedLinearAttention", "onnxep", "gla", 1, attrs, (),
                    (ValueInfo("y"), ValueInfo("present")))  # fmt: skip


def _inputs(case: Case, seed: int = 0) -> tuple:
    rng = np.random.default_rng(seed)
    b, hk = 1, max(case.hkv, 1)
    g = hk * (case.dk if case.per_key else 1)

    def r(*shape, s=1.0):
        return (rng.standard_normal(shape) * s).astype(case.dtype)

    q = r(b, case.t, case.hq * case.dk)
    k = r(b, case.t, hk * case.dk)
    v = r(b, case.t, hk * case.dv)
    past = r(b, hk, case.dk, case.dv, s=0.3) if case.past else None
    a = r(b, case.t, g)
    dt_bias = rng.uniform(-0.5, 0.5, g).astype(F32)  # float32, as float16 exports keep them
    decay_scale = (-np.exp(rng.uniform(-1, 0.3, g))).astype(F32)
    beta_in = r(b, case.t, hk)
    return q, k, v, past, a, dt_bias, decay_scale, beta_in


def _unfused(case: Case, ins: tuple) -> tuple:
    """The CUDA kernels the fusion replaces, one after the other (emulated)."""
    q, k, v, past, a, dt_bias, decay_scale, b = ins
    gate = NodeInfo("LinearAttentionGate", "com.microsoft", "gate", 1, {}, (),
                    (ValueInfo("decay"), ValueInfo("beta")))  # fmt: skip
    decay, beta = gate_op.linear_attention_gate(gate, np)(a, dt_bias, decay_scale, b)
    x_info = ValueInfo("x", "tensor", np.dtype(case.dtype), (1, case.t, -1, case.dk))
    lp_node = NodeInfo("LpNormalization", "", "lp", 22, {"axis": -1, "p": 2}, (x_info,),
                       (ValueInfo("n"),))  # fmt: skip
    lp = lp_op.lp_normalization(lp_node, np)

    def norm(x):
        bsz, t, w = x.shape
        return lp(x.reshape(bsz, t, w // case.dk, case.dk))[0].reshape(bsz, t, w)

    if case.qnorm:
        q = norm(q)
    if case.qscale != 1.0:
        q = q * np.asarray(case.qscale, q.dtype)
    if case.knorm:
        k = norm(k)
    attrs = {"q_num_heads": case.hq, "kv_num_heads": case.hkv, "update_rule": case.rule,
             "scale": 1.0}  # fmt: skip
    la = NodeInfo("LinearAttention", "com.microsoft", "la", 1, attrs, (),
                  (ValueInfo("y"), ValueInfo("present")))  # fmt: skip
    return la_op.linear_attention(la, np)(q, k, v, past, decay, beta)


@pytest.fixture(scope="module")
def provider():
    with emu.registered() as name:
        yield name


@pytest.fixture
def emulated(provider, monkeypatch):
    emu.install(monkeypatch)


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_fused_kernel_matches_the_cpu_and_the_unfused_kernels(case, emulated):
    node = _node(case)
    ins = _inputs(case)
    got = fused_op.gated_linear_attention(node, np)(*ins)
    want = generic.gated_linear_attention(node, np)(*ins)
    atol, rtol = TOLERANCES[np.dtype(case.dtype)]
    for name, g, w in zip(("output", "present_state"), got, want, strict=True):
        assert g.dtype == w.dtype and g.shape == w.shape, name
        np.testing.assert_allclose(g, w, rtol=rtol, atol=atol, err_msg=f"{case.id} {name}")
    if case.dk <= 256:
        for name, g, w in zip(("output", "present_state"), got, _unfused(case, ins), strict=True):
            np.testing.assert_array_equal(g, w, err_msg=f"{case.id} {name} (unfused CUDA)")


def test_refusals_name_what_is_wrong(emulated):
    from onnxep.errors import NotSupported

    node = _node(Case())
    node.attrs["update_rule"] = "delta"
    with pytest.raises(NotSupported, match="update_rule 'delta'"):
        fused_op.gated_linear_attention(node, np)
    case = Case()
    ins = list(_inputs(case))
    ins[5] = ins[5][:1]  # one dt_bias value for two heads
    with pytest.raises(ValueError, match="dt_bias"):
        fused_op.gated_linear_attention(_node(case), np)(*ins)
