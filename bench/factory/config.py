"""Architectures the factory builds, and the named sizes benchmarks refer to."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class DecoderConfig:
    """A LLaMA/Qwen2-style decoder, in the terms onnxruntime-genai's builder uses."""

    hidden: int
    layers: int
    heads: int
    kv_heads: int
    intermediate: int
    vocab: int
    head_dim: int = 0  # 0: hidden // heads
    rope_theta: float = 10000.0
    eps: float = 1e-6
    max_length: int = 256  # rows of the cos/sin caches (the builder's context_length)
    attention_bias: bool = False  # Qwen2 has q/k/v biases, LLaMA has none
    tie_embeddings: bool = False

    def __post_init__(self) -> None:
        if not self.head_dim:
            object.__setattr__(self, "head_dim", self.hidden // self.heads)

    def replace(self, **changes: Any) -> DecoderConfig:
        return dataclasses.replace(self, **changes)


@dataclass(frozen=True)
class HybridConfig(DecoderConfig):
    """A Qwen3.5-style hybrid: gated-delta linear-attention layers between full-attention ones."""

    full_attention_interval: int = 4  # every 4th layer is full attention, as in Qwen3.5
    conv_kernel: int = 4
    linear_key_heads: int = 2
    linear_value_heads: int = 4
    linear_key_dim: int = 32
    linear_value_dim: int = 32
    partial_rotary_factor: float = 0.25
    # interleaved MRoPE sections (time, height, width) over rotary_dim / 2, for positions="3d"
    mrope_section: tuple[int, ...] = ()
    layer_types: tuple[str, ...] = field(default=())

    def __post_init__(self) -> None:
        super().__post_init__()
        if not self.layer_types:
            n = self.full_attention_interval
            types = tuple(
                "full_attention" if (i + 1) % n == 0 else "linear_attention"
                for i in range(self.layers)
            )
            object.__setattr__(self, "layer_types", types)
        if not self.mrope_section:
            half = self.rotary_dim // 2
            third = -(-half // 3)
            object.__setattr__(self, "mrope_section", (third, third, half - 2 * third))

    @property
    def rotary_dim(self) -> int:
        return int(self.head_dim * self.partial_rotary_factor)

    @property
    def conv_dim(self) -> int:
        # the causal conv runs over the packed q, k and v channels
        return 2 * self.linear_key_heads * self.linear_key_dim + self.value_dim

    @property
    def value_dim(self) -> int:
        return self.linear_value_heads * self.linear_value_dim


SIZES: dict[str, DecoderConfig] = {
    "tiny": DecoderConfig(hidden=128, layers=2, heads=4, kv_heads=2, intermediate=256, vocab=512),
    "qwen2.5-0.5b": DecoderConfig(
        hidden=896,
        layers=24,
        heads=14,
        kv_heads=2,
        head_dim=64,
        intermediate=4864,
        vocab=151936,
        rope_theta=1000000.0,
        max_length=32768,
        attention_bias=True,
        tie_embeddings=True,
    ),
    "qwen2.5-1.5b": DecoderConfig(
        hidden=1536,
        layers=28,
        heads=12,
        kv_heads=2,
        head_dim=128,
        intermediate=8960,
        vocab=151936,
        rope_theta=1000000.0,
        max_length=32768,
        attention_bias=True,
        tie_embeddings=True,
    ),
}

HYBRID_SIZES: dict[str, HybridConfig] = {
    "tiny": HybridConfig(
        hidden=128,
        layers=4,
        heads=4,
        kv_heads=2,
        head_dim=32,
        intermediate=256,
        vocab=512,
        mrope_section=(2, 1, 1),
    ),
    # Qwen3.5-0.8B's text decoder
    "qwen3.5-0.8b": HybridConfig(
        hidden=1024,
        layers=24,
        heads=8,
        kv_heads=2,
        head_dim=256,
        intermediate=3584,
        vocab=248320,
        rope_theta=10000000.0,
        max_length=32768,
        linear_key_heads=16,
        linear_value_heads=16,
        linear_key_dim=128,
        linear_value_dim=128,
        mrope_section=(11, 11, 10),
        tie_embeddings=True,
    ),
}


def resolve(config: str | dict[str, Any] | DecoderConfig, table: dict[str, Any]) -> Any:
    """A size name, a dict of fields or a config object, as a config object."""
    if isinstance(config, str):
        if config not in table:
            raise ValueError(f"unknown size {config!r}; choose from {', '.join(table)}")
        return table[config]
    if isinstance(config, dict):
        cls = HybridConfig if table is HYBRID_SIZES else DecoderConfig
        return cls(**config)
    return config
