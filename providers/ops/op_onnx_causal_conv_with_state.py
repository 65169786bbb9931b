"""ONNX CausalConvWithState (opset 27): stateful causal depthwise 1-D conv."""

from __future__ import annotations

from onnxep.errors import NotSupported
from onnxep.providers.kernel import kernel
from onnxep.providers.node import NodeInfo
from onnxep.providers.ops.attention import compute_dtype, widen


@kernel("CausalConvWithState", since=27, dtypes=("float", "float16", "bfloat16", "double"))
def causal_conv_with_state(node: NodeInfo, xp):
    act = node.attr("activation", "none")
    act = act.decode() if isinstance(act, bytes) else act
    if act not in ("none", "silu", "swish"):
        raise NotSupported(f"CausalConvWithState: activation {act!r} is not none/silu/swish")

    def run(x, w, bias=None, past=None):
        ct = compute_dtype(x.dtype)
        b, c, n = x.shape
        k = w.shape[2]
        if past is None:
            pad = xp.zeros((b, c, k - 1), dtype=x.dtype)
        else:
            pad = past.astype(x.dtype)
        padded = xp.concatenate((pad, x), axis=2)
        pf = widen(padded, ct)
        wf = widen(w, ct)
        # loop over the (small) kernel taps, each a shifted window times a per-channel weight
        acc = pf[:, :, 0:n] * wf[None, :, 0, 0:1]
        for i in range(1, k):
            acc = acc + pf[:, :, i : i + n] * wf[None, :, 0, i : i + 1]
        if bias is not None:
            acc = acc + widen(bias, ct)[None, :, None]
        if act != "none":
            acc = acc.astype(x.dtype).astype(ct)
            acc = acc / (1 + xp.exp(-acc))
        present = padded[:, :, padded.shape[2] - (k - 1) :]
        return (acc.astype(x.dtype), present)

    return run
