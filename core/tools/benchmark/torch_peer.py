"""The torch peer: the same architecture and weights as a factory model, in PyTorch.

Factory models (``bench/factory``) record their architecture in the model's
metadata (``onnxep.factory`` and ``onnxep.config``); the weights come from the
model's own initializers (``MatMulNBits`` weights dequantized), so both sides
compute the same function and a benchmark compares runtimes, not models.

Precision: the model's own activation dtype, except that on CUDA quantized
models run with fp16 weights and activations (what a torch user would run);
fp16 on CPU would only measure torch's slow CPU half-precision path.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from typing import Any

import numpy as np


def factory_config(model_path: str) -> dict[str, Any] | None:
    import onnx

    proto = onnx.load(model_path, load_external_data=False)
    meta = {p.key: p.value for p in proto.metadata_props}
    if "onnxep.factory" not in meta:
        return None
    return {"kind": meta["onnxep.factory"], **json.loads(meta.get("onnxep.config", "{}"))}


def load_torch_peer(model_path: str, device: str = "cpu") -> Any:
    cfg = factory_config(model_path)
    if cfg is None:
        raise ValueError(
            f"{model_path} was not made by onnxep's model factory, so there is no torch "
            "version of it to compare against"
        )
    peers = {"genai-decoder": GenaiDecoderPeer, "hybrid-decoder": HybridDecoderPeer}
    if cfg["kind"] not in peers:
        raise ValueError(f"no torch peer for factory model kind {cfg['kind']!r} yet")
    return peers[cfg["kind"]](model_path, cfg, device)


def dequantize_nbits(
    torch: Any,
    packed: np.ndarray,
    scales: np.ndarray,
    zero_points: np.ndarray | None,
    k: int,
    bits: int,
    device: str,
) -> Any:
    """The [K, N] float32 weight of a MatMulNBits node (B [N, blocks, blob], scales [N, blocks]).

    In torch on the target device: NumPy takes ~30 s for a 0.5B model's weights.
    """
    p = torch.from_numpy(np.array(packed, copy=True)).to(device)
    n, blocks = p.shape[0], p.shape[1]
    q = torch.stack([p & 0x0F, p >> 4], dim=-1) if bits == 4 else p
    q = q.reshape(n, blocks, -1).float()
    if zero_points is None:
        zp = torch.full((n, blocks), float(1 << (bits - 1)), device=device)
    else:
        z = torch.from_numpy(np.array(zero_points, copy=True)).to(device)
        z = torch.stack([z & 0x0F, z >> 4], dim=-1) if bits == 4 else z
        zp = z.reshape(n, -1)[:, :blocks].float()
    s = torch.from_numpy(np.array(scales, np.float32)).to(device).reshape(n, blocks)
    q.sub_(zp[..., None]).mul_(s[..., None])  # in place: these are the model's largest tensors
    return q.reshape(n, -1)[:, :k].T


class _Weights:
    """The model's initializers by the builder's names, as torch tensors on one device."""

    def __init__(self, model_path: str, cfg: Mapping[str, Any], device: str) -> None:
        import onnx
        import torch
        from onnx import numpy_helper

        self.torch = torch
        proto = onnx.load(model_path)
        self.arrays = {t.name: numpy_helper.to_array(t) for t in proto.graph.initializer}
        self.output_names = [o.name for o in proto.graph.output]
        self.bits = int(cfg.get("bits") or 0)
        self.device = device
        # io_dtype: the model's inputs and outputs; dtype: what the weights and math use
        self.io_dtype = torch.float16 if cfg.get("dtype") == "fp16" else torch.float32
        quantized_on_gpu = self.bits and device.startswith("cuda")
        self.dtype = torch.float16 if quantized_on_gpu else self.io_dtype

    def tensor(self, name: str, dtype: Any = None) -> Any:
        arr = np.asarray(self.arrays[name])
        return self.torch.from_numpy(arr.astype(np.float32)).to(self.device, dtype or self.dtype)

    def has(self, name: str) -> bool:
        return name in self.arrays

    def release(self) -> None:
        """Drop the NumPy copies once every tensor has been made."""
        self.arrays = {}

    def matmul(self, prefix: str) -> Any:
        """``{prefix}.weight`` ([K, N]), or the dequantized ``{prefix}.weight_Q{bits}``."""
        if self.has(f"{prefix}.weight"):
            return self.tensor(f"{prefix}.weight")
        packed = self.arrays[f"{prefix}.weight_Q{self.bits}"]
        scales = self.arrays[f"{prefix}.weight_scales"]
        zp = self.arrays.get(f"{prefix}.weight_zero_points")
        k = packed.shape[1] * packed.shape[2] * 8 // self.bits
        w = dequantize_nbits(self.torch, packed, scales, zp, k, self.bits, self.device)
        return w.to(self.dtype).contiguous()  # torch's CPU GEMV is ~2x slower on the view


class _DecoderBase:
    """Embedding, RMSNorm, rotary, GQA attention, SiLU MLP and LM head, shared by both kinds."""

    def __init__(self, model_path: str, cfg: dict[str, Any], device: str) -> None:
        import torch

        self.torch, self.cfg, self.device = torch, cfg, device
        #: outputs in the compute dtype, for a loop that feeds the cache straight back
        self.native_outputs = False
        self.w = _Weights(model_path, cfg, device)
        self.eps = float(cfg["eps"])
        self.lm_head = self.w.matmul("lm_head.MatMul")
        if self.w.has("model.embed_tokens.weight"):
            self.embed = self.w.tensor("model.embed_tokens.weight")
        else:  # tied: the embedding gathers rows of the LM head's weight
            self.embed = self.lm_head.T.contiguous()
        self.cos = self.w.tensor("cos_cache", torch.float32)
        self.sin = self.w.tensor("sin_cache", torch.float32)
        self.final_norm = self.w.tensor(
            f"model.layers.{cfg['layers']}.final_norm_layernorm.weight", torch.float32
        )

    def feed_in(self, feeds: Mapping[str, Any], name: str, dtype: Any = None) -> Any:
        v = feeds[name]
        t = v if isinstance(v, self.torch.Tensor) else self.torch.from_numpy(np.asarray(v))
        return t.to(self.device, dtype) if dtype is not None else t.to(self.device)

    def rms(self, x: Any, weight: Any) -> Any:
        # in float32, as SimplifiedLayerNormalization does (stash_type 1)
        xf = x.float()
        y = xf * self.torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return (y * weight).to(x.dtype)

    def rotate(self, x: Any, positions: Any, rot_dim: int) -> Any:
        """Non-interleaved rotary on the first ``rot_dim`` dims of x [B, H, S, D]."""
        cos = self.cos[positions][:, None, :, : rot_dim // 2]  # [B, 1, S, rot/2]
        sin = self.sin[positions][:, None, :, : rot_dim // 2]
        xr, rest = x[..., :rot_dim].float(), x[..., rot_dim:]
        x1, x2 = xr[..., : rot_dim // 2], xr[..., rot_dim // 2 :]
        out = self.torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1).to(x.dtype)
        return self.torch.cat([out, rest], dim=-1) if rest.shape[-1] else out

    def attend(self, q: Any, k: Any, v: Any, allowed: Any) -> Any:
        """GQA attention of q [B, H, S, D] over k, v [B, KV, T, D]; ``allowed`` [B|1, 1, S, T]
        (the cache's causal and padding mask)."""
        torch = self.torch
        b, heads, s, d = q.shape
        kvh = k.shape[1]
        # query heads grouped per KV head, so K and V are never repeated; torch's
        # CPU SDPA with a mask and enable_gqa is ~100x slower than this at decode sizes
        qg = q.reshape(b, kvh, heads // kvh, s, d)
        scores = (qg @ k[:, :, None].transpose(-1, -2)).float() * (1.0 / math.sqrt(d))
        scores = scores.masked_fill(~allowed[:, :, None], float("-inf"))
        probs = torch.softmax(scores, dim=-1).to(v.dtype)
        return (probs @ v[:, :, None]).reshape(b, heads, s, d)

    def mlp(self, i: int, x: Any) -> Any:
        gate, up, down = self._mlp[i]
        return (self.torch.nn.functional.silu(x @ gate) * (x @ up)) @ down

    def _load_mlp(self, i: int) -> tuple[Any, Any, Any]:
        p = f"model.layers.{i}.mlp"
        return tuple(self.w.matmul(f"{p}.{n}_proj.MatMul") for n in ("gate", "up", "down"))

    def norms(self, i: int) -> tuple[Any, Any]:
        f32 = self.torch.float32
        return (
            self.w.tensor(f"model.layers.{i}.input_layernorm.weight", f32),
            self.w.tensor(f"model.layers.{i}.post_attention_layernorm.weight", f32),
        )

    def logits(self, x: Any) -> Any:
        return self.rms(x, self.final_norm) @ self.lm_head

    def finish(self, outputs: dict[str, Any]) -> list[Any]:
        if self.native_outputs:
            return [outputs[n] for n in self.w.output_names]
        out_dtype = self.w.io_dtype
        return [outputs[n].to(out_dtype) for n in self.w.output_names]

    def _past(self, feeds: Mapping[str, Any]) -> int:
        return next(
            (int(np.shape(v)[2]) for k, v in feeds.items() if k.startswith("past_key_values.")), 0
        )

    def run(self, feeds: Mapping[str, Any]) -> list[Any]:
        """One run on the model's feeds: past state in, present state out (concatenated)."""
        torch = self.torch
        ids = self.feed_in(feeds, "input_ids", torch.long)
        past = self._past(feeds)
        if "position_ids" in feeds:
            positions = self.feed_in(feeds, "position_ids", torch.long)
            if positions.dim() == 3:
                positions = positions[0]  # text: the three MRoPE rows are equal
        else:
            b, s = ids.shape
            positions = torch.arange(past, past + s, device=self.device)[None].expand(b, s)
        outputs: dict[str, Any] = {}
        cache = ConcatCache(self, feeds, outputs, self.feed_in(feeds, "attention_mask"), past)
        outputs["logits"] = self.forward(ids, positions, cache)
        return self.finish(outputs)

    def forward(self, ids: Any, positions: Any, cache: Any) -> Any:
        """Logits of ``ids`` [B, S] at ``positions`` [B, S], reading and updating ``cache``."""
        raise NotImplementedError


class ConcatCache:
    """A run's state from its feeds; the present KV cache is past and new rows concatenated
    (what an eager torch loop with a growing cache does), each present stored in ``outputs``."""

    def __init__(
        self, peer: Any, feeds: Mapping[str, Any], outputs: dict[str, Any], mask: Any, past: int
    ) -> None:
        self.peer, self.feeds, self.outputs, self.mask, self.past = peer, feeds, outputs, mask, past
        self.torch = peer.torch

    def kv(self, i: int, k: Any, v: Any) -> tuple[Any, Any, Any]:
        """Layer ``i``'s keys and values with the new rows k, v [B, KV, S, D], and the mask."""
        torch, s = self.torch, k.shape[2]
        past = self.peer.feed_in
        k = torch.cat([past(self.feeds, f"past_key_values.{i}.key", k.dtype), k], dim=2)
        v = torch.cat([past(self.feeds, f"past_key_values.{i}.value", v.dtype), v], 2)
        self.outputs[f"present.{i}.key"], self.outputs[f"present.{i}.value"] = k, v
        total = k.shape[2]
        q_pos = torch.arange(self.past, self.past + s, device=k.device)[:, None]
        allowed = torch.arange(total, device=k.device)[None, :] <= q_pos  # [S, T]
        allowed = allowed[None, None] & (self.mask[:, None, None, :total] != 0)
        return k, v, allowed

    def conv(self, i: int, dtype: Any) -> Any:
        return self.peer.feed_in(self.feeds, f"past.{i}.conv", dtype)

    def set_conv(self, i: int, value: Any) -> None:
        self.outputs[f"present.{i}.conv"] = value

    def recurrent(self, i: int) -> Any:
        return self.peer.feed_in(self.feeds, f"past.{i}.recurrent", self.torch.float32)

    def set_recurrent(self, i: int, value: Any) -> None:
        self.outputs[f"present.{i}.recurrent"] = value


class GenaiDecoderPeer(_DecoderBase):
    """A ``genai-decoder``: packed QKV (+bias), rotary from the caches, GQA, SiLU MLP."""

    def __init__(self, model_path: str, cfg: dict[str, Any], device: str) -> None:
        super().__init__(model_path, cfg, device)
        self.layers = []
        self._mlp = []
        for i in range(cfg["layers"]):
            p = f"model.layers.{i}.attn"
            bias = f"{p}.qkv_proj.Add.bias"
            self.layers.append(
                (
                    *self.norms(i),
                    self.w.matmul(f"{p}.qkv_proj.MatMul"),
                    self.w.tensor(bias) if self.w.has(bias) else None,
                    self.w.matmul(f"{p}.o_proj.MatMul"),
                )
            )
            self._mlp.append(self._load_mlp(i))
        self.w.release()

    def forward(self, ids: Any, positions: Any, cache: Any) -> Any:
        cfg = self.cfg
        b, s = ids.shape
        heads, kvh, d = cfg["heads"], cfg["kv_heads"], cfg["head_dim"]
        x = self.embed[ids]
        for i, (n_in, n_post, w_qkv, bias, w_o) in enumerate(self.layers):
            h = self.rms(x, n_in)
            qkv = h @ w_qkv
            if bias is not None:
                qkv = qkv + bias
            q, k, v = qkv.split([heads * d, kvh * d, kvh * d], dim=-1)
            q = self.rotate(q.view(b, s, heads, d).transpose(1, 2), positions, d)
            k = self.rotate(k.view(b, s, kvh, d).transpose(1, 2), positions, d)
            k, v, allowed = cache.kv(i, k, v.view(b, s, kvh, d).transpose(1, 2))
            a = self.attend(q, k, v, allowed).transpose(1, 2).reshape(b, s, heads * d)
            x = x + a @ w_o
            x = x + self.mlp(i, self.rms(x, n_post))
        return self.logits(x)


class HybridDecoderPeer(_DecoderBase):
    """A ``hybrid-decoder`` (Qwen3.5): gated-delta linear attention and gated full attention.

    Linear layers: causal depthwise conv with carried state and SiLU, per-head
    L2-normalized q and k, decay ``-exp(A_log) * softplus(a + dt_bias)`` and
    rate ``sigmoid(b)``, the gated delta rule one token at a time, then an RMS
    norm gated by ``silu(z)``. Full layers: q with a per-head output gate,
    per-head q/k RMS norms, partial rotary, GQA over the cache, sigmoid gate.
    """

    def __init__(self, model_path: str, cfg: dict[str, Any], device: str) -> None:
        super().__init__(model_path, cfg, device)
        f32 = self.torch.float32
        self.layers: list[tuple[str, tuple[Any, ...]]] = []
        self._mlp = []
        for i, kind in enumerate(cfg["layer_types"]):
            if kind == "linear_attention":
                p = f"model.layers.{i}.linear_attn"
                weights = (
                    *(self.w.matmul(f"{p}.{n}_proj.MatMul") for n in ("qkv", "z", "b", "a")),
                    self.w.tensor(f"{p}.conv1d.weight"),
                    self.w.tensor(f"{p}.conv1d.bias"),
                    self.w.tensor(f"{p}.dt_bias", f32),
                    self.w.tensor(f"{p}.neg_exp_A", f32),
                    self.w.tensor(f"{p}.norm.weight", f32),
                    self.w.matmul(f"{p}.out_proj.MatMul"),
                )
            else:
                p = f"model.layers.{i}.attn"
                weights = (
                    self.w.matmul(f"{p}.qkv_proj.MatMul"),
                    self.w.tensor(f"{p}.q_norm.layernorm.weight", f32),
                    self.w.tensor(f"{p}.k_norm.layernorm.weight", f32),
                    self.w.matmul(f"{p}.o_proj.MatMul"),
                )
            self.layers.append((kind, (*self.norms(i), *weights)))
            self._mlp.append(self._load_mlp(i))
        self.w.release()

    def forward(self, ids: Any, positions: Any, cache: Any) -> Any:
        x = self.embed[ids]
        for i, (kind, (n_in, n_post, *weights)) in enumerate(self.layers):
            h = self.rms(x, n_in)
            if kind == "linear_attention":
                x = x + self.linear_attention(i, h, weights, cache)
            else:
                x = x + self.full_attention(i, h, weights, cache, positions)
            x = x + self.mlp(i, self.rms(x, n_post))
        return self.logits(x)

    def full_attention(self, i, h, weights, cache, pos) -> Any:
        torch, cfg = self.torch, self.cfg
        w_qkv, q_norm, k_norm, w_o = weights
        b, s, _ = h.shape
        heads, kvh, d = cfg["heads"], cfg["kv_heads"], cfg["head_dim"]
        qg, k, v = (h @ w_qkv).split([2 * heads * d, kvh * d, kvh * d], dim=-1)
        q, gate = qg.view(b, s, heads, 2 * d).split([d, d], dim=-1)
        rot = int(d * cfg["partial_rotary_factor"])
        q = self.rotate(self.rms(q, q_norm).transpose(1, 2), pos, rot)
        k = self.rotate(self.rms(k.view(b, s, kvh, d), k_norm).transpose(1, 2), pos, rot)
        k, v, allowed = cache.kv(i, k, v.view(b, s, kvh, d).transpose(1, 2))
        a = self.attend(q, k, v, allowed).transpose(1, 2)  # [B, S, H, D]
        return (a * torch.sigmoid(gate)).reshape(b, s, heads * d) @ w_o

    def linear_attention(self, i, h, weights, cache) -> Any:
        torch, cfg = self.torch, self.cfg
        fn = torch.nn.functional
        w_qkv, w_z, w_b, w_a, conv_w, conv_b, dt_bias, neg_exp_a, norm_w, w_out = weights
        b, s, _ = h.shape
        nk, dk = cfg["linear_key_heads"], cfg["linear_key_dim"]
        hv, dv = cfg["linear_value_heads"], cfg["linear_value_dim"]
        # causal depthwise conv over [past state | new tokens], then SiLU
        seq = torch.cat([cache.conv(i, h.dtype), (h @ w_qkv).transpose(1, 2)], 2)
        cache.set_conv(i, seq[:, :, seq.shape[2] - (conv_w.shape[-1] - 1) :])
        conv = fn.silu(fn.conv1d(seq, conv_w, conv_b, groups=seq.shape[1])).transpose(1, 2)
        q, k, v = conv.float().split([nk * dk, nk * dk, hv * dv], dim=-1)
        q = fn.normalize(q.view(b, s, nk, dk), dim=-1) / math.sqrt(dk)
        k = fn.normalize(k.view(b, s, nk, dk), dim=-1)
        q, k = (t.repeat_interleave(hv // nk, dim=2) for t in (q, k))  # per value head
        v = v.view(b, s, hv, dv)
        decay = neg_exp_a * fn.softplus((h @ w_a).float() + dt_bias)  # [B, S, Hv], log space
        beta = torch.sigmoid((h @ w_b).float())
        state = cache.recurrent(i)  # [B, Hv, dk, dv]
        outs = []
        for t in range(s):
            state = state * decay[:, t, :, None, None].exp()
            kt = k[:, t]
            upd = beta[:, t, :, None] * (v[:, t] - (kt[:, :, None, :] @ state)[:, :, 0])
            state = state + kt[:, :, :, None] * upd[:, :, None, :]
            outs.append((q[:, t, :, None, :] @ state)[:, :, 0])
        cache.set_recurrent(i, state)
        o = torch.stack(outs, dim=1)  # [B, S, Hv, dv]
        z = (h @ w_z).float().view(b, s, hv, dv)
        o = o * torch.rsqrt(o.pow(2).mean(-1, keepdim=True) + self.eps) * norm_w * fn.silu(z)
        return o.reshape(b, s, hv * dv).to(h.dtype) @ w_out
