"""Benchmark models built to order: genai-format and hybrid decoders, torch-exported models."""

from .config import HYBRID_SIZES, SIZES, DecoderConfig, HybridConfig
from .genai import build_genai_decoder
from .hybrid import build_hybrid_decoder

__all__ = [
    "HYBRID_SIZES",
    "SIZES",
    "DecoderConfig",
    "HybridConfig",
    "build_genai_decoder",
    "build_hybrid_decoder",
]
