"""RoiAlign: per-ROI bilinear sampling, built on the host as separable weights.

Average mode is Ay @ X[b] @ Ax^T with host-built (out, H) and (out, W)
matrices. Max mode follows onnxruntime: the max, over the samples of a bin,
of the largest of the four weighted corner terms.
"""

from __future__ import annotations

import math

import numpy as np

from onnxep.errors import NotSupported
from onnxep.providers.kernel import kernel

from .indices import checked_indices
from .nn import compute_dtype, str_attr


def _samples(start, bin_size, out_len, grid, length):
    """Low/high indices, weights and validity of every sample along one axis: (out*grid,).

    Arithmetic stays in the ROI dtype (float32 for float32 inputs), as
    onnxruntime does: grid sizes come from ceil() of these values.
    """
    ft = type(start)
    p = np.repeat(np.arange(out_len), grid).astype(ft)
    i = np.tile(np.arange(grid), out_len).astype(ft)
    pos = start + p * bin_size + (i + ft(0.5)) * bin_size / ft(grid)
    valid = ~((pos < -1.0) | (pos > length))
    pos = np.maximum(pos, 0.0)
    low = pos.astype(np.int64)
    at_end = low >= length - 1
    low = np.where(at_end, length - 1, low)
    high = np.where(at_end, length - 1, low + 1)
    pos = np.where(at_end, low.astype(np.float64), pos)
    lw = pos - low
    hw = 1.0 - lw
    return low, high, np.where(valid, hw, 0.0), np.where(valid, lw, 0.0)


@kernel("RoiAlign", since=(10, 16, 22), host_inputs=(1, 2))
def roi_align(node, xp):
    mode = str_attr(node, "mode", "avg")
    if mode not in ("avg", "max"):
        raise NotSupported(f"RoiAlign: mode {mode!r} is not supported (avg, max)")
    oh = int(node.attr("output_height", 1))
    ow = int(node.attr("output_width", 1))
    sr = int(node.attr("sampling_ratio", 0))
    scale = float(node.attr("spatial_scale", 1.0))
    ctm = (
        str_attr(node, "coordinate_transformation_mode", "half_pixel")
        if node.opset >= 16
        else "output_half_pixel"
    )
    half = ctm == "half_pixel"

    def run(x, rois, batch_indices):
        dt = x.dtype
        cdt = compute_dtype(dt)
        xc = x.astype(cdt, copy=False)
        _, c, h, w = x.shape
        ft = np.float64 if dt == np.float64 else np.float32
        rois = np.asarray(rois).astype(ft).reshape(-1, 4)
        bidx = np.asarray(batch_indices).reshape(-1)
        # images of the batch: a negative index does not count from the end
        n = x.shape[0]
        checked_indices(
            np, bidx, n, "RoiAlign", name="batch_indices", negative=False, extent=f"{n} images"
        )
        outs = []
        for r in range(rois.shape[0]):
            off = ft(0.5 if half else 0.0)
            x0, y0, x1, y1 = rois[r] * ft(scale) - off
            rw, rh = x1 - x0, y1 - y0
            if not half:
                rw, rh = max(rw, ft(1.0)), max(rh, ft(1.0))
            bh, bw = rh / ft(oh), rw / ft(ow)
            gh = sr if sr > 0 else int(math.ceil(bh))
            gw = sr if sr > 0 else int(math.ceil(bw))
            img = xc[int(bidx[r])]
            if gh <= 0 or gw <= 0:
                outs.append(xp.zeros((c, oh, ow), dtype=cdt))
                continue
            yl, yh, wyl, wyh = _samples(y0, bh, oh, gh, h)
            xl, xh, wxl, wxh = _samples(x0, bw, ow, gw, w)
            if mode == "avg":
                ay = np.zeros((oh * gh, h))
                np.add.at(ay, (np.arange(oh * gh), yl), wyl)
                np.add.at(ay, (np.arange(oh * gh), yh), wyh)
                ay = ay.reshape(oh, gh, h).sum(axis=1) / gh
                ax = np.zeros((ow * gw, w))
                np.add.at(ax, (np.arange(ow * gw), xl), wxl)
                np.add.at(ax, (np.arange(ow * gw), xh), wxh)
                ax = ax.reshape(ow, gw, w).sum(axis=1) / gw
                y = xp.matmul(
                    xp.matmul(xp.asarray(ay.astype(cdt)), img), xp.asarray(ax.T.astype(cdt))
                )
            else:
                best = None
                for yi, wy in ((yl, wyl), (yh, wyh)):
                    rows = img[:, xp.asarray(yi), :]  # (C, oh*gh, W)
                    for xi, wx in ((xl, wxl), (xh, wxh)):
                        v = rows[:, :, xp.asarray(xi)]  # (C, oh*gh, ow*gw)
                        wgt = xp.asarray(np.outer(wy, wx).astype(cdt))
                        t = v * wgt
                        best = t if best is None else xp.maximum(best, t)
                y = xp.max(best.reshape(c, oh, gh, ow, gw), axis=(2, 4))
            outs.append(y)
        if not outs:
            return (xp.zeros((0, c, oh, ow), dtype=dt),)
        return (xp.stack(outs).astype(dt, copy=False),)

    return run
