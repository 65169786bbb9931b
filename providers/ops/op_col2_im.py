"""Col2Im: scatter-add blocks back into an image, then drop the padding."""

from __future__ import annotations

import numpy as np

from onnxep.providers.kernel import kernel

from .nn import col2im_add, crop_spatial, prod


@kernel("Col2Im", since=18, host_inputs=(1, 2))
def col2im(node, xp):
    def run(x, image_shape, block_shape):
        img = [int(v) for v in np.asarray(image_shape).reshape(-1)]
        blk = [int(v) for v in np.asarray(block_shape).reshape(-1)]
        r = len(img)
        strides = list(node.attr("strides", None) or [1] * r)
        dil = list(node.attr("dilations", None) or [1] * r)
        pads = list(node.attr("pads", None) or [0] * (2 * r))
        pb, pe = pads[:r], pads[r:]
        blocks = [
            (i + a + e - ((k - 1) * d + 1)) // s + 1
            for i, a, e, k, d, s in zip(img, pb, pe, blk, dil, strides)
        ]
        n = x.shape[0]
        kk = prod(blk)
        c = x.shape[1] // kk
        cols = x.reshape(n, c, kk, *blocks)
        full = [i + a + e for i, a, e in zip(img, pb, pe)]
        y = col2im_add(xp, cols, blk, strides, dil, blocks, full)
        return (crop_spatial(xp, y, pb, pe),)

    return run
