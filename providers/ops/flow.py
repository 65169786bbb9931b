"""Shared pieces of the control-flow, sequence, optional and recurrent kernels.

Control flow (If, Loop, Scan, SequenceMap) runs its subgraphs through the
core, which takes and returns values in host memory; those kernels therefore
declare every input and output as host memory (``HOST_ALL``) and work on host
(NumPy) values, so a device provider never sees a host array in a device slot.

The recurrent nets (RNN, GRU, LSTM) share one driver, :func:`recurrent`: it
handles layout, directions, ``sequence_lens`` masking and the outputs, and
each op supplies only its cell.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from onnxep.errors import NotSupported
from onnxep.providers import bounds
from onnxep.providers.node import NodeInfo, ValueInfo

#: Input/output indices a control-flow kernel keeps in host memory: all of them,
#: since subgraphs take and return host values. Membership is all the core checks.
HOST_ALL = tuple(range(256))

CONTROL_NOTE = "runs subgraphs whose work depends on run-time values (branch, trip count)"
SEQUENCE_NOTE = "sequences are Python lists built at run time"
OPTIONAL_NOTE = "optionals are decided at run time (None or a value)"


def truth(value: Any) -> bool:
    """A one-element boolean tensor (a condition) as a Python bool."""
    return bool(value.reshape(-1)[0]) if hasattr(value, "reshape") else bool(value)


def host_int(value: Any) -> int:
    """A one-element integer tensor (a host input) as a Python int."""
    return int(np.asarray(value).reshape(-1)[0])


def norm_position(pos: int, length: int, *, insert: bool, op: str) -> int:
    """A sequence position, negative counting from the back, checked against ``length``.

    Insertion accepts ``length`` itself (append); access does not.
    """
    hi = length if insert else length - 1
    p = pos + length if pos < 0 else pos
    if p < 0 or p > hi:
        raise IndexError(f"{op}: position {pos} is out of range for a sequence of {length}")
    return p


def norm_axis(axis: int, rank: int, op: str) -> int:
    if not -rank <= axis < rank:
        raise ValueError(f"{op}: axis {axis} is out of range for rank {rank}")
    return axis + rank if axis < 0 else axis


def empty_output(info: ValueInfo | None, dims: dict[int, int], op: str) -> np.ndarray:
    """A stacked output no iteration wrote, typed from the node's static output type.

    ``dims`` fixes the sizes known at run time (the stacked axis gets 0); dims
    unknown statically get 0 too, as the tensor is empty either way.
    """
    if info is None or info.dtype is None or info.shape is None:
        raise RuntimeError(
            f"{op}: zero iterations and the output's element type or rank is not known "
            "statically, so the empty output cannot be typed"
        )
    shape = [d if isinstance(d, int) else 0 for d in info.shape]
    for axis, size in dims.items():
        shape[axis] = size
    return np.zeros(shape, dtype=info.dtype)


def stack(values: Sequence[Any], axis: int, info: ValueInfo | None, op: str) -> np.ndarray:
    """Stack per-iteration host values along a new ``axis``; zero iterations uses ``info``."""
    if not values:
        return empty_output(info, {axis: 0}, op)
    arrs = [np.asarray(v) for v in values]
    return np.stack(arrs, axis=axis if axis >= 0 else axis + arrs[0].ndim + 1)


# -- recurrent nets ---------------------------------------------------------------

# name -> (alpha default, beta default, builder(xp, alpha, beta) -> fn). None: required.
_ACTS: dict[str, tuple[float | None, float | None, Callable[..., Callable[[Any], Any]]]] = {}


def _act(name: str, alpha: float | None = None, beta: float | None = None):
    def register(fn):
        _ACTS[name] = (alpha, beta, fn)
        return fn

    return register


@_act("relu")
def _relu(xp, a, b):
    return lambda x: xp.maximum(x, 0)


@_act("tanh")
def _tanh(xp, a, b):
    return xp.tanh


@_act("sigmoid")
def _sigmoid(xp, a, b):
    # tanh form: no overflow for large |x|
    return lambda x: 0.5 * (xp.tanh(0.5 * x) + 1)


@_act("affine", 1.0, 0.0)
def _affine(xp, a, b):
    return lambda x: a * x + b


@_act("leakyrelu", 0.01)
def _leaky(xp, a, b):
    return lambda x: xp.where(x >= 0, x, a * x)


@_act("thresholdedrelu", 1.0)
def _thresholded(xp, a, b):
    return lambda x: xp.where(x > a, x, 0)


@_act("scaledtanh", 1.0, 1.0)
def _scaled_tanh(xp, a, b):
    return lambda x: a * xp.tanh(b * x)


@_act("hardsigmoid", 0.2, 0.5)
def _hard_sigmoid(xp, a, b):
    return lambda x: xp.clip(a * x + b, 0, 1)


@_act("elu", 1.0)
def _elu(xp, a, b):
    return lambda x: xp.where(x >= 0, x, a * (xp.exp(xp.minimum(x, 0)) - 1))


@_act("softsign")
def _softsign(xp, a, b):
    return lambda x: x / (1 + xp.abs(x))


@_act("softplus")
def _softplus(xp, a, b):
    return lambda x: xp.log1p(xp.exp(-xp.abs(x))) + xp.maximum(x, 0)


_USES_ALPHA = {"affine", "leakyrelu", "thresholdedrelu", "scaledtanh", "hardsigmoid", "elu"}
_USES_BETA = {"affine", "scaledtanh", "hardsigmoid"}


def _as_str(s: Any) -> str:
    return s.decode() if isinstance(s, bytes) else str(s)


def activation_specs(node: NodeInfo, defaults: Sequence[str], num_dir: int) -> list[list[tuple]]:
    """``(name, alpha, beta)`` of each activation function, per direction (names lower-case).

    As in onnxruntime, ``activation_alpha`` / ``activation_beta`` entries go,
    in order, to the functions that take them; the others use ONNX defaults.
    """
    names = [_as_str(n) for n in node.attr("activations", [])] or list(defaults) * num_dir
    per_dir = len(defaults)
    if len(names) == per_dir and num_dir == 2:
        names = names * 2
    if len(names) != per_dir * num_dir:
        raise NotSupported(
            f"{node.op_type}: expected {per_dir * num_dir} activations, got {len(names)}"
        )
    alphas = list(node.attr("activation_alpha", []))
    betas = list(node.attr("activation_beta", []))
    specs = []
    for name in names:
        key = name.lower()
        if key not in _ACTS:
            raise NotSupported(f"{node.op_type}: activation {name!r} is not supported")
        a_def, b_def, _ = _ACTS[key]
        a = alphas.pop(0) if key in _USES_ALPHA and alphas else a_def
        b = betas.pop(0) if key in _USES_BETA and betas else b_def
        specs.append((key, a, b))
    return [specs[d * per_dir : (d + 1) * per_dir] for d in range(num_dir)]


def activation_fn(xp: Any, spec: tuple) -> Callable[[Any], Any]:
    """The function of one ``(name, alpha, beta)`` from :func:`activation_specs`."""
    name, a, b = spec
    return _ACTS[name][2](xp, a, b)


def activations(node: NodeInfo, xp: Any, defaults: Sequence[str], num_dir: int) -> list[list]:
    """The activation functions per direction (see :func:`activation_specs`)."""
    specs = activation_specs(node, defaults, num_dir)
    return [[activation_fn(xp, s) for s in per_dir] for per_dir in specs]


#: A cell factory: (W_d, R_d, B_d or None, P_d or None, activations_d, clip, hidden)
#: -> (pre, step). ``pre(X)`` maps [T, batch, input] to the input projections
#: (biases folded in where they can be); ``step(xw_t, states)`` returns the new
#: states, hidden state first.
CellFactory = Callable[..., tuple[Callable[[Any], Any], Callable[[Any, tuple], tuple]]]


def compute_dtype(xp: Any, dt: Any) -> Any:
    """Half-precision recurrences accumulate in float32."""
    return xp.float32 if np.dtype(dt).itemsize < 4 else dt


def recurrent(
    node: NodeInfo,
    xp: Any,
    *,
    default_acts: Sequence[str],
    n_states: int,
    make_cell: CellFactory,
) -> Callable[..., tuple]:
    """The run callable of RNN / GRU / LSTM given the op's cell factory.

    ``make_cell`` is called per direction on every run (the weights are inputs).
    Inputs follow the ONNX order X, W, R, B, sequence_lens, initial_h[,
    initial_c, P]; outputs are Y, Y_h[, Y_c]. Steps past a batch entry's
    sequence length keep its state and write zeros to Y.
    """
    direction = _as_str(node.attr("direction", "forward"))
    if direction not in ("forward", "reverse", "bidirectional"):
        raise NotSupported(f"{node.op_type}: direction {direction!r} is not supported")
    num_dir = 2 if direction == "bidirectional" else 1
    layout = int(node.attr("layout", 0))
    clip = node.attr("clip", None)
    acts = activations(node, xp, default_acts, num_dir)
    reverse = [False, True] if num_dir == 2 else [direction == "reverse"]

    def run(X, W, R, B=None, lens=None, h0=None, c0=None, P=None):
        out_dt = X.dtype
        cdt = compute_dtype(xp, out_dt)
        if layout:
            X = xp.transpose(X, (1, 0, 2))
        X = X.astype(cdt, copy=False)
        T, batch = X.shape[0], X.shape[1]
        hidden = R.shape[-1]
        inits = [h0, c0][:n_states]
        states0 = []
        for s in inits:
            if s is None:
                states0.append(xp.zeros((num_dir, batch, hidden), dtype=cdt))
            else:
                states0.append(
                    (xp.transpose(s, (1, 0, 2)) if layout else s).astype(cdt, copy=False)
                )
        mask = rev_idx = None
        if lens is not None:
            bounds.check_sequence_lengths(xp, lens, T)
            t = xp.arange(T)[:, None]
            lens_ = lens.astype(xp.int64)
            valid = t < lens_[None, :]  # [T, batch]
            mask = valid[:, :, None]
            rev_idx = xp.where(valid, lens_[None, :] - 1 - t, t)[:, :, None]
        ys, finals = [], [[] for _ in range(n_states)]
        for d in range(num_dir):
            pre, step = make_cell(
                W[d].astype(cdt, copy=False),
                R[d].astype(cdt, copy=False),
                None if B is None else B[d].astype(cdt, copy=False),
                None if P is None else P[d].astype(cdt, copy=False),
                acts[d],
                clip,
                hidden,
            )
            xw = pre(X)
            if reverse[d]:
                xw = xw[::-1] if rev_idx is None else xp.take_along_axis(xw, rev_idx, axis=0)
            states = tuple(s[d] for s in states0)
            out = []
            for i in range(T):
                new = step(xw[i], states)
                if mask is not None:
                    m = mask[i]
                    new = tuple(xp.where(m, a, b) for a, b in zip(new, states))
                    out.append(xp.where(m, new[0], 0))
                else:
                    out.append(new[0])
                states = new
            y = xp.stack(out) if out else xp.zeros((0, batch, hidden), dtype=cdt)
            if reverse[d]:
                y = y[::-1] if rev_idx is None else xp.take_along_axis(y, rev_idx, axis=0)
            ys.append(y)
            for k in range(n_states):
                finals[k].append(states[k])
        Y = xp.stack(ys, axis=1)  # [T, num_dir, batch, hidden]
        last = [xp.stack(f) for f in finals]  # [num_dir, batch, hidden]
        if lens is not None:
            # onnxruntime's final states of an empty sequence are zeros
            last = [xp.where((lens_ > 0)[None, :, None], s, 0) for s in last]
        if layout:
            Y = xp.transpose(Y, (2, 0, 1, 3))
            last = [xp.transpose(s, (1, 0, 2)) for s in last]
        return (Y.astype(out_dt, copy=False), *(s.astype(out_dt, copy=False) for s in last))

    return run


def project(xp: Any, X: Any, Wt: Any) -> Any:
    """[T, batch, input] @ [input, k] as one 2-D matmul (a 3-D one loops over T)."""
    T, batch = X.shape[0], X.shape[1]
    return xp.matmul(X.reshape(T * batch, X.shape[2]), Wt).reshape(T, batch, Wt.shape[1])


def clipper(xp: Any, clip: float | None) -> Callable[[Any], Any]:
    if clip is None:
        return lambda x: x
    c = float(clip)
    return lambda x: xp.clip(x, -c, c)
