"""com.microsoft GroupQueryAttention on CUDA: prefill and fused split-K decode, fp32 and fp16.

Semantics are the CPU kernel's (``providers/ops/op_group_query_attention.py``):
per batch row ``T = seqlens_k[b] + 1`` tokens are valid after the step,
``Q = min(S, T)`` (or ``query_seqlens[b]``) are new, written to cache rows
``[T - Q, T)``; the causal mask, the local window and rotary positions follow
from there. ``seqlens_k``, ``query_seqlens`` and ``position_ids`` are read on
the device only (a position id outside the cos/sin cache, which the CPU
refuses, gives NaN rotated channels: the device cannot raise).

``total_sequence_length`` is a host input, as in onnxruntime's CUDA kernel
(real exports compute it from the attention mask's shape, so it costs no
device read): it sizes the present cache exactly as the CPU kernel and
onnxruntime do, ``max(total, past capacity)``, and bounds the keys read.
When that equals the past buffer's capacity the present cache IS the past
buffer (onnxruntime's past_present_share_buffer): the new rows are written
into it in place and it is returned as present, so a fixed-capacity decode
loop moves only the new rows. Otherwise a fresh cache is filled from the past.

A single-token (decode) step is one launch, ``gqa_decode`` (rotary, cache
write, split-K attention and the merge of the splits fused); a longer step is
two (prepare, prefill): float16 head sizes that are multiples of 16 up to 256
take the tensor-core flash kernel on sm_80 and later (``_flash_prefill``), the
rest the tiled kernel, and the route of each signature is on the kernel
(``run.routes``, logged at debug level). A fresh cache adds one fill. Nothing synchronizes or
reads device memory on the host, so the step can be captured in a CUDA graph.
"""

from __future__ import annotations

from dataclasses import dataclass

from onnxep.errors import NotSupported
from onnxep.providers.kernel import kernel
from onnxep.providers.node import NodeInfo

from ._attention_cuda import kernels_by_dtype, sm_count
from ._flash_prefill import Kernels, Route, log_route
from ._gqa_cuda import GQA_SOURCE, KERNEL_NAMES, NAME_EXPRESSIONS
from ._gqa_geometry import MAX_HEAD_SIZE
from ._gqa_step import host_total, plan_step

_UNSUPPORTED_INPUTS = {12: "k_scale", 13: "v_scale", 14: "q_norm_weight", 15: "k_norm_weight"}
_OP = "GroupQueryAttention"
#: Planned steps kept per node (one per input signature).
_MAX_PLANS = 16


@dataclass(frozen=True)
class GqaConfig:
    """The node's attributes, parsed once."""

    num_heads: int
    kv_num_heads: int
    scale: float  # 0: 1/sqrt(head_size)
    softcap: float
    window: int  # -1: no local window
    causal: bool
    do_rotary: bool
    interleaved: bool
    smooth: bool


def parse_gqa(node: NodeInfo) -> GqaConfig:
    """Attributes checked; raises NotSupported, with the reason, for what CUDA cannot run."""
    nh = int(node.attr("num_heads"))
    nkv = int(node.attr("kv_num_heads"))
    if nh <= 0 or nkv <= 0 or nh % nkv:
        raise NotSupported(
            f"{_OP}: num_heads {nh} must be a positive multiple of kv_num_heads {nkv}"
        )
    if node.attr("sliding_window_cache", 0):
        raise NotSupported(f"{_OP}: sliding_window_cache=1 is not supported")
    for i, name in _UNSUPPORTED_INPUTS.items():
        if node.has_input(i):
            raise NotSupported(f"{_OP}: input {name} (quantized cache / QK norm) is not supported")
    for attr in ("k_quant_type", "v_quant_type"):
        q = node.attr(attr, "NONE")
        if (q.decode() if isinstance(q, bytes) else q) != "NONE":
            raise NotSupported(f"{_OP}: {attr} (quantized KV cache) is not supported")
    if node.has_output(3):
        raise NotSupported(f"{_OP}: output_qk is not produced on CUDA (the CPU provider has it)")
    return GqaConfig(
        num_heads=nh,
        kv_num_heads=nkv,
        scale=float(node.attr("scale", 0.0)),
        softcap=float(node.attr("softcap", 0.0)),
        window=int(node.attr("local_window_size", -1)),
        causal=bool(node.attr("causal", 1)),
        do_rotary=bool(node.attr("do_rotary", 0)),
        interleaved=bool(node.attr("rotary_interleaved", 0)),
        smooth=bool(node.attr("smooth_softmax", 0)),
    )


def static_head_size(node: NodeInfo, cfg: GqaConfig) -> int | None:
    """Head size from the query's declared width, when it is a known integer."""
    q = node.inputs[0] if node.inputs else None
    width = q.shape[-1] if q is not None and q.shape else None
    if not isinstance(width, int):
        return None
    heads = cfg.num_heads if node.has_input(1) else cfg.num_heads + 2 * cfg.kv_num_heads
    return width // heads if width % heads == 0 else None


@kernel(
    _OP,
    since=1,
    domain="com.microsoft",
    dtypes={0: ("float", "float16")},
    host_inputs=(6,),
    inplace=((3, 1), (4, 2)),
    capture_safe=True,
)
def group_query_attention(node: NodeInfo, xp):
    cfg = parse_gqa(node)
    hd = static_head_size(node, cfg)
    if hd is not None and hd > MAX_HEAD_SIZE:
        raise NotSupported(f"{_OP}: head size {hd} is above the CUDA kernel's {MAX_HEAD_SIZE}")
    fns_by_dtype = kernels_by_dtype(GQA_SOURCE, KERNEL_NAMES, NAME_EXPRESSIONS, node.input_dtype(0))
    sms = sm_count()
    flash = Kernels(_OP)
    flash.prepare(node.input_dtype(0), hd)
    steps: dict[tuple, object] = {}
    # the prefill kernel each signature took and why (``run.routes``), for reports
    routes: dict[tuple, Route] = {}

    def run(
        query,
        key=None,
        value=None,
        past_k=None,
        past_v=None,
        seqlens_k=None,
        total_len=None,
        cos=None,
        sin=None,
        position_ids=None,
        attn_bias=None,
        head_sink=None,
        *rest,
    ):
        qseq = rest[4] if len(rest) > 4 else None  # input 16
        ins = [query, key, value, past_k, past_v, seqlens_k, cos, sin, position_ids, attn_bias,
               head_sink, qseq]  # fmt: skip
        total = host_total(total_len)
        sig = (total, *[None if a is None else (a.shape, a.dtype) for a in ins])
        step = steps.get(sig)
        if step is None:
            if len(steps) >= _MAX_PLANS:  # a growing cache makes a new signature every step
                steps.clear()
            step = steps[sig] = plan_step(cfg, fns_by_dtype, sms, xp, total, ins, flash)
            if step.route is not None:
                routes[sig] = step.route
                log_route(_OP, node.name, sig[1][0] if sig[1] else None, step.route)
        return step(ins)

    run.routes = routes  # type: ignore[attr-defined]
    return run
