"""Normalizations and losses on torch: LayerNormalization, RMSNormalization,
LpNormalization, NegativeLogLikelihoodLoss, SoftmaxCrossEntropyLoss.

Statistics are computed in float32 at least (``stash_type`` 1), as the ONNX
functions specify, and the result is cast back to the input's dtype.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from onnxep.errors import NotSupported
from onnxep.providers import NodeInfo, kernel

from .common import FLOATS


def _stash(x: torch.Tensor, stash_type: int) -> torch.Tensor:
    if stash_type == 1 and x.dtype == torch.float16:
        return x.float()
    return x


@kernel("LayerNormalization", since=17, dtypes={0: FLOATS})
def layer_norm(node: NodeInfo, xp: Any):
    axis = int(node.attr("axis", -1))
    eps = float(node.attr("epsilon", 1e-5))
    stash = int(node.attr("stash_type", 1))
    n_out = node.num_outputs

    def run(x: torch.Tensor, scale: torch.Tensor, bias: torch.Tensor | None = None):
        a = axis + x.ndim if axis < 0 else axis
        dims = list(range(a, x.ndim))
        xc = _stash(x, stash)
        mean = xc.mean(dim=dims, keepdim=True)
        d = xc - mean
        inv = torch.rsqrt((d * d).mean(dim=dims, keepdim=True) + eps)
        y = (d * inv).to(x.dtype) * scale
        if bias is not None:
            y = y + bias
        return (y, mean, inv)[:n_out]

    return run


@kernel("RMSNormalization", since=23, dtypes={0: FLOATS})
def rms_norm(node: NodeInfo, xp: Any):
    axis = int(node.attr("axis", -1))
    eps = float(node.attr("epsilon", 1e-5))
    stash = int(node.attr("stash_type", 1))

    def run(x: torch.Tensor, scale: torch.Tensor):
        a = axis + x.ndim if axis < 0 else axis
        xc = _stash(x, stash)
        inv = torch.rsqrt((xc * xc).mean(dim=list(range(a, x.ndim)), keepdim=True) + eps)
        return ((xc * inv).to(x.dtype) * scale,)

    return run


@kernel("LpNormalization", since=1, dtypes={0: FLOATS})
def lp_norm(node: NodeInfo, xp: Any):
    axis = int(node.attr("axis", -1))
    p = int(node.attr("p", 2))
    if p not in (1, 2):
        raise NotSupported(f"LpNormalization: p={p} is not defined (1 or 2)")

    def run(x: torch.Tensor):
        norm = torch.linalg.vector_norm(x, ord=p, dim=axis, keepdim=True)
        return (x / torch.where(norm == 0, torch.ones_like(norm), norm),)

    return run


def _reduction(node: NodeInfo) -> str:
    r = node.attr("reduction", "mean")
    return r.decode() if isinstance(r, bytes) else r


def _nll(logp: torch.Tensor, target: torch.Tensor, weight: torch.Tensor | None, ignore, reduction):
    # torch's nll_loss follows the ONNX definition (weighted mean over the
    # non-ignored targets); it wants int64 targets and one ignore value.
    return F.nll_loss(
        logp,
        target.long(),
        weight,
        ignore_index=-100 if ignore is None else ignore,
        reduction=reduction,
    )


@kernel("NegativeLogLikelihoodLoss", since=12, dtypes={0: ["float", "double"]})
def nll_loss(node: NodeInfo, xp: Any):
    reduction = _reduction(node)
    ignore = node.attr("ignore_index", None)

    def run(x: torch.Tensor, target: torch.Tensor, weight: torch.Tensor | None = None):
        return (_nll(x, target, weight, ignore, reduction).to(x.dtype),)

    return run


@kernel("SoftmaxCrossEntropyLoss", since=12, dtypes={0: ["float", "double"]})
def softmax_cross_entropy(node: NodeInfo, xp: Any):
    reduction = _reduction(node)
    ignore = node.attr("ignore_index", None)
    n_out = node.num_outputs

    def run(x: torch.Tensor, target: torch.Tensor, weight: torch.Tensor | None = None):
        logp = torch.log_softmax(x, dim=1)
        loss = _nll(logp, target, weight, ignore, reduction).to(x.dtype)
        return (loss, logp)[:n_out]

    return run
