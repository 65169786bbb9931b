"""LinearAttention on CUDA (com.microsoft, and ONNX's from opset 27): one launch per step.

The semantics are the CPU kernels' (``providers/ops/op_linear_attention.py``
and ``op_onnx_linear_attention.py``): the linear, gated, delta and
gated-delta recurrences over a (d_k, d_v) state per KV head, grouped query
heads (and, in com.microsoft, fewer query than KV heads, fewer key heads
than KV heads, and ``state_window``). The CPU runs long prefills
chunk-parallel; this kernel runs every step as the recurrence, token by
token (``linear_attention_cuda``), which is the same function.

The present state overwrites the past one when the caller gave that buffer
up for the run (``onnxep.providers.inplace``: IO binding bound it as both
the past input and the present output, as ``onnxep.generate`` does): the
kernel is alias-safe (each block reads its state tile before writing it, no
``__restrict__`` on the pair), so a decode step updates the state where it
is and a captured graph replays that update. Otherwise, and with
``state_window`` (whose present is a shifted window of the past), present is
a fresh buffer.

Inputs are checked and launch arguments built once per input signature; a
call only allocates the outputs and launches, so it can be captured in a
CUDA graph.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from onnxep.errors import NotSupported
from onnxep.providers.inplace import may_overwrite
from onnxep.providers.kernel import kernel
from onnxep.providers.node import NodeInfo

from . import reduce_cuda as K
from .hybrid_cuda import FLOATS, contiguity_test, contiguous, float_refusal, signature, type_bits
from .linear_attention_cuda import MAX_DK, la_geometry, la_kernel

_OP = "LinearAttention"
_RULES = ("linear", "gated", "delta", "gated_delta")
_INPUTS = ("query", "key", "value", "past_state", "decay", "beta")
_FLOAT_NAMES = ("float", "float16")


@dataclass(frozen=True)
class LaConfig:
    """The node's attributes, parsed once."""

    hq: int
    hkv: int
    rule: str
    scale: float  # 0: 1/sqrt(d_k)
    window: int
    onnx: bool  # the ONNX op: key heads == KV heads, q heads a multiple of them, no window

    @property
    def gated(self) -> bool:
        return self.rule in ("gated", "gated_delta")

    @property
    def delta(self) -> bool:
        return self.rule in ("delta", "gated_delta")


def parse_config(node: NodeInfo, onnx: bool) -> LaConfig:
    hq = int(node.attr("q_num_heads"))
    hkv = int(node.attr("kv_num_heads"))
    if hq <= 0 or hkv <= 0:
        raise NotSupported(f"{_OP}: q_num_heads and kv_num_heads must be positive")
    if onnx and hq % hkv:
        raise NotSupported(f"{_OP}: q_num_heads {hq} must be a multiple of kv_num_heads {hkv}")
    if max(hq, hkv) % min(hq, hkv):
        raise NotSupported(
            f"{_OP}: q_num_heads={hq} and kv_num_heads={hkv} must divide one another"
        )
    rule = node.attr("update_rule", "gated_delta")
    rule = rule.decode() if isinstance(rule, bytes) else str(rule)
    if rule not in _RULES:
        raise NotSupported(f"{_OP}: update_rule {rule!r} is not one of {', '.join(_RULES)}")
    window = 0 if onnx else int(node.attr("state_window", 0))
    if window < 0:
        raise NotSupported(f"{_OP}: state_window must be >= 0, got {window}")
    return LaConfig(hq, hkv, rule, float(node.attr("scale", 0.0)), window, onnx)


def _static_refusal(node: NodeInfo, cfg: LaConfig) -> str | None:
    """What the node's declared types and sizes already rule out."""
    for i, name in enumerate(_INPUTS):
        why = float_refusal(_OP, name, node.input_dtype(i))
        if why:
            return why
    if node.has_output(1):
        why = float_refusal(_OP, "present_state", node.outputs[1].dtype)
        if why:
            return why
    q = node.inputs[0] if node.inputs else None
    width = q.shape[-1] if q is not None and q.shape else None
    if isinstance(width, int) and width % cfg.hq == 0 and width // cfg.hq > MAX_DK:
        return f"{_OP}: head size d_k {width // cfg.hq} is above the CUDA kernel's {MAX_DK}"
    return None


@dataclass(frozen=True)
class LaLaunch:
    """Everything about one input signature: output shapes and dtypes, the launch."""

    y_shape: tuple[int, ...]
    y_dtype: np.dtype
    state_shape: tuple[int, ...]
    state_dtype: np.dtype
    grid: tuple[int]
    block: tuple[int]
    args: tuple  # the kernel's arguments after the eight pointers
    width: int  # outputs the node has (at least 1)


def _fail(msg: str) -> None:
    raise ValueError(f"{_OP}: {msg}")


def plan_launch(cfg: LaConfig, node: NodeInfo, sig: tuple, sms: int) -> LaLaunch:
    """Check one input signature as the CPU kernel does, and build its launch."""
    for name, meta in zip(_INPUTS, sig, strict=True):
        if meta is not None and meta[1] not in FLOATS:
            _fail(f"{name} is {meta[1]}; the CUDA kernel takes float32 and float16")
    (qs, qdt), (ks, _), (vs, _), past, decay, beta = sig
    for name, shp in (("query", qs), ("key", ks), ("value", vs)):
        if len(shp) != 3:
            _fail(f"{name} must be 3-D (batch, sequence, heads * size), got shape {shp}")
    if not qs[:2] == ks[:2] == vs[:2]:
        _fail(f"query {qs}, key {ks} and value {vs} must agree in batch and sequence length")
    bsz, seq, qh = qs
    hq, hkv = cfg.hq, cfg.hkv
    dk = qh // hq
    if dk * hq != qh or dk == 0:
        _fail(f"query hidden {qh} is not a positive multiple of q_num_heads {hq}")
    nk = ks[2] // dk
    dv = vs[2] // hkv
    if nk * dk != ks[2] or dv * hkv != vs[2] or nk == 0 or hkv % nk:
        _fail("key/value hidden sizes do not fit the head counts")
    if cfg.onnx and nk != hkv:
        _fail(f"key hidden {ks[2]} must be kv_num_heads {hkv} times d_k {dk}")
    if cfg.gated and decay is None:
        _fail(f"decay is required for update_rule={cfg.rule}")
    if cfg.delta and beta is None:
        _fail(f"beta is required for update_rule={cfg.rule}")
    gw = bw = 1
    if cfg.gated:
        ds = decay[0]
        if len(ds) != 3 or ds[:2] != (bsz, seq) or ds[2] not in (hkv * dk, hkv):
            _fail(f"decay must be (batch, sequence, H_kv or H_kv*d_k), got {ds}")
        gw = ds[2] // hkv
    if cfg.delta:
        bs = beta[0]
        if len(bs) != 3 or bs[:2] != (bsz, seq) or bs[2] not in (hkv, 1):
            _fail(f"beta must be (batch, sequence, H_kv or 1), got {bs}")
        bw = bs[2]
    size = bsz * hkv * dk * dv
    window = cfg.window
    past_off = 0
    if past is not None:
        ps = past[0]
        if window > 0:
            if len(ps) < 1 or ps[0] < window or math.prod(ps[1:]) != size:
                _fail(
                    f"past_state {ps} must hold at least state_window={window} states of "
                    f"(batch, H_kv, d_k, d_v) = {(bsz, hkv, dk, dv)}"
                )
            past_off = (window - 1) * size
        elif math.prod(ps) != size:
            _fail(f"past_state {ps} must be (batch, H_kv, d_k, d_v) = {(bsz, hkv, dk, dv)}")
    group = hq // hkv if hq >= hkv else 1
    geo = la_geometry(bsz, hkv, dk, dv, group, gw, cfg.gated, cfg.delta, sms)
    if isinstance(geo, str):
        _fail(geo)
    qdiv = 1 if hq >= hkv else hkv // hq
    scale = cfg.scale if cfg.scale != 0.0 else 1.0 / math.sqrt(dk)
    fallback = past[1] if past is not None else qdt
    if cfg.onnx:
        state_dtype = np.dtype(fallback)
    else:
        declared = node.outputs[1].dtype if node.has_output(1) else None
        state_dtype = np.dtype(declared if declared is not None else fallback)
    if state_dtype not in FLOATS:
        _fail(f"present_state would be {state_dtype.name}; the CUDA kernel writes float32/float16")
    state = (bsz, hkv, dk, dv)
    types = type_bits(*[None if m is None else m[1] for m in sig], qdt, state_dtype)
    i32, i64 = np.int32, np.int64
    args = (i64(bsz), i64(seq), i32(hq), i32(hkv), i32(nk), i32(dk), i32(dv), i32(group),
            i32(qdiv), i32(hkv // nk), i32(gw), i32(bw), i32(geo.lanes), i32(geo.columns),
            i32(geo.tokens), i32(window), i64(past_off), np.float32(scale), i32(cfg.gated),
            i32(cfg.delta), types)  # fmt: skip
    return LaLaunch(
        y_shape=(bsz, seq, hkv * group * dv),
        y_dtype=np.dtype(qdt),
        state_shape=(window, *state) if window > 0 else state,
        state_dtype=state_dtype,
        grid=(geo.grid,),
        block=(geo.block,),
        args=args,
        width=max(node.num_outputs, 1),
    )


def step_outputs(xp: Any, plan: LaLaunch, cfg: LaConfig, name: str, past: Any) -> tuple:
    """The step's output and present state: present is the past buffer itself when the caller
    gave it up for this run (``may_overwrite``) and it has the present's shape and dtype (no
    state window: that present is a shifted window of the past), else a fresh buffer."""
    y = xp.empty(plan.y_shape, plan.y_dtype)
    if (
        cfg.window == 0
        and past is not None
        and past.dtype == plan.state_dtype
        and tuple(past.shape) == plan.state_shape
        and may_overwrite(name, past)
    ):
        return y, past
    return y, xp.empty(plan.state_shape, plan.state_dtype)


def _build(node: NodeInfo, xp: Any, onnx: bool):
    cfg = parse_config(node, onnx)
    why = _static_refusal(node, cfg)
    if why:
        raise NotSupported(why)
    fn = la_kernel()
    sms = K.sm_count()
    plans = K.PlanCache(lambda *sig: plan_launch(cfg, node, sig, sms))
    is_contiguous = contiguity_test(xp)
    gated, delta = cfg.gated, cfg.delta
    name = node.name

    def run(query, key, value, past_state=None, decay=None, beta=None):
        decay = decay if gated else None
        beta = beta if delta else None
        ins = (query, key, value, past_state, decay, beta)
        plan = plans(*signature(ins))
        ins = contiguous(xp, is_contiguous, ins)
        y, present = step_outputs(xp, plan, cfg, name, ins[3])
        if plan.grid[0]:
            fn(plan.grid, plan.block, (*ins, y, present, *plan.args))
        return (y, present)[: plan.width]

    return run


@kernel(
    _OP,
    since=1,
    domain="com.microsoft",
    dtypes={0: _FLOAT_NAMES},
    inplace=((3, 1),),
    capture_safe=True,
)
def linear_attention(node: NodeInfo, xp: Any):
    return _build(node, xp, onnx=False)


@kernel(_OP, since=27, dtypes={0: _FLOAT_NAMES}, inplace=((3, 1),), capture_safe=True)
def onnx_linear_attention(node: NodeInfo, xp: Any):
    return _build(node, xp, onnx=True)
