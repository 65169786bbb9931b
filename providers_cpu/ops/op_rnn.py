"""RNN: H_t = f(X_t W^T + H_{t-1} R^T + Wb + Rb).

With tanh (the default) a compiled loop per direction (recurrent_jit.py); otherwise, or
without numba, NumPy steps with both directions per step.
"""

from __future__ import annotations

import numpy as np

from onnxep.errors import InvalidArgument
from onnxep.providers.dtypes import FLOAT_TYPES
from onnxep.providers.kernel import kernel

from . import recurrent_jit
from .recurrent_cpu import (
    check_weights,
    clip_fn,
    compute_dtype,
    parse_direction,
    run_recurrent,
    stacked_activations,
    transposed,
)


@kernel("RNN", since=(1, 7, 14, 22), dtypes=FLOAT_TYPES)
def rnn(node, xp):
    num_dir, reverse = parse_direction(node)
    layout = int(node.attr("layout", 0))
    (f_act,) = stacked_activations(node, ("Tanh",), num_dir)
    clip_at = node.attr("clip", None)
    clip = clip_fn(clip_at)
    compiled = recurrent_jit.usable(node, ("Tanh",), num_dir)
    if compiled:
        loops = recurrent_jit.loops()
        clip32 = np.float32(np.inf if clip_at is None else clip_at)

    def run(X, W, R, B=None, lens=None, h0=None):
        cdt = compute_dtype(X.dtype)
        H = check_weights("RNN", W, R, 1, num_dir)
        bias = None
        if B is not None:
            if B.shape != (num_dir, 2 * H):
                raise InvalidArgument(f"RNN: B has shape {list(B.shape)}, expected "
                                      f"{[num_dir, 2 * H]}")  # fmt: skip
            bias = B[:, :H].astype(cdt) + B[:, H:]
        if compiled and cdt == np.float32:
            Rc = np.ascontiguousarray(R, dtype=np.float32)

            def direction(d, xw, h, c, ys, lens):
                return loops.rnn_direction(xw, Rc[d], clip32, lens, reverse[d], h, ys)

            Wc = np.ascontiguousarray(W, dtype=np.float32)
            Wt = recurrent_jit.transposed_w(W)
            blas, project = recurrent_jit.projection(loops, Wc, Wt, bias, X)
            return recurrent_jit.run(
                "RNN", X, Wc.shape[2], H, blas=blas, project=project, hidden=H,
                num_dir=num_dir, layout=layout, lens=lens, inits=[h0], direction=direction,
            )  # fmt: skip
        Rt = transposed(R, slice(None), cdt)

        def make_step(D, batch, dt):
            def step(x, h, out, c):
                np.matmul(h, Rt, out=out)
                out += x
                clip(out)
                f_act(out, out)

            return step

        return run_recurrent(
            "RNN", X, W, R, gates=1, num_dir=num_dir, reverse=reverse, layout=layout,
            bias=bias, lens=lens, inits=[h0], make_step=make_step,
        )  # fmt: skip

    return run
