"""com.microsoft CausalConvWithState: depthwise causal 1D convolution with a carried state.

The state holds the trailing history of the (virtual) sequence [past_state | input]
along the causal axis, so decode steps continue exactly where prefill stopped.
Supported: ndim=1, dilation, channels_last (any number of trailing channel
axes), state_window, and the extended state_length / state_channels_last /
input_channel_offset / input_channels / state_update_capacity attributes.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from onnxep.errors import NotSupported
from onnxep.providers.kernel import kernel
from onnxep.providers.node import NodeInfo

from . import contrib as C


def _str(v: Any) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)


@kernel("CausalConvWithState", domain="com.microsoft", dtypes=("float", "float16", "bfloat16"))
def causal_conv_with_state(node: NodeInfo, xp: Any):
    op = "CausalConvWithState"
    ndim = int(node.attr("ndim", 1))
    if ndim != 1:
        raise NotSupported(f"{op}: ndim={ndim} is not supported (only 1)")
    act = _str(node.attr("activation", "none"))
    if act not in ("none", "silu", "swish"):
        raise NotSupported(f"{op}: activation {act!r} is not one of none, silu, swish")
    use_silu = act != "none"
    dilation = int(node.attr("dilation", 1))
    if dilation < 1:
        raise NotSupported(f"{op}: dilation must be >= 1, got {dilation}")
    channels_last = bool(node.attr("channels_last", 0))
    window = int(node.attr("state_window", 0))
    state_cl = int(node.attr("state_channels_last", -1))
    state_cl = channels_last if state_cl < 0 else bool(state_cl)
    state_len_attr = int(node.attr("state_length", 0))
    in_off = int(node.attr("input_channel_offset", 0))
    in_ch = int(node.attr("input_channels", 0))
    capacity = int(node.attr("state_update_capacity", 0))
    if window < 0 or capacity < 0 or state_len_attr < 0:
        raise NotSupported(
            f"{op}: state_window, state_length and state_update_capacity must be >= 0"
        )
    want_update = capacity > 0 and node.has_output(2)

    def run(x, weight, bias=None, past_state=None):
        b = x.shape[0]
        cw = weight.shape[0]
        k = weight.shape[-1]
        pad = (k - 1) * dilation
        s_len = state_len_attr or pad
        if s_len < pad:
            raise ValueError(
                f"{op}: state_length {s_len} is shorter than the receptive field {pad}"
            )
        # Bring the activation to (B, C, L) float32.
        if channels_last:
            seq = x.shape[1]
            chan_shape = x.shape[2:]
            xc = C.up(x, xp, np.float32).reshape(b, seq, -1)
            if in_ch:
                xc = xc[:, :, in_off : in_off + in_ch]
                chan_shape = (in_ch,)
            xc = xp.swapaxes(xc, 1, 2)
        else:
            if in_ch:
                raise ValueError(f"{op}: input_channels needs channels_last input")
            seq = x.shape[2]
            chan_shape = (x.shape[1],)
            xc = C.up(x, xp, np.float32)
        c = xc.shape[1]
        if c != cw:
            raise ValueError(f"{op}: weight has {cw} channels, input {c}")
        state_shape = (b, s_len) + tuple(chan_shape) if state_cl else (b, c, s_len)

        if past_state is None:
            hist = xp.zeros((b, c, s_len), dtype=np.float32)
        else:
            ps = past_state[window - 1] if window > 0 else past_state
            ps = C.up(ps, xp, np.float32)
            hist = (
                xp.swapaxes(ps.reshape(b, s_len, c), 1, 2) if state_cl else ps.reshape(b, c, s_len)
            )
        padded = xp.concatenate([hist, xc], axis=2)

        w = C.up(weight, xp, np.float32).reshape(c, k)
        start = s_len - pad
        y = None
        for j in range(k):  # taps: a small axis
            o = start + j * dilation
            term = w[:, j : j + 1] * padded[:, :, o : o + seq]
            y = term if y is None else y + term
        if bias is not None:
            y = y + C.up(bias, xp, np.float32).reshape(c, 1)
        if use_silu:
            y = C.silu(y, xp)

        if channels_last:
            y = xp.swapaxes(y, 1, 2).reshape((b, seq) + tuple(chan_shape))
        out = C.down(y, x.dtype)

        sdt = past_state.dtype if past_state is not None else x.dtype

        def to_state(h):  # (B, C, s_len) -> declared state layout
            if state_cl:
                h = xp.swapaxes(h, 1, 2)
            return C.down(h.reshape(state_shape), sdt)

        if window > 0:
            slots = []
            for j in range(window):
                p = seq - window + j  # the state after position p of this call
                if p < 0:
                    slots.append(xp.zeros(state_shape, dtype=sdt))
                else:
                    slots.append(to_state(padded[:, :, p + 1 : p + 1 + s_len]))
            present = xp.stack(slots)
        else:
            present = to_state(padded[:, :, seq : seq + s_len])

        outs = {0: out, 1: present}
        if want_update:
            m = min(seq, capacity)
            rows = xp.swapaxes(xc[:, :, :m], 1, 2)
            rest = xp.zeros((b, capacity - m, c), dtype=np.float32)
            outs[2] = C.down(xp.concatenate([rows, rest], axis=1), x.dtype)
        return C.pad_outputs(node, outs)

    return run
