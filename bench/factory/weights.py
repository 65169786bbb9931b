"""Where a factory model's weights come from: a Hugging Face state dict, or a seeded init.

Names and layouts are Hugging Face's (``model.layers.0.self_attn.q_proj.weight``,
``[out, in]``), so a real checkpoint's state dict drops in. Random tensors are
drawn per name (seeded by the name), so a tensor does not depend on which
others were drawn before it, and never all at once.
"""

from __future__ import annotations

import zlib
from collections.abc import Mapping

import numpy as np

INIT_STD = 0.02  # Hugging Face's initializer_range for these families


class WeightSource:
    def __init__(self, weights: Mapping[str, np.ndarray] | None = None, seed: int = 0) -> None:
        self.weights = weights
        self.seed = seed

    def _rng(self, name: str) -> np.random.Generator:
        return np.random.default_rng([self.seed, zlib.crc32(name.encode())])

    def get(self, name: str, shape: tuple[int, ...], kind: str = "linear") -> np.ndarray:
        """The float32 tensor ``name``; ``kind`` picks the random init when none is given.

        kinds: ``linear`` (normal * 0.02), ``norm`` (near 1), ``offset`` (near 0, for
        ``1 + weight`` norms), ``bias`` (small), ``a_log`` (Qwen3.5's log decay rate)
        or ``conv`` (uniform in +-0.5).
        """
        if self.weights is not None:
            if name not in self.weights:
                raise KeyError(f"weights has no {name!r} (needed with shape {shape})")
            arr = np.asarray(self.weights[name], dtype=np.float32)
            if tuple(arr.shape) != tuple(shape):
                raise ValueError(f"{name}: shape {arr.shape}, expected {shape}")
            return arr
        rng = self._rng(name)
        if kind == "norm":
            # near 1 rather than exactly 1, so a wrong norm weight shows in the logits
            return (1.0 + 0.1 * rng.standard_normal(shape, np.float32)).astype(np.float32)
        if kind == "offset":
            # an offset norm's weight (scale = 1 + weight), as spread as ``norm``
            return (0.1 * rng.standard_normal(shape, np.float32)).astype(np.float32)
        if kind == "bias":
            return (INIT_STD * rng.standard_normal(shape, np.float32)).astype(np.float32)
        if kind == "a_log":
            # Qwen3.5 draws A from U(0, 16) and stores log(A); here A in [1, 16)
            return np.log(1.0 + 15.0 * rng.random(shape, np.float32)).astype(np.float32)
        if kind == "conv":
            # a depthwise conv's default init scale (1/sqrt(kernel)), so the conv passes signal
            return rng.uniform(-0.5, 0.5, shape).astype(np.float32)
        out = rng.standard_normal(shape, np.float32)
        out *= np.float32(INIT_STD)
        return out
