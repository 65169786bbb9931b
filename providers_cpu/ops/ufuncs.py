"""NumPy's own ufuncs where the public function wraps them at a cost.

``np.clip`` is a Python wrapper (about 1.3 us a call) around the ``clip`` ufunc; the ufunc
itself is NumPy's vectorised clip at every size. It matters because NumPy 2.4's
``maximum``/``minimum`` against a scalar take a slow loop on float32 (a 640k-element
``np.maximum(x, 0)`` took 188 us against 47 for ``clip(x, 0, inf)``, docs/cpu_kernels.md,
"Activations without slow NumPy loops"), so Relu and Clip go through ``clip``.
"""

from __future__ import annotations

import numpy as np

try:  # NumPy 2
    from numpy._core.umath import clip as clip_ufunc
except ImportError:  # pragma: no cover - NumPy 1.26: same ufunc, older module path
    try:
        from numpy.core.umath import clip as clip_ufunc
    except ImportError:
        clip_ufunc = np.clip

from onnxep.providers.ops.elementwise import NARROW_FLOATS

#: the float dtypes these kernels compute themselves
BLAS_FLOATS = frozenset({np.dtype(np.float32), np.dtype(np.float64)})
#: every other dtype a tensor may have: the generic kernel's (``direct``'s ``upcast`` set)
OTHER_DTYPES = frozenset(np.dtype(c) for c in "?bBhHiIlLqQe") | NARROW_FLOATS
