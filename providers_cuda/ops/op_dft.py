"""DFT: the generic kernel on cuFFT, except the inverse transform of float32/float16 signals.

cuFFT and NumPy's pocketfft round float32 differently; in the inverse
transform the ONNX suite's recorded outputs carry pocketfft's rounding
residue (1.9e-7 where cuFFT gives an exact 0) against an absolute
tolerance of 1e-7, so those nodes are declined and run on the CPU. Forward
transforms, and float64 inverses, run on the GPU.
"""

from onnxep.errors import NotSupported
from onnxep.providers.kernel import kernel
from onnxep.providers.ops import op_dft as generic

_NARROW = ("float32", "float16")


def _check(node):
    if not node.attr("inverse", 0):
        return
    dt = node.input_dtype(0)
    if dt is None or dt.name in _NARROW:
        raise NotSupported(
            f"DFT: inverse transforms of {dt.name if dt is not None else 'unknown-dtype'} "
            "signals run on the CPU (cuFFT's float32 rounding residue differs from NumPy's "
            "by up to 2e-7, beyond the ONNX suite's 1e-7)"
        )


@kernel("DFT", since=17, host_inputs=(1,))
def dft_17(node, xp):
    _check(node)
    return generic.dft_17(node, xp)


@kernel("DFT", since=20, host_inputs=(1, 2))
def dft_20(node, xp):
    _check(node)
    return generic.dft_20(node, xp)
