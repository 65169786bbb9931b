"""com.microsoft QMoE: MoE whose expert weights are 2-, 4- or 8-bit integers.

The ``quant_type='int'`` form: each expert's FC weight is [N, K] packed along K as
MatMulNBits packs it (low-order bits first), with one scale per row (``block_size``
omitted) or per ``block_size`` elements of a row, and zero points packed the same way
(per row: packed along N) or, without them, 2^(bits-1). Routing, activations and mixing
are MoE's; ``router_weights`` (input 14), when given, supplies the mixing weights while
``router_probs`` still picks the experts. As onnxruntime's CPU kernel, block-wise 8-bit
experts (and 4-bit ones at ``accuracy_level=4``) multiply activations rounded to int8 per
block of K, not the float activations.

Declined with a reason: the fp4, nvfp4, fp8 and wfp4afp8 types, 3-bit weights, and
prepacked layouts other than onnxruntime's CPU one.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from onnxep.errors import InvalidArgument, NotSupported
from onnxep.providers.kernel import kernel
from onnxep.providers.ops._contrib import dequantize_nbits, int8_blocks, unpack_bits

from ._misc import to_str
from ._moe import MoeSpec, check_experts, linear, mixture

_FC = ("fc1", "fc2", "fc3")


@kernel("QMoE", since=1, domain="com.microsoft", dtypes={0: ("float", "float16", "bfloat16")})
def qmoe(node: Any, xp: Any):
    spec = MoeSpec(node)
    op = spec.op
    quant = to_str(node.attr("quant_type", "int"))
    if quant != "int":
        raise NotSupported(
            f"{op}: quant_type {quant!r} is not supported on the CPU provider (only 'int')"
        )
    base_bits = int(node.attr("expert_weight_bits", 4))
    bits = {}
    for fc in _FC:
        b = node.attr(f"{fc}_expert_weight_bits", None)
        bits[fc] = base_bits if b is None else int(b)
        if bits[fc] not in (2, 4, 8):
            raise NotSupported(
                f"{op}: {fc} weights of {bits[fc]} bits are not supported (2, 4 or 8)"
            )
    block = int(node.attr("block_size", 0) or 0)
    if block and (block < 16 or block & (block - 1)):
        raise NotSupported(f"{op}: block_size {block} must be a power of two of at least 16")
    level4 = int(node.attr("accuracy_level", 0) or 0) == 4
    int8_acts = {fc: bool(block) and (bits[fc] == 8 or (level4 and bits[fc] == 4)) for fc in _FC}
    cache: dict = {}

    def dequant(fc, e, w, scales, zps, k):
        """Expert ``e``'s [N, K] float32 weight of ``fc``."""
        key = (fc, e)
        hit = cache.get(key)
        if hit is not None and hit[0] is w and hit[1] is scales and hit[2] is zps:
            return hit[3]
        nb = bits[fc]
        n = w.shape[1]
        if w.shape[2] * 8 != k * nb:
            raise InvalidArgument(
                f"{op}: {fc}_experts_weights has {w.shape[2]} bytes a row, {k} {nb}-bit values "
                f"need {k * nb // 8}"
            )
        if scales is None:
            raise InvalidArgument(f"{op}: {fc}_scales is required for integer weights")
        bs = block or k
        zp = zps[e] if zps is not None else None
        if zp is not None and not block:
            # one zero point per row, packed along N
            zp = unpack_bits(zp.reshape(-1), nb, np)[:n].astype(np.float32).reshape(n, 1)
        s = scales[e].reshape(n, -1)
        wf = dequantize_nbits(
            w[e], s, zp, None, n=n, k=k, bits=nb, block_size=bs, dtype=np.float32, xp=np
        )
        cache[key] = (w, scales, zps, wf)  # holding them keeps the identities valid
        return wf

    def run(
        x,
        probs,
        w1,
        s1=None,
        b1=None,
        w2=None,
        s2=None,
        b2=None,
        w3=None,
        s3=None,
        b3=None,
        z1=None,
        z2=None,
        z3=None,
        router_weights=None,
        *unused,
    ):
        if any(t is not None for t in unused):
            raise NotSupported(f"{op}: the fp4/fp8 global and activation scales are not supported")
        experts = probs.shape[-1]
        hidden = x.shape[-1]
        for what, t in (("fc1_experts_weights", w1), ("fc2_experts_weights", w2)):
            check_experts(op, what, t, experts)
        inter = w2.shape[2] * 8 // bits["fc2"]

        def fc(name, rows, e, w, scales, zps, bias, k):
            inputs = int8_blocks(rows, block, np) if int8_acts[name] else rows
            return linear(
                inputs, dequant(name, e, w, scales, zps, k), None if bias is None else bias[e]
            )

        def expert(e, rows):
            h = fc("fc1", rows, e, w1, s1, z1, b1, hidden)
            up = None
            if spec.act == "swiglu" and not spec.fused and w3 is not None:
                up = fc("fc3", rows, e, w3, s3, z3, b3, hidden)
            return fc("fc2", spec.activate(h, up), e, w2, s2, z2, b2, inter)

        return (mixture(spec, x, probs, expert, router_weights),)

    return run
