"""The torch peer with a static cache, its decode step captured as one CUDA graph.

What a torch user does for fast decode (transformers' ``StaticCache`` with
the step under ``torch.cuda.graphs``): every state lives in a buffer of
fixed shape, so one step's kernels and addresses never change. Full-attention
layers keep keys and values at ``capacity`` rows; a step writes its rows at
its positions (``index_copy_``) and attends over all ``capacity`` rows with a
mask (rows after the step's position are masked out). The hybrid's conv and
recurrent states are fixed-size already; a step copies the new state into
the same buffer (``copy_``).

The decode step (one token per row) reads its token ids and position from
static input tensors, runs the peer's own layers (:mod:`.torch_peer`, the
same math as the concatenating peer), takes the greedy argmax on the device
into a static output, and is captured once after warm-up on a side stream;
each later step sets the inputs on the device and replays. A step reads back
one tensor of token ids. Precision is the torch peer's: the model's dtype, fp16
for quantized models on CUDA (their weights dequantized once). Everything runs
under ``torch.no_grad`` (as transformers' static-cache decode does), not
``inference_mode``: inference tensors made while warming up cannot be updated
in place by a later capture.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ...errors import InvalidArgument, NotSupported


def cuda_graph_unavailable(torch: Any) -> str | None:
    """Why torch cannot capture CUDA graphs here, or None when it can."""
    if not torch.cuda.is_available():
        built = torch.version.cuda
        why = f"torch {torch.__version__} " + (
            f"(CUDA {built}) finds no CUDA device" if built else "is built without CUDA"
        )
        return f"torch-graph needs CUDA graphs: {why}"
    return None


class StaticCache:
    """Every state of a factory decoder in buffers of fixed shape on the peer's device."""

    def __init__(self, peer: Any, batch: int, capacity: int) -> None:
        torch, cfg, dev = peer.torch, peer.cfg, peer.device
        self.torch, self.capacity = torch, capacity
        kinds = cfg.get("layer_types") or ["full_attention"] * cfg["layers"]
        dtype = peer.w.dtype
        self.keys: dict[int, Any] = {}
        self.values: dict[int, Any] = {}
        self.convs: dict[int, Any] = {}
        self.recurrents: dict[int, Any] = {}
        for i, kind in enumerate(kinds):
            if kind == "linear_attention":
                conv_dim = 2 * cfg["linear_key_heads"] * cfg["linear_key_dim"]
                conv_dim += cfg["linear_value_heads"] * cfg["linear_value_dim"]
                shape = (batch, conv_dim, cfg["conv_kernel"] - 1)
                self.convs[i] = torch.zeros(shape, dtype=dtype, device=dev)
                shape = (
                    batch,
                    cfg["linear_value_heads"],
                    cfg["linear_key_dim"],
                    cfg["linear_value_dim"],
                )
                self.recurrents[i] = torch.zeros(shape, dtype=torch.float32, device=dev)
            else:
                shape = (batch, cfg["kv_heads"], capacity, cfg["head_dim"])
                self.keys[i] = torch.zeros(shape, dtype=dtype, device=dev)
                self.values[i] = torch.zeros(shape, dtype=dtype, device=dev)
        self._cols = torch.arange(capacity, device=dev)
        self._rows: Any = None
        self._allowed: Any = None

    def at(self, rows: Any) -> None:
        """The next forward writes cache rows ``rows`` ([S] int64, the tokens' positions)."""
        self._rows = rows
        self._allowed = (self._cols[None, :] <= rows[:, None])[None, None]  # [1, 1, S, cap]

    def kv(self, i: int, k: Any, v: Any) -> tuple[Any, Any, Any]:
        self.keys[i].index_copy_(2, self._rows, k)
        self.values[i].index_copy_(2, self._rows, v)
        return self.keys[i], self.values[i], self._allowed

    def conv(self, i: int, dtype: Any) -> Any:
        return self.convs[i]

    def set_conv(self, i: int, value: Any) -> None:
        self.convs[i].copy_(value)

    def recurrent(self, i: int) -> Any:
        return self.recurrents[i]

    def set_recurrent(self, i: int, value: Any) -> None:
        self.recurrents[i].copy_(value)

    def snapshot(self) -> list[tuple[Any, Any]]:
        """Copies of the states a step overwrites (not the KV rows: a step rewrites its own
        row before reading it), to undo warm-up steps."""
        states = [*self.convs.values(), *self.recurrents.values()]
        return [(t, t.clone()) for t in states]

    @staticmethod
    def restore(saved: list[tuple[Any, Any]]) -> None:
        for t, copy in saved:
            t.copy_(copy)


class StaticDecoder:
    """A greedy decode of ``tokens`` tokens from ``prompt`` with a :class:`StaticCache`.

    The first :meth:`step` is the prefill (eager); later steps run the decode
    step, replayed from one CUDA graph when ``graph`` (captured right after
    the prefill, so no decode step pays for it) or eagerly otherwise. A
    capture that fails is recorded (``fallbacks``, ``failures``) and the
    steps run eagerly: never a crash, never a wrong token.
    """

    def __init__(
        self, peer: Any, prompt: np.ndarray, tokens: int, graph: bool = False, warmup: int = 2
    ) -> None:
        torch = self.torch = peer.torch
        if graph:
            why = cuda_graph_unavailable(torch)
            if why is not None or not str(peer.device).startswith("cuda"):
                raise NotSupported(why or f"CUDA graphs need the peer on CUDA, not {peer.device}")
        ids = np.asarray(prompt, np.int64)
        if ids.ndim != 2 or tokens < 1:
            raise InvalidArgument(
                f"a static decode needs a [batch, n] prompt and tokens >= 1, got shape "
                f"{list(ids.shape)} and tokens {tokens}"
            )
        self.peer, self.graph_wanted, self.warmup = peer, graph, warmup
        self.batch, self.prompt_length = ids.shape
        self.max_new_tokens = tokens
        # the last token is never fed back: the cache holds the prompt and tokens - 1 more
        self.capacity = self.prompt_length + tokens - 1
        dev = peer.device
        with torch.no_grad():
            self.cache = StaticCache(peer, self.batch, self.capacity)
            self._prompt = torch.from_numpy(ids).to(dev)
            self._ids = torch.zeros((self.batch, 1), dtype=torch.long, device=dev)
            self._pos = torch.zeros(1, dtype=torch.long, device=dev)
            self._next = torch.zeros(self.batch, dtype=torch.long, device=dev)
        self._graph: Any = None
        self.past = 0
        self.tokens: list[int] = []
        #: the last step's logits when run eagerly (a captured step leaves them in the graph)
        self.last_logits: Any = None
        self.captures = self.replays = self.fallbacks = 0
        self.failures: list[str] = []

    @property
    def done(self) -> bool:
        return len(self.tokens) >= self.max_new_tokens

    def decode_body(self) -> Any:
        """One token per row at position ``_pos``: reads ``_ids``, writes ``_next``."""
        self.cache.at(self._pos)
        positions = self._pos.view(1, 1).expand(self.batch, 1)
        logits = self.peer.forward(self._ids, positions, self.cache)
        self._next.copy_(self.torch.argmax(logits[:, -1], dim=-1))
        return logits

    def _capture(self) -> None:
        torch = self.torch
        saved = self.cache.snapshot()
        try:
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                for _ in range(max(self.warmup, 1)):
                    self.decode_body()
            torch.cuda.current_stream().wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                self.decode_body()
            self._graph = graph
            self.captures += 1
        except Exception as exc:  # a failed capture decodes eagerly, with the reason kept
            self.fallbacks += 1
            self.failures.append(f"capture failed: {type(exc).__name__}: {exc}"[:300])
            self.graph_wanted = False
        finally:
            self.cache.restore(saved)  # the warm-up steps advanced the fixed-size states

    def step(self) -> list[int]:
        """One run: the prefill first, then one decode step; the new token of every row."""
        if self.done:
            raise InvalidArgument(f"all {self.max_new_tokens} tokens were generated")
        torch = self.torch
        with torch.no_grad():
            if self.past == 0:
                n = self.prompt_length
                rows = torch.arange(n, device=self.peer.device)
                self.cache.at(rows)
                positions = rows[None].expand(self.batch, n)
                self.last_logits = self.peer.forward(self._prompt, positions, self.cache)
                self._next.copy_(torch.argmax(self.last_logits[:, -1], dim=-1))
            elif self._graph is not None:
                self._graph.replay()
                self.replays += 1
            else:
                self.last_logits = self.decode_body()
            token = self._next.tolist()  # the step's one read
            self.past += self._prompt.shape[1] if self.past == 0 else 1
            self.tokens.append(int(token[0]))
            if not self.done:
                # the next step's inputs, set on the device (no host copy)
                self._ids.copy_(self._next.view(self.batch, 1))
                self._pos.fill_(self.past)
                if self.graph_wanted and self._graph is None:
                    self._capture()
        return token

    def counters(self) -> dict[str, Any]:
        """Captures, replays and fallbacks in the form onnxep's capture counters take."""
        policy = "whole" if self.graph_wanted or self.captures else "off"
        return {
            "policy": policy,
            "reason": "torch.cuda.CUDAGraph of the decode step, static cache",
            "captures": self.captures,
            "replays": self.replays,
            "fallbacks": self.fallbacks,
            "failures": list(self.failures),
        }
