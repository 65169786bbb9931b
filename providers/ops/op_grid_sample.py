"""GridSample (N-D): per-tap gathers combined with separable weights.

Follows the reference semantics: the sampling coordinate is first brought
inside the border (border/reflection), then every interpolation tap is padded
again (zeros outside, clamped, or reflected).
"""

from __future__ import annotations

import itertools

from onnxep.errors import NotSupported
from onnxep.providers.kernel import kernel

from .nn import compute_dtype, str_attr

_MODES = {
    "bilinear": "linear",
    "linear": "linear",
    "nearest": "nearest",
    "bicubic": "cubic",
    "cubic": "cubic",
}


def _reflect(xp, x, lo, hi):
    rng = hi - lo
    if rng <= 0:
        return xp.full(x.shape, lo, dtype=x.dtype)
    below = x < lo
    dx = xp.where(below, lo - x, x - hi)
    n = xp.floor(dx / rng)
    r = dx - n * rng
    even = (n % 2) == 0
    lo_side = xp.where(even, lo + r, hi - r)
    hi_side = xp.where(even, hi - r, lo + r)
    return xp.where(below, lo_side, xp.where(x > hi, hi_side, x))


def _cubic(xp, t, a=-0.75):
    # Keys weights for the taps at offsets -1, 0, 1, 2 from floor(x).
    w0 = ((a * (t + 1) - 5 * a) * (t + 1) + 8 * a) * (t + 1) - 4 * a
    w1 = ((a + 2) * t - (a + 3)) * t * t + 1
    w2 = ((a + 2) * (1 - t) - (a + 3)) * (1 - t) * (1 - t) + 1
    w3 = ((a * (2 - t) - 5 * a) * (2 - t) + 8 * a) * (2 - t) - 4 * a
    return [w0, w1, w2, w3]


@kernel("GridSample", since=(16, 20, 22))
def grid_sample(node, xp):
    mode = _MODES.get(str_attr(node, "mode", "bilinear" if node.opset < 20 else "linear"))
    if mode is None:
        raise NotSupported(f"GridSample: mode {node.attr('mode')!r} is not supported")
    pad = str_attr(node, "padding_mode", "zeros")
    if pad not in ("zeros", "border", "reflection"):
        raise NotSupported(f"GridSample: padding_mode {pad!r} is not supported")
    align = bool(node.attr("align_corners", 0))

    def run(x, grid):
        dt = x.dtype
        cdt = compute_dtype(dt)
        n, c = x.shape[:2]
        dims = list(x.shape[2:])
        nd = len(dims)
        out_sp = list(grid.shape[1:-1])
        g = grid.astype(cdt, copy=False).reshape(n, -1, nd)
        xt = xp.swapaxes(x.astype(cdt, copy=False).reshape(n, c, -1), 1, 2)  # (N, P_in, C)
        per_dim = []  # for each spatial dim: list of (index, weight, valid)
        for i, d in enumerate(dims):
            u = g[:, :, nd - 1 - i]
            if align:
                pos = (u + 1) / 2 * (d - 1)
                lo, hi = 0.0, d - 1.0
            else:
                pos = ((u + 1) * d - 1) / 2
                lo, hi = -0.5, d - 0.5
            if mode == "nearest":
                pos = xp.rint(pos)
            # Cubic pads each tap only (onnxruntime, PyTorch); the other modes
            # first bring the coordinate itself inside the border.
            if pad == "border" and mode != "cubic":
                pos = xp.clip(pos, 0, d - 1)
            elif pad == "reflection" and mode != "cubic":
                pos = _reflect(xp, pos, lo, hi)
            if mode == "nearest":
                taps = [(pos, None)]
            else:
                f0 = xp.floor(pos)
                t = pos - f0
                if mode == "linear":
                    taps = [(f0, 1 - t), (f0 + 1, t)]
                else:
                    taps = list(zip((f0 - 1, f0, f0 + 1, f0 + 2), _cubic(xp, t)))
            entries = []
            for p, w in taps:
                if pad == "zeros":
                    ok = (p >= 0) & (p <= d - 1)
                    idx = xp.clip(p, 0, d - 1).astype(xp.int64)
                elif pad == "border":
                    ok = None
                    idx = xp.clip(p, 0, d - 1).astype(xp.int64)
                else:
                    ok = None
                    idx = xp.clip(_reflect(xp, p, lo, hi).astype(xp.int64), 0, d - 1)
                entries.append((idx, w, ok))
            per_dim.append(entries)
        strides = [1] * nd
        for i in range(nd - 2, -1, -1):
            strides[i] = strides[i + 1] * dims[i + 1]
        ni = xp.arange(n).reshape(n, 1)
        acc = None
        for combo in itertools.product(*per_dim):
            flat = None
            wt = None
            ok = None
            for (idx, w, v), s in zip(combo, strides):
                flat = idx * s if flat is None else flat + idx * s
                if w is not None:
                    wt = w if wt is None else wt * w
                if v is not None:
                    ok = v if ok is None else ok & v
            if ok is not None:
                wt = xp.where(ok, 1.0, 0.0).astype(cdt) if wt is None else xp.where(ok, wt, 0)
            vals = xt[ni, flat]  # (N, P_out, C)
            term = vals if wt is None else vals * wt[..., None]
            acc = term if acc is None else acc + term
        y = xp.swapaxes(acc, 1, 2).reshape(n, c, *out_sp)
        return (y.astype(dt, copy=False),)

    return run
