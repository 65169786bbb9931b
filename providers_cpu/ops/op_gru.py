"""GRU: a compiled loop per direction (recurrent_jit.py), or NumPy steps (both directions
per step, gates z, r, h in preallocated buffers) where that does not apply."""

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
    half_sigmoid,
    halve_rows,
    parse_direction,
    run_recurrent,
    stacked_activations,
    transposed,
)


@kernel("GRU", since=(1, 3, 7, 14, 22), dtypes=FLOAT_TYPES)
def gru(node, xp):
    num_dir, reverse = parse_direction(node)
    layout = int(node.attr("layout", 0))
    linear_before_reset = bool(node.attr("linear_before_reset", 0))
    f_act, g_act = stacked_activations(node, ("Sigmoid", "Tanh"), num_dir)
    clip_at = node.attr("clip", None)
    clip = clip_fn(clip_at)
    # the exporters' case: z and r through half_sigmoid, their weights halved
    folded = default_activations(node, ("Sigmoid", "Tanh"), num_dir)
    clip_zr = clip_fn(None if clip_at is None else 0.5 * float(clip_at)) if folded else clip
    act_zr = half_sigmoid if folded else f_act

    def prepare(cdt, W, R, B=None):
        H = check_weights("GRU", W, R, 3, num_dir)
        bias = rb_h = Rt_h = None
        if B is not None:
            if B.shape != (num_dir, 6 * H):
                raise InvalidArgument(f"GRU: B has shape {list(B.shape)}, expected "
                                      f"{[num_dir, 6 * H]}")  # fmt: skip
            bias = B[:, : 3 * H].astype(cdt)
            if linear_before_reset:
                # Rb_h is multiplied by r: it stays in the step
                bias[:, : 2 * H] += B[:, 3 * H : 5 * H]
                rb_h = B[:, None, 5 * H :].astype(cdt)
            else:
                np.add(bias, B[:, 3 * H :], out=bias)
        if linear_before_reset:
            Rt = transposed(R, slice(None), cdt)
        else:
            Rt = transposed(R, slice(0, 2 * H), cdt)
            Rt_h = transposed(R, slice(2 * H, 3 * H), cdt)
        if folded:
            if np.shares_memory(Rt, R):
                Rt = Rt.copy()  # R itself (a contiguous transpose when H is 1): not halved
            zr = slice(0, 2 * H)
            W = halve_rows(W, zr, cdt)
            Rt[..., zr] *= 0.5
            if bias is not None:
                bias[:, zr] *= 0.5
        return H, W, Rt, Rt_h, bias, rb_h

    # Constant weights (initializers) are transposed, halved and summed once per compute
    # dtype: on a small recurrence that preparation cost more than the steps.
    consts = [node.const_input(i) if node.has_input(i) else None for i in (1, 2, 3)]
    known = consts[0] is not None and consts[1] is not None
    known = known and (consts[2] is not None or not node.has_input(3))
    prepared: dict = {}

    def run(X, W, R, B=None, lens=None, h0=None):
        cdt = compute_dtype(X.dtype)
        if not known:
            H, W, Rt, Rt_h, bias, rb_h = prepare(cdt, W, R, B)
        else:
            got = prepared.get(cdt)
            if got is None:
                # A race makes the same arrays twice; either copy is right.
                got = prepared[cdt] = prepare(cdt, *consts)
            H, W, Rt, Rt_h, bias, rb_h = got

        def make_step(D, batch, dt):
            g = np.empty((D, batch, (3 if linear_before_reset else 2) * H), dtype=dt)
            tmp = np.empty((D, batch, H), dtype=dt)
            gzr, gz, gr = g[..., : 2 * H], g[..., :H], g[..., H : 2 * H]
            n = g[..., 2 * H :] if linear_before_reset else np.empty((D, batch, H), dtype=dt)

            def step(x, h, out, c):
                np.matmul(h, Rt, out=g)
                np.add(gzr, x[..., : 2 * H], out=gzr)
                clip_zr(gzr)
                act_zr(gzr, gzr)
                if linear_before_reset:
                    if rb_h is not None:
                        np.add(n, rb_h, out=n)
                    np.multiply(n, gr, out=n)
                else:
                    np.multiply(gr, h, out=tmp)
                    np.matmul(tmp, Rt_h, out=n)
                np.add(n, x[..., 2 * H :], out=n)
                clip(n)
                g_act(n, n)
                # (1 - z) * n + z * h
                np.subtract(h, n, out=tmp)
                np.multiply(tmp, gz, out=tmp)
                np.add(n, tmp, out=out)

            return step

        return run_recurrent(
            "GRU", X, W, R, gates=3, num_dir=num_dir, reverse=reverse, layout=layout,
            bias=bias, lens=lens, inits=[h0], make_step=make_step,
        )  # fmt: skip

    if not recurrent_jit.usable(node, ("Sigmoid", "Tanh"), num_dir):
        return run
    compiled = _compiled_runner(node, tuple(consts) if known else None)

    def either(X, W, R, B=None, lens=None, h0=None):
        if X.dtype == np.float64:
            return run(X, W, R, B, lens, h0)
        return compiled(X, W, R, B, lens, h0)

    return either


def _compiled_runner(node, weights):
    """GRU through recurrent_loops.gru_direction (float32 computation)."""
    num_dir, reverse = parse_direction(node)
    layout = int(node.attr("layout", 0))
    lbr = bool(node.attr("linear_before_reset", 0))
    clip_at = node.attr("clip", None)
    clip = np.float32(np.inf if clip_at is None else clip_at)
    loops = recurrent_jit.loops()

    def prepare(W, R, B):
        H = check_weights("GRU", W, R, 3, num_dir)
        bias = None
        rb_h = np.zeros((num_dir, H), np.float32)
        if B is not None:
            if B.shape != (num_dir, 6 * H):
                raise InvalidArgument(f"GRU: B has shape {list(B.shape)}, expected "
                                      f"{[num_dir, 6 * H]}")  # fmt: skip
            bias = B[:, : 3 * H].astype(np.float32)
            if lbr:
                # Rb_h is multiplied by r: it stays in the step
                bias[:, : 2 * H] += B[:, 3 * H : 5 * H]
                rb_h[...] = B[:, 5 * H :]
            else:
                bias += B[:, 3 * H :]
        Rc = np.ascontiguousarray(R, dtype=np.float32)
        Wc = np.ascontiguousarray(W, dtype=np.float32)
        Wt = recurrent_jit.transposed_w(W)
        return H, Wc, Wt, Rc, bias, rb_h, recurrent_jit.weight_products(Wt)

    fixed = None if weights is None else prepare(*weights)
    usual = None if fixed is None else _usual_call(fixed, num_dir, reverse, layout, lbr, clip)

    def run(X, W, R, B=None, lens=None, h0=None):
        if usual is not None and lens is None:
            got = usual(X, h0)
            if got is not None:
                return got
        H, Wc, Wt, Rc, bias, rb_h, packed = fixed if fixed is not None else prepare(W, R, B)

        def direction(d, xw, h, c, ys, lens):
            return loops.gru_direction(xw, Rc[d], rb_h[d], lbr, clip, lens, reverse[d], h, ys)

        blas, project = recurrent_jit.projection(loops, Wc, Wt, bias, X, packed)
        return recurrent_jit.run(
            "GRU", X, Wc.shape[2], 3 * H, blas=blas, project=project, hidden=H,
            num_dir=num_dir, layout=layout, lens=lens, inits=[h0], direction=direction,
        )  # fmt: skip

    return run


def _usual_call(fixed, num_dir, reverse, layout, lbr, clip):
    """The exporters' call (constant weights, no sequence_lens, float32 X and initial_h,
    at least one step and row) through ``recurrent_node.gru_dirs``: the general driver's
    loops on its buffers, without its twenty NumPy calls around them. None where it does
    not apply: the caller then takes the general path, which also words the errors."""
    from .recurrent_node import gru_dirs

    H, Wc, Wt, Rc, bias, rb_h, packed = fixed
    n_in, G = Wc.shape[2], 3 * H
    bias = np.zeros((num_dir, G), np.float32) if bias is None else bias
    rev = np.asarray(reverse, np.int64)

    def usual(X, h0):
        frame = recurrent_jit.usual_frame(X, (h0,), n_in, num_dir, H, G, layout, Wt, bias, packed)
        if frame is None:
            return None
        T, rows, proj, few, (h,), Y = frame

        def part(d0, d1):
            gru_dirs(rows, Wc, bias, proj, few, Rc, rb_h, lbr, clip, rev, layout, T, h, Y, d0, d1)

        parallel_rows(num_dir, rows.shape[0] * G * (H + n_in), part)
        return Y, *recurrent_jit.states_out((h,), layout)

    return usual
