"""LSTM: a compiled loop per direction (recurrent_jit.py), or NumPy steps (both directions
per step, gates i, o, f, c in preallocated buffers) where that does not apply."""

from __future__ import annotations

import numpy as np

from onnxep.errors import InvalidArgument
from onnxep.providers.dtypes import FLOAT_TYPES
from onnxep.providers.kernel import kernel

from . import recurrent_jit
from .nn_cpu import parallel_rows
from .recurrent_cpu import (
    check_weights,
    clip_fn,
    compute_dtype,
    default_activations,
    halve_rows,
    parse_direction,
    peepholes,
    run_recurrent,
    stacked_activations,
    transposed,
)


@kernel("LSTM", since=(1, 7, 14, 22), dtypes=FLOAT_TYPES)
def lstm(node, xp):
    consts = [node.const_input(i) if node.has_input(i) else None for i in (1, 2, 3)]
    known = consts[0] is not None and consts[1] is not None
    known = known and (consts[2] is not None or not node.has_input(3))
    weights = tuple(consts) if known else None
    numpy_run = lstm_runner(node, weights=weights)
    num_dir, _ = parse_direction(node)
    if not recurrent_jit.usable(node, ("Sigmoid", "Tanh", "Tanh"), num_dir):
        return numpy_run
    compiled = _compiled_runner(node, weights)

    def run(X, W, R, B=None, lens=None, h0=None, c0=None, P=None):
        if X.dtype == np.float64:
            return numpy_run(X, W, R, B, lens, h0, c0, P)
        return compiled(X, W, R, B, lens, h0, c0, P)

    return run


def _compiled_runner(node, weights):
    """LSTM through recurrent_loops.lstm_direction (float32 computation)."""
    op = node.op_type
    num_dir, reverse = parse_direction(node)
    layout = int(node.attr("layout", 0))
    input_forget = bool(node.attr("input_forget", 0))
    clip_at = node.attr("clip", None)
    clip = np.float32(np.inf if clip_at is None else clip_at)
    loops = recurrent_jit.loops()
    no_scale = np.empty(0, np.float32)

    def prepare(W, R, B):
        H = check_weights(op, W, R, 4, num_dir)
        bias = None
        if B is not None:
            if B.shape != (num_dir, 8 * H):
                raise InvalidArgument(f"{op}: B has shape {list(B.shape)}, expected "
                                      f"{[num_dir, 8 * H]}")  # fmt: skip
            bias = (B[:, : 4 * H].astype(np.float32) + B[:, 4 * H :]).astype(np.float32)
        Rc = np.ascontiguousarray(R, dtype=np.float32)
        Wc = np.ascontiguousarray(W, dtype=np.float32)
        Wt = recurrent_jit.transposed_w(W)
        return H, Wc, Wt, Rc, bias, recurrent_jit.weight_products(Wt)

    fixed = None if weights is None else prepare(*weights)

    no_peep = np.empty((num_dir, 0), np.float32)  # read only: one for every run

    usual = None
    if fixed is not None:
        usual = _usual_call(fixed, num_dir, reverse, layout, clip, input_forget)

    def run(X, W, R, B=None, lens=None, h0=None, c0=None, P=None):
        if usual is not None and lens is None and P is None:
            got = usual(X, h0, c0)
            if got is not None:
                return got
        H, Wc, Wt, Rc, bias, packed = fixed if fixed is not None else prepare(W, R, B)
        peep = peepholes(op, P, no_peep, num_dir, H)

        def direction(d, xw, h, c, ys, lens):
            return loops.lstm_direction(
                xw, Rc[d], no_scale, False, peep[d], clip, input_forget,
                lens, reverse[d], h, c, ys,
            )  # fmt: skip

        blas, project = recurrent_jit.projection(loops, Wc, Wt, bias, X, packed)
        return recurrent_jit.run(
            op, X, Wc.shape[2], 4 * H, blas=blas, project=project, hidden=H, num_dir=num_dir,
            layout=layout, lens=lens, inits=[h0, c0], direction=direction,
        )  # fmt: skip

    return run


def _usual_call(fixed, num_dir, reverse, layout, clip, input_forget):
    """The exporters' call (constant weights, no sequence_lens or peepholes, float32 X and
    states, at least one step and row) through ``recurrent_node.lstm_dirs``, as GRU's
    (op_gru._usual_call); None where it does not apply (the general path then runs)."""
    from .recurrent_node import lstm_dirs

    H, Wc, Wt, Rc, bias, packed = fixed
    n_in, G = Wc.shape[2], 4 * H
    bias = np.zeros((num_dir, G), np.float32) if bias is None else bias
    rev = np.asarray(reverse, np.int64)

    def usual(X, h0, c0):
        states = (h0, c0)
        frame = recurrent_jit.usual_frame(X, states, n_in, num_dir, H, G, layout, Wt, bias, packed)
        if frame is None:
            return None
        T, rows, proj, few, (h, c), Y = frame
        args = (rows, Wc, bias, proj, few, Rc, clip, input_forget, rev, layout, T, h, c, Y)

        def part(d0, d1):
            lstm_dirs(*args, d0, d1)

        parallel_rows(num_dir, rows.shape[0] * G * (H + n_in), part)
        return Y, *recurrent_jit.states_out((h, c), layout)

    return usual


def lstm_runner(node, weights=None, hidden_hook=None):
    """The CPU LSTM's ``run(X, W, R, B, lens, h0, c0, P)``.

    ``weights`` (W, R, B), when given, are constants standing for inputs 1-3 (the
    node's own, or DynamicQuantizeLSTM's dequantized ones): their transposed, halved
    forms are made once per compute dtype instead of every run. ``hidden_hook(h)``
    returns what multiplies R in place of the hidden state h ([dirs, batch, H]):
    DynamicQuantizeLSTM's 8-bit round trip.
    """
    op = node.op_type
    num_dir, reverse = parse_direction(node)
    layout = int(node.attr("layout", 0))
    input_forget = bool(node.attr("input_forget", 0))
    f_act, g_act, h_act = stacked_activations(node, ("Sigmoid", "Tanh", "Tanh"), num_dir)
    clip_at = node.attr("clip", None)
    clip = clip_fn(clip_at)
    # the exporters' case: sigmoid gates computed by the same tanh call as the cell gate
    folded = default_activations(node, ("Sigmoid", "Tanh", "Tanh"), num_dir)
    prepared: dict = {}
    affine: dict = {}

    def affine_columns(H, dt):
        """The folded step's per-column affine after its one tanh: (t + 1) / 2 on i, o, f,
        c as it is; made once per size (np.r_ cost more than a small step)."""
        got = affine.get((H, dt))
        if got is None:
            scale = np.concatenate([np.full(3 * H, 0.5, dt), np.ones(H, dt)])
            shift = np.concatenate([np.full(3 * H, 0.5, dt), np.zeros(H, dt)])
            got = affine[(H, dt)] = (scale, shift)
        return got

    def prepare(W, R, B, cdt, fold):
        H = check_weights(op, W, R, 4, num_dir)
        Rt = transposed(R, slice(None), cdt)
        if np.shares_memory(Rt, R):
            # R was a transposed view already (DynamicQuantizeLSTM's): copy before halving.
            Rt = Rt.copy()
        bias = None
        if B is not None:
            if B.shape != (num_dir, 8 * H):
                raise InvalidArgument(f"{op}: B has shape {list(B.shape)}, expected "
                                      f"{[num_dir, 8 * H]}")  # fmt: skip
            bias = B[:, : 4 * H].astype(cdt) + B[:, 4 * H :]
        if fold:
            ifo = slice(0, 3 * H)
            W = halve_rows(W, ifo, cdt)
            Rt[..., ifo] *= 0.5
            if bias is not None:
                bias[:, ifo] *= 0.5
        return W, R, Rt, bias, H

    def run(X, W, R, B=None, lens=None, h0=None, c0=None, P=None):
        cdt = compute_dtype(X.dtype)
        fold = folded and P is None
        if weights is None:
            W, R, Rt, bias, H = prepare(W, R, B, cdt, fold)
        else:
            got = prepared.get((cdt, fold))
            if got is None:
                # A race makes the same arrays twice; either copy is right.
                got = prepared[(cdt, fold)] = prepare(*weights, cdt, fold)
            W, R, Rt, bias, H = got
        peep = None
        if P is not None:
            if P.shape != (num_dir, 3 * H):
                raise InvalidArgument(f"{op}: P has shape {list(P.shape)}, expected "
                                      f"{[num_dir, 3 * H]}")  # fmt: skip
            peep = P.astype(cdt)[:, None, :]  # [dirs, 1, 3H]: i, o, f

        def make_step(D, batch, dt):
            g = np.empty((D, batch, 4 * H), dtype=dt)
            tmp = np.empty((D, batch, H), dtype=dt)
            gi, go, gf, gc = (g[..., k * H : (k + 1) * H] for k in range(4))
            if peep is not None:
                pi, po, pf = (peep[..., k * H : (k + 1) * H] for k in range(3))

            scale, shift = affine_columns(H, dt)
            if clip_at is not None:
                hi = float(clip_at) * scale
                lo = -hi

            def folded_step(x, h, out, c):
                np.matmul(h if hidden_hook is None else hidden_hook(h), Rt, out=g)
                np.add(g, x, out=g)
                if clip_at is not None:
                    np.clip(g, lo, hi, out=g)
                np.tanh(g, out=g)
                np.multiply(g, scale, out=g)
                np.add(g, shift, out=g)
                if input_forget:
                    np.subtract(1, gi, out=gf)
                c *= gf
                np.multiply(gi, gc, out=tmp)
                c += tmp
                np.tanh(c, out=tmp)
                np.multiply(go, tmp, out=out)

            def step(x, h, out, c):
                np.matmul(h if hidden_hook is None else hidden_hook(h), Rt, out=g)
                np.add(g, x, out=g)
                if peep is None:
                    clip(g)
                    if input_forget:
                        f_act(gi, gi)
                        f_act(go, go)
                        np.subtract(1, gi, out=gf)
                    else:
                        f_act(g[..., : 3 * H], g[..., : 3 * H])
                else:
                    np.multiply(c, pi, out=tmp)
                    np.add(gi, tmp, out=gi)
                    clip(gi)
                    f_act(gi, gi)
                    if input_forget:
                        np.subtract(1, gi, out=gf)
                    else:
                        np.multiply(c, pf, out=tmp)
                        np.add(gf, tmp, out=gf)
                        clip(gf)
                        f_act(gf, gf)
                    clip(gc)
                g_act(gc, gc)
                c *= gf
                np.multiply(gi, gc, out=tmp)
                c += tmp
                if peep is not None:
                    np.multiply(c, po, out=tmp)
                    np.add(go, tmp, out=go)
                    clip(go)
                    f_act(go, go)
                h_act(c, tmp)
                np.multiply(go, tmp, out=out)

            return folded_step if fold else step

        return run_recurrent(
            op, X, W, R, gates=4, num_dir=num_dir, reverse=reverse, layout=layout,
            bias=bias, lens=lens, inits=[h0, c0], make_step=make_step,
        )  # fmt: skip

    return run
