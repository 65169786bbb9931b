"""The NumPy recurrence driver of the CPU provider's RNN / GRU / LSTM kernels.

Why it is fast (the generic driver in ``providers/ops/flow.py`` stays the reference):

- the input projection of every time step is one matmul per direction,
  ``[T*batch, input] @ [input, gates]``, from X already in that direction's step order
  (time-reversed, sorted by length), with the foldable biases added once;
- the directions run side by side: each step is one stacked matmul
  ``[dirs, batch, H] @ [dirs, H, gates]`` (reverse directions read a time-reversed
  copy of their projections, per batch entry when ``sequence_lens`` is given), so a
  bidirectional layer costs one Python step loop, not two;
- the recurrent weights are transposed into contiguous ``[dirs, H, gates]`` once per
  run (BLAS is several times slower on a transposed view at these shapes);
- every step writes into buffers allocated before the loop (ufuncs with ``out=``)
  and the hidden state of step t is written straight into ``Y[t]``;
- with ``sequence_lens`` the batch is sorted longest first, so the entries still
  running at step t are a prefix of it: each step computes that prefix only (no
  masking; a finished entry's state is simply not touched and its outputs stay the
  zeros ONNX asks for), and the work is the sum of the lengths, not batch * T.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from onnxep.errors import InvalidArgument, NotSupported
from onnxep.providers import bounds
from onnxep.providers.ops.flow import activation_fn, activation_specs

#: act(x, out): out = f(x), elementwise; ``out`` may be ``x``.
Act = Callable[[np.ndarray, np.ndarray], None]


def _sigmoid(x: np.ndarray, out: np.ndarray) -> None:
    # the tanh form cannot overflow, as the generic kernel's
    np.multiply(x, 0.5, out=out)
    np.tanh(out, out=out)
    out *= 0.5
    out += 0.5


def _tanh(x: np.ndarray, out: np.ndarray) -> None:
    np.tanh(x, out=out)


def _relu(x: np.ndarray, out: np.ndarray) -> None:
    np.maximum(x, 0, out=out)


_IN_PLACE: dict[str, Act] = {"sigmoid": _sigmoid, "tanh": _tanh, "relu": _relu}


def _one(spec: tuple) -> Act:
    if spec[0] in _IN_PLACE:
        return _IN_PLACE[spec[0]]
    fn = activation_fn(np, spec)

    def act(x: np.ndarray, out: np.ndarray) -> None:
        out[...] = fn(x)

    return act


def stacked_activations(node: Any, defaults: Sequence[str], num_dir: int) -> list[Act]:
    """One act per activation slot, applied to ``[dirs, ...]`` arrays: one call when every
    direction uses the same function, else one per direction."""
    specs = activation_specs(node, defaults, num_dir)
    acts = []
    for slot in range(len(defaults)):
        per_dir = [specs[d][slot] for d in range(num_dir)]
        if all(s == per_dir[0] for s in per_dir):
            acts.append(_one(per_dir[0]))
            continue
        fns = [_one(s) for s in per_dir]

        def act(x: np.ndarray, out: np.ndarray, fns: list[Act] = fns) -> None:
            for d, fn in enumerate(fns):
                fn(x[d], out[d])

        acts.append(act)
    return acts


def default_activations(node: Any, defaults: Sequence[str], num_dir: int) -> bool:
    """Whether every direction uses the op's default functions (what exporters write)."""
    want = [(n.lower(), None, None) for n in defaults]
    return all(per_dir == want for per_dir in activation_specs(node, defaults, num_dir))


def half_sigmoid(x: np.ndarray, out: np.ndarray) -> None:
    """sigmoid(2x): the sigmoid of gates whose weights :func:`halve_rows` halved."""
    np.tanh(x, out=out)
    out *= 0.5
    out += 0.5


def halve_rows(a: np.ndarray, rows: slice, cdt: np.dtype) -> np.ndarray:
    """A copy of ``a`` in ``cdt`` with ``a[:, rows]`` halved.

    sigmoid(x) = (tanh(x / 2) + 1) / 2: with the sigmoid gates' weights and biases halved,
    one tanh over all the gates serves the sigmoid and the tanh gates alike.
    """
    out = np.array(a, dtype=cdt)
    out[:, rows] *= 0.5
    return out


def clip_fn(clip: float | None) -> Callable[[np.ndarray], None]:
    """Clip in place to [-clip, clip], or nothing."""
    if clip is None:
        return lambda x: None
    c = float(clip)
    return lambda x: np.clip(x, -c, c, out=x)


#: step(x_t [dirs, batch, gates], h [dirs, batch, H], out [dirs, batch, H], c or None):
#: writes h_t into ``out`` and updates ``c`` in place; ``out`` is never ``h``.
Step = Callable[[np.ndarray, np.ndarray, np.ndarray, Any], None]


def compute_dtype(dt: np.dtype) -> np.dtype:
    """Half-precision recurrences accumulate in float32, as the generic kernels do."""
    return np.dtype(np.float32) if dt.itemsize < 4 else dt


def parse_direction(node: Any) -> tuple[int, list[bool]]:
    direction = node.attr("direction", "forward")
    direction = direction.decode() if isinstance(direction, bytes) else str(direction)
    if direction not in ("forward", "reverse", "bidirectional"):
        raise NotSupported(f"{node.op_type}: direction {direction!r} is not supported")
    if direction == "bidirectional":
        return 2, [False, True]
    return 1, [direction == "reverse"]


def check_shape(op: str, name: str, a: np.ndarray, shape: tuple) -> None:
    if tuple(a.shape) != shape:
        raise InvalidArgument(
            f"{op}: input {name} has shape {list(a.shape)}, expected {list(shape)} "
            "from X, R and the direction attribute"
        )


def check_weights(op: str, W: np.ndarray, R: np.ndarray, gates: int, num_dir: int) -> int:
    """The hidden size, once W and R have the shapes the direction attribute asks for."""
    H = R.shape[-1] if R.ndim == 3 else -1
    check_shape(op, "R", R, (num_dir, gates * H, H) if H >= 0 else (num_dir, "gates*H", "H"))
    if W.ndim != 3:
        check_shape(op, "W", W, (num_dir, gates * H, "input"))
    check_shape(op, "W", W, (num_dir, gates * H, W.shape[2]))
    return H


def run_recurrent(
    op: str,
    X: np.ndarray,
    W: np.ndarray,
    R: np.ndarray,
    *,
    gates: int,
    num_dir: int,
    reverse: list[bool],
    layout: int,
    bias: np.ndarray | None,
    lens: np.ndarray | None,
    inits: list[np.ndarray | None],
    make_step: Callable[[int, int, np.dtype], Step],
) -> tuple:
    """Y, Y_h[, Y_c] of a recurrence whose cell is ``make_step(dirs, batch, dtype)``.

    ``W`` / ``R`` are the op's inputs ([dirs, gates*H, input] / [dirs, gates*H, H]),
    ``bias`` the part of B folded into the projections ([dirs, gates*H], compute dtype),
    ``inits`` the initial states as given (h, then c for LSTM), in the op's layout.
    """
    out_dt = X.dtype
    cdt = compute_dtype(out_dt)
    if X.ndim != 3:
        raise InvalidArgument(f"{op}: X must be 3-D, got shape {list(X.shape)}")
    T, batch = (X.shape[1], X.shape[0]) if layout else (X.shape[0], X.shape[1])
    n_in = X.shape[2]
    hidden = check_weights(op, W, R, gates, num_dir)
    G = gates * hidden
    check_shape(op, "W", W, (num_dir, G, n_in))
    states = []
    for k, s in enumerate(inits):
        name = ("initial_h", "initial_c")[k]
        if s is None:
            states.append(np.zeros((num_dir, batch, hidden), dtype=cdt))
            continue
        check_shape(op, name, s, (batch, num_dir, hidden) if layout else (num_dir, batch, hidden))
        s = s.transpose(1, 0, 2) if layout else s
        states.append(np.array(s, dtype=cdt, order="C"))  # a copy: updated in place
    h = states[0]
    c = states[1] if len(states) > 1 else None

    order = rev_idx = None
    if lens is not None:
        check_shape(op, "sequence_lens", lens, (batch,))
        lens = lens.astype(np.int64)
        bounds.check_sequence_lengths(np, lens, T)  # the CUDA kernel's sentence too
        if not batch or lens.min() == T:
            lens = None
        else:
            # longest first: the entries still running at step t are a prefix of the batch
            order = np.argsort(-lens, kind="stable")
            lens = lens[order]
            h = h[:, order]
            c = None if c is None else c[:, order]
            t = np.arange(T)[:, None]
            rev_idx = np.where(t < lens[None, :], lens[None, :] - 1 - t, t)[:, :, None]

    # Each direction's input projection for every step: one matmul, from X already in
    # that direction's step order (reversed, sorted: X is input-wide, the projection
    # gates-wide, so the reordering copies the smaller of the two), written where the
    # steps read it.
    X = X.astype(cdt, copy=False)
    xt = X.transpose(1, 0, 2) if layout else X  # [T, batch, input]
    if order is not None:
        xt = xt[:, order]
    W = W.astype(cdt, copy=False)
    xw = np.empty((num_dir, T, batch, G), dtype=cdt)
    for d in range(num_dir):
        xd = xt
        if reverse[d]:
            xd = xd[::-1] if rev_idx is None else np.take_along_axis(xd, rev_idx, axis=0)
        rows = np.ascontiguousarray(xd).reshape(T * batch, n_in)
        np.matmul(rows, W[d].T, out=xw[d].reshape(T * batch, G))
        if bias is not None:
            xw[d] += bias[d]
    xw = xw.transpose(1, 0, 2, 3)  # [T, dirs, batch, G]: xw[t] is one step's input

    ys = (np.empty if lens is None else np.zeros)((T, num_dir, batch, hidden), dtype=cdt)
    if lens is None:
        step = make_step(num_dir, batch, cdt)
        for t in range(T):
            step(xw[t], h, ys[t], c)
            h = ys[t]
        last = [np.array(h)]
    else:
        # a finished entry is no longer computed: its state stays, its outputs stay zero
        running = (lens[None, :] > np.arange(int(lens[0]))[:, None]).sum(axis=1)
        steps: dict[int, Step] = {}
        for t, n in enumerate(running.tolist()):
            if n not in steps:
                steps[n] = make_step(num_dir, n, cdt)
            cn = None if c is None else c[:, :n]
            steps[n](xw[t, :, :n], h[:, :n], ys[t, :, :n], cn)
            h = ys[t]
        ends = np.maximum(lens - 1, 0)
        last = [ys[ends, :, np.arange(batch)].transpose(1, 0, 2)]
    if c is not None:
        last.append(c)
    if not T:
        # onnxruntime's final states of an empty sequence are zeros, not the initial
        # states (as for an entry whose sequence_lens is 0, below; the compiled loops agree)
        for s in last:
            s[...] = 0
    for d in range(num_dir):
        if reverse[d]:
            yd = ys[:, d]
            yd[...] = yd[::-1].copy() if rev_idx is None else np.take_along_axis(yd, rev_idx, 0)
    if order is not None:
        back = np.argsort(order)
        ys = ys[:, :, back]
        last = [s[:, back] for s in last]
        for s in last:  # onnxruntime's final states of an empty sequence are zeros
            s[:, lens[back] == 0] = 0
    if layout:
        Y = np.ascontiguousarray(ys.transpose(2, 0, 1, 3))
        last = [np.ascontiguousarray(s.transpose(1, 0, 2)) for s in last]
    else:
        Y = ys
    return (Y.astype(out_dt, copy=False), *(s.astype(out_dt, copy=False) for s in last))


def transposed(R: np.ndarray, rows: slice, cdt: np.dtype) -> np.ndarray:
    """``R[:, rows]`` as contiguous [dirs, H, len(rows)]: the right operand of the step matmul."""
    return np.ascontiguousarray(R[:, rows].transpose(0, 2, 1), dtype=cdt)


def peepholes(op: str, P: Any, no_peep: np.ndarray, num_dir: int, H: int) -> np.ndarray:
    """An LSTM's peephole weights as the compiled cells take them: ``no_peep`` (an empty
    ``(num_dir, 0)`` array made once per node) without P, else P checked and float32."""
    if P is None:
        return no_peep
    if P.shape != (num_dir, 3 * H):
        raise InvalidArgument(f"{op}: P has shape {list(P.shape)}, expected {[num_dir, 3 * H]}")
    return np.ascontiguousarray(P, dtype=np.float32)
