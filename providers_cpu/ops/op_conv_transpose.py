"""ConvTranspose on NumPy: one GEMM per group (W^T X), then col2im through the stride phases.

The generic kernel scatters every kernel offset's columns into the output
with a strided slice (step = stride), whose inner loop NumPy cannot
vectorise. Output index ``i * s + t * d`` lies in stride phase ``(t * d) % s``
at position ``i + (t * d) // s``, so here each offset adds into a dense plane
of its phase (unit-step slices, contiguous rows), and each phase is written
into the output once. Constant weights are transposed for the GEMM once.
Only the cropped output is written; the bias is added in place.

The product W^T X is a 1x1 convolution with M * prod(kernel) output channels, so where
``conv_gemm`` runs a float32 pointwise convolution of that shape (sessions of more than
one thread on AVX2: OpenBLAS's even split waits for a descheduled thread), it runs there
too: rapidocr-v6-det's [96, 24] x [24, 384] upsampling took 13.5 ms a run on two
OpenBLAS threads of the loaded 2-core machine, against onnxruntime's 0.04.
"""

from __future__ import annotations

import numpy as np

from onnxep.providers.kernel import kernel
from onnxep.providers.ops.nn import compute_dtype
from onnxep.providers.ops.op_conv_transpose import conv_transpose as generic_conv_transpose
from onnxep.providers.ops.op_conv_transpose import conv_transpose_setup

from .. import jit
from ..threads import run_threads
from . import conv_gemm
from .nn_cpu import Scratch, parallel_rows

_COMPILED = (np.dtype(np.float32), np.dtype(np.float64))


@kernel("ConvTranspose", since=(1, 11, 22))
def conv_transpose(node, xp):
    group, ksh, strides, dil, geometry = conv_transpose_setup(node)
    rank = len(strides)
    wconst = node.const_input(1)
    packed: dict = {}
    # Negative crops (output_shape past the full size) and empty inputs: the generic steps.
    fallback = generic_conv_transpose(node, xp)
    scratch = Scratch()
    gemm_ok = group == 1 and wconst is not None and conv_gemm.enabled()

    def gemm_cols(x, c, mg, kk, lsz):
        """(N, M * prod(k), L) through conv_gemm's 1x1 kernel, or None where it does not run."""
        mkk = mg * kk
        if not (
            gemm_ok
            and x.dtype == np.float32
            and conv_gemm.applies((1, 1), 1, mkk, c, lsz, x.dtype, True, True, run_threads())
        ):
            return None
        got = packed.get("cgemm")
        if got is None:
            wt = weights(wconst, np.dtype(np.float32), c, mg, kk)
            got = packed["cgemm"] = (
                conv_gemm.pack_weights(wt[0].reshape(mkk, c, 1, 1)),
                np.zeros(mkk, np.float32),
            )
        key = ("cgemm", x.shape)
        cg = scratch.bufs.get(key)
        if cg is None:
            flat = (x.shape[0], c, 1, lsz)
            cg = scratch.bufs[key] = conv_gemm.ConvGemm(
                flat, got[0], got[1], (1, 1), (1, 1), (1, 1), (0, 0), (0, 0), (1, lsz)
            )
        cols = np.empty((x.shape[0], mkk, lsz), np.float32)
        cg(x.reshape(x.shape[0], c, 1, lsz), cols)
        return cols

    def weights(w, cdt, c, mg, kk):
        """(G, Mg * K, C / G) contiguous: W^T per group."""
        got = packed.get(cdt) if wconst is not None else None
        if got is None:
            wg = np.asarray(w).astype(cdt, copy=False).reshape(group, c // group, mg * kk)
            got = np.ascontiguousarray(wg.transpose(0, 2, 1))
            if wconst is not None:
                packed[cdt] = got
        return got

    def run(x, w, b=None):
        k = list(ksh) if ksh is not None else list(w.shape[2:])
        in_sp = list(x.shape[2:])
        full, pb, pe = geometry(in_sp, k)
        dt = x.dtype
        cdt = compute_dtype(dt)
        n, c = x.shape[:2]
        mg = w.shape[1]
        m = group * mg
        kk = int(np.prod(k))
        lsz = int(np.prod(in_sp))
        if any(p < 0 for p in (*pb, *pe)) or n == 0 or lsz == 0:
            return fallback(x, w, b)
        cols = gemm_cols(x, c, mg, kk, lsz)
        if cols is not None:
            cols = cols.reshape(n, m, kk, *in_sp)
        else:
            wt = weights(w, cdt, c, mg, kk)
            xg = x.astype(cdt, copy=False).reshape(n, group, c // group, lsz)
            if group == 1 and n == 1:
                cols = (wt[0] @ xg[0, 0]).reshape(1, m, kk, *in_sp)
            else:
                cols = np.matmul(wt, xg).reshape(n, m, kk, *in_sp)
        out_sp = [f - b0 - e0 for f, b0, e0 in zip(full, pb, pe)]
        if offsets_tile(k, strides, dil, pb, pe, in_sp, out_sp):
            if rank == 2 and cols.dtype in _COMPILED and jit.ENABLED:
                # the bias goes on as each value is placed (the same sum as after)
                return (depth_to_space_2d(cols, k, out_sp, b).astype(dt, copy=False),)
            y = depth_to_space(cols, k, in_sp, out_sp)
        else:
            y = col2im_phases(cols, k, strides, dil, in_sp, full, pb, out_sp)
        if b is not None:
            y += np.asarray(b, dtype=cdt).reshape(1, m, *([1] * rank))
        return (y if y.dtype == dt else y.astype(dt),)

    return run


def offsets_tile(k, strides, dil, pb, pe, in_sp, out_sp) -> bool:
    """Whether every output position is one offset of one input position: kernel ==
    stride, no dilation, no crop (the 2x2 stride-2 upsampling of a detection neck)."""
    return (
        list(k) == list(strides)
        and all(d == 1 for d in dil)
        and not any(pb)
        and not any(pe)
        and list(out_sp) == [v * s for v, s in zip(in_sp, strides)]
    )


def depth_to_space_2d(cols, k, out_sp, b=None):
    """``depth_to_space`` of a 2-D kernel, plus the bias ``b`` (M,) when given, in one compiled
    pass (``jit._depth_to_space_2d``) over the run's threads."""
    n, m, kk, h, w = cols.shape
    c3 = np.ascontiguousarray(cols).reshape(n * m, kk, h, w)
    y = np.empty((n * m, *out_sp), dtype=cols.dtype)
    bias = (
        np.zeros(1, cols.dtype)
        if b is None
        else np.ascontiguousarray(np.asarray(b, dtype=cols.dtype).reshape(-1))
    )
    f = jit.loop("depth_to_space_2d")
    kh, kw = k
    parallel_rows(n * m, y.size, lambda r0, r1: f(c3, bias, b is not None, kh, kw, r0, r1, y))
    return y.reshape(n, m, *out_sp)


def depth_to_space(cols, k, in_sp, out_sp):
    """``cols`` (N, M, prod(k), *in_sp) to (N, M, *out_sp) when the offsets tile the output:
    output ``i * k + t`` is offset ``t``'s column at ``i``, so one strided copy places them
    all (the phase planes' zero fill and adds were three passes, and 5x onnxruntime's time
    on rapidocr-v6-det's two upsamplings)."""
    n, m = cols.shape[:2]
    y = np.empty((n, m, *out_sp), dtype=cols.dtype)
    # one strided copy per offset, each a whole input map long (a copy through a single
    # transposed view ran NumPy's loop two values at a time: 92 us for 24 x 32 x 48)
    for i, kpos in enumerate(np.ndindex(*k)):
        y[(slice(None), slice(None), *(slice(t, None, kk) for t, kk in zip(kpos, k)))] = cols[
            :, :, i
        ]
    return y


def col2im_phases(cols, k, strides, dil, in_sp, full, pb, out_sp):
    """Sum of every offset's columns at its place in the output, cropped to ``out_sp`` from ``pb``.

    ``cols`` (N, M, prod(k), *in_sp). Per phase: a zero plane of ``in + max shift``
    positions per axis, each offset added at its shift (offsets in kernel order),
    then the plane's positions inside the crop written into the output.
    """
    n, m = cols.shape[:2]
    by_phase: dict = {}
    for i, kpos in enumerate(np.ndindex(*k)):
        ph = tuple((t * d) % s for t, d, s in zip(kpos, dil, strides))
        sh = tuple((t * d) // s for t, d, s in zip(kpos, dil, strides))
        by_phase.setdefault(ph, []).append((i, sh))
    y = np.zeros((n, m, *out_sp), dtype=cols.dtype)
    for ph, terms in by_phase.items():
        ext = [v + max(sh[a] for _, sh in terms) for a, v in enumerate(in_sp)]
        plane = np.zeros((n, m, *ext), dtype=cols.dtype)
        for i, sh in terms:
            dst = (slice(None), slice(None), *(slice(a, a + v) for a, v in zip(sh, in_sp)))
            plane[dst] += cols[:, :, i]
        # Plane position q is full index ph + q * s, output index ph + q * s - pb.
        src, dst = [slice(None)] * 2, [slice(None)] * 2
        for a in range(len(k)):
            s, p0 = strides[a], ph[a]
            # first q with ph + q * s >= pb, last with ph + q * s < pb + out
            q0 = max(0, -(-(pb[a] - p0) // s))
            q1 = min(ext[a], -(-(pb[a] + out_sp[a] - p0) // s))
            if q1 <= q0:
                break
            src.append(slice(q0, q1))
            o0 = p0 + q0 * s - pb[a]
            dst.append(slice(o0, o0 + (q1 - q0 - 1) * s + 1, s))
        else:
            y[tuple(dst)] = plane[tuple(src)]
    return y
