"""``onnxep.generate``: greedy decoding with the model's state kept where the model runs.

On a session whose first provider has a device, every past/present pair
that GroupQueryAttention can share (its present IS the past buffer when the
past has a fixed capacity) is allocated once, at ``capacity`` rows, on the
device, and bound with IO binding as both the past input and the present
output, so a step writes only its new rows and copies nothing. Fixed-size
states (a conv or recurrent state) are fed back from the step's device
outputs, and so is every state of a model whose cache no kernel shares (a
torch export's ``present = Concat(past, new)``): nothing crosses the host.
Logits stay on the device and the argmax runs there, so a step reads back
one token id per sequence. On the CPU provider the same loop runs on NumPy
and feeds the state back, which is the NumPy kernels' fast path.

On a device the loop never waits for the host between steps: the argmax of
step t writes its ids straight into the device buffer bound as step t+1's
``input_ids`` (``Provider.argmax_rows_into``), its copy to the host is
queued behind it (``Provider.to_host_async``), and step t+1 is queued before
the host waits for token t, so that one read per step overlaps the next
step's work. The mask and positions of step t+1 depend on no token: the
host writes them while the device runs step t.

Each step feeds ``input_ids``, an ``attention_mask`` and ``position_ids``
when the model has them. The builder's graph takes ``total_sequence_length``
from the mask's shape on the host and ``seqlens_k`` from its sum on the
device. The prefill's mask is all ones, of the prompt's length. On the
shared-buffer path every decode step's mask has the buffers' full capacity,
ones for the rows filled so far and the new token, zeros after: the step's
input shapes never change, so GroupQueryAttention plans once and a session
with CUDA-graph capture on replays one graph per step (GroupQueryAttention
attends only ``seqlens_k + 1`` keys, so the tokens are the same). Where the
cache grows instead, the mask grows with it (past + new, all ones). Prompts of
different lengths padded on the right (``lengths``) get each row's own ones,
positions and first token (see ``_right_padding``), and a ``choose`` callable
may pick the tokens instead of the argmax (onnxep.sampling's chooser).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..errors import InvalidArgument
from ..progress import progress_bar
from .spec import DecodeSpec, StateInput, decode_spec, model_dims, state_shape
from .step_inputs import StepInputs

#: state paths a decode can take (GenerateResult.state_path)
SHARED = "shared-buffer"
FEED_BACK = "feed-back"


@dataclass
class GenerateResult:
    """The new tokens, how the state was kept, and what every run cost.

    Per-run lists hold one entry per model run: the prefill first, then one
    per decode step. ``step_ms`` is wall time from binding the step's inputs
    to the token being on the host; ``host_ms`` ends when the run call
    returned (the host's share when device work is queued asynchronously).
    Transfer counts come from the providers' own counters (None when no
    provider counts its copies).
    """

    token_ids: np.ndarray  # int64 [batch, new tokens]
    prompt_length: int
    state_path: str
    state_note: str
    device: str
    capacity: int | None
    compute_nodes: int = 0
    step_ms: list[float] = field(default_factory=list)
    host_ms: list[float] = field(default_factory=list)
    device_to_host_reads: list[int] | None = None
    host_to_device_copies: list[int] | None = None
    #: outputs each run copied into their bound buffers (0 when every state is shared in place)
    copied_outputs: list[int] = field(default_factory=list)
    #: the session's capture counters over this decode (captures, replays, fallbacks,
    #: invalidations, rebinds, the copies replays made) and the policy with its reason
    capture_stats: dict[str, Any] = field(default_factory=dict)
    #: True when decode steps fed a full-capacity mask (fixed input shapes)
    full_mask: bool = False

    @property
    def tokens(self) -> list[int]:
        """The first (often the only) sequence's new token ids."""
        return [int(t) for t in self.token_ids[0]]

    @property
    def decode_ms(self) -> float:
        """Median wall ms of a decode step (the prefill left out)."""
        steps = self.step_ms[1:]
        return float(np.median(steps)) if steps else float("nan")

    @property
    def tokens_per_second(self) -> float:
        return 1000.0 / self.decode_ms if self.step_ms[1:] else float("nan")

    @property
    def host_us_per_op(self) -> float:
        """Median host time of a decode step's run call, executor included, per compute node."""
        steps = self.host_ms[1:]
        if not steps or not self.compute_nodes:
            return float("nan")
        return float(np.median(steps)) * 1000.0 / self.compute_nodes

    def summary(self) -> str:
        reads = self.device_to_host_reads[1:] if self.device_to_host_reads else []
        per_step = f"{max(reads)}" if reads else "n/a"
        return (
            f"{self.token_ids.shape[1]} tokens after a {self.prompt_length}-token prompt on "
            f"{self.device}: {self.decode_ms:.3f} ms/step ({self.tokens_per_second:.1f} tok/s), "
            f"host {self.host_us_per_op:.1f} us/op over {self.compute_nodes} nodes, "
            f"device-to-host reads per step {per_step}; state: {self.state_path} "
            f"({self.state_note})"
        )


def _prompt(input_ids: Any) -> np.ndarray:
    ids = np.asarray(input_ids)
    if ids.ndim == 1:
        ids = ids[None]
    if ids.ndim != 2 or ids.shape[0] < 1 or ids.shape[1] < 1 or ids.dtype.kind not in "iu":
        raise InvalidArgument(
            f"input_ids must be token ids, 1-D [sequence] or 2-D [batch, sequence] integers "
            f"with at least one token, got {ids.dtype} of shape {list(ids.shape)}"
        )
    return ids.astype(np.int64)


def _positive_int(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int | np.integer) or value < 1:
        raise InvalidArgument(f"{name} must be a positive integer, got {value!r}")
    return int(value)


def _unshared_caches(session: Any, spec: DecodeSpec) -> list[str]:
    """Growing states whose present is not GroupQueryAttention's view of the past buffer.

    GroupQueryAttention's present_key/present_value (outputs 1, 2) have the
    length ``max(total_sequence_length, past capacity)``, and its kernels
    write the new rows into the past buffer (inputs 3, 4) when that fits.
    """
    outputs = {v.name: v for v in session.compiled.model.graph.outputs}
    unshared = []
    for s in spec.states:
        if s.grow_axis is None:
            continue
        v = outputs.get(s.output)
        node = v.producer() if v is not None else None
        ok = (
            node is not None
            and node.op_type == "GroupQueryAttention"
            and node.domain == "com.microsoft"
            and v.index() in (1, 2)
            and len(node.inputs) > v.index() + 2
            and node.inputs[v.index() + 2] is not None
            and node.inputs[v.index() + 2].name == s.name
        )
        if not ok:
            what = f"{node.op_type} node {node.name!r}" if node is not None else "a graph input"
            unshared.append(f"{s.output} (made by {what})")
    return unshared


def _right_padding(
    session: Any, spec: DecodeSpec, ids: np.ndarray, lengths: Sequence[int] | None
) -> np.ndarray:
    """Each row's right padding (int64 [batch]), after checking the model can take it.

    A row padded on the right by ``pad`` tokens shows the model a mask of its
    real tokens only; GroupQueryAttention takes each row's length from the
    mask's sum (``seqlens_k``), attends only that many keys, writes each new
    row at the row's own length and rotates by it, so the padding is never
    read and is overwritten as the row grows. Caches that other attention
    keeps (the new rows land after the padding, at one offset for every row)
    and fixed-size states (a recurrent state would take the padding in) would
    need more than a mask, so those models are refused.
    """
    batch, width = ids.shape
    if lengths is None:
        return np.zeros(batch, np.int64)
    lens = np.asarray(lengths)
    if lens.shape != (batch,) or lens.dtype.kind not in "iu" or (lens < 1).any():
        raise InvalidArgument(
            f"lengths must be one positive integer per row of input_ids ({batch}), "
            f"got {np.asarray(lengths).tolist()!r}"
        )
    if (lens > width).any():
        raise InvalidArgument(
            f"lengths {lens.tolist()} exceed the {width} tokens of each input_ids row"
        )
    pad = (width - lens).astype(np.int64)
    if pad.any():
        why = _ragged_refusal(session, spec)
        if why:
            raise InvalidArgument(
                f"prompts of different lengths cannot be batched on this model: {why}; "
                "give prompts of one length or generate them one at a time"
            )
    return pad


def _ragged_refusal(session: Any, spec: DecodeSpec) -> str:
    """Why the model cannot take right-padded rows ('' when it can)."""
    if spec.mask is None:
        return "it takes no attention_mask to say where each row ends"
    fixed = [s.name for s in spec.states if s.grow_axis is None]
    if fixed:
        return f"its fixed-size state {fixed[0]!r} would take the padding in"
    unshared = _unshared_caches(session, spec)
    if unshared:
        return (
            f"its cache {unshared[0]} is not addressed by each row's length, as "
            "GroupQueryAttention's is"
        )
    return ""


@contextlib.contextmanager
def _entered(provider: Any) -> Iterator[None]:
    """The provider's device, stream and pool made current (CuPy keeps them per thread)."""
    cm = provider.run_context()
    if cm is None:
        yield
    else:
        with cm:
            yield


class GreedyDecoder:
    """One greedy decode of ``session``: each :meth:`step` is one run and one new token per row.

    The first step runs the whole prompt (the prefill); ``max_new_tokens``
    steps make that many tokens. Used by :func:`generate` and by ``onnxep
    bench --decode``, which interleaves steps of several runtimes.
    """

    def __init__(
        self,
        session: Any,
        input_ids: Any,
        max_new_tokens: int,
        *,
        capacity: int | None = None,
        dims: Mapping[str, int] | None = None,
        share_on_host: bool = False,
        lengths: Sequence[int] | None = None,
        choose: Callable[[Any, Any], Any] | None = None,
        pipeline: bool = True,
    ) -> None:
        """``share_on_host`` takes the shared-buffer path on the CPU provider too (host
        buffers bound as past and present, full-capacity masks): the device's path,
        checked on the CPU; an error when no GroupQueryAttention shares the cache.

        ``lengths``: each row's prompt length when ``input_ids`` holds prompts of different
        lengths padded on the right (see :func:`_right_padding`). ``choose(logits, xp)``
        picks the next token of every row from the ``[batch, vocabulary]`` logits of each
        row's last real position, computed where they are with the provider's array
        module, and returns the ids there (one read follows); None: the argmax.

        ``pipeline`` (on a device) queues the next step before a token is read; off, a
        step queues its own run and returns with the device idle, so steps of several
        decoders interleaved by a benchmark time each decoder alone."""
        ids = _prompt(input_ids)
        steps = _positive_int("max_new_tokens", max_new_tokens)
        # the last token is never fed back, so the cache holds one fewer
        need = ids.shape[1] + steps - 1
        if capacity is not None:
            capacity = _positive_int("capacity", capacity)
            if capacity < need:
                raise InvalidArgument(
                    f"capacity {capacity} is too small: the cache must hold the "
                    f"{ids.shape[1]}-token prompt and the {steps - 1} generated tokens fed "
                    f"back after it, {need} rows; give capacity >= {need} or None"
                )
        spec = decode_spec(session.get_inputs(), session.get_outputs())
        if not spec.states:
            raise InvalidArgument(
                "greedy decoding needs a model with a KV cache (past*/present* input/output "
                "pairs); "
                f"this model's inputs are {[a.name for a in session.get_inputs()]}"
            )
        self.session, self.spec = session, spec
        self._pad = _right_padding(session, spec, ids, lengths)
        self._choose = choose
        self.batch, self.max_new_tokens = ids.shape[0], steps
        self.prompt_length = ids.shape[1]
        self.ids, self.past = ids, 0
        self.provider = session.providers[0]
        self.on_device = self.provider.device != "cpu"
        # IO binding leaves arrays on a device only through a provider that adopts them
        self._state_on_device = self.on_device and self.provider.implements("adopt")
        self._dims = {**(model_dims(session.model_path) if session.model_path else {})}
        self._dims.update(dims or {})
        self._counted = [p for p in session.providers if p.implements("transfer_counts")]
        self._share_on_host = bool(share_on_host)
        self._in_place = self._updated_in_place()
        self.state_path, self.state_note = self._choose_path()
        self.capacity = None
        if self.state_path == SHARED:
            self.capacity = capacity if capacity is not None else ids.shape[1] + steps
        #: decode steps feed the mask at full capacity (fixed shapes; see the module's note)
        self.full_mask = self.state_path == SHARED and spec.mask is not None
        # host decode steps' masks and positions from buffers made once (the device path
        # writes the next step's while a run may still read the last one's: fresh arrays)
        self._host_steps = None
        if not self._state_on_device:
            width = max(self.capacity or 0, ids.shape[1] + steps)
            self._host_steps = StepInputs(self._pad, width, spec.mask_dtype, spec.positions_rank)
        self._capture_start = self._capture_counters()
        self._tokens: list[np.ndarray] = []
        # The device path's pipeline: the run queued and not yet read, the device buffer the
        # argmax writes the next ids into, and when the last token reached the host.
        self._queued: _Queued | None = None
        self._ids_buf: Any = None
        self._last_token_at: float | None = None
        self._pipeline = bool(pipeline)
        self.result = GenerateResult(
            token_ids=np.zeros((self.batch, 0), np.int64),
            prompt_length=self.prompt_length,
            state_path=self.state_path,
            state_note=self.state_note,
            device=f"{self.provider.name} ({self.provider.device})",
            capacity=self.capacity,
            device_to_host_reads=[] if self._counted else None,
            host_to_device_copies=[] if self._counted else None,
            full_mask=self.full_mask,
        )
        self._bind()

    # -- setting up ---------------------------------------------------------------------
    def _choose_path(self) -> tuple[str, str]:
        p = self.provider
        fixed = sum(1 for s in self.spec.states if s.grow_axis is None)
        in_place = len(self._in_place)
        fed = "".join(
            [
                f"; {in_place} fixed-size state(s) updated in place" if in_place else "",
                f"; {fixed - in_place} fixed-size state(s) fed back" if fixed > in_place else "",
            ]
        )
        if self._share_on_host and not self._state_on_device:
            unshared = _unshared_caches(self.session, self.spec)
            if unshared or fixed == len(self.spec.states):
                raise InvalidArgument(
                    "share_on_host needs every growing cache to be GroupQueryAttention's "
                    "shared past buffer; not shared: "
                    + (", ".join(unshared[:3]) if unshared else "no state grows")
                    + "; leave share_on_host off"
                )
            return SHARED, (
                f"{len(self.spec.states) - fixed} past/present host buffer(s) bound in place "
                f"(share_on_host){fed}"
            )
        if not self.on_device:
            return FEED_BACK, f"{p.name} provider: outputs fed back as inputs in host memory"
        if not p.implements("adopt"):
            return FEED_BACK, (
                f"provider {p.name!r} takes no bound device arrays (no adopt()), so IO binding "
                "leaves the state in host memory"
            )
        unshared = _unshared_caches(self.session, self.spec)
        if unshared:
            return FEED_BACK, (
                "device outputs fed back as inputs: no GroupQueryAttention shares the cache of "
                + ", ".join(unshared[:3])
                + (f" and {len(unshared) - 3} more" if len(unshared) > 3 else "")
            )
        caches = len(self.spec.states) - fixed
        if not caches:
            return FEED_BACK, "device outputs fed back as inputs: no state grows"
        return SHARED, f"{caches} past/present buffer(s) shared in place{fed}"

    def _zeros(self, shape: tuple, dtype: np.dtype) -> Any:
        if not self._state_on_device:
            return np.zeros(shape, dtype)
        with _entered(self.provider):
            return self.provider.xp.zeros(shape, dtype=dtype)

    def _bind(self) -> None:
        spec = self.spec
        io = self.io = self.session.io_binding()
        # IOBinding calls every device "cuda", as onnxruntime's device_type does
        where = "cuda" if self._state_on_device else "cpu"
        io.bind_output(spec.logits, where)
        self._fed_back: list[tuple[StateInput, int]] = []
        self.states: dict[str, Any] = {}
        for k, s in enumerate(spec.states, start=1):  # output k: logits come first
            grows = self.state_path == SHARED and s.grow_axis is not None
            shared = grows or s.name in self._in_place
            rows = self.capacity if shared else 0
            buf = self.states[s.name] = self._zeros(
                state_shape(s, self.batch, rows, self._dims), s.dtype
            )
            io.bind_input(s.name, buf)
            if shared:
                io.bind_output(s.output, buf)
            else:
                io.bind_output(s.output, where)
                self._fed_back.append((s, k))

    def _updated_in_place(self) -> set[str]:
        """Fixed-size states (conv, recurrent) a kernel updates where they are when one
        device buffer is bound as the past input and the present output."""
        if not self._state_on_device:
            return set()
        pairs = self.session.inplace_pairs()
        return {
            s.name
            for s in self.spec.states
            if s.grow_axis is None and pairs.get(s.name) == s.output
        }

    # -- running ------------------------------------------------------------------------
    @property
    def done(self) -> bool:
        return len(self._tokens) >= self.max_new_tokens

    def _counts(self) -> tuple[int, int] | None:
        if not self._counted:
            return None
        snaps = [p.transfer_counts() for p in self._counted]
        return sum(c["device_to_host"] for c in snaps), sum(c["host_to_device"] for c in snaps)

    def step_feeds(self) -> dict[str, Any]:
        """The next run's ids, mask and positions (small host arrays, copied up by the run;
        the ids are the device buffer the last step's argmax wrote, on the device path)."""
        f = self._feeds()
        if self.spec.mask and self._host_steps is not None and self.past:
            f[self.spec.mask] = f[self.spec.mask].copy()  # the run's is a view later steps write
        return f

    def _feeds(self) -> dict[str, Any]:
        spec = self.spec
        n = self.ids.shape[1]
        f = {spec.ids: self.ids}
        host = self._host_steps
        if host is not None and self.past and n == 1:
            if spec.mask:
                f[spec.mask] = host.mask(
                    self.past, self.capacity if self.full_mask else self.past + 1
                )
            if spec.positions:
                f[spec.positions] = host.positions(self.past)
            return f
        # a row padded on the right by `pad` tokens has past - pad real ones cached
        filled = np.maximum(self.past - self._pad, 0)
        if spec.mask:
            # capacity was checked to hold past + n rows
            width = self.capacity if self.full_mask and self.past else self.past + n
            valid = self.past + n - self._pad
            mask = np.arange(width)[None] < valid[:, None]
            f[spec.mask] = mask.astype(spec.mask_dtype)
        if spec.positions:
            pos = filled[:, None] + np.arange(n, dtype=np.int64)[None]
            f[spec.positions] = pos if spec.positions_rank == 2 else np.stack([pos] * 3)
        return f

    def _last(self, logits: Any) -> Any:
        """Each row's logits at its last real position, [batch, vocabulary], where they are."""
        if logits.ndim != 3:
            raise InvalidArgument(
                f"logits output {self.spec.logits!r} has shape {list(logits.shape)}; "
                "generate needs [batch, sequence, vocabulary]"
            )
        if self.past or not self._pad.any():
            return logits[:, -1]
        if logits.shape[1] != self.prompt_length:
            raise InvalidArgument(
                f"logits output {self.spec.logits!r} holds {logits.shape[1]} positions of the "
                f"{self.prompt_length}-token prefill; prompts of different lengths need one "
                "per position, so give prompts of one length"
            )
        xp = self.provider.xp if self._state_on_device else np
        # one view per row: no index array to copy to the device
        return xp.stack(
            [logits[b, self.prompt_length - 1 - int(p)] for b, p in enumerate(self._pad)]
        )

    def _chosen(self, logits: Any) -> np.ndarray:
        """``choose``'s token of every row, computed where the logits are; one read."""
        if not self._state_on_device:
            ids = self._choose(self._last(np.asarray(logits)), np)
            return np.asarray(ids, dtype=np.int64).reshape(self.batch)
        p = self.provider
        with _entered(p):
            ids = self._choose(self._last(logits), p.xp)
        return np.array(p.to_host(ids), dtype=np.int64).reshape(self.batch)

    def _argmax(self, logits: Any) -> np.ndarray:
        """The last position's argmax per row, computed where the logits are; one read."""
        if not self._state_on_device:
            last = self._last(logits if logits.__class__ is np.ndarray else np.asarray(logits))
            return last.argmax(axis=-1).astype(np.int64, copy=False)
        p = self.provider
        with _entered(p):
            last = self._last(logits)
            if last.shape[0] == 1:
                # A whole-array argmax takes CuPy's device-wide (CUB) reduction; one along an
                # axis gives each row a single block: 110 us of a 2.3 ms step on the H200 for
                # a 151936-token vocabulary (bench/gpu_step_profile.py).
                ids = p.xp.argmax(last.reshape(-1))
            else:
                ids = p.xp.argmax(last, axis=-1)
        return np.array(p.to_host(ids), dtype=np.int64).reshape(self.batch)

    def step(self) -> np.ndarray:
        """Run once and return the new token id of every row (int64 [batch])."""
        if self.done:
            raise InvalidArgument(
                f"all {self.max_new_tokens} tokens were generated; make a new GreedyDecoder"
            )
        if self._state_on_device:
            return self._pipelined_step()
        n = self.ids.shape[1]
        before = self._counts()
        t0 = time.perf_counter()
        for name, value in self._feeds().items():
            self.io.bind_input_array(name, value)
        self.session.run_with_iobinding(self.io)
        t1 = time.perf_counter()
        outs = self.io.get_outputs()
        token = self._argmax(outs[0].array) if self._choose is None else self._chosen(outs[0].array)
        t2 = time.perf_counter()
        after = self._counts()
        r = self.result
        r.host_ms.append((t1 - t0) * 1000.0)
        r.step_ms.append((t2 - t0) * 1000.0)
        r.copied_outputs.append(len(self.io.copied_outputs))
        if before is not None and after is not None:
            r.device_to_host_reads.append(after[0] - before[0])  # type: ignore[union-attr]
            r.host_to_device_copies.append(after[1] - before[1])  # type: ignore[union-attr]
        for s, k in self._fed_back:
            self.states[s.name] = outs[k].array
            self.io.bind_input_array(s.name, outs[k].array)
        self.past += n
        self.ids = token[:, None]
        self._tokens.append(token)
        return token

    # -- the device path: the next run queued before this token is read -------------------
    def _launch(self) -> None:
        """Bind the next run's feeds and queue it (the device may still be on the last one)."""
        before = self._counts()
        t0 = time.perf_counter()
        for name, value in self.step_feeds().items():
            if isinstance(value, np.ndarray):
                self.io.bind_cpu_input(name, value)
            else:
                self.io.bind_input(name, value)
        self.session.run_with_iobinding(self.io)
        t1 = time.perf_counter()
        self._queued = _Queued(self.io.get_outputs(), self.ids.shape[1], t0, t1, before,
                               len(self.io.copied_outputs))  # fmt: skip
        if self._last_token_at is None:
            self._last_token_at = t0

    def _queue_token(self, logits: Any) -> Any:
        """Every row's next token (the argmax of its last real position, or ``choose``'s),
        written on the device into the buffer the next run reads as its ids; returns the
        wait for its host copy."""
        p = self.provider
        with _entered(p):
            last = self._last(logits)
            if self._ids_buf is None:
                self._ids_buf = p.xp.zeros((self.batch, 1), dtype=np.int64)
            if self._choose is None:
                p.argmax_rows_into(last, self._ids_buf)
            else:
                self._ids_buf[:, 0] = p.xp.asarray(self._choose(last, p.xp)).reshape(self.batch)
            return p.to_host_async(self._ids_buf)

    def _pipelined_step(self) -> np.ndarray:
        if self._queued is None:
            self._launch()
        run = self._queued
        assert run is not None
        self._queued = None
        outs = run.outputs
        read = self._queue_token(outs[0].array)
        for s, k in self._fed_back:
            self.states[s.name] = outs[k].array
            self.io.bind_input(s.name, outs[k].array)
        self.past += run.rows
        self.ids = self._ids_buf
        if self._pipeline and len(self._tokens) + 1 < self.max_new_tokens:
            self._launch()  # step t+1 is queued before the host waits for token t
        token = np.array(read(), dtype=np.int64).reshape(self.batch)
        t2 = time.perf_counter()
        r = self.result
        r.host_ms.append((run.host_end - run.start) * 1000.0)
        # Pipelined steps overlap: a step's wall time is the interval between two tokens on
        # the host; otherwise from binding the step's feeds to its token.
        since = self._last_token_at if self._pipeline else run.start
        r.step_ms.append((t2 - since) * 1000.0)
        self._last_token_at = t2
        r.copied_outputs.append(run.copied)
        after = self._counts()
        if run.counts is not None and after is not None:
            # this step's reads and uploads, its own token's included, not the next run's feeds
            queued = self._queued.counts if self._queued is not None else after
            r.device_to_host_reads.append(after[0] - run.counts[0])  # type: ignore[union-attr]
            r.host_to_device_copies.append(queued[1] - run.counts[1])  # type: ignore[union-attr]
        self._tokens.append(token)
        return token

    # -- reporting ----------------------------------------------------------------------
    _COUNTERS = ("captures", "replays", "fallbacks", "invalidations", "rebinds", "copies")

    def _capture_counters(self) -> dict[str, Any]:
        stats = getattr(self.session, "capture_stats", None)
        return dict(stats()) if stats is not None else {}

    def capture_delta(self) -> dict[str, Any]:
        """The session's capture counters over this decode, with the policy and its reason.

        The counters are the session's: runs of other decodes on the same
        session in between are counted too."""
        now = self._capture_counters()
        out = {k: now.get(k, 0) - self._capture_start.get(k, 0) for k in self._COUNTERS}
        out.update(policy=now.get("policy", "off"), reason=now.get("reason", ""))
        seen = len(self._capture_start.get("failures", []))
        out["failures"] = list(now.get("failures", []))[seen:]
        return out

    @property
    def tokens(self) -> list[int]:
        """The first row's tokens so far."""
        return [int(t[0]) for t in self._tokens]

    def finish(self) -> GenerateResult:
        """The result so far, with the token ids and the compute node count filled in."""
        r = self.result
        if self._tokens:
            r.token_ids = np.stack(self._tokens, axis=1)
        r.compute_nodes = sum(1 for n in self.session.placement() if n.role == "compute")
        r.capture_stats = self.capture_delta()
        return r

    def host_feeds(self) -> dict[str, np.ndarray]:
        """The next run's feeds in host memory (for a profiled run outside any timing)."""
        f = {**self.step_feeds(), **self.states}
        to_host = self.provider.to_host
        return {n: v if isinstance(v, np.ndarray) else np.asarray(to_host(v)) for n, v in f.items()}


@dataclass
class _Queued:
    """A run queued on the device and not yet read: its outputs (device arrays), the rows
    it fed, when its run call started and returned, the transfer counts before it, and the
    outputs it copied into bound buffers."""

    outputs: list[Any]
    rows: int
    start: float
    host_end: float
    counts: tuple[int, int] | None
    copied: int


def generate(
    session: Any,
    input_ids: Sequence[int] | np.ndarray,
    max_new_tokens: int,
    *,
    capacity: int | None = None,
    progress: bool | None = None,
    dims: Mapping[str, int] | None = None,
) -> GenerateResult:
    """Greedy decoding: ``max_new_tokens`` new token ids after ``input_ids``.

    ``session`` runs a decoder with a KV cache, genai format
    (``past_key_values.N.key`` -> ``present.N.key``) or a torch export
    (``past_*`` -> ``present_*``); ``input_ids`` is one prompt (1-D) or a
    batch of equal-length prompts (2-D). ``capacity`` is the rows of the
    fixed KV buffers on a device (default: prompt + ``max_new_tokens``);
    it is unused where the cache grows instead (the CPU provider, caches no
    kernel shares), and an error when it cannot hold the prompt and the
    tokens fed back. ``progress`` shows a tqdm bar (None: on a terminal, for
    64 tokens or more). ``dims`` settles symbolic state dims (head size)
    that no genai_config.json beside the model gives.

    The result holds the token ids, which state path was taken and why,
    per-run timings and transfer counts, and the session's capture counters
    over the decode (see :class:`GenerateResult`). On a session whose CUDA
    provider captures graphs (option ``capture``, ``$ONNXEP_CUDA_CAPTURE``),
    decode steps after the first few replay one graph. The graph reads and
    writes this decode's KV buffers in place (no cache copy per step), so it
    is captured on them: a later decode, with buffers of its own, captures
    once more at its first decode step (no warm-up), then replays.
    """
    decoder = GreedyDecoder(session, input_ids, max_new_tokens, capacity=capacity, dims=dims)
    bar = progress_bar(decoder.max_new_tokens, progress, desc="generate", unit="tok")
    try:
        while not decoder.done:
            decoder.step()
            bar.update(1)
    finally:
        bar.close()
    return decoder.finish()
