"""onnxep::GatedLinearAttention on CUDA: the fused kernel, and the fusions on real graphs.

The kernel cases run the CUDA builder and compare it with the op's generic
CPU kernel at the project's per-dtype tolerances, and with the unfused CUDA
kernels run one after the other (``la_gate``, ``lp_normalize``, the q scale,
``linear_attention``), which it must equal bit for bit where the norm's warp
path applies (d_k <= 256). tests/test_gated_linear_attention_cuda_emulated.py
runs the same cases through the CPU emulator of the kernels. Below them: the
fusions (``fuse_linear_attention_gates``, ``fuse_linear_attention_l2_norm``,
which must be in ``standard_fusions()``) on a hand-built layer and on the
tiny hybrid decoder, fused on the GPU against the unfused CPU run.
"""

from __future__ import annotations

from dataclasses import dataclass

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
    Case(F16, qnorm=False, knorm=True, qscale=0.5),  # a scale without the norm
    Case(t=2, dk=320, dv=8),  # a norm past lp_normalize's warp rows: within tolerance only
]


def gla_node(case: Case) -> NodeInfo:
    attrs = {"q_num_heads": case.hq, "kv_num_heads": case.hkv, "update_rule": case.rule,
             "scale": 1.0, "q_l2_norm": int(case.qnorm), "k_l2_norm": int(case.knorm),
             "q_scale": case.qscale}  # fmt: skip
    return NodeInfo("GatedLinearAttention", "onnxep", "gla", 1, attrs, (),
                    (ValueInfo("y"), ValueInfo("present")))  # fmt: skip


def inputs(case: Case, seed: int = 0) -> tuple:
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


def _unfused(case: Case, ins: tuple, xp) -> tuple:
    """The CUDA kernels the fusion replaces, one after the other (emulated)."""
    q, k, v, past, a, dt_bias, decay_scale, b = ins
    gate = NodeInfo("LinearAttentionGate", "com.microsoft", "gate", 1, {}, (),
                    (ValueInfo("decay"), ValueInfo("beta")))  # fmt: skip
    decay, beta = gate_op.linear_attention_gate(gate, xp)(a, dt_bias, decay_scale, b)
    x_info = ValueInfo("x", "tensor", np.dtype(case.dtype), (1, case.t, -1, case.dk))
    lp_node = NodeInfo("LpNormalization", "", "lp", 22, {"axis": -1, "p": 2}, (x_info,),
                       (ValueInfo("n"),))  # fmt: skip
    lp = lp_op.lp_normalization(lp_node, xp)

    def norm(x):
        bsz, t, w = x.shape
        return lp(x.reshape(bsz, t, w // case.dk, case.dk))[0].reshape(bsz, t, w)

    if case.qnorm:
        q = norm(q)
    if case.qscale != 1.0:
        q = q * xp.asarray(case.qscale, q.dtype)
    if case.knorm:
        k = norm(k)
    attrs = {"q_num_heads": case.hq, "kv_num_heads": case.hkv, "update_rule": case.rule,
             "scale": 1.0}  # fmt: skip
    la = NodeInfo("LinearAttention", "com.microsoft", "la", 1, attrs, (),
                  (ValueInfo("y"), ValueInfo("present")))  # fmt: skip
    return la_op.linear_attention(la, xp)(q, k, v, past, decay, beta)


def check_fused(case: Case, xp, to_host=np.asarray) -> None:
    """The fused kernel on ``xp``'s arrays against the generic CPU kernel (tolerance) and the
    unfused CUDA kernels (bit for bit where d_k <= 256)."""
    node = gla_node(case)
    host = inputs(case)
    dev = tuple(None if a is None else xp.asarray(a) for a in host)
    got = [to_host(g) for g in fused_op.gated_linear_attention(node, xp)(*dev)]
    want = generic.gated_linear_attention(node, np)(*host)
    atol, rtol = TOLERANCES[np.dtype(case.dtype)]
    for name, g, w in zip(("output", "present_state"), got, want, strict=True):
        assert g.dtype == w.dtype and g.shape == w.shape, name
        np.testing.assert_allclose(g, w, rtol=rtol, atol=atol, err_msg=f"{case.id} {name}")
    if case.dk <= 256:
        plain = [to_host(u) for u in _unfused(case, dev, xp)]
        for name, g, w in zip(("output", "present_state"), got, plain, strict=True):
            np.testing.assert_array_equal(g, w, err_msg=f"{case.id} {name} (unfused CUDA)")


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_fused_kernel_matches_the_cpu_and_the_unfused_kernels(case):
    import cupy

    check_fused(case, cupy, cupy.asnumpy)


# ----------------------------------------------------------------------------- the fusions


def _passes_on() -> None:
    from onnxep.providers.fusions import standard_fusions

    names = {p.name for p in standard_fusions()}
    missing = {"fuse_linear_attention_gates", "fuse_linear_attention_l2_norm"} - names
    assert not missing, f"not in standard_fusions(): {sorted(missing)}"


@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_fused_layer_on_cuda_matches_the_unfused_cpu(dtype):
    from onnx import TensorProto
    from test_fusions_linear_attention import la_feeds, la_model

    import onnxep

    _passes_on()
    model = la_model(TensorProto.FLOAT if dtype == "float32" else TensorProto.FLOAT16)
    opts = onnxep.SessionOptions(disable_fallback=True)
    fused = onnxep.InferenceSession(model, opts, providers=["cuda"])
    placed = [(n.op_type, n.provider) for n in fused.placement()]
    assert ("GatedLinearAttention", "cuda") in placed, fused.placement().format()
    cpu = onnxep.InferenceSession(model, providers=["cpu"])
    feeds = la_feeds(model)
    atol, rtol = TOLERANCES[np.dtype(dtype)]
    for arg, g, w in zip(fused.get_outputs(), fused.run(None, feeds), cpu.run(None, feeds),
                         strict=True):  # fmt: skip
        np.testing.assert_allclose(g, w, rtol=rtol, atol=atol, err_msg=arg.name)


def test_tiny_hybrid_decoder_fuses_and_matches_the_cpu():
    from conftest import exported_feeds

    import onnxep
    from bench.factory.hybrid import build_hybrid_decoder

    _passes_on()
    model = build_hybrid_decoder("tiny")
    layers = sum(1 for n in model.graph.node if n.op_type == "LinearAttention")
    fused = onnxep.InferenceSession(model, providers=["cuda", "cpu"])
    on_cuda = [n for n in fused.placement() if n.op_type == "GatedLinearAttention"]
    assert len(on_cuda) == layers and all(n.provider == "cuda" for n in on_cuda)
    cpu = onnxep.InferenceSession(model, providers=["cpu"])
    dims = {"batch_size": 1, "sequence_length": 4, "past_sequence_length": 3,
            "total_sequence_length": 7}  # fmt: skip
    feeds = exported_feeds(fused, dims, np.random.default_rng(0), 100)
    atol, rtol = TOLERANCES[np.dtype(np.float32)]
    for arg, g, w in zip(fused.get_outputs(), fused.run(None, feeds), cpu.run(None, feeds),
                         strict=True):  # fmt: skip
        np.testing.assert_allclose(g, w, rtol=rtol, atol=atol, err_msg=arg.name)
