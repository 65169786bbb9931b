"""Greedy decode loops, one per kind of side, stepped in turn by ``bench --decode``.

Every loop starts from the same prompt, makes one token per :meth:`step`
(the first step is the prefill) and keeps its state the way its runtime
would: onnxep through :class:`onnxep.generation.greedy.GreedyDecoder` (state on the
device, argmax there), the torch peer in torch tensors on its own device,
and peers that take host feeds (onnxruntime, the reference) through
:class:`DecodeState`, whose state round-trips through NumPy.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from ...generation.spec import DecodeSpec, DecodeState, state_shape


class DecodeLoop:
    """``tokens`` new tokens from ``prompt`` [batch, n], one :meth:`step` each."""

    def __init__(self, tokens: int) -> None:
        self.max_new_tokens = tokens

    @property
    def tokens(self) -> list[int]:
        raise NotImplementedError

    @property
    def done(self) -> bool:
        return len(self.tokens) >= self.max_new_tokens

    def step(self) -> None:
        raise NotImplementedError


class HostLoop(DecodeLoop):
    """A side that runs host feeds and returns host outputs."""

    def __init__(
        self,
        side: Any,
        spec: DecodeSpec,
        prompt: np.ndarray,
        tokens: int,
        dims: Mapping[str, int],
        output_names: list[str],
    ) -> None:
        super().__init__(tokens)
        self.side, self.names = side, output_names
        self.state = DecodeState(spec, prompt.shape[1], prompt=prompt, dims=dict(dims))

    @property
    def tokens(self) -> list[int]:
        return self.state.tokens

    def step(self) -> None:
        out = self.side.run(self.state.feeds())
        self.state.advance(dict(zip(self.names, to_numpy(out))))


class DecoderLoop(DecodeLoop):
    """A loop whose runtime has a greedy decoder of its own (``.tokens``, ``.step()``)."""

    decoder: Any

    @property
    def tokens(self) -> list[int]:
        return self.decoder.tokens

    def step(self) -> None:
        self.decoder.step()


class OnnxepLoop(DecoderLoop):
    """onnxep's own greedy loop (``onnxep.generate``'s), one run per step."""

    def __init__(
        self,
        session: Any,
        prompt: np.ndarray,
        tokens: int,
        dims: Mapping[str, int],
        capacity: int | None = None,
        pipeline: bool = False,
    ) -> None:
        """``pipeline`` off (interleaved steps): each step returns with the device idle, so
        the next side's step is timed alone; on, as ``onnxep.generate`` runs."""
        super().__init__(tokens)
        from ...generation.greedy import GreedyDecoder

        self.decoder = GreedyDecoder(
            session, prompt, tokens, capacity=capacity, dims=dims, pipeline=pipeline
        )


class TorchLoop(DecodeLoop):
    """The torch peer's greedy loop: cache in torch tensors on its device, argmax there.

    The peer hands its outputs back in its compute dtype (no cast of the
    cache per step), and one token id per row is read to the host.
    """

    def __init__(
        self,
        side: Any,
        spec: DecodeSpec,
        prompt: np.ndarray,
        tokens: int,
        dims: Mapping[str, int],
    ) -> None:
        super().__init__(tokens)
        self.torch, self.module, self.spec = side.torch, side.module, spec
        self.module.native_outputs = True
        names = list(self.module.w.output_names)
        self.logits_index = names.index(spec.logits)
        self.state_index = [(s.name, names.index(s.output)) for s in spec.states]
        self.batch = prompt.shape[0]
        self.states = {
            s.name: self.torch.from_numpy(
                np.zeros(state_shape(s, self.batch, 0, dict(dims)), s.dtype)
            ).to(side.device)
            for s in spec.states
        }
        self.ids, self.past = np.asarray(prompt, np.int64), 0
        self._tokens: list[int] = []

    @property
    def tokens(self) -> list[int]:
        return self._tokens

    def step(self) -> None:
        spec, torch = self.spec, self.torch
        n = self.ids.shape[1]
        feeds: dict[str, Any] = {spec.ids: self.ids}
        if spec.mask:
            feeds[spec.mask] = np.ones((self.batch, self.past + n), spec.mask_dtype)
        if spec.positions:
            pos = np.arange(self.past, self.past + n, dtype=np.int64)[None].repeat(self.batch, 0)
            feeds[spec.positions] = pos if spec.positions_rank == 2 else np.stack([pos] * 3)
        feeds.update(self.states)
        with torch.inference_mode():
            outs = self.module.run(feeds)
            token = torch.argmax(outs[self.logits_index][:, -1], dim=-1).cpu().numpy()
        for name, k in self.state_index:
            self.states[name] = outs[k]
        self.past += n
        self.ids = token.astype(np.int64).reshape(self.batch, 1)
        self._tokens.append(int(token[0]))


class StaticTorchLoop(DecoderLoop):
    """The torch peer with a static cache (:mod:`.torch_static`), the decode step replayed
    from one CUDA graph when ``graph`` (the ``torch-graph`` side)."""

    def __init__(self, side: Any, prompt: np.ndarray, tokens: int, graph: bool) -> None:
        super().__init__(tokens)
        from .torch_static import StaticDecoder

        self.decoder = StaticDecoder(side.module, prompt, tokens, graph=graph)


def to_numpy(values: list[Any]) -> list[Any]:
    """A side's outputs as NumPy arrays (torch tensors detached and copied to the host)."""
    out = []
    for v in values:
        if hasattr(v, "detach"):
            v = v.detach().cpu().numpy()
        out.append(np.asarray(v) if not isinstance(v, list) else v)
    return out
