"""Random feeds for a session, from its model's declared inputs (see onnxep.random_feeds)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from ..random_feeds import random_feeds

__all__ = ["random_inputs"]


def random_inputs(
    model_or_session: Any,
    dims: Mapping[str, int] | None = None,
    seed: int = 0,
    default_dim: int = 1,
    *,
    shapes: Mapping[str, Sequence[int]] | None = None,
    int_ranges: Mapping[str, tuple[int, int]] | None = None,
    given: Mapping[str, Any] | None = None,
) -> dict[str, np.ndarray]:
    """``random_feeds`` for a session's inputs (``model_or_session``: a session, or a model
    opened on the CPU provider); the arguments are ``random_feeds``'s."""
    from ..session import InferenceSession

    sess = (
        model_or_session
        if isinstance(model_or_session, InferenceSession)
        else InferenceSession(model_or_session, providers=["cpu"])
    )
    return random_feeds(
        sess.get_inputs(),
        sess.compiled.model.graph,
        sess.model_path,
        dims,
        seed,
        default_dim,
        shapes=shapes,
        int_ranges=int_ranges,
        given=given,
    )
