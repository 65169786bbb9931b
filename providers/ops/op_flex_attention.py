"""FlexAttention (ai.onnx.preview, version 1): SDPA with score_mod / prob_mod subgraphs."""

from __future__ import annotations

import math

import numpy as np

from onnxep.providers.dtypes import np_dtype
from onnxep.providers.kernel import kernel
from onnxep.providers.node import NodeInfo
from onnxep.providers.ops.attention import (
    grouped_context,
    grouped_scores,
    softmax_rows,
    widen,
)


@kernel(
    "FlexAttention",
    since=1,
    domain="ai.onnx.preview",
    dtypes=("float", "float16", "bfloat16", "double"),
    capture_safe=False,
    capture_note="score_mod/prob_mod subgraphs run through the host",
)
def flex_attention(node: NodeInfo, xp):
    scale_attr = node.attr("scale", None)
    prec = node.attr("softmax_precision", None)
    score_mod = node.subgraphs.get("score_mod")
    prob_mod = node.subgraphs.get("prob_mod")
    n = node.num_inputs

    def run(*args):
        q, k, v = args[:3]
        outer = list(args[n:])
        if prec is not None:
            sdt = np_dtype(int(prec))
        else:
            sdt = np.dtype(np.float64) if q.dtype == np.float64 else np.dtype(np.float32)
        # matmul and softmax run at least in float32 whatever softmax_precision says
        ct = np.dtype(np.float64) if np.float64 in (sdt, q.dtype) else np.dtype(np.float32)
        d = q.shape[-1]
        scale = scale_attr if scale_attr is not None else 1.0 / math.sqrt(d)
        scores = grouped_scores(xp, widen(q, ct), widen(k, ct)) * ct.type(scale)
        if score_mod is not None:
            scores = score_mod.run([scores.astype(sdt)], outer)[0]
            scores = xp.asarray(scores)
        probs = softmax_rows(xp, widen(scores, ct))
        if prob_mod is not None:
            probs = xp.asarray(prob_mod.run([probs.astype(sdt)], outer)[0])
        y = grouped_context(xp, widen(probs, ct), widen(v, ct))
        return (y.astype(q.dtype),)

    return run
