"""onnxep::GatedLinearAttention on CUDA: LinearAttention, its gates and q/k L2 norms in one launch.

The op (``providers/ops/op_onnxep_gated_linear_attention.py``) is what
``fuse_linear_attention_gates`` and ``fuse_linear_attention_l2_norm`` make of
``LinearAttentionGate`` (or its primitives), the per-head ``LpNormalization``
of q and k and com.microsoft ``LinearAttention``. The launch is
LinearAttention's (``op_linear_attention.plan_launch``, with a's shape for the
decay and b's for beta); the kernel (``gated_linear_attention_cuda``) computes
the gates and norms while it stages each token. Present overwrites the past
state when the caller gave that buffer up for the run (``onnxep.providers.inplace``,
as LinearAttention does: the kernel reads each state tile before writing it),
else it is a fresh buffer. Inputs are checked and arguments built once per
input signature, so a call only allocates the outputs and launches, and can
be captured.
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any

import numpy as np

from onnxep.errors import NotSupported
from onnxep.providers.kernel import kernel
from onnxep.providers.node import NodeInfo
from onnxep.providers.ops.op_onnxep_gated_linear_attention import gated_rule

from . import reduce_cuda as K
from .gated_linear_attention_cuda import GLA_BODY, GLA_NAMES
from .hybrid_cuda import F16, contiguity_test, contiguous, float_refusal, signature
from .op_linear_attention import LaConfig, LaLaunch, parse_config, plan_launch, step_outputs

_OP = "onnxep::GatedLinearAttention"
_INPUTS = ("query", "key", "value", "past_state", "a", "dt_bias", "decay_scale", "b")


def plan_gated(cfg: LaConfig, node: NodeInfo, sig: tuple, sms: int, norms: tuple) -> LaLaunch:
    """LinearAttention's launch for the gates' shapes, with this kernel's arguments."""
    q, k, v, past, a, bias, scale, b = sig
    if a is None or bias is None or scale is None:
        raise ValueError(f"{_OP}: inputs a, dt_bias and decay_scale are required")
    h = a[0][-1] if a[0] else 0
    for name, meta in (("dt_bias", bias), ("decay_scale", scale)):
        if math.prod(meta[0]) != h:
            raise ValueError(f"{_OP}: {name} {meta[0]} must hold one value per last dim of a ({h})")
    for name, meta in zip(_INPUTS, sig, strict=True):
        why = float_refusal(_OP, name, None if meta is None else meta[1])
        if why:
            raise ValueError(why)
    la = plan_launch(cfg, node, (q, k, v, past, a, b if cfg.delta else None), sms)
    qnorm, knorm, qscale = norms
    types = int(la.args[-1])
    for bit, meta in ((8, bias), (9, scale)):
        if np.dtype(meta[1]) == F16:
            types |= 1 << bit
    i32 = np.int32
    # LinearAttention's arguments up to the scale, then this kernel's flags.
    args = (*la.args[:18], i32(cfg.delta), i32(qnorm), i32(knorm), np.float32(qscale),
            i32(types))  # fmt: skip
    return replace(la, args=args)  # the arguments after this kernel's ten pointers


@kernel("GatedLinearAttention", domain="onnxep", dtypes={0: ("float", "float16")},
        inplace=((3, 1),), capture_safe=True)  # fmt: skip
def gated_linear_attention(node: NodeInfo, xp: Any):
    gated_rule(node)
    cfg = parse_config(node, onnx=False)
    for i, name in enumerate(_INPUTS):
        why = float_refusal(_OP, name, node.input_dtype(i))
        if why:
            raise NotSupported(why)
    norms = (int(node.attr("q_l2_norm", 0)), int(node.attr("k_l2_norm", 0)),
             float(node.attr("q_scale", 1.0)))  # fmt: skip
    fn = K.compile_kernels(GLA_BODY, GLA_NAMES)["gated_linear_attention"]
    sms = K.sm_count()
    plans = K.PlanCache(lambda *sig: plan_gated(cfg, node, sig, sms, norms))
    is_contiguous = contiguity_test(xp)
    delta = cfg.delta
    name = node.name

    def run(query, key, value, past_state=None, a=None, dt_bias=None, decay_scale=None, b=None):
        b = b if delta else None
        ins = (query, key, value, past_state, a, dt_bias, decay_scale, b)
        plan = plans(*signature(ins))
        ins = contiguous(xp, is_contiguous, ins)
        y, present = step_outputs(xp, plan, cfg, name, ins[3])
        if plan.grid[0]:
            fn(plan.grid, plan.block, (*ins, y, present, *plan.args))
        return (y, present)[: plan.width]

    return run
