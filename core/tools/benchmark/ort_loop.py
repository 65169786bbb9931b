"""onnxruntime's greedy decode as its users make it fast: IO binding, shared KV buffers, a graph.

Each KV cache is one fixed-capacity OrtValue bound as both the past input and the present
output, so GroupQueryAttention writes the new rows in place (onnxruntime-genai's
``past_present_share_buffer``); after the prefill the ids, positions and a full-capacity
mask are fixed OrtValues updated in place every step, the logits a fixed output, and the
decode step's shapes never change. With the CUDA provider's graph (``enable_cuda_graph``)
that step is captured once and replayed; the prefill, of other shapes, runs outside it
(``gpu_graph_id`` -1). The last position's argmax runs on the device (CuPy over the bound
logits) and one token id per row is read back per step, as onnxep does. Fixed-size states
(a hybrid model's conv and recurrent states) are copied from their present buffer into
their past buffer after each step, so every bound address stays fixed.

The bound buffers belong to the side, not to one loop: the bench decodes a warm-up loop
and then a timed one, and onnxruntime's graph, captured in the first, replays the
addresses it was captured with. A loop that bound fresh buffers would be read through
stale addresses (the replay writing logits into the warm-up's freed buffer, the timed loop
reading zeros), so every loop of a side takes the same buffers, zeroed.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from ...generation.spec import DecodeSpec, state_shape
from .loops import DecodeLoop


def shares_caches(model_path: str, spec: DecodeSpec) -> str | None:
    """Why a growing cache of the model cannot be bound as a shared past/present buffer (its
    present is not a GroupQueryAttention output), or None when all can."""
    import onnx

    graph = onnx.load(model_path, load_external_data=False).graph
    producer = {o: n for n in graph.node for o in n.output}
    for s in spec.states:
        if s.grow_axis is None:
            continue
        node = producer.get(s.output)
        if node is None or node.op_type != "GroupQueryAttention":
            made = f"{node.op_type} node {node.name!r}" if node is not None else "no node"
            return f"present {s.output!r} is made by {made}, which does not share the past buffer"
    return None


class OrtBoundLoop(DecodeLoop):
    """A greedy decode of one onnxruntime session through IO binding (see the module)."""

    def __init__(
        self,
        side: Any,
        spec: DecodeSpec,
        prompt: np.ndarray,
        tokens: int,
        dims: Mapping[str, int],
        capacity: int | None = None,
    ) -> None:
        super().__init__(tokens)
        self.ort, self.sess, self.spec = side.ort, side.session, spec
        self.device = "cuda" if side.on_cuda else "cpu"
        self.batch, self.prompt = prompt.shape[0], np.asarray(prompt, np.int64)
        need = prompt.shape[1] + tokens
        self.capacity = max(capacity or need, need)
        self.buffers: dict[tuple, Any] = side.bound_buffers
        self.io = self.sess.io_binding()
        self.io.bind_output(spec.logits, self.device)  # first: the prefill reads outputs[0]
        self.past = 0
        self._tokens: list[int] = []
        self._cupy = None
        if self.device == "cuda":
            import cupy

            self._cupy = cupy
        dims = dict(dims)
        self.kv: dict[str, Any] = {}
        self.fixed: list[tuple[Any, Any]] = []  # (past buffer, present buffer) to copy back
        for s in spec.states:
            grows = s.grow_axis is not None
            shape = state_shape(s, self.batch, self.capacity if grows else 0, dims)
            past = self._zeros(shape, s.dtype, s.name)
            self.io.bind_ortvalue_input(s.name, past)
            if grows:
                self.io.bind_ortvalue_output(s.output, past)  # GQA writes the rows in place
            else:
                present = self._zeros(shape, s.dtype, s.output)
                self.io.bind_ortvalue_output(s.output, present)
                self.fixed.append((past, present))
            self.kv[s.name] = past
        self._step_inputs: dict[str, Any] | None = None
        self._logits: Any = None
        self._prefill_options = side.ort.RunOptions()
        self._prefill_options.add_run_config_entry("gpu_graph_id", "-1")

    # -- buffers --------------------------------------------------------------------------
    def _zeros(self, shape: tuple, dtype: Any, role: str) -> Any:
        """The side's buffer for ``role`` at this shape and dtype, zeroed (made once)."""
        zeros = np.zeros(shape, dtype)
        key = (role, zeros.shape, zeros.dtype.str)
        value = self.buffers.get(key)
        if value is None:
            value = self.buffers[key] = self.ort.OrtValue.ortvalue_from_numpy(zeros, self.device, 0)
        else:
            value.update_inplace(zeros)
        return value

    def _view(self, value: Any) -> Any:
        """A CuPy (or NumPy) view of an OrtValue's tensor, without a copy."""
        shape = tuple(value.shape())
        if self._cupy is None:
            return value.numpy()
        cp = self._cupy
        dtype = _ORT_DTYPES[value.data_type()]
        nbytes = int(np.prod(shape)) * np.dtype(dtype).itemsize
        mem = cp.cuda.UnownedMemory(value.data_ptr(), nbytes, value)
        return cp.ndarray(shape, dtype, cp.cuda.MemoryPointer(mem, 0))

    def _decode_inputs(self) -> dict[str, Any]:
        """The decode step's fixed inputs and logits output, bound once after the prefill."""
        spec, b = self.spec, self.batch
        arrays: dict[str, np.ndarray] = {spec.ids: np.zeros((b, 1), np.int64)}
        if spec.mask:
            arrays[spec.mask] = np.zeros((b, self.capacity), spec.mask_dtype)
        if spec.positions:
            shape = (b, 1) if spec.positions_rank == 2 else (3, b, 1)
            arrays[spec.positions] = np.zeros(shape, np.int64)
        values = {n: self._zeros(a.shape, a.dtype, n) for n, a in arrays.items()}
        for name, v in values.items():
            self.io.bind_ortvalue_input(name, v)
        logits_dtype = _ORT_DTYPES[self._logits.data_type()]
        vocab = int(self._logits.shape()[-1])
        self._logits = self._zeros((b, 1, vocab), logits_dtype, spec.logits)
        self.io.bind_ortvalue_output(spec.logits, self._logits)
        return values

    # -- stepping -------------------------------------------------------------------------
    @property
    def tokens(self) -> list[int]:
        return self._tokens

    def _argmax(self, logits: Any) -> np.ndarray:
        last = self._view(logits)[:, -1]
        xp = self._cupy if self._cupy is not None else np
        ids = xp.argmax(last.reshape(-1)) if self.batch == 1 else xp.argmax(last, axis=-1)
        return np.asarray(ids.get() if self._cupy is not None else ids).reshape(self.batch)

    def step(self) -> None:
        spec, b = self.spec, self.batch
        if self._step_inputs is None and not self._tokens:  # the prefill
            n = self.prompt.shape[1]
            self.io.bind_cpu_input(spec.ids, self.prompt)
            if spec.mask:
                self.io.bind_cpu_input(spec.mask, np.ones((b, n), spec.mask_dtype))
            if spec.positions:
                pos = np.arange(n, dtype=np.int64)[None].repeat(b, 0)
                self.io.bind_cpu_input(
                    spec.positions, pos if spec.positions_rank == 2 else np.stack([pos] * 3)
                )
            self.sess.run_with_iobinding(self.io, self._prefill_options)
            self.io.synchronize_outputs()
            self._logits = self.io.get_outputs()[0]
            token = self._argmax(self._logits)
            self.past = n
            self._step_inputs = self._decode_inputs()
        else:
            vals = self._step_inputs
            assert vals is not None
            vals[spec.ids].update_inplace(self._ids)
            if spec.mask:
                mask = np.zeros((b, self.capacity), spec.mask_dtype)
                mask[:, : self.past + 1] = 1
                vals[spec.mask].update_inplace(mask)
            if spec.positions:
                pos = np.full((b, 1), self.past, np.int64)
                vals[spec.positions].update_inplace(
                    pos if spec.positions_rank == 2 else np.stack([pos] * 3)
                )
            self.sess.run_with_iobinding(self.io)
            self.io.synchronize_outputs()
            token = self._argmax(self._logits)
            self.past += 1
        self._copy_fixed_states()
        self._ids = token.astype(np.int64).reshape(b, 1)
        self._tokens.append(int(token[0]))

    def _copy_fixed_states(self) -> None:
        """Each fixed-size state's present into its past buffer (the addresses stay bound)."""
        for past, present in self.fixed:
            if self._cupy is None:
                past.update_inplace(present.numpy())
            else:
                nbytes = present.tensor_size_in_bytes()
                self._cupy.cuda.runtime.memcpy(past.data_ptr(), present.data_ptr(), nbytes, 3)


#: onnxruntime's element type strings -> NumPy dtypes.
_ORT_DTYPES = {
    "tensor(float)": np.float32,
    "tensor(float16)": np.float16,
    "tensor(double)": np.float64,
    "tensor(int64)": np.int64,
    "tensor(int32)": np.int32,
}
