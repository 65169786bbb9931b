"""STFT: frames gathered with one index array, windowed, then one batched FFT."""

from __future__ import annotations

import numpy as np

from onnxep.providers.kernel import kernel

from .nn import from_complex, to_complex


@kernel("STFT", since=17, host_inputs=(1, 3))
def stft(node, xp):
    onesided = bool(node.attr("onesided", 1))

    def run(signal, frame_step, window=None, frame_length=None):
        step = int(np.asarray(frame_step).reshape(-1)[0])
        z, is_complex = to_complex(xp, signal)  # (B, L)
        length = z.shape[1]
        if frame_length is not None:
            fl = int(np.asarray(frame_length).reshape(-1)[0])
        elif window is not None:
            fl = int(window.shape[0])
        else:
            fl = length
        frames = (length - fl) // step + 1
        idx = np.arange(frames)[:, None] * step + np.arange(fl)[None, :]
        fr = xp.take(z, xp.asarray(idx.reshape(-1)), axis=1).reshape(z.shape[0], frames, fl)
        if window is not None:
            fr = fr * window.astype(fr.real.dtype if is_complex else fr.dtype, copy=False)
        if onesided and not is_complex:
            y = xp.fft.rfft(fr, n=fl, axis=-1)
        else:
            y = xp.fft.fft(fr, n=fl, axis=-1)
        return (from_complex(xp, y, signal.dtype),)

    return run
