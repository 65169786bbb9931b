"""Hugging Face counterparts of factory configs, and their state dicts in factory naming.

Used to check the factory against onnxruntime-genai's builder (same weights
through both), and to build a factory model from a real checkpoint. Needs
``transformers`` and ``torch`` (``pip install -e .[export]``).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .config import DecoderConfig, HybridConfig


def qwen2_config(cfg: DecoderConfig) -> Any:
    """A ``Qwen2Config`` of the same shape (Qwen2 always has q/k/v biases)."""
    from transformers import Qwen2Config

    return Qwen2Config(
        vocab_size=cfg.vocab,
        hidden_size=cfg.hidden,
        intermediate_size=cfg.intermediate,
        num_hidden_layers=cfg.layers,
        num_attention_heads=cfg.heads,
        num_key_value_heads=cfg.kv_heads,
        max_position_embeddings=cfg.max_length,
        rms_norm_eps=cfg.eps,
        rope_parameters={"rope_type": "default", "rope_theta": cfg.rope_theta},
        tie_word_embeddings=cfg.tie_embeddings,
    )


def qwen3_5_config(cfg: HybridConfig) -> Any:
    """A ``Qwen3_5Config`` whose text model has this shape (and a one-layer vision tower)."""
    from transformers import Qwen3_5Config

    text = dict(
        vocab_size=cfg.vocab,
        hidden_size=cfg.hidden,
        intermediate_size=cfg.intermediate,
        num_hidden_layers=cfg.layers,
        num_attention_heads=cfg.heads,
        num_key_value_heads=cfg.kv_heads,
        head_dim=cfg.head_dim,
        linear_conv_kernel_dim=cfg.conv_kernel,
        linear_key_head_dim=cfg.linear_key_dim,
        linear_value_head_dim=cfg.linear_value_dim,
        linear_num_key_heads=cfg.linear_key_heads,
        linear_num_value_heads=cfg.linear_value_heads,
        layer_types=list(cfg.layer_types),
        max_position_embeddings=cfg.max_length,
        rms_norm_eps=cfg.eps,
        tie_word_embeddings=cfg.tie_embeddings,
        rope_parameters={
            "rope_type": "default",
            "rope_theta": cfg.rope_theta,
            "partial_rotary_factor": cfg.partial_rotary_factor,
            "mrope_section": list(cfg.mrope_section),
            "mrope_interleaved": True,
        },
    )
    vision = dict(
        depth=1, hidden_size=32, intermediate_size=64, num_heads=2, out_hidden_size=cfg.hidden
    )
    return Qwen3_5Config(
        text_config=text, vision_config=vision, tie_word_embeddings=cfg.tie_embeddings
    )


def text_state_dict(model: Any) -> dict[str, np.ndarray]:
    """The text decoder's weights as float32 arrays, named ``model.layers...`` / ``lm_head``.

    (A multimodal model's ``model.language_model.`` prefix is dropped, its vision tower left out.)
    """
    out = {}
    for name, tensor in model.state_dict().items():
        if "visual" in name:
            continue
        out[name.replace("model.language_model.", "model.")] = tensor.detach().float().numpy()
    return out
