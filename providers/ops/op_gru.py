"""GRU with gates ordered z, r, h, including ``linear_before_reset``."""

from onnxep.providers.dtypes import FLOAT_TYPES
from onnxep.providers.kernel import kernel

from .flow import clipper, project, recurrent


@kernel("GRU", since=(1, 3, 7, 14, 22), dtypes=FLOAT_TYPES)
def gru(node, xp):
    linear_before_reset = bool(node.attr("linear_before_reset", 0))

    def make_cell(W, R, B, P, acts, clip, H):
        f, g = acts[0], acts[1]
        cl = clipper(xp, clip)
        wb = None if B is None else B[: 3 * H]
        rb_zr = None if B is None else B[3 * H : 5 * H]
        rb_h = None if B is None else B[5 * H :]
        Wt = W.T
        R_zr_t = R[: 2 * H].T
        R_h_t = R[2 * H :].T

        def pre(X):
            xw = project(xp, X, Wt)
            return xw if wb is None else xw + wb

        def step(xw, states):
            h = states[0]
            hr = xp.matmul(h, R_zr_t)
            if rb_zr is not None:
                hr = hr + rb_zr
            z = f(cl(xw[..., :H] + hr[..., :H]))
            r = f(cl(xw[..., H : 2 * H] + hr[..., H:]))
            if linear_before_reset:
                hh = xp.matmul(h, R_h_t)
                if rb_h is not None:
                    hh = hh + rb_h
                hh = r * hh
            else:
                hh = xp.matmul(r * h, R_h_t)
                if rb_h is not None:
                    hh = hh + rb_h
            n = g(cl(xw[..., 2 * H :] + hh))
            return ((1 - z) * n + z * h,)

        return pre, step

    return recurrent(node, xp, default_acts=("Sigmoid", "Tanh"), n_states=1, make_cell=make_cell)
