"""Shared routing and expert math for com.microsoft MoE and QMoE on NumPy."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from onnxep.errors import InvalidArgument, NotSupported
from onnxep.providers.ops._contrib import gelu_tanh, sigmoid

from ._misc import to_str

_ACTIVATIONS = ("relu", "gelu", "silu", "identity", "swiglu")


class MoeSpec:
    """The attributes MoE and QMoE share, parsed once."""

    def __init__(self, node: Any) -> None:
        op = node.op_type
        self.op = op
        self.k = int(node.attr("k", 1))
        self.normalize = bool(node.attr("normalize_routing_weights", 0))
        self.act = to_str(node.attr("activation_type", "relu")).lower()
        self.fusion = int(node.attr("swiglu_fusion", 0))
        self.alpha = float(node.attr("activation_alpha", 1.0))
        self.beta = float(node.attr("activation_beta", 0.0))
        limit = node.attr("swiglu_limit", None)
        self.limit = None if limit is None else float(limit)
        if node.attr("use_sparse_mixer", 0):
            raise NotSupported(f"{op}: use_sparse_mixer=1 is not supported")
        if node.attr("swiglu_limit_after_activation", 0):
            raise NotSupported(f"{op}: swiglu_limit_after_activation=1 is CUDA-only")
        if self.act not in _ACTIVATIONS:
            raise NotSupported(
                f"{op}: activation_type {self.act!r} is not supported on the CPU provider "
                f"(one of {', '.join(_ACTIVATIONS)})"
            )
        if self.fusion not in (0, 1, 2):
            raise NotSupported(f"{op}: swiglu_fusion={self.fusion} is not 0, 1 or 2")
        if self.k < 1:
            raise NotSupported(f"{op}: k={self.k} must be at least 1")

    @property
    def fused(self) -> bool:
        return self.act == "swiglu" and self.fusion != 0

    def route(self, probs: np.ndarray, rows: int, weights: Any = None) -> tuple:
        """(experts [rows, k], mixing weights [rows, k]): the top-k of softmax(probs) per row.

        With ``weights`` (router_weights) the mixing weights are its values at the chosen
        experts instead.
        """
        p = probs.reshape(-1, probs.shape[-1]).astype(np.float32)
        if p.shape[0] != rows:
            raise InvalidArgument(
                f"{self.op}: router_probs has {p.shape[0]} rows for {rows} tokens"
            )
        if self.k > p.shape[1]:
            raise InvalidArgument(f"{self.op}: k={self.k} exceeds the {p.shape[1]} experts")
        e = np.exp(p - p.max(axis=1, keepdims=True))
        soft = e / e.sum(axis=1, keepdims=True)
        # ties go to the lower expert index
        top = np.argsort(-p, axis=1, kind="stable")[:, : self.k]
        source = soft if weights is None else weights.reshape(rows, -1).astype(np.float32)
        w = np.take_along_axis(source, top, axis=1)
        if self.normalize:
            w = w / w.sum(axis=1, keepdims=True)
        return top, w

    def activate(self, h: np.ndarray, up: Any = None) -> np.ndarray:
        """The activation of FC1's output ``h`` (with FC3's ``up`` for unfused SwiGLU)."""
        if self.act == "relu":
            return np.maximum(h, 0)
        if self.act == "gelu":
            return gelu_tanh(h, np)
        if self.act == "silu":
            return h * sigmoid(h, np)
        if self.act == "identity":
            return h
        if self.fusion == 1:
            gate, lin = h[..., 0::2], h[..., 1::2]
        elif self.fusion == 2:
            half = h.shape[-1] // 2
            gate, lin = h[..., :half], h[..., half:]
        else:
            if up is None:
                raise InvalidArgument(f"{self.op}: swiglu_fusion=0 needs fc3_experts_weights")
            gate, lin = h, up
        if self.limit is not None:
            gate = np.minimum(gate, np.float32(self.limit))
            lin = np.clip(lin, -np.float32(self.limit), np.float32(self.limit))
        return gate * sigmoid(np.float32(self.alpha) * gate, np) * (lin + np.float32(self.beta))


def mixture(
    spec: MoeSpec,
    x: np.ndarray,
    probs: np.ndarray,
    expert: Callable[[int, np.ndarray], np.ndarray],
    router_weights: Any = None,
) -> np.ndarray:
    """sum over each token's top-k experts of weight * expert(e, token rows), in x's shape."""
    if x.ndim not in (2, 3):
        raise InvalidArgument(f"{spec.op}: input must be 2-D or 3-D, got shape {x.shape}")
    rows = x.reshape(-1, x.shape[-1]).astype(np.float32)
    top, w = spec.route(probs, rows.shape[0], router_weights)
    out = np.zeros_like(rows)
    for e in np.unique(top):
        tok, slot = np.nonzero(top == e)
        out[tok] += w[tok, slot, None] * expert(int(e), rows[tok])
    return out.reshape(x.shape).astype(x.dtype, copy=False)


def linear(rows: np.ndarray, w: np.ndarray, b: Any) -> np.ndarray:
    """rows [t, K] @ w[N, K]^T (+ b [N]) in float32."""
    y = rows @ w.astype(np.float32, copy=False).T
    return y if b is None else y + b.astype(np.float32)


def check_experts(op: str, what: str, t: Any, experts: int) -> None:
    if t is not None and t.shape[0] != experts:
        raise InvalidArgument(f"{op}: {what} has {t.shape[0]} experts, router_probs {experts}")
