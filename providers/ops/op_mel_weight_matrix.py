"""MelWeightMatrix: triangular filters on integer DFT bins (onnxruntime's bin rounding)."""

from __future__ import annotations

import numpy as np

from onnxep.providers.dtypes import np_dtype
from onnxep.providers.kernel import kernel


@kernel("MelWeightMatrix", since=17, host_inputs=(0, 1, 2, 3, 4))
def mel_weight_matrix(node, xp):
    out_dt = np_dtype(int(node.attr("output_datatype", 1)))

    def run(num_mel_bins, dft_length, sample_rate, lower, upper):
        nmel = int(np.asarray(num_mel_bins).reshape(-1)[0])
        dft = int(np.asarray(dft_length).reshape(-1)[0])
        sr = np.asarray(sample_rate).reshape(-1)[0]
        lo = np.asarray(lower).reshape(-1)[0]
        hi = np.asarray(upper).reshape(-1)[0]
        nbins = dft // 2 + 1
        lo_mel = 2595 * np.log1p(lo / 700) / np.log(10)
        hi_mel = 2595 * np.log1p(hi / 700) / np.log(10)
        step = (hi_mel - lo_mel) / (nmel + 2)
        mel = np.arange(nmel + 2) * step + lo_mel
        hz = 700 * np.expm1(mel / 2595 * np.log(10))
        bins = (((dft + 1) * hz) // sr).astype(np.int64)
        out = np.zeros((nbins, nmel))
        for i in range(nmel):
            left, center, right = int(bins[i]), int(bins[i + 1]), int(bins[i + 2])
            if center == left:
                if 0 <= center < nbins:
                    out[center, i] = 1.0
            else:
                j = np.arange(left, center + 1)
                ok = (j >= 0) & (j < nbins)
                out[j[ok], i] = (j[ok] - left) / (center - left)
            if right > center:
                j = np.arange(center, right)
                ok = (j >= 0) & (j < nbins)
                out[j[ok], i] = (right - j[ok]) / (right - center)
        return (xp.asarray(out.astype(out_dt)),)

    return run
