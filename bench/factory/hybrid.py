"""Qwen3.5-style hybrid decoders, in the form onnxruntime-genai's builder exports them.

Three gated-delta linear-attention layers to each full-attention layer (the
builder's ``Qwen35TextModel``):

- linear attention: qkv/z/b/a projections, ``CausalConvWithState`` over the
  packed q/k/v channels (state ``past.N.conv``), per-head L2 norm of q and k
  (``LpNormalization``), q scaled by 1/sqrt(d_k), ``LinearAttentionGate``
  (decay and beta), ``LinearAttention`` (update rule ``gated_delta``, state
  ``past.N.recurrent``), ``GatedRMSNorm`` with the z gate, output projection;
- full attention: a packed projection whose q half carries a per-head output
  gate, q/k RMS norms, rotary on the first quarter of each head, then
  ``GroupQueryAttention`` without rotary of its own, the sigmoid output gate
  and the output projection.

The builder feeds rotary 3-D ``position_ids`` (``MRotaryEmbedding``, Qwen3.5's
multimodal rotary). For text the three position rows are equal, so
``positions="2d"`` (the default) emits ``RotaryEmbedding`` on 2-D position ids
instead: the same function, in the op more runtimes have. ``positions="3d"``
emits exactly the builder's form.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto

from .config import HYBRID_SIZES, HybridConfig, resolve
from .genai import metadata
from .graph import MS, GraphWriter, save
from .layers import Emitter, Precision, rotary_caches
from .weights import WeightSource

FACTORY_KIND = "hybrid-decoder"


class HybridEmitter(Emitter):
    cfg: HybridConfig

    def _norm_w(self, hf_name: str) -> np.ndarray:
        # Qwen3.5's RMSNorm scales by (1 + weight); the builder bakes the 1 in, and so do we
        return self.offset_norm(hf_name, (self.cfg.hidden,))

    def offset_norm(self, hf_name: str, shape: tuple[int, ...]) -> np.ndarray:
        return 1.0 + self.weight(hf_name, shape, "offset")


def build_hybrid_decoder(
    config: str | dict[str, Any] | HybridConfig,
    weights: Mapping[str, np.ndarray] | None = None,
    seed: int = 0,
    dtype: str = "fp32",
    out_path: str | Path | None = None,
    positions: str = "2d",
) -> onnx.ModelProto:
    """The hybrid decoder for ``config`` (a name in ``HYBRID_SIZES``, a dict or a config).

    ``weights``: a Hugging Face state dict of the text model (``model.layers...``
    names, Qwen3.5's offset norm weights). See ``build_genai_decoder`` for the rest.
    """
    if positions not in ("2d", "3d"):
        raise ValueError(f"positions must be '2d' or '3d', not {positions!r}")
    cfg: HybridConfig = resolve(config, HYBRID_SIZES)
    prec = Precision(dtype)
    out = Path(out_path) if out_path else None
    g = GraphWriter(out.with_name(out.name + ".data") if out else None)
    e = HybridEmitter(g, WeightSource(weights, seed), cfg, prec)

    full = [i for i, t in enumerate(cfg.layer_types) if t == "full_attention"]
    linear = [i for i, t in enumerate(cfg.layer_types) if t == "linear_attention"]
    pos_shape = ["batch_size", "sequence_length"]
    e.decoder_io(
        [("position_ids", TensorProto.INT64, [3, *pos_shape] if positions == "3d" else pos_shape)]
    )
    e.kv_cache_io(full)
    _state_io(e, linear)
    seqlens, total = e.mask_lengths()
    x = e.embedding()
    caches: tuple[str, str] | None = None
    for i in range(cfg.layers):
        h = e.norm(
            f"/model/layers.{i}/input_layernorm", f"model.layers.{i}.input_layernorm.weight", x
        )
        if cfg.layer_types[i] == "linear_attention":
            e.pending = linear_attention(e, i, h)
        else:
            if caches is None:
                cos, sin = rotary_caches(cfg.rotary_dim, cfg.rope_theta, cfg.max_length)
                caches = (
                    g.init("cos_cache", cos),
                    g.init("sin_cache", sin),
                )  # fp32, as the builder
            e.pending = full_attention(e, i, h, seqlens, total, caches, positions)
        h = e.norm(
            f"/model/layers.{i}/post_attention_layernorm",
            f"model.layers.{i}.post_attention_layernorm.weight",
        )
        e.pending = e.mlp(i, h)
    h = e.norm(f"/model/layers.{cfg.layers}/final_norm_layernorm", "model.norm.weight", final=True)
    e.lm_head(h)

    meta = metadata(cfg, prec, FACTORY_KIND)
    meta["onnxep.config"]["positions"] = positions
    model = g.finish("main_graph", meta)
    if out:
        save(model, out)
    return model


def _state_io(e: HybridEmitter, linear: list[int]) -> None:
    """Conv states [B, conv_dim, K-1] and recurrent states [B, Hv, Dk, Dv], in and out."""
    cfg = e.cfg
    shapes = {
        "conv": ["batch_size", cfg.conv_dim, cfg.conv_kernel - 1],
        "recurrent": [
            "batch_size",
            cfg.linear_value_heads,
            cfg.linear_key_dim,
            cfg.linear_value_dim,
        ],
    }
    for prefix, add in (("past", e.g.input), ("present", e.g.output)):
        for kind, shape in shapes.items():
            for i in linear:
                add(f"{prefix}.{i}.{kind}", e.prec.elem, shape)


def linear_attention(e: HybridEmitter, i: int, x: str) -> str:
    cfg, g, prec = e.cfg, e.g, e.prec
    base, hf = f"/model/layers.{i}/linear_attn", f"model.layers.{i}.linear_attn"
    hv, key_dim, value_dim = (
        cfg.linear_value_heads,
        cfg.linear_key_heads * cfg.linear_key_dim,
        cfg.value_dim,
    )
    qkv = e.linear(
        f"{base}/qkv_proj/MatMul", x, f"{hf}.in_proj_qkv.weight", cfg.conv_dim, cfg.hidden
    )
    z = e.linear(f"{base}/z_proj/MatMul", x, f"{hf}.in_proj_z.weight", value_dim, cfg.hidden)
    # the builder keeps the small decay/beta gate projections dense even in int4 models
    dense = Emitter(g, e.src, cfg, Precision("fp16" if prec.name == "fp16" else "fp32"))
    b = dense.linear(f"{base}/b_proj/MatMul", x, f"{hf}.in_proj_b.weight", hv, cfg.hidden)
    a = dense.linear(f"{base}/a_proj/MatMul", x, f"{hf}.in_proj_a.weight", hv, cfg.hidden)
    qkv_t = g.op("Transpose", [qkv], f"{base}/qkv_proj/Transpose", perm=[0, 2, 1])
    conv_w = e.float_init(
        f"{hf}.conv1d.weight",
        e.weight(f"{hf}.conv1d.weight", (cfg.conv_dim, 1, cfg.conv_kernel), "conv"),
    )
    conv_b = e.float_init(
        f"{hf}.conv1d.bias", np.zeros(cfg.conv_dim, np.float32)
    )  # Qwen3.5 has none
    conv = g.node(
        "CausalConvWithState",
        [qkv_t, conv_w, conv_b, f"past.{i}.conv"],
        f"{base}/CausalConvWithState",
        [f"{base}/CausalConvWithState/output_0", f"present.{i}.conv"],
        MS,
        activation="silu",
        ndim=1,
        state_window=0,
    )[0]
    conv = g.op("Transpose", [conv], f"{base}/conv_out/Transpose", perm=[0, 2, 1])
    q, k, v = g.node(
        "Split",
        [conv, g.constant("INT64", [key_dim, key_dim, value_dim])],
        f"{base}/split_qkv/Split",
        3,
        axis=-1,
    )
    q = _l2_normalize(e, f"{base}/q_l2norm", q)
    k = _l2_normalize(e, f"{base}/k_l2norm", k)
    f_type = "FLOAT16" if prec.name == "fp16" else "FLOAT"
    q = g.op(
        "Mul",
        [q, g.constant(f_type, float(1.0 / np.sqrt(cfg.linear_key_dim)))],
        f"{base}/q_scaled/Mul",
    )
    # decay = -exp(A_log) * softplus(a + dt_bias), beta = sigmoid(b), inside LinearAttentionGate
    dt_bias = g.init(f"{hf}.dt_bias", e.weight(f"{hf}.dt_bias", (hv,), "norm"))
    a_log = e.weight(f"{hf}.A_log", (hv,), "a_log")
    neg_exp_a = g.init(f"{hf}.neg_exp_A", _neg_exp(a_log))
    decay, beta = g.node(
        "LinearAttentionGate", [a, dt_bias, neg_exp_a, b], f"{base}/LinearAttentionGate", 2, MS
    )
    attn = g.node(
        "LinearAttention",
        [q, k, v, f"past.{i}.recurrent", decay, beta],
        f"{base}/LinearAttention",
        [f"{base}/LinearAttention/output_0", f"present.{i}.recurrent"],
        MS,
        kv_num_heads=hv,
        q_num_heads=cfg.linear_key_heads,
        scale=1.0,  # q is already scaled
        state_window=0,
        update_rule="gated_delta",
    )[0]
    norm_w = e.float_init(
        f"{hf}.norm.weight", e.weight(f"{hf}.norm.weight", (cfg.linear_value_dim,), "norm")
    )
    gated = g.op("GatedRMSNorm", [attn, norm_w, z], f"{base}/GatedRMSNorm", MS, epsilon=cfg.eps)
    return e.linear(
        f"{base}/out_proj/MatMul", gated, f"{hf}.out_proj.weight", cfg.hidden, value_dim
    )


def _neg_exp(a_log: np.ndarray) -> np.ndarray:
    """-exp(A_log) in float32; through torch when it is there, to match the builder bit for bit."""
    try:
        import torch
    except ImportError:
        return (-np.exp(a_log.astype(np.float32))).astype(np.float32)
    return (-torch.from_numpy(np.array(a_log, np.float32)).exp()).numpy()


def _l2_normalize(e: HybridEmitter, base: str, x: str) -> str:
    """Per-head L2 norm: [B, S, N*H] -> [B, S, N, H], LpNormalization, and back."""
    cfg, g = e.cfg, e.g
    heads, dim = cfg.linear_key_heads, cfg.linear_key_dim
    x = g.op("Reshape", [x, g.constant("INT64", [0, 0, heads, dim])], f"{base}/flat/Reshape")
    x = g.op("LpNormalization", [x], f"{base}/LpNormalization", axis=-1, p=2)
    return g.op("Reshape", [x, g.constant("INT64", [0, 0, heads * dim])], f"{base}/unflat/Reshape")


def full_attention(
    e: HybridEmitter,
    i: int,
    x: str,
    seqlens: str,
    total: str,
    caches: tuple[str, str],
    positions: str,
) -> str:
    cfg, g = e.cfg, e.g
    base, hf = f"/model/layers.{i}/attn", f"model.layers.{i}.self_attn"
    d, heads, kvh = cfg.head_dim, cfg.heads, cfg.kv_heads
    q_size, kv_size = heads * d, kvh * d
    w = np.concatenate(
        [
            e.weight(f"{hf}.q_proj.weight", (2 * q_size, cfg.hidden)),  # per head: q then gate
            e.weight(f"{hf}.k_proj.weight", (kv_size, cfg.hidden)),
            e.weight(f"{hf}.v_proj.weight", (kv_size, cfg.hidden)),
        ]
    )
    qkv = e.matmul(f"{base}/qkv_proj/MatMul", x, w.T)
    qg, k, v = g.node(
        "Split",
        [qkv, g.constant("INT64", [2 * q_size, kv_size, kv_size])],
        f"{base}/qkv_proj/Split",
        3,
        axis=-1,
    )
    qg = g.op("Reshape", [qg, g.constant("INT64", [0, 0, heads, 2 * d])], f"{base}/q_gate/Reshape")
    q4, gate4 = g.node(
        "Split", [qg, g.constant("INT64", [d, d])], f"{base}/q_gate/Split", 2, axis=-1
    )
    flat = g.constant("INT64", [0, 0, q_size])
    q = g.op("Reshape", [q4, flat], f"{base}/q_proj/Reshape")
    gate = g.op("Reshape", [gate4, flat], f"{base}/gate/Reshape")
    q = _head_norm(e, f"{base}/q_norm", q, f"{hf}.q_norm.weight", q_size)
    k = _head_norm(e, f"{base}/k_norm", k, f"{hf}.k_norm.weight", kv_size)
    q = _rotary(e, f"{base}/q_rotary", q, heads, caches, positions)
    k = _rotary(e, f"{base}/k_rotary", k, kvh, caches, positions)
    attn = g.node(
        "GroupQueryAttention",
        [q, k, v, f"past_key_values.{i}.key", f"past_key_values.{i}.value", seqlens, total]
        + ["", "", "", "", ""],
        f"{base}/GroupQueryAttention",
        [f"{base}/GroupQueryAttention/output_0", f"present.{i}.key", f"present.{i}.value"],
        MS,
        do_rotary=0,
        kv_num_heads=kvh,
        local_window_size=-1,
        num_heads=heads,
        rotary_interleaved=0,
        scale=float(1.0 / np.sqrt(d)),
        softcap=0.0,
    )[0]
    sig = g.op("Sigmoid", [gate], f"{base}/gate/Sigmoid")
    gated = g.op("Mul", [attn, sig], f"{base}/gate/Mul")
    return e.linear(f"{base}/o_proj/MatMul", gated, f"{hf}.o_proj.weight", cfg.hidden, q_size)


def _head_norm(e: HybridEmitter, base: str, x: str, hf_name: str, width: int) -> str:
    """RMSNorm over each head: reshape to [B, S*N, D], SimplifiedLayerNormalization, back."""
    cfg, g = e.cfg, e.g
    w = e.float_init(
        f"{base[1:].replace('/', '.')}.layernorm.weight", e.offset_norm(hf_name, (cfg.head_dim,))
    )
    x = g.op("Reshape", [x, g.constant("INT64", [0, -1, cfg.head_dim])], f"{base}/Reshape_1")
    x = g.op(
        "SimplifiedLayerNormalization",
        [x, w],
        f"{base}/SimplifiedLayerNormalization",
        axis=-1,
        epsilon=cfg.eps,
        stash_type=1,
    )
    return g.op("Reshape", [x, g.constant("INT64", [0, -1, width])], f"{base}/Reshape_2")


def _rotary(
    e: HybridEmitter, base: str, x: str, heads: int, caches: tuple[str, str], positions: str
) -> str:
    """Partial rotary in fp32 (cast around it for fp16 models, as the builder does)."""
    cfg, g = e.cfg, e.g
    op = "MRotaryEmbedding" if positions == "3d" else "RotaryEmbedding"
    name = f"{base}/{op}"
    out = f"{name}/output_0"
    attrs: dict[str, Any] = dict(
        interleaved=0, is_packed_batching=0, num_heads=heads, rotary_embedding_dim=cfg.rotary_dim
    )
    if positions == "3d":
        # Qwen3.5's interleaved MRoPE sections over the rotary half-dim (time, height, width)
        attrs.update(mrope_layout=1, mrope_section=list(cfg.mrope_section))
    fp16 = e.prec.name == "fp16"
    if fp16:
        x = g.op("Cast", [x], f"{name}/root_input/Cast", to=TensorProto.FLOAT)
        out = f"{name}/output_0/Cast/output_0"
    g.node(op, [x, "position_ids", *caches], name, [out], MS, **attrs)
    if fp16:
        g.node("Cast", [out], f"{name}/output_0/Cast", [f"{name}/output_0"], to=TensorProto.FLOAT16)
    return f"{name}/output_0"
