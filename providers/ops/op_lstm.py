"""LSTM with gates ordered i, o, f, c; peepholes, ``input_forget`` and ``clip``."""

from onnxep.providers.dtypes import FLOAT_TYPES
from onnxep.providers.kernel import kernel

from .flow import clipper, project, recurrent


@kernel("LSTM", since=(1, 7, 14, 22), dtypes=FLOAT_TYPES)
def lstm(node, xp):
    input_forget = bool(node.attr("input_forget", 0))

    def make_cell(W, R, B, P, acts, clip, H):
        f, g, h_act = acts
        cl = clipper(xp, clip)
        # both biases act the same way, so fold them into the input projection
        bias = None if B is None else B[: 4 * H] + B[4 * H :]
        Wt, Rt = W.T, R.T
        pi, po, pf = (None, None, None) if P is None else (P[:H], P[H : 2 * H], P[2 * H :])

        def pre(X):
            xw = project(xp, X, Wt)
            return xw if bias is None else xw + bias

        def step(xw, states):
            h, c = states
            a = xw + xp.matmul(h, Rt)
            ai, ao, af, ac = a[..., :H], a[..., H : 2 * H], a[..., 2 * H : 3 * H], a[..., 3 * H :]
            if pi is not None:
                ai = ai + pi * c
                af = af + pf * c
            i = f(cl(ai))
            fg = 1 - i if input_forget else f(cl(af))
            c_new = fg * c + i * g(cl(ac))
            if po is not None:
                ao = ao + po * c_new
            o = f(cl(ao))
            return (o * h_act(c_new), c_new)

        return pre, step

    return recurrent(
        node, xp, default_acts=("Sigmoid", "Tanh", "Tanh"), n_states=2, make_cell=make_cell
    )
