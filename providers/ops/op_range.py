import math

import numpy as np

from onnxep.providers.kernel import kernel


@kernel("Range", since=(11, 27), host_inputs=(0, 1, 2))
def range_(node, xp):
    stash = node.attr("stash_type", 1) if node.opset >= 27 else 0

    def run(start, limit, delta):
        dtype = np.asarray(start).dtype
        s, lim, d = (np.asarray(v).reshape(()) for v in (start, limit, delta))
        if dtype.kind in "iu":
            s, lim, d = int(s), int(lim), int(d)
            n = max(-((s - lim) // d), 0)  # exact integer ceil
            return ((xp.arange(n, dtype=np.int64) * d + s).astype(dtype),)
        n = max(math.ceil((float(lim) - float(s)) / float(d)), 0)
        # half-precision types accumulate in float32 unless stash_type says otherwise
        wide = dtype.itemsize < 4 and (node.opset < 27 or stash == 1)
        work = np.float32 if wide else dtype
        i = xp.arange(n, dtype=work)
        out = i * xp.asarray(d.astype(work)) + xp.asarray(s.astype(work))
        return (out.astype(dtype),)

    return run
