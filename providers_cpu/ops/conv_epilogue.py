"""The activations a fused convolution applies to its own output, while that output is in cache.

Each is the float operations the unfused CPU nodes run, in their order, on the
output's type, so a fused node gives the unfused graph's bits: with numba, one
compiled pass (``jit._conv_act``, inside the depthwise loop or over a GEMM's output
rows); without it, the NumPy ufuncs of those nodes, over blocks of the output that
fit in L2 (the multi-pass activations then stay in cache). Sigmoid and SiLU on float32
run the CPU Sigmoid's own compiled loop (``logistic.py``: no libm ``exp``), inline as
the others, or through ``logistic`` where the NumPy path runs, so both routes keep the
unfused nodes' bits. Tanh runs the CPU Tanh kernel's function (``tanh.py``) on the
output's blocks: not inline (numba's ``math.tanh`` is a scalar libm call per value), but
the same bits as the unfused node.

Names (``FusedConv``'s ``activation`` and ``activation_params``):

- ``Relu``, ``Clip`` (lo, hi), ``HardSigmoid`` (alpha, beta), ``LeakyRelu`` (alpha),
  ``Sigmoid``, ``Tanh``: com.microsoft FusedConv's own, as onnxruntime defines them;
- ``HardSwish``: ONNX HardSwish as the CPU kernel computes it (``x * clip(x * (1/6) +
  0.5, 0, 1)``), ``SiLU``: ``x * sigmoid(x)`` as the CPU's onnxep::SiLU;
- ``ClipSwish`` (a, lo, hi, d): ``x * clip(x + a, lo, hi) / d``, the HardSwish that
  PaddlePaddle's exporter writes as Add, Clip, Mul and Div nodes;
- ``Gelu`` (d, a, h): ``x * (erf(x / d) + a) * h`` on float32, the erf the CPU Erf
  kernel's (``op_erf.erf32``), as an exporter writes GELU in Div, Erf, Add, Mul, Mul.

The last four are not onnxruntime's: only ``onnxep::FusedConv`` carries them.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from onnxep.errors import NotSupported

from .. import jit
from .logistic import logistic
from .nn_cpu import parallel_rows
from .op_erf import ERF_P32, ERF_Q32, erf32
from .tanh import tanh
from .ufuncs import clip_ufunc

#: Compiled codes of ``jit._conv_act``; 0: the NumPy ufuncs only.
_CODES = {
    "Relu": 1,
    "Clip": 2,
    "HardSigmoid": 3,
    "HardSwish": 4,
    "LeakyRelu": 5,
    "ClipSwish": 6,
    "Gelu": 7,
    "Sigmoid": 8,
    "SiLU": 9,
}
_NUMPY_ONLY = ("Tanh",)
# Codes whose compiled loop is float32 only (the CPU Erf's erf32, the logistic loop)
_FLOAT32_ONLY = ("Gelu", "Sigmoid", "SiLU")
_LOGISTIC = ("Sigmoid", "SiLU")
#: Parameters when ``activation_params`` is absent or short (onnxruntime's defaults).
_DEFAULTS = {
    "Clip": (-np.inf, np.inf),
    "HardSigmoid": (0.2, 0.5),
    "LeakyRelu": (0.01,),
    "ClipSwish": (3.0, 0.0, 6.0, 6.0),
    "Gelu": (2**0.5, 1.0, 0.5),
}
NAMES = (*_CODES, *_NUMPY_ONLY)
_FAST = (np.dtype(np.float32), np.dtype(np.float64))
# Elements per NumPy block: 256 KB of float32, a temporary beside it still in L2.
_BLOCK = 1 << 16
# At most this many values, Relu, Clip and HardSigmoid take their ufuncs even with numba
_SMALL = 8192
_ONE_UFUNC = (_CODES["Relu"], _CODES["Clip"], _CODES["HardSigmoid"])
# Rows shorter than this run as one flat row when the output has at most _FLAT_MAX values
_SHORT_ROWS = 256
_FLAT_MAX = 1 << 18


class Epilogue:
    """A fused activation, built once per node: ``apply`` runs it in place."""

    def __init__(self, name: str, params: Sequence[float] | None) -> None:
        if name not in NAMES:
            raise NotSupported(
                f"FusedConv: activation {name!r} is not supported (CPU: {', '.join(NAMES)})"
            )
        self.name = name
        given = [float(v) for v in (params or [])]
        default = _DEFAULTS.get(name, ())
        self.params = tuple(given[: len(default)]) + tuple(default[len(given) :])
        self.code = _CODES.get(name, 0)
        self._prm: dict = {}

    def prm(self, dtype) -> np.ndarray:
        """The compiled loop's constants in ``dtype`` (``jit._conv_act``'s ``prm``)."""
        got = self._prm.get(dtype)
        if got is None:
            p = list(self.params) + [0.0] * (4 - len(self.params))
            t = np.dtype(dtype).type
            # 1/6 rounded once to the dtype, as the CPU HardSwish multiplies by it
            erf = [*ERF_P32, *ERF_Q32, -4.0, 4.0]
            got = self._prm[dtype] = np.array([*p, 0.0, 1.0, t(1 / 6), 0.5, *erf], dtype)
        return got

    def compiled(self, dtype) -> bool:
        """Whether the compiled loops run it on ``dtype`` (numba on, a compiled code)."""
        if self.name in _FLOAT32_ONLY and np.dtype(dtype) != np.float32:
            return False  # erf32 is the float32 Erf only; the logistic loop float32 only
        return self.code != 0 and np.dtype(dtype) in _FAST and jit.ENABLED

    def apply(self, y: np.ndarray) -> None:
        """The activation over ``y`` (N, M, ...), in place."""
        if y.size == 0:
            return
        if y.size <= _SMALL and self.code in _ONE_UFUNC:
            # A few thousand values (a short signal's conv): the compiled loop's dispatch
            # (seven arguments typed per call) and the row split cost more than the one
            # or three ufunc calls, which give the same bits.
            self.numpy(y)
            return
        if self.compiled(y.dtype) and y.flags.c_contiguous:
            if self.name in _LOGISTIC:
                # One flat pass on this thread (logistic.py says why): a call per channel row
                # doubled the time on 10x10 maps. The same loop, so the same bits.
                logistic(y, mul=self.name == "SiLU", out=y)
                return
            rows = y.shape[0] * y.shape[1]
            if y.size // max(rows, 1) < _SHORT_ROWS and y.size <= _FLAT_MAX:
                # Short rows (a 2x3 map's 6 values) leave the compiled loop its scalar
                # remainder per row: GELU on 768 rows of 6 took 51 us, as one row 5. The
                # activation is per value, so the bits are the same.
                rows = 1
            y2 = y.reshape(rows, -1)
            f = jit.loop("conv_epilogue")
            zero = np.zeros(1, y.dtype)
            prm = self.prm(y.dtype)
            parallel_rows(rows, y.size, lambda r0, r1: f(y2, zero, False, self.code, prm, r0, r1))
            return
        flat = y.reshape(-1)
        if not flat.flags.c_contiguous:
            self.numpy(y)
            return
        for i in range(0, flat.size, _BLOCK):
            self.numpy(flat[i : i + _BLOCK])

    def with_bias(self, bias, size: int, dtype):
        """``f(y)`` adding ``bias`` (one value per channel, axis 1 of y (N, M, L)) and applying
        the activation in one compiled pass, for outputs of ``size`` values of ``dtype``;
        None where ``apply`` would not run the compiled row loop (no numba, the logistic
        and NumPy-only activations, small outputs). The row loop adds the bias first, then
        the activation per value: the bits of ``y += bias`` then ``apply``."""
        if size <= _SMALL or not self.compiled(dtype) or self.name in _LOGISTIC:
            return None
        bv = np.ascontiguousarray(np.asarray(bias).astype(dtype).reshape(-1))
        f = jit.loop("conv_epilogue")
        code, prm = self.code, self.prm(dtype)

        def run(y):
            rows = y.shape[0] * y.shape[1]
            y2 = y.reshape(rows, -1)
            parallel_rows(rows, y.size, lambda r0, r1: f(y2, bv, True, code, prm, r0, r1))

        return run

    def inplace(self, size: int, dtype):
        """``apply`` for outputs of ``size`` values of ``dtype``, as one callable ``f(y)``.

        A short signal's conv output (a few hundred values) takes the cheapest call with
        ``apply``'s bits: Relu one ``np.maximum`` against a zero of the output's type (the
        Relu kernel's bits: its clip + 0 only stands in for NumPy 2.4's slow ``maximum``
        loop on large maps), Clip one clip ufunc call (what ``np.clip`` runs, without its
        wrapper and ``errstate``). Anything else, or more values: ``apply``.
        """
        if size <= _SMALL and np.dtype(dtype) in _FAST:
            t = np.dtype(dtype).type
            if self.name == "Relu":
                zero = t(0)
                return lambda y: np.maximum(y, zero, out=y)
            if self.name == "Clip":
                lo, hi = t(self.params[0]), t(self.params[1])
                return lambda y: clip_ufunc(y, lo, hi, out=y)
            if self.name == "HardSigmoid" and np.isfinite(self.params[0]) and self.params[0]:
                # ``numpy``'s three ufuncs without its errstate (a nonzero finite alpha
                # makes no invalid operation): a squeeze-and-excitation gate's conv
                al, be, zero, one = t(self.params[0]), t(self.params[1]), t(0), t(1)

                def hard_sigmoid(y):
                    np.multiply(y, al, out=y)
                    np.add(y, be, out=y)
                    clip_ufunc(y, zero, one, out=y)

                return hard_sigmoid
        return self.apply

    def numpy(self, y: np.ndarray) -> None:
        """The unfused CPU nodes' own ufuncs, in place on ``y``."""
        with np.errstate(invalid="ignore"):  # -inf * 0 is NaN there too
            self._numpy(y)

    def _numpy(self, y: np.ndarray) -> None:
        name, p = self.name, self.params
        t = y.dtype.type
        if name == "Relu":
            # np.maximum against a scalar is NumPy 2.4's slow loop; clip then + 0 gives its
            # bits (op_relu.py)
            clip_ufunc(y, 0, np.inf, out=y)
            y += 0.0
        elif name == "Clip":
            np.clip(y, t(p[0]), t(p[1]), out=y)
        elif name == "HardSigmoid":
            y *= p[0]
            y += p[1]
            np.clip(y, 0, 1, out=y)
        elif name == "LeakyRelu":
            np.multiply(y, p[0], out=y, where=y < 0)
        elif name == "Tanh":
            tanh(y, out=y)
        elif name in ("Sigmoid", "SiLU"):
            # the CPU Sigmoid / SiLU kernels' own function: their bits, compiled or not
            logistic(y, mul=name == "SiLU", out=y)
        elif name == "HardSwish":
            s = np.multiply(y, t(1 / 6))
            s += 0.5
            np.clip(s, 0, 1, out=s)
            y *= s
        elif name == "Gelu":
            if y.dtype != np.float32:
                raise NotSupported("FusedConv: Gelu runs on float32 only (the CPU Erf's)")
            s = np.divide(y, t(p[0]))
            s = erf32(s)
            s += t(p[1])
            y *= s
            y *= t(p[2])
        else:  # ClipSwish
            s = np.add(y, t(p[0]))
            np.clip(s, t(p[1]), t(p[2]), out=s)
            y *= s
            y /= t(p[3])
