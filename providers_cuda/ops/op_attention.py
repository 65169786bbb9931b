"""ONNX Attention (opsets 23-25) and onnxep::Attention on CUDA: one tiled kernel, fp32 and fp16.

Semantics are the CPU kernel's (``providers/ops/op_attention.py``): 3-D inputs
split by ``q_num_heads``/``kv_num_heads``, GQA, a bool or additive mask
broadcast to (B, Hq, Sq, Skv) and padded with -inf past its columns,
bottom-right causal alignment, ``scale`` (1/sqrt(D) by default), ``softcap``,
past/present caches, ``nonpad_kv_seqlen`` (24+) and the windows (25+); a row
with no attendable key gives zeros. Sums accumulate in float32 and the
output is rounded once to the inputs' dtype.

Declined, so the CPU provider runs the node: the ``qk_matmul_output``
output, ``softmax_precision`` other than float32, inputs whose dtypes
differ, and head sizes above the kernel's limit. What this kernel accepts it
runs in one launch, plus ``att_concat`` twice when present caches are built
from past ones and ``att_reduce`` when the keys are split across blocks
(decode), without host synchronisation or cuBLAS, so it can be captured in a
CUDA graph. Float16 calls with one head size, a multiple of 16 up to 256, whose
keys are not split run the tensor-core flash kernel instead on sm_80 and later
(``_flash_prefill``); each signature's route is on the kernel (``run.routes``).
"""

from __future__ import annotations

from onnxep.errors import NotSupported
from onnxep.providers.kernel import kernel
from onnxep.providers.node import NodeInfo

from ._attention23_cuda import ATTENTION_SOURCE, KERNEL_NAMES, NAME_EXPRESSIONS
from ._attention23_step import AttentionConfig, plan_step
from ._attention_cuda import kernels_by_dtype, sm_count
from ._flash_prefill import Kernels, Route, log_route
from ._gqa_geometry import MAX_HEAD_SIZE

_FLOATS = ("float", "float16")
_DTYPES = {i: _FLOATS for i in (0, 1, 2, 4, 5)}
#: softmax_precision values computed as asked: unset, or FLOAT (1).
_SOFTMAX_FLOAT = (None, 1)
#: Planned calls kept per node (one per input signature).
_MAX_PLANS = 16


def parse_attention(node: NodeInfo, opset: int) -> AttentionConfig:
    """Attributes checked; raises NotSupported, with the reason, for what CUDA does not run."""
    op = node.op_type
    if node.has_output(3):
        mode = int(node.attr("qk_matmul_output_mode", 0))
        raise NotSupported(
            f"{op}: the qk_matmul_output output (mode {mode}) is not produced on CUDA "
            "(the CPU provider has it)"
        )
    prec = node.attr("softmax_precision", None)
    if (None if prec is None else int(prec)) not in _SOFTMAX_FLOAT:
        raise NotSupported(
            f"{op}: softmax_precision={prec} is not supported on CUDA (the softmax runs in "
            "float32 there); the CPU provider runs it"
        )
    dts = {node.input_dtype(i) for i in (0, 1, 2, 4, 5) if node.has_input(i)} - {None}
    if len(dts) > 1:
        names = ", ".join(sorted(str(d) for d in dts))
        raise NotSupported(f"{op}: Q, K, V and the past caches mix dtypes ({names})")
    for i in (0, 1, 2):
        x = node.inputs[i] if node.has_input(i) else None
        width = x.shape[-1] if x is not None and x.shape else None
        rank = len(x.shape) if x is not None and x.shape is not None else None
        if rank == 4 and isinstance(width, int) and width > MAX_HEAD_SIZE:
            raise NotSupported(
                f"{op}: head size {width} is above the CUDA kernel's {MAX_HEAD_SIZE}"
            )
    q_heads = node.attr("q_num_heads", None)
    kv_heads = node.attr("kv_num_heads", None)
    scale = node.attr("scale", None)
    return AttentionConfig(
        q_heads=None if q_heads is None else int(q_heads),
        kv_heads=None if kv_heads is None else int(kv_heads),
        scale=None if scale is None else float(scale),
        softcap=float(node.attr("softcap", 0.0)),
        causal=bool(node.attr("is_causal", 0)),
        left=int(node.attr("left_window_size", -1)) if opset >= 25 else -1,
        right=int(node.attr("right_window_size", -1)) if opset >= 25 else -1,
    )


def _build(node: NodeInfo, xp, opset: int):
    cfg = parse_attention(node, opset)
    fns_by_dtype = kernels_by_dtype(
        ATTENTION_SOURCE, KERNEL_NAMES, NAME_EXPRESSIONS, node.input_dtype(0)
    )
    sms = sm_count()
    flash = Kernels(node.op_type)
    flash.prepare(node.input_dtype(0), *_static_head_sizes(node))
    steps: dict[tuple, object] = {}
    # the kernel each signature took and why (``run.routes``), for reports
    routes: dict[tuple, Route] = {}

    def run(q, k, v, mask=None, past_k=None, past_v=None, nonpad=None):
        ins = (q, k, v, mask, past_k, past_v, nonpad)
        sig = tuple(None if a is None else (a.shape, a.dtype) for a in ins)
        step = steps.get(sig)
        if step is None:
            if len(steps) >= _MAX_PLANS:  # a growing cache makes a new signature every call
                steps.clear()
            step = steps[sig] = plan_step(cfg, fns_by_dtype, sms, xp, ins, flash)
            routes[sig] = step.route
            log_route(node.op_type, node.name, sig[0][0], step.route)
        return step(ins)

    run.routes = routes  # type: ignore[attr-defined]
    return run


def _static_head_sizes(node: NodeInfo) -> tuple[int | None, int | None]:
    """Q's and V's head sizes where the declared shapes tell them (4-D inputs, or 3-D with
    the head-count attributes), else None."""
    sizes = []
    for i, attr in ((0, "q_num_heads"), (2, "kv_num_heads")):
        x = node.inputs[i] if node.has_input(i) else None
        shape = x.shape if x is not None else None
        width = shape[-1] if shape else None
        heads = node.attr(attr, None)
        if not isinstance(width, int):
            sizes.append(None)
        elif len(shape) == 4:
            sizes.append(width)
        else:
            ok = heads is not None and int(heads) > 0 and width % int(heads) == 0
            sizes.append(width // int(heads) if ok else None)
    return sizes[0], sizes[1]


@kernel("Attention", since=(23, 24, 25), dtypes=_DTYPES, capture_safe=True)
def attention(node: NodeInfo, xp):
    return _build(node, xp, node.opset)


@kernel("Attention", since=1, domain="onnxep", dtypes=_DTYPES, capture_safe=True)
def onnxep_attention(node: NodeInfo, xp):
    """onnxep::Attention has exactly Attention-23's contract."""
    return _build(node, xp, 23)
