"""com.microsoft DynamicQuantizeLSTM: LSTM whose products run on 8-bit weights.

What onnxruntime.quantization.quantize_dynamic makes of LSTM. W is [dirs, input, 4H] and
R [dirs, H, 4H] (transposed from LSTM's), 8-bit, with per-direction or per-column scales
and zero points (W_scale, W_zero_point, R_scale, R_zero_point, inputs 8-11). As onnxruntime
does, X is quantized to uint8 once for the whole sequence and each step's hidden state
(per direction) before its product with R, both with DynamicQuantizeLinear's range rule;
products are those 8-bit values times the 8-bit weights, scaled back to float. The cell
runs one of three ways:

- 8-bit tiles (numba, default activations, AVX-512 VNNI or AVX2: jit_int8.tiles();
  recurrent_vnni.py): one compiled call per run quantizes X, projects every step as one
  uint8 x int8 product and runs each step's hidden state times R on the tiles, all in
  exact int32 (W and R packed into 64-column panels once per session), directions on two
  threads only past ``PARALLEL_WORK``. The same integers as the loop below, which sums
  them in float32: equal results while those sums are exact.
- compiled (numba, default activations; recurrent_jit.py): one loop per direction over
  the whole sequence. The hidden state's 8-bit integers multiply the 8-bit weights (less
  their zero point, as int8, or int16 where that does not fit) converted in the loop, and
  the float32 sum is scaled once by both scales: a quarter of the bytes of the float32
  weights a step reads. The hidden state's quantisation is the NumPy round trip's, bit
  for bit (recurrent_loops.quantize_rows).
- NumPy: the CPU LSTM's steps (both directions per step, preallocated gates) on weights
  dequantized to float32, with the hidden state's round trip before each product.

Constant weights (quantize_dynamic's always are) are prepared once per session. With
sequence_lens shorter than the sequence, the generic recurrence runs instead: there
every step quantizes the whole batch's hidden state, finished entries included, where
the CPU kernels compute only the entries still running.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from onnxep.errors import InvalidArgument
from onnxep.providers.kernel import kernel
from onnxep.providers.ops.flow import clipper, project, recurrent

from .. import jit, jit_int8
from ..threads import run_threads
from . import recurrent_jit, vnni_gemm
from .nn_cpu import parallel_rows
from .op_lstm import lstm_runner
from .qlinear import constant_inputs, dequantize_per_column, dynamic_uint8
from .recurrent_cpu import check_shape, parse_direction, peepholes


def _fake_quant(x: np.ndarray) -> np.ndarray:
    """``x`` through uint8 and back, with the range rule of onnxruntime's dynamic quantization."""
    q, scale, zp = dynamic_uint8(x)
    return (q.astype(np.float32) - np.float32(zp)) * scale


def _fake_quant_per_direction(h: np.ndarray) -> np.ndarray:
    """:func:`_fake_quant` of each ``h[d]`` ([dirs, batch, H]) at once, the same float32
    operations element for element (so the same bits as one direction at a time).

    About twenty NumPy calls on a step's few hundred values; with numba (providers_cpu/jit)
    one compiled loop does the same operations in a few microseconds.
    """
    if jit.ENABLED and h.dtype == np.float32 and h.ndim == 3:
        out = np.empty_like(h)
        if jit.loop("uint8_round_trip")(np.ascontiguousarray(h), out):
            return out
    return _fake_quant_numpy(h)


def _fake_quant_numpy(h: np.ndarray) -> np.ndarray:
    d = h.shape[0]
    flat = h.reshape(d, -1)
    zero = np.float32(0)
    if flat.shape[1]:
        lo = np.minimum(flat.min(axis=1), zero)
        hi = np.maximum(flat.max(axis=1), zero)
    else:
        lo = hi = np.zeros(d, np.float32)
    scale = np.where(hi == lo, np.float32(1), (hi - lo) / np.float32(255)).astype(np.float32)
    zp = np.rint(np.clip(zero - lo / scale, 0, 255)).astype(np.float32)
    s3, z3 = scale.reshape(d, 1, 1), zp.reshape(d, 1, 1)
    # clamp(rint(h / s) + zp, 0, 255) - zp is clamp(rint(h / s), -zp, 255 - zp) on these
    # small integers (exact either way; NaN goes to -zp through fmax in both), one pass
    # fewer on a step's few hundred values; + 0 turns rint's -0 into the +0 that q - zp gives
    q = np.rint(h / s3)
    np.fmax(q, -z3, out=q)
    np.minimum(q, np.float32(255) - z3, out=q)
    q += zero
    q *= s3
    return q


@kernel("DynamicQuantizeLSTM", since=1, domain="com.microsoft", dtypes={0: ("float",)})
def dynamic_quantize_lstm(node: Any, xp: Any):
    op = node.op_type
    input_forget = bool(node.attr("input_forget", 0))

    def make_cell(W, R, B, P, acts, clip, H):
        f, g, h_act = acts
        cl = clipper(np, clip)
        bias = None if B is None else B[: 4 * H] + B[4 * H :]
        Wt, Rt = W.T, R.T
        pi, po, pf = (None, None, None) if P is None else (P[:H], P[H : 2 * H], P[2 * H :])

        def pre(X):
            xw = project(np, _fake_quant(X), Wt)
            return xw if bias is None else xw + bias

        def step(xw, states):
            h, c = states
            a = xw + np.matmul(_fake_quant(h), Rt)
            ai, ao, af, ac = a[..., :H], a[..., H : 2 * H], a[..., 2 * H : 3 * H], a[..., 3 * H :]
            if pi is not None:
                ai = ai + pi * c
                af = af + pf * c
            i = f(cl(ai))
            fg = 1 - i if input_forget else f(cl(af))
            c_new = fg * c + i * g(cl(ac))
            if po is not None:
                ao = ao + po * c_new
            o = f(cl(ao))
            return (o * h_act(c_new), c_new)

        return pre, step

    cell_run = recurrent(
        node, np, default_acts=("Sigmoid", "Tanh", "Tanh"), n_states=2, make_cell=make_cell
    )
    consts = constant_inputs(node, (1, 2, 8, 9, 10, 11))
    bias = node.const_input(3) if node.has_input(3) else None
    fixed = None
    fast = None
    if consts is not None:
        fixed = _float_weights(*consts, op)
        if bias is not None or not node.has_input(3):
            fast = lstm_runner(node, weights=(*fixed, bias), hidden_hook=_fake_quant_per_direction)
    num_dir, _ = parse_direction(node)
    compiled = tiles = None
    if recurrent_jit.usable(node, ("Sigmoid", "Tanh", "Tanh"), num_dir):
        known = consts is not None and (bias is not None or not node.has_input(3))
        compiled = _compiled_runner(node, (*consts, bias) if known else None)
        if jit_int8.tiles():
            tiles = _tiles_runner(node, (*consts, bias) if known else None)

    def run(
        X, W, R, B=None, lens=None, h0=None, c0=None, P=None, ws=None, wz=None, rs=None, rz=None
    ):
        full = lens is None or (lens.size and int(np.min(lens)) == X.shape[0])
        if tiles is not None and full and X.dtype == np.float32:
            out = tiles(X, W, R, B, h0, c0, P, ws, wz, rs, rz)
            if out is not None:
                return out
        if compiled is not None and full and X.dtype == np.float32:
            out = compiled(X, W, R, B, h0, c0, P, ws, wz, rs, rz)
            if out is not None:
                return out
        if fast is not None and full and X.dtype == np.float32:
            return fast(_fake_quant(X), None, None, None, lens, h0, c0, P)
        Wf, Rf = fixed if fixed is not None else _float_weights(W, R, ws, wz, rs, rz, op)
        return cell_run(X, Wf, Rf, B, lens, h0, c0, P)

    return run


#: Below this many multiply-adds (steps x batch x 4H x (H + input)) the two directions run
#: in one call on one thread: handing one to another thread cost about 40 us on the shared
#: 2-core machine, as much as a direction of tashkeel's 9 steps x 2 rows (18M).
PARALLEL_WORK = 1 << 25

#: Up to this many rows (steps x batch) the input projection runs in the compiled loop on
#: the 8-bit weights (a quarter of the bytes of the float32 copy BLAS reads); past it, BLAS.
LOOP_PROJECTION_ROWS = 64


def _shifted_int8(w, zp, num_dir):
    """8-bit weights [dirs, k, n] less their zero point, transposed to [dirs, n, k]: int8
    where every value fits, else int16."""
    shifted = np.asarray(w).astype(np.int16)
    if zp is not None:
        shifted -= np.asarray(zp).astype(np.int16).reshape(num_dir, 1, -1)
    small = shifted.size == 0 or (shifted.min() >= -128 and shifted.max() <= 127)
    return np.ascontiguousarray(np.swapaxes(shifted, 1, 2), np.int8 if small else np.int16)


def _compiled_runner(node, weights):
    """DynamicQuantizeLSTM through recurrent_loops.lstm_direction on the 8-bit weights
    (full-length sequences, float32)."""
    op = node.op_type
    num_dir, reverse = parse_direction(node)
    input_forget = bool(node.attr("input_forget", 0))
    clip_at = node.attr("clip", None)
    clip = np.float32(np.inf if clip_at is None else clip_at)
    loops = recurrent_jit.loops()

    def scales(s, n):
        return np.ascontiguousarray(
            np.broadcast_to(np.asarray(s, np.float32).reshape(num_dir, -1), (num_dir, n))
        )

    def prepare(W, R, ws, wz, rs, rz, B):
        Wf, _ = _float_weights(W, R, ws, wz, rs, rz, op)  # checks every shape
        H = R.shape[1]
        bias = None
        if B is not None:
            if B.shape != (num_dir, 8 * H):
                raise InvalidArgument(f"{op}: B has shape {list(B.shape)}, expected "
                                      f"{[num_dir, 8 * H]}")  # fmt: skip
            bias = (B[:, : 4 * H] + B[:, 4 * H :]).astype(np.float32)
        Wt = np.ascontiguousarray(np.swapaxes(Wf, 1, 2))  # the dequantized [dirs, input, 4H]
        Wq = _shifted_int8(W, wz, num_dir)
        Rq = _shifted_int8(R, rz, num_dir)
        return H, Wt, Wq, scales(ws, 4 * H), Rq, scales(rs, 4 * H), bias

    fixed = None if weights is None else prepare(*weights)

    def run(X, W, R, B, h0, c0, P, ws, wz, rs, rz):
        H, Wt, Wq, wsc, Rq, rsc, bias = (
            fixed if fixed is not None else prepare(W, R, ws, wz, rs, rz, B)
        )
        if P is None:
            peep = np.empty((num_dir, 0), np.float32)
        elif P.shape != (num_dir, 3 * H):
            raise InvalidArgument(f"{op}: P has shape {list(P.shape)}, expected "
                                  f"{[num_dir, 3 * H]}")  # fmt: skip
        else:
            peep = np.ascontiguousarray(P, dtype=np.float32)
        if X.ndim != 3 or X.shape[2] != Wt.shape[1]:
            raise InvalidArgument(
                f"{op}: X has shape {list(X.shape)}, expected [seq, batch, {Wt.shape[1]}]"
            )
        # X through uint8 once for the whole sequence, as onnxruntime does
        q, xs, xz = dynamic_uint8(X)
        rows = np.ascontiguousarray(q.reshape(-1, X.shape[2]), dtype=np.float32)
        if rows.shape[0] <= LOOP_PROJECTION_ROWS:
            rows -= np.float32(xz)  # the integers X's 8-bit values stand for
            scale = wsc * xs
            none = np.empty(0, np.float32)
            blas = None

            def project(d, rows, out):
                loops.project(Wq[d], rows, scale[d], none if bias is None else bias[d], out)

        else:
            rows = (rows - np.float32(xz)) * xs  # _fake_quant(X), the same operations
            blas, project = (Wt, bias), None

        def direction(d, xw, h, c, ys, lens):
            return loops.lstm_direction(
                xw, Rq[d], rsc[d], True, peep[d], clip, input_forget,
                lens, reverse[d], h, c, ys,
            )  # fmt: skip

        return recurrent_jit.run(
            op, X, Wt.shape[1], 4 * H, blas=blas, project=project, rows=rows, hidden=H,
            num_dir=num_dir, layout=0, lens=None, inits=[h0, c0], direction=direction,
        )  # fmt: skip

    return run


def _tiles_runner(node, weights):
    """DynamicQuantizeLSTM through recurrent_vnni's loops on the 8-bit tiles (full-length
    sequences, float32, 8-bit weights): W and R packed into panels once per session when
    constant, then one compiled call per run (two, one per direction, when the run has
    threads for them). The run gives None (the caller's next path runs) when X holds a NaN
    or infinity, a hidden state stops being finite, or the weights are not 8-bit."""
    op = node.op_type
    num_dir, reverse = parse_direction(node)
    input_forget = bool(node.attr("input_forget", 0))
    clip_at = node.attr("clip", None)
    clip = np.float32(np.inf if clip_at is None else clip_at)
    rev = np.array(reverse, dtype=np.bool_)

    def per_output(v, d):
        return None if v is None else np.asarray(v).reshape(num_dir, -1)[d].reshape(-1)

    def stacked(packs, attr):
        return np.ascontiguousarray(np.stack([getattr(p, attr) for p in packs]))

    def prepare(W, R, ws, wz, rs, rz, B):
        if not vnni_gemm.available(W.dtype, R.dtype):
            return None
        _float_weights(W, R, ws, wz, rs, rz, op)  # checks every shape
        H = R.shape[1]
        G = 4 * H
        width = -(-G // 64) * 64
        bias = np.full((num_dir, width), -0.0, np.float32)
        if B is not None:
            if B.shape != (num_dir, 8 * H):
                raise InvalidArgument(f"{op}: B has shape {list(B.shape)}, expected "
                                      f"{[num_dir, 8 * H]}")  # fmt: skip
            bias[:, :G] = B[:, :G] + B[:, G:]
        wsc = np.zeros((num_dir, width), np.float32)
        wsc[:, :G] = np.broadcast_to(np.asarray(ws, np.float32).reshape(num_dir, -1), (num_dir, G))
        rsc = np.ascontiguousarray(
            np.broadcast_to(np.asarray(rs, np.float32).reshape(num_dir, -1), (num_dir, G))
        )
        pw = [vnni_gemm.PackedB(W[d], per_output(wz, d), panels=True) for d in range(num_dir)]
        pr = [vnni_gemm.PackedB(R[d], per_output(rz, d), panels=True) for d in range(num_dir)]
        wargs = (stacked(pw, "y"), pw[0].nk4, stacked(pw, "zc"), stacked(pw, "cc"), wsc, bias)
        rargs = (stacked(pr, "y"), pr[0].nk4, stacked(pr, "zc"), stacked(pr, "cc"), rsc)
        isas = {p.isa for p in pw + pr}  # AVX2's sign pairs only where every pack takes them
        isa = isas.pop() if len(isas) == 1 else jit_int8.tiles()
        return H, pw[0].k, wargs, rargs, isa

    fixed = None if weights is None else prepare(*weights)
    loops = _vnni_module().loops(fixed[-1]) if fixed is not None else None
    no_peep = np.empty((num_dir, 0), np.float32)

    def run(X, W, R, B, h0, c0, P, ws, wz, rs, rz):
        prepared = fixed if fixed is not None else prepare(W, R, ws, wz, rs, rz, B)
        if prepared is None:
            return None
        H, n_in, wargs, rargs, isa = prepared
        peep = peepholes(op, P, no_peep, num_dir, H)
        if X.ndim != 3 or X.shape[2] != n_in:
            raise InvalidArgument(
                f"{op}: X has shape {list(X.shape)}, expected [seq, batch, {n_in}]"
            )
        T, batch = X.shape[0], X.shape[1]
        if X.size == 0:
            return None  # the driver's empty-sequence rules
        states = []
        for k, s in enumerate((h0, c0)):
            if s is None:
                states.append(np.zeros((num_dir, batch, H), np.float32))
            else:
                check_shape(op, ("initial_h", "initial_c")[k], s, (num_dir, batch, H))
                states.append(np.array(s, dtype=np.float32, order="C"))
        h, c = states
        Y = np.empty((T, num_dir, batch, H), np.float32)
        x = np.ascontiguousarray(X)
        vl = loops if loops is not None else _vnni_module().loops(isa)
        args = (*wargs, *rargs, peep, clip, input_forget, rev, h, c, Y)
        work = T * batch * 4 * H * (H + n_in)
        if num_dir == 1 or run_threads() == 1 or work < PARALLEL_WORK:
            done = [vl.lstm_node(x, *args, 0, num_dir)]
        else:  # a direction per thread; each quantizes X (a few microseconds)
            done = [1, 1]

            def part(d0: int, d1: int) -> None:
                done[d0] = vl.lstm_node(x, *args, d0, d1)

            parallel_rows(num_dir, work, part)
        return (Y, h, c) if min(done) == 1 else None

    return run


def _vnni_module():
    """The VNNI loops' module (imports numba through jit on first use)."""
    from . import recurrent_vnni as module

    return module


def _float_weights(W, R, ws, wz, rs, rz, op):
    """W and R back in float, in LSTM's [dirs, 4H, k] layout."""
    if ws is None or rs is None:
        raise InvalidArgument(f"{op}: W_scale and R_scale are required")
    W, R = np.asarray(W), np.asarray(R)
    if W.ndim != 3 or R.ndim != 3 or W.shape[2] != R.shape[2] or R.shape[2] != 4 * R.shape[1]:
        raise InvalidArgument(
            f"{op}: W must be [dirs, input, 4H] and R [dirs, H, 4H], got {W.shape}, {R.shape}"
        )
    # the 8-bit products are exact in float32 before their one scaling
    Wf = np.swapaxes(dequantize_per_column(W, ws, wz, op, "W"), 1, 2)
    Rf = np.swapaxes(dequantize_per_column(R, rs, rz, op, "R"), 1, 2)
    return Wf, Rf
