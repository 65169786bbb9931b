"""Optional compiled loops for the CPU provider's kernels, through numba when installed.

A few kernels (depthwise convolution, ConvTranspose's col2im) are loops that
NumPy can only express as one full pass over memory per term; numba compiles
them into one cache-resident loop each. Whether they are used is decided once,
at import: numba importable and ``ONNXEP_CPU_JIT`` not ``0``. Without numba every
kernel keeps its pure-NumPy path, and results agree within float rounding
(the compiled loops add the same terms, in a fixed order per output). The
choice is reported by ``onnxep providers`` (:func:`jit_status`).

The loops are compiled on first use (about a second each, cached on disk
where numba's cache directory is writable) and release the GIL, so the
provider's thread pool can run several at once.
"""

from __future__ import annotations

import os
from typing import Any

_why_not: str | None = None
nb: Any = None
if os.environ.get("ONNXEP_CPU_JIT", "1").strip() == "0":
    _why_not = "off (ONNXEP_CPU_JIT=0)"
else:
    try:
        import numba as nb
    except Exception as exc:  # a broken numba install is a reason, not a crash
        nb = None
        _why_not = f"numba not importable ({type(exc).__name__}); pure NumPy loops"

ENABLED = nb is not None


def jit_status() -> str:
    """One line for ``onnxep providers``: which loops the CPU kernels run."""
    if ENABLED:
        return f"compiled loops: numba {nb.__version__} (depthwise Conv, ConvTranspose col2im)"
    return f"compiled loops: {_why_not}"


_compiled: dict[str, Any] = {}


def loop(name: str) -> Any:
    """The compiled function ``name`` (defined below), compiling it on first use."""
    f = _compiled.get(name)
    if f is None:
        f = _compiled[name] = nb.njit(cache=True, nogil=True, boundscheck=False)(_SOURCES[name])
    return f


def _depthwise_rows(planes, term_plane, term_off, w, mult, r0, r1, out):
    """out[r] = sum_t w[r, t] * planes[term_plane[t], r // mult, term_off[t]:][:ln], rows r0..r1.

    Three terms per pass over the output row (left to right, the same order
    for every row), so the row is read and written a third as often.
    """
    ln = out.shape[1]
    nt = term_off.shape[0]
    for r in range(r0, r1):
        ri = r // mult
        o = out[r]
        p0 = planes[term_plane[0], ri, term_off[0] : term_off[0] + ln]
        w0 = w[r, 0]
        for x in range(ln):
            o[x] = w0 * p0[x]
        t = 1
        while t + 3 <= nt:
            pa = planes[term_plane[t], ri, term_off[t] : term_off[t] + ln]
            pb = planes[term_plane[t + 1], ri, term_off[t + 1] : term_off[t + 1] + ln]
            pc = planes[term_plane[t + 2], ri, term_off[t + 2] : term_off[t + 2] + ln]
            wa = w[r, t]
            wb = w[r, t + 1]
            wc = w[r, t + 2]
            for x in range(ln):
                o[x] = o[x] + wa * pa[x] + wb * pb[x] + wc * pc[x]
            t += 3
        while t < nt:
            p = planes[term_plane[t], ri, term_off[t] : term_off[t] + ln]
            wv = w[r, t]
            for x in range(ln):
                o[x] += wv * p[x]
            t += 1


def _col2im_rows(cols, term_off, r0, r1, out):
    """out[r, term_off[t]:][:ln] += cols[r, t] for every term t, rows r0..r1 (terms in order)."""
    ln = cols.shape[2]
    nt = cols.shape[1]
    for r in range(r0, r1):
        o = out[r]
        for t in range(nt):
            c = cols[r, t]
            s = o[term_off[t] : term_off[t] + ln]
            for x in range(ln):
                s[x] += c[x]


_SOURCES = {"depthwise_rows": _depthwise_rows, "col2im_rows": _col2im_rows}
