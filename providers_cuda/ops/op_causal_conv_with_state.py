"""CausalConvWithState on CUDA (com.microsoft, and ONNX's from opset 27): one launch per node.

A depthwise causal 1-D convolution over ``[past state | input]`` per (batch,
channel), its optional SiLU, the present state (the sequence's last
``state_length`` positions) and, in com.microsoft, the ``state_window``
slots and the ``state_update_capacity`` output, all in one grid-stride
kernel (``causal_conv_state`` in ``hybrid_cuda``). The semantics are the
CPU kernels' (``providers/ops/op_causal_conv_with_state.py`` and
``op_onnx_causal_conv_with_state.py``), including channels-last inputs and
states, dilation, a channel slice of the input, and the ONNX op's rounding
of the history and the pre-activation to the input's type.

The kernel writes present to a fresh buffer: while the sequence is shorter
than the state, present takes values from past, so writing it over past
would race. When the caller gave the past buffer up for the run
(``onnxep.providers.inplace``: bound as both past input and present output,
as ``onnxep.generate`` does), present is then copied over past on the device
(the state is a few values per channel) and past is returned as present, so
the state stays where it is and a captured graph replays the update.
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
from .hybrid_cuda import (
    FLAT_BLOCK,
    FLOATS,
    contiguity_test,
    contiguous,
    flat_grid,
    float_refusal,
    hybrid_kernel,
    signature,
    type_bits,
)

_OP = "CausalConvWithState"
_INPUTS = ("input", "weight", "bias", "past_state")


def _str(v: Any) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)


@dataclass(frozen=True)
class ConvConfig:
    """The node's attributes, parsed once (the ONNX op has only the activation)."""

    silu: bool
    onnx: bool
    dilation: int = 1
    channels_last: bool = False
    state_cl: bool = False
    state_length: int = 0  # 0: the receptive field, (k - 1) * dilation
    in_off: int = 0
    in_ch: int = 0  # 0: every channel
    window: int = 0
    capacity: int = 0  # rows of the state_update output (0: none)


@dataclass(frozen=True)
class ConvLaunch:
    shapes: tuple[tuple[int, ...], ...]  # output, present, update (None: not produced)
    dtypes: tuple[np.dtype, ...]
    grid: tuple[int]
    args: tuple  # after the seven pointers
    total: int


def _fail(msg: str) -> None:
    raise ValueError(f"{_OP}: {msg}")


def plan_conv(cfg: ConvConfig, sig: tuple) -> ConvLaunch:
    """Check one input signature as the CPU kernel does, and build its launch."""
    for name, meta in zip(_INPUTS, sig, strict=True):
        if meta is not None and meta[1] not in FLOATS:
            _fail(f"{name} is {meta[1]}; the CUDA kernel takes float32 and float16")
    (xs, xdt), (ws, wdt), bias, past = sig
    if len(xs) < (3 if not cfg.channels_last or cfg.onnx else 2):
        _fail(f"input {xs} must be (batch, channels, length), or (batch, length, ...) when last")
    if not ws:
        _fail("weight must have at least one dimension")
    bsz = xs[0]
    k = ws[-1]
    if cfg.onnx:
        if len(xs) != 3 or len(ws) != 3:
            _fail(f"input {xs} and weight {ws} must be 3-D (weight: channels, 1, k)")
        c, seq = xs[1], xs[2]
        w_cs = ws[1] * k
        if ws[0] != c or ws[1] < 1:
            _fail(f"weight {ws} must be (channels={c}, 1, k)")
        chan_shape: tuple[int, ...] = (c,)
        x_strides = (c * seq, seq, 1)
        x_off = 0
    elif cfg.channels_last:
        seq = xs[1]
        chan_shape = tuple(xs[2:])
        total_ch = math.prod(chan_shape)
        x_off = cfg.in_off if cfg.in_ch else 0
        if cfg.in_ch:
            if cfg.in_off + cfg.in_ch > total_ch:
                _fail(
                    f"input_channel_offset {cfg.in_off} + input_channels {cfg.in_ch} exceed the "
                    f"input's {total_ch} channels"
                )
            chan_shape = (cfg.in_ch,)
        c = math.prod(chan_shape)
        x_strides = (seq * total_ch, 1, total_ch)
        w_cs = k
    else:
        if cfg.in_ch:
            _fail("input_channels needs channels_last input")
        if len(xs) != 3:
            _fail(f"input {xs} must be (batch, channels, length)")
        c, seq = xs[1], xs[2]
        chan_shape = (c,)
        x_strides = (c * seq, seq, 1)
        x_off = 0
        w_cs = k
    if not cfg.onnx and (ws[0] != c or math.prod(ws) != c * k):
        _fail(f"weight {ws} must hold {c} channels of {k} taps; the input has {c} channels")
    if bias is not None and math.prod(bias[0]) != c:
        _fail(f"bias {bias[0]} must hold one value per channel ({c})")
    pad = (k - 1) * cfg.dilation
    s_len = cfg.state_length or pad
    if s_len < pad:
        _fail(f"state_length {s_len} is shorter than the receptive field {pad}")
    size = bsz * c * s_len
    past_off = 0
    if past is not None:
        ps = past[0]
        if cfg.window > 0:
            if len(ps) < 1 or ps[0] < cfg.window or math.prod(ps[1:]) != size:
                _fail(
                    f"past_state {ps} must hold at least state_window={cfg.window} states of "
                    f"{size} values (batch {bsz}, {c} channels, length {s_len})"
                )
            past_off = (cfg.window - 1) * size
        elif math.prod(ps) != size or (cfg.onnx and ps != (bsz, c, s_len)):
            _fail(f"past_state {ps} must hold batch {bsz}, {c} channels and length {s_len}")
    state_shape = (bsz, s_len, *chan_shape) if cfg.state_cl else (bsz, c, s_len)
    slots = max(cfg.window, 1)
    present_shape = (cfg.window, *state_shape) if cfg.window > 0 else state_shape
    present_dt = xdt if cfg.onnx or past is None else past[1]
    y_shape = (bsz, seq, *chan_shape) if cfg.channels_last else (bsz, c, seq)
    cap = cfg.capacity
    i32, i64 = np.int32, np.int64
    args = (i64(bsz), i64(c), i64(seq), i64(k), i64(cfg.dilation), i64(w_cs), i64(x_off),
            *(i64(s) for s in x_strides), i64(s_len), i64(past_off), i64(s_len - pad),
            i32(slots), i32(cfg.window), i64(cap), i32(cfg.channels_last), i32(cfg.state_cl),
            i32(cfg.silu), i32(cfg.onnx),
            type_bits(xdt, wdt, None if bias is None else bias[1], None if past is None
                      else past[1], present_dt))  # fmt: skip
    total = bsz * c * (seq + slots * s_len + cap)
    return ConvLaunch(
        shapes=(y_shape, present_shape, (bsz, cap, c) if cap else None),
        dtypes=(np.dtype(xdt), np.dtype(present_dt), np.dtype(xdt)),
        grid=flat_grid(total),
        args=args,
        total=total,
    )


def _runner(node: NodeInfo, xp: Any, cfg: ConvConfig):
    for i, name in enumerate(_INPUTS):
        why = float_refusal(_OP, name, node.input_dtype(i))
        if why:
            raise NotSupported(why)
    fn = hybrid_kernel("causal_conv_state")
    plans = K.PlanCache(lambda *sig: plan_conv(cfg, sig))
    is_contiguous = contiguity_test(xp)
    width = max(node.num_outputs, 1)
    name = node.name

    def run(x, weight, bias=None, past_state=None):
        ins = (x, weight, bias, past_state)
        plan = plans(*signature(ins))
        ins = contiguous(xp, is_contiguous, ins)
        outs = [None if s is None else xp.empty(s, dt) for s, dt in zip(plan.shapes, plan.dtypes)]
        if plan.total:
            fn(plan.grid, (FLAT_BLOCK,), (*ins, *outs, *plan.args))
        present = outs[1] if len(outs) > 1 else None
        if (
            present is not None
            and past_state is not None
            and past_state.dtype == present.dtype
            and past_state.shape == present.shape
            and may_overwrite(name, past_state)
        ):
            past_state[...] = present
            outs[1] = past_state
        return (*outs, *(None,) * (width - 3))[:width]

    return run


@kernel(
    _OP,
    domain="com.microsoft",
    dtypes={0: ("float", "float16")},
    inplace=((3, 1),),
    capture_safe=True,
)
def causal_conv_with_state(node: NodeInfo, xp: Any):
    ndim = int(node.attr("ndim", 1))
    if ndim != 1:
        raise NotSupported(f"{_OP}: ndim={ndim} is not supported (only 1)")
    act = _str(node.attr("activation", "none"))
    if act not in ("none", "silu", "swish"):
        raise NotSupported(f"{_OP}: activation {act!r} is not one of none, silu, swish")
    dilation = int(node.attr("dilation", 1))
    if dilation < 1:
        raise NotSupported(f"{_OP}: dilation must be >= 1, got {dilation}")
    channels_last = bool(node.attr("channels_last", 0))
    state_cl = int(node.attr("state_channels_last", -1))
    window = int(node.attr("state_window", 0))
    capacity = int(node.attr("state_update_capacity", 0))
    state_length = int(node.attr("state_length", 0))
    in_off, in_ch = int(node.attr("input_channel_offset", 0)), int(node.attr("input_channels", 0))
    if min(window, capacity, state_length, in_off, in_ch) < 0:
        raise NotSupported(
            f"{_OP}: state_window, state_length, state_update_capacity, input_channel_offset "
            "and input_channels must be >= 0"
        )
    cfg = ConvConfig(
        silu=act != "none",
        onnx=False,
        dilation=dilation,
        channels_last=channels_last,
        state_cl=channels_last if state_cl < 0 else bool(state_cl),
        state_length=state_length,
        in_off=in_off,
        in_ch=in_ch,
        window=window,
        capacity=capacity if node.has_output(2) else 0,
    )
    return _runner(node, xp, cfg)


@kernel(_OP, since=27, dtypes={0: ("float", "float16")}, inplace=((3, 1),), capture_safe=True)
def onnx_causal_conv_with_state(node: NodeInfo, xp: Any):
    act = _str(node.attr("activation", "none"))
    if act not in ("none", "silu", "swish"):
        raise NotSupported(f"{_OP}: activation {act!r} is not none/silu/swish")
    return _runner(node, xp, ConvConfig(silu=act != "none", onnx=True))
