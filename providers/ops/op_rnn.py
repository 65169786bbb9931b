"""RNN: H_t = f(X_t W^T + H_{t-1} R^T + Wb + Rb)."""

from onnxep.providers.dtypes import FLOAT_TYPES
from onnxep.providers.kernel import kernel

from .flow import clipper, project, recurrent


@kernel("RNN", since=(1, 7, 14, 22), dtypes=FLOAT_TYPES)
def rnn(node, xp):
    def make_cell(W, R, B, P, acts, clip, hidden):
        f = acts[0]
        cl = clipper(xp, clip)
        bias = None if B is None else B[:hidden] + B[hidden:]
        Wt, Rt = W.T, R.T

        def pre(X):
            xw = project(xp, X, Wt)
            return xw if bias is None else xw + bias

        def step(xw, states):
            return (f(cl(xw + xp.matmul(states[0], Rt))),)

        return pre, step

    return recurrent(node, xp, default_acts=("Tanh",), n_states=1, make_cell=make_cell)
