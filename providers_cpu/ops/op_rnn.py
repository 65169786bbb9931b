"""RNN on NumPy: H_t = f(X_t W^T + H_{t-1} R^T + Wb + Rb), both directions per step."""

from __future__ import annotations

import numpy as np

from onnxep.errors import InvalidArgument
from onnxep.providers.dtypes import FLOAT_TYPES
from onnxep.providers.kernel import kernel

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
    clip = clip_fn(node.attr("clip", None))

    def run(X, W, R, B=None, lens=None, h0=None):
        cdt = compute_dtype(X.dtype)
        H = check_weights("RNN", W, R, 1, num_dir)
        Rt = transposed(R, slice(None), cdt)
        bias = None
        if B is not None:
            if B.shape != (num_dir, 2 * H):
                raise InvalidArgument(f"RNN: B has shape {list(B.shape)}, expected "
                                      f"{[num_dir, 2 * H]}")  # fmt: skip
            bias = B[:, :H].astype(cdt) + B[:, H:]

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
