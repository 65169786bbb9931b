"""LSTM on NumPy: gates i, o, f, c in preallocated buffers, both directions per step."""

from __future__ import annotations

import numpy as np

from onnxep.errors import InvalidArgument
from onnxep.providers.dtypes import FLOAT_TYPES
from onnxep.providers.kernel import kernel

from .recurrent_cpu import (
    check_weights,
    clip_fn,
    compute_dtype,
    constant_weights,
    default_activations,
    halve_rows,
    parse_direction,
    run_recurrent,
    stacked_activations,
    transposed,
)


@kernel("LSTM", since=(1, 7, 14, 22), dtypes=FLOAT_TYPES)
def lstm(node, xp):
    num_dir, reverse = parse_direction(node)
    layout = int(node.attr("layout", 0))
    input_forget = bool(node.attr("input_forget", 0))
    f_act, g_act, h_act = stacked_activations(node, ("Sigmoid", "Tanh", "Tanh"), num_dir)
    clip_at = node.attr("clip", None)
    clip = clip_fn(clip_at)
    # the exporters' case: sigmoid gates computed by the same tanh call as the cell gate
    folded = default_activations(node, ("Sigmoid", "Tanh", "Tanh"), num_dir)

    def prepare(cdt, W, R, B=None, P=None):
        H = check_weights("LSTM", W, R, 4, num_dir)
        Rt = transposed(R, slice(None), cdt)
        bias = None
        if B is not None:
            if B.shape != (num_dir, 8 * H):
                raise InvalidArgument(f"LSTM: B has shape {list(B.shape)}, expected "
                                      f"{[num_dir, 8 * H]}")  # fmt: skip
            bias = B[:, : 4 * H].astype(cdt) + B[:, 4 * H :]
        if folded and P is None:
            ifo = slice(0, 3 * H)
            W = halve_rows(W, ifo, cdt)
            Rt[..., ifo] *= 0.5
            if bias is not None:
                bias[:, ifo] *= 0.5
        peep = None
        if P is not None:
            if P.shape != (num_dir, 3 * H):
                raise InvalidArgument(f"LSTM: P has shape {list(P.shape)}, expected "
                                      f"{[num_dir, 3 * H]}")  # fmt: skip
            peep = P.astype(cdt)[:, None, :]  # [dirs, 1, 3H]: i, o, f
        # the folded step's per-column affine after its one tanh: (t + 1) / 2 on i, o, f;
        # c as it is
        scale = np.concatenate([np.full(3 * H, 0.5, cdt), np.ones(H, cdt)])
        shift = np.concatenate([np.full(3 * H, 0.5, cdt), np.zeros(H, cdt)])
        return H, W, Rt, bias, peep, scale, shift

    weights = constant_weights(node, (1, 2, 3, 7), prepare)

    def run(X, W, R, B=None, lens=None, h0=None, c0=None, P=None):
        cdt = compute_dtype(X.dtype)
        fold = folded and P is None
        H, W, Rt, bias, peep, scale, shift = weights(cdt, W, R, B, P)

        def make_step(D, batch, dt):
            g = np.empty((D, batch, 4 * H), dtype=dt)
            tmp = np.empty((D, batch, H), dtype=dt)
            gi, go, gf, gc = (g[..., k * H : (k + 1) * H] for k in range(4))
            if peep is not None:
                pi, po, pf = (peep[..., k * H : (k + 1) * H] for k in range(3))

            if clip_at is not None:
                hi = float(clip_at) * scale
                lo = -hi

            def folded_step(x, h, out, c):
                np.matmul(h, Rt, out=g)
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
                np.matmul(h, Rt, out=g)
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
            "LSTM", X, W, R, gates=4, num_dir=num_dir, reverse=reverse, layout=layout,
            bias=bias, lens=lens, inits=[h0, c0], make_step=make_step,
        )  # fmt: skip

    return run
