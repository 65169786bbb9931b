"""LLaMA / Qwen2 decoders in exactly the form onnxruntime-genai's model builder exports them.

Per layer: RMSNorm (``SimplifiedLayerNormalization`` for the first, then
``SkipSimplifiedLayerNormalization``), one packed QKV MatMul (plus one packed
bias Add when any q/k/v bias is nonzero, as the builder checks),
``GroupQueryAttention`` with rotary from the ``cos_cache``/``sin_cache``
initializers, the output projection, the SiLU-gated MLP; then the final norm
and the LM head. ``seqlens_k`` and ``total_sequence_length`` come from
``attention_mask`` through the builder's ReduceSum/Sub/Cast and
Shape/Gather/Cast subgraph.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import onnx

from .config import SIZES, DecoderConfig, resolve
from .graph import MS, GraphWriter, save
from .layers import Emitter, Precision, rotary_caches
from .weights import WeightSource

FACTORY_KIND = "genai-decoder"


def build_genai_decoder(
    config: str | dict[str, Any] | DecoderConfig,
    weights: Mapping[str, np.ndarray] | None = None,
    seed: int = 0,
    dtype: str = "fp32",
    out_path: str | Path | None = None,
    symmetric: bool = True,
) -> onnx.ModelProto:
    """The genai-format decoder for ``config`` (a name in ``SIZES``, a dict or a config).

    ``weights``: a Hugging Face state dict (numpy arrays) to use instead of a
    seeded random init. With ``out_path`` the model is saved there and its
    weights to ``<name>.data`` beside it (the returned proto refers to that file).
    """
    cfg: DecoderConfig = resolve(config, SIZES)
    prec = Precision(dtype, symmetric=symmetric)
    out = Path(out_path) if out_path else None
    g = GraphWriter(out.with_name(out.name + ".data") if out else None)
    e = Emitter(g, WeightSource(weights, seed), cfg, prec)

    layer_ids = list(range(cfg.layers))
    e.decoder_io()
    e.kv_cache_io(layer_ids)
    seqlens, total = e.mask_lengths()
    x = e.embedding()
    cos, sin = rotary_caches(cfg.head_dim, cfg.rope_theta, cfg.max_length)
    caches = (e.float_init("cos_cache", cos), e.float_init("sin_cache", sin))
    for i in layer_ids:
        h = e.norm(
            f"/model/layers.{i}/input_layernorm", f"model.layers.{i}.input_layernorm.weight", x
        )
        e.pending = attention(e, i, h, seqlens, total, caches)
        h = e.norm(
            f"/model/layers.{i}/post_attention_layernorm",
            f"model.layers.{i}.post_attention_layernorm.weight",
        )
        e.pending = e.mlp(i, h)
    h = e.norm(f"/model/layers.{cfg.layers}/final_norm_layernorm", "model.norm.weight", final=True)
    e.lm_head(h)

    model = g.finish("main_graph", metadata(cfg, prec))
    if out:
        save(model, out)
    return model


def metadata(cfg: DecoderConfig, prec: Precision, kind: str = FACTORY_KIND) -> dict[str, Any]:
    """What the torch peer needs to rebuild the architecture."""
    conf = dataclasses.asdict(cfg)
    conf.update(
        dtype=prec.name,
        bits=prec.bits,
        block_size=prec.block_size if prec.bits else 0,
        symmetric=prec.symmetric,
    )
    return {"onnxep.factory": kind, "onnxep.config": conf}


def attention(e: Emitter, i: int, x: str, seqlens: str, total: str, caches: tuple[str, str]) -> str:
    """Packed QKV projection, GroupQueryAttention (rotary inside), output projection."""
    cfg, g = e.cfg, e.g
    base, hf = f"/model/layers.{i}/attn", f"model.layers.{i}.self_attn"
    q_out, kv_out = cfg.heads * cfg.head_dim, cfg.kv_heads * cfg.head_dim
    w = np.concatenate(
        [
            e.weight(f"{hf}.q_proj.weight", (q_out, cfg.hidden)),
            e.weight(f"{hf}.k_proj.weight", (kv_out, cfg.hidden)),
            e.weight(f"{hf}.v_proj.weight", (kv_out, cfg.hidden)),
        ]
    )
    qkv = e.matmul(f"{base}/qkv_proj/MatMul", x, w.T)
    if cfg.attention_bias:
        bias = np.concatenate(
            [
                e.weight(f"{hf}.q_proj.bias", (q_out,), "bias"),
                e.weight(f"{hf}.k_proj.bias", (kv_out,), "bias"),
                e.weight(f"{hf}.v_proj.bias", (kv_out,), "bias"),
            ]
        )
        # the builder drops an all-zero bias rather than add zeros
        if np.count_nonzero(bias):
            b = e.float_init(f"model.layers.{i}.attn.qkv_proj.Add.bias", bias)
            qkv = g.op("Add", [qkv, b], f"{base}/qkv_proj/Add")
    outs = g.node(
        "GroupQueryAttention",
        [qkv, "", "", f"past_key_values.{i}.key", f"past_key_values.{i}.value", seqlens, total]
        + [*caches, "", "", ""],
        f"{base}/GroupQueryAttention",
        [f"{base}/GroupQueryAttention/output_0", f"present.{i}.key", f"present.{i}.value"],
        MS,
        do_rotary=1,
        kv_num_heads=cfg.kv_heads,
        local_window_size=-1,
        num_heads=cfg.heads,
        rotary_interleaved=0,
        scale=float(1.0 / np.sqrt(cfg.head_dim)),
        softcap=0.0,
    )
    return e.linear(f"{base}/o_proj/MatMul", outs[0], f"{hf}.o_proj.weight", cfg.hidden, q_out)
