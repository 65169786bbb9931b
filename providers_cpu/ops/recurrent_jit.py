"""The compiled recurrence driver of the CPU LSTM / GRU / RNN / DynamicQuantizeLSTM kernels.

Which path a node takes (decided once, when the session builds its kernel, from the
node alone; the dtype at run time):

- **compiled** (recurrent_loops.py, one call per direction for the whole sequence): numba
  present and enabled (``jit.ENABLED``, see providers_cpu/jit.py), the op's default
  activations (LSTM sigmoid/tanh/tanh, GRU sigmoid/tanh, RNN tanh: what exporters write),
  and a float32 computation (float32 or float16 inputs). Every other attribute is covered:
  directions, ``layout`` 0 and 1, ``sequence_lens`` (0 and T included), initial states,
  ``clip``, peepholes, ``input_forget``, ``linear_before_reset``, constant or fed weights.
- **NumPy** (recurrent_cpu.py, a Python loop over steps): everything else: other
  activations, float64, numba absent or ``ONNXEP_CPU_JIT=0``; DynamicQuantizeLSTM also with
  ``sequence_lens`` shorter than the sequence (the generic recurrence, as before).

What the driver does around the loops: one input projection per direction (BLAS,
``[T*batch, input] @ [input, gates*H]``) in time order with the foldable biases added,
written where the loops read it (layout 1 through strided views, no transposed copy of
X or Y); the directions run on the run's threads (one direction per thread, each
independent); the rows of an empty sequence end with zero states, as onnxruntime's.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from onnxep.errors import InvalidArgument
from onnxep.providers import bounds

from .. import jit
from ..threads import run_threads
from .nn_cpu import parallel_rows
from .recurrent_cpu import check_shape, default_activations

F32 = np.dtype(np.float32)

#: direction(d, xw [T, batch, G], h [batch, H], c or None, ys [T, batch, H], lens) -> ok
Direction = Callable[..., bool]


def usable(node, defaults: Sequence[str], num_dir: int) -> bool:
    """Whether the node's kernel may take the compiled path (dtype permitting)."""
    return bool(jit.ENABLED) and default_activations(node, defaults, num_dir)


def loops():
    """The compiled loops' module (imports numba through jit on first use)."""
    from . import recurrent_loops

    return recurrent_loops


def transposed_w(W: np.ndarray) -> np.ndarray:
    """W [dirs, gates*H, input] as contiguous float32 [dirs, input, gates*H]: BLAS is
    several times slower on the transposed view for a few rows."""
    return np.ascontiguousarray(np.swapaxes(W, 1, 2), dtype=F32)


#: Up to this many rows (steps x batch) the float32 input projection runs in the compiled
#: loop (recurrent_loops.project) instead of one BLAS call per direction: below it the
#: call's own cost dominates.
LOOP_PROJECTION_ROWS = 8

#: Up to this many rows the input projection takes the compiled GEMM (``weight_products``)
#: at any thread count, where its rule runs it at two: OpenBLAS packs the whole weight on
#: every call, which a few rows do not pay back (one thread, Zen 3: [10, 256] x [256, 384]
#: 42 against 54 us, [14, 256] x [256, 384] 56 against 62, [10, 512] x [512, 2048] 314
#: against 545), and a session's second BLAS thread waits on a busy core.
PACKED_ROWS = 16


def run(
    op: str,
    X: np.ndarray,
    n_in: int,
    G: int,
    *,
    blas: tuple[np.ndarray, np.ndarray | None] | None,
    project: Callable[[int, np.ndarray, np.ndarray], None] | None,
    rows: np.ndarray | None = None,
    hidden: int,
    num_dir: int,
    layout: int,
    lens: np.ndarray | None,
    inits: list[np.ndarray | None],
    direction: Direction,
) -> tuple | None:
    """Y, Y_h[, Y_c] of the node, or None if a direction's loop gave up (the caller then
    runs the NumPy path).

    The input projection ``[steps*batch, G]`` per direction is either ``blas`` = (Wt
    [dirs, input, G] float32, bias [dirs, G] or None), one matmul per direction before the
    loops, or ``project(d, rows, out)``, called on the direction's thread (the compiled
    projection). ``rows`` are X's rows as the projection reads them ([steps*batch, input]
    in X's order; X as float32 if not given). ``inits`` the initial states as given (h,
    then c for LSTM).
    """
    if X.ndim != 3:
        raise InvalidArgument(f"{op}: X must be 3-D, got shape {list(X.shape)}")
    T, batch = (X.shape[1], X.shape[0]) if layout else (X.shape[0], X.shape[1])
    if X.shape[2] != n_in:
        check_shape(op, "X", X, (batch, T, n_in) if layout else (T, batch, n_in))
    if rows is None:
        rows = np.ascontiguousarray(X, dtype=F32).reshape(-1, X.shape[2])
    # row-major whatever X's strides: the compiled projection's inner loop runs along a row
    # (an F-ordered copy of a strided X ran it 13x slower)
    rows = np.ascontiguousarray(rows, dtype=F32)
    states = []
    for k, s in enumerate(inits):
        if s is None:
            states.append(np.zeros((num_dir, batch, hidden), F32))
            continue
        want = (batch, num_dir, hidden) if layout else (num_dir, batch, hidden)
        check_shape(op, ("initial_h", "initial_c")[k], s, want)
        states.append(np.array(s.transpose(1, 0, 2) if layout else s, dtype=F32, order="C"))
    if lens is None:
        lens = np.full(batch, T, np.int64)
    else:
        check_shape(op, "sequence_lens", lens, (batch,))
        lens = lens.astype(np.int64)
        bounds.check_sequence_lengths(np, lens, T)

    # the input projection of every step, in time order: [dirs, T, batch, G] (as views)
    proj = np.empty((num_dir, rows.shape[0], G), F32)
    if blas is not None:
        project_rows(rows, blas[0], blas[1], blas[2] if len(blas) > 2 else None, proj)
    if layout:
        xw = proj.reshape(num_dir, batch, T, G).transpose(0, 2, 1, 3)
        Y = np.empty((batch, T, num_dir, hidden), F32)
        ys = Y.transpose(1, 2, 0, 3)  # [T, dirs, batch, H]
    else:
        xw = proj.reshape(num_dir, T, batch, G)
        Y = ys = np.empty((T, num_dir, batch, hidden), F32)
    h = states[0]
    c = states[1] if len(states) > 1 else None
    ok = [True] * num_dir

    def part(d0: int, d1: int) -> None:
        for d in range(d0, d1):
            if project is not None:
                project(d, rows, proj[d])
            cd = None if c is None else c[d]
            ok[d] = direction(d, xw[d], h[d], cd, ys[:, d], lens)

    parallel_rows(num_dir, T * batch * G * (hidden + rows.shape[1]), part)
    if not all(ok):
        return None
    last = [h] if c is None else [h, c]
    empty = lens == 0
    if empty.any():  # onnxruntime's final states of an empty sequence are zeros
        for s in last:
            s[:, empty] = 0
    if layout:
        last = [np.ascontiguousarray(s.transpose(1, 0, 2)) for s in last]
    out_dt = X.dtype
    return (Y.astype(out_dt, copy=False), *(s.astype(out_dt, copy=False) for s in last))


def weight_products(Wt: np.ndarray) -> list:
    """One ``weight_gemm.WeightGemm`` a direction of Wt [dirs, input, G] (float32, made
    once for constant weights): the input projection on the compiled GEMM where its rule
    says (sessions of more than one thread on this machine: OpenBLAS's split of [12, 512]
    x [512, 2048] took 5 ms a call on a loaded machine, against 0.3 ms)."""
    from .shared_weights import SharedWeight
    from .weight_gemm import WeightGemm

    return [WeightGemm(SharedWeight(Wt[d]), False) for d in range(Wt.shape[0])]


def project_rows(
    rows: np.ndarray, Wt: np.ndarray, bias: np.ndarray | None, packed: list | None, proj: np.ndarray
) -> None:
    """``proj[d] = rows @ Wt[d] (+ bias[d])`` for every direction: the compiled GEMM
    (``weight_products``) where its rule says, BLAS otherwise."""
    threads = run_threads()
    if rows.shape[0] <= PACKED_ROWS:
        threads = max(threads, 2)
    for d in range(Wt.shape[0]):
        if packed is not None and packed[d].fits(rows, threads):
            packed[d](rows, None if bias is None else bias[d], out=proj[d])
            continue
        np.matmul(rows, Wt[d], out=proj[d])
        if bias is not None:
            proj[d] += bias[d]


def usual_frame(X, states, n_in, num_dir, H, G, layout, Wt, bias, packed):
    """The frame of GRU's and LSTM's usual calls (float32 X [T, batch, input], or
    [batch, T, input] with ``layout``, at least one step and row; each state None or float32
    of its layout's shape): ``(T, rows, proj, few, states, Y)``, the states as
    [dirs, batch, H] copies the loops update in place and the input projections made unless
    ``few`` (the loops make them), or None where the call is not a usual one."""
    if X.dtype != F32 or X.ndim != 3 or X.shape[2] != n_in:
        return None
    T, batch = (X.shape[1], X.shape[0]) if layout else (X.shape[0], X.shape[1])
    if not T or not batch:
        return None
    want = (batch, num_dir, H) if layout else (num_dir, batch, H)
    made = []
    for s in states:
        if s is None:
            made.append(np.zeros((num_dir, batch, H), F32))
        elif s.dtype != F32 or s.shape != want:
            return None
        else:
            made.append(np.array(s.transpose(1, 0, 2) if layout else s, order="C"))
    rows = np.ascontiguousarray(X).reshape(T * batch, n_in)
    proj = np.empty((num_dir, T * batch, G), F32)
    few = T * batch <= LOOP_PROJECTION_ROWS
    if not few:
        project_rows(rows, Wt, bias, packed, proj)
    Y = np.empty((batch, T, num_dir, H) if layout else (T, num_dir, batch, H), F32)
    return T, rows, proj, few, made, Y


def states_out(states, layout) -> tuple:
    """The final states as the node's layout has them."""
    if not layout:
        return tuple(states)
    return tuple(np.ascontiguousarray(s.transpose(1, 0, 2)) for s in states)


def projection(
    loops,
    W: np.ndarray,
    Wt: np.ndarray,
    bias: np.ndarray | None,
    X: np.ndarray,
    packed: list | None = None,
):
    """``(blas, project)`` for :func:`run` with float32 weights W [dirs, G, input] (and
    their transpose Wt, and ``weight_products(Wt)`` when made): the compiled projection
    for a few rows, BLAS or the compiled GEMM otherwise."""
    if X.shape[0] * X.shape[1] > LOOP_PROJECTION_ROWS:
        return (Wt, bias, packed), None
    none = np.empty(0, F32)

    def project(d: int, rows: np.ndarray, out: np.ndarray) -> None:
        loops.project(W[d], rows, none, none if bias is None else bias[d], out)

    return None, project
