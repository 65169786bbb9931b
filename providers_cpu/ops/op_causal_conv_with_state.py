"""com.microsoft CausalConvWithState on NumPy: the channels-first layout with a plain
carried state in one compiled pass (causal_conv_jit); every other layout, dtype or
attribute (channels_last, state_window, state_update_capacity, input channel slices), or
numba off, runs the generic kernel.
"""

from __future__ import annotations

import numpy as np

from onnxep.providers.kernel import kernel
from onnxep.providers.ops.op_causal_conv_with_state import causal_conv_with_state as generic

from .. import jit
from . import causal_conv_jit
from .norms_jit import rows_ok

_F32 = np.dtype(np.float32)


def _plain(node) -> bool:
    """Attributes whose kernel is the channels-first, state-in-state-out one."""
    attr = node.attr
    state_cl = int(attr("state_channels_last", -1))
    return (
        not int(attr("channels_last", 0))
        and state_cl in (-1, 0)
        and int(attr("state_window", 0)) == 0
        and int(attr("input_channels", 0)) == 0
        and int(attr("input_channel_offset", 0)) == 0
        and not (int(attr("state_update_capacity", 0)) > 0 and node.has_output(2))
        and all(
            node.outputs[j] is None or node.outputs[j].dtype in (None, _F32)
            for j in range(min(node.num_outputs, 2))
        )
    )


@kernel("CausalConvWithState", domain="com.microsoft", dtypes=("float", "float16", "bfloat16"))
def causal_conv_with_state(node, xp):
    general = generic(node, xp)  # also refuses what it does not support
    if not jit.ENABLED or not _plain(node):
        return general
    act = node.attr("activation", "none")
    silu = (act.decode() if isinstance(act, bytes) else str(act)) != "none"
    dilation = int(node.attr("dilation", 1))
    state_len = int(node.attr("state_length", 0))
    n_out = max(node.num_outputs, 1)

    def run(x, weight, bias=None, past_state=None):
        if x.ndim != 3 or weight.shape[0] != x.shape[1] or not rows_ok(x, weight):
            return general(x, weight, bias, past_state)
        b, c = x.shape[0], x.shape[1]
        k = weight.shape[-1]
        if k < 1 or weight.size != c * k:
            return general(x, weight, bias, past_state)
        s_len = state_len or (k - 1) * dilation
        if s_len < (k - 1) * dilation or (bias is not None and bias.size != c):
            return general(x, weight, bias, past_state)
        if past_state is not None and (
            past_state.shape != (b, c, s_len) or not rows_ok(past_state)
        ):
            return general(x, weight, bias, past_state)
        if bias is not None and not rows_ok(bias):
            return general(x, weight, bias, past_state)
        y, present = causal_conv_jit.conv(
            x,
            weight.reshape(c, k),
            None if bias is None else bias.reshape(c),
            past_state,
            s_len,
            dilation,
            silu,
        )
        return ((y, present) + (None,) * (n_out - 2))[:n_out]

    return run
