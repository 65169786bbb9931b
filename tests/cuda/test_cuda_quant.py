"""CUDA MatMulNBits and GatherBlockQuantized against the CPU provider's kernels.

Most cases call the builders directly (a hand-made NodeInfo, the CUDA
builder with the provider's CuPy namespace, the CPU builder with NumPy), so
a failure names the kernel and the shape without the session in between; a
few go through sessions with ``disable_fallback``; two run inside CUDA
stream capture. Tolerances are the parity kit's (float32 1e-5 + 1e-4|ref|,
float16 2.5e-3 + 1e-3|ref|) except where a case says why.
"""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import onnxep
from onnxep.errors import NotSupported
from onnxep.providers.node import NodeInfo, ValueInfo

MS = "com.microsoft"
U16 = 2.0**-11  # float16 unit roundoff


def device_cupy():
    import cupy

    return cupy


def device_xp():
    from onnxep.providers_cuda.xp import cuda_namespace

    return cuda_namespace()


def _vi(name, arr=None, *, dtype=None, shape=None, const=False):
    if arr is not None:
        return ValueInfo(
            name, "tensor", np.dtype(arr.dtype), tuple(arr.shape), arr if const else None
        )
    return ValueInfo(name, "tensor", None if dtype is None else np.dtype(dtype), shape)


def _assert_close(got, ref, atol, rtol, what, extra=0.0):
    """|got - ref| <= atol + rtol * |ref| + extra everywhere; the message names the worst."""
    got = np.asarray(got)
    ref = np.asarray(ref)
    assert got.shape == ref.shape, f"{what}: shape {got.shape} != {ref.shape}"
    assert got.dtype == ref.dtype, f"{what}: dtype {got.dtype} != {ref.dtype}"
    g64, r64 = got.astype(np.float64), ref.astype(np.float64)
    err = np.abs(g64 - r64)
    tol = atol + rtol * np.abs(r64) + extra
    bad = ~(err <= tol)
    if bad.any():
        i = np.unravel_index(
            np.argmax(np.where(bad, np.nan_to_num(err - tol, nan=np.inf), -1)), err.shape
        )
        raise AssertionError(
            f"{what}: {int(bad.sum())} of {bad.size} elements off; worst at {i}: "
            f"got {g64[i]!r}, want {r64[i]!r}, tolerance {np.broadcast_to(tol, err.shape)[i]:.3g}"
        )


TOL = {np.dtype(np.float32): (1e-5, 1e-4), np.dtype(np.float16): (2.5e-3, 1e-3)}


# ---------------------------------------------------------------- MatMulNBits


def nbits_consts(rng, k, n, bits, block, zp_kind, dtype):
    """B, scales and zero points as onnxruntime's quantizer lays them out (see the CPU tests)."""
    kb = -(-k // block)
    blob = block * bits // 8
    b = rng.integers(0, 256, (n, kb, blob), dtype=np.uint8)
    scales = (rng.random((n, kb)) * 0.1 + 0.01).astype(dtype)
    zp = None
    if zp_kind == "packed":
        zp = rng.integers(0, 256, (n, -(-kb * bits // 8)), dtype=np.uint8)
    elif zp_kind == "float":
        zp = (rng.random((n, kb)) * (1 << bits)).astype(dtype)
    return b, scales, zp


def nbits_node(
    k,
    n,
    bits,
    block,
    a_dtype,
    b,
    scales,
    zp,
    *,
    g_idx=None,
    bias=None,
    bias_const=True,
    accuracy_level=0,
    const=True,
):
    ins = [
        _vi("A", dtype=a_dtype, shape=(None, k)),
        _vi("B", b, const=const),
        _vi("scales", scales, const=const),
        None if zp is None else _vi("zero_points", zp, const=const),
        None if g_idx is None else _vi("g_idx", g_idx, const=True),
        None if bias is None else _vi("bias", bias, const=bias_const),
    ]
    while ins and ins[-1] is None:
        ins.pop()
    attrs = {"K": k, "N": n, "bits": bits, "block_size": block, "accuracy_level": accuracy_level}
    return NodeInfo(
        "MatMulNBits",
        MS,
        "mm",
        1,
        attrs,
        tuple(ins),
        (_vi("Y", dtype=a_dtype),),
        opsets={"": 21, MS: 1},
    )


def builders():
    from onnxep.providers.ops.op_matmul_nbits import matmul_nbits as cpu
    from onnxep.providers_cuda.ops.op_matmul_nbits import matmul_nbits as cuda

    return cpu, cuda


def _nbits_extra(a, b, scales, zp, k, n, bits, block, y_nobias, fp16_weights):
    """Tolerance beyond the parity kit's that comes from summing K products in another order.

    Both sides accumulate in float32, in different orders: each side's error is
    a sum of roundings of partial sums, with a standard deviation of about
    2^-24 * sqrt(K) * r, r = sqrt(sum_k (a_k w_k)^2); 4 times that bounds the
    difference (8-bit weights make r large, and a near-cancelling output can
    then miss a fixed 1e-5). The float16 prefill path also rounds its
    dequantised weights to float16 (relative error <= u = 2^-11 each, so a
    further error with standard deviation <= u / sqrt(3) * r: 4u * r is about 7
    sigma) and its cuBLAS output once more before the bias is added (u * |A @ W.T|).
    """
    from onnxep.providers.ops import contrib as C

    w = C.dequantize_nbits(
        b, scales, zp, None, n=n, k=k, bits=bits, block_size=block, dtype=np.float32, xp=np
    ).astype(np.float64)
    a64 = a.reshape(-1, k).astype(np.float64)
    r = np.sqrt((a64**2) @ (w**2).T)
    extra = 4 * 2.0**-24 * np.sqrt(k) * r
    if fp16_weights:
        extra += 4 * U16 * r + U16 * np.abs(y_nobias.reshape(-1, n))
    return extra.reshape(y_nobias.shape)


NBITS_CASES = [
    # (bits, block_size, zero points, K, N): K past whole blocks and chunks, N odd
    (4, 32, "none", 96, 37),
    (4, 32, "packed", 200, 37),
    (4, 16, "packed", 72, 19),  # two blocks per 16-byte chunk; the last one past K
    (4, 64, "float", 130, 41),
    (4, 128, "packed", 300, 23),
    (4, 256, "none", 520, 9),
    (4, 32, "packed", 1100, 50),  # 8 rows of A no longer fit shared memory at once
    (8, 16, "packed", 40, 29),
    (8, 32, "none", 100, 33),
    (8, 64, "float", 160, 17),
    (8, 128, "packed", 256, 45),
    (2, 16, "packed", 80, 13),
    (2, 32, "none", 100, 11),
    (2, 128, "float", 130, 7),
]
# GEMV with 1, 2, 4 and 8 rows per launch; 17: a GEMV per 8 rows or dequantise + cuBLAS,
# by op_matmul_nbits.gemv_rows; 40: dequantise + cuBLAS
M_ROWS = (1, 2, 3, 5, 8, 17, 40)


def check_nbits(
    bits, block, zp_kind, k, n, dtype, *, accuracy_level=0, bias_kind=None, rows=M_ROWS, seed=0
):
    cp = device_cupy()
    cpu, cuda = builders()
    rng = np.random.default_rng(seed + 7 * k + n + bits)
    b, scales, zp = nbits_consts(rng, k, n, bits, block, zp_kind, dtype)
    bias = None if bias_kind is None else rng.standard_normal(n).astype(dtype)
    node = nbits_node(
        k,
        n,
        bits,
        block,
        dtype,
        b,
        scales,
        zp,
        bias=bias,
        bias_const=bias_kind == "const",
        accuracy_level=accuracy_level,
    )
    ref_fn = cpu(node, np)
    fn = cuda(node, device_xp())
    dev = [None if v is None else cp.asarray(v) for v in (b, scales, zp, None, bias)]
    atol, rtol = TOL[np.dtype(dtype)]
    for m in rows:
        a = rng.standard_normal((m, k)).astype(dtype)
        (want,) = ref_fn(a, b, scales, zp, None, bias)
        (got,) = fn(cp.asarray(a), *dev)
        fp16_weights = m > 8 and np.dtype(dtype) == np.float16 and accuracy_level != 4
        y0 = want.astype(np.float32) - (0 if bias is None else bias.astype(np.float32))
        extra = _nbits_extra(a, b, scales, zp, k, n, bits, block, y0, fp16_weights)
        what = (
            f"MatMulNBits bits={bits} block={block} zp={zp_kind} K={k} N={n} {np.dtype(dtype)} "
            f"M={m} accuracy_level={accuracy_level} bias={bias_kind}"
        )
        _assert_close(cp.asnumpy(got), want, atol, rtol, what, extra)


# float16 on the 4-bit cases and one of each other width: each case compiles its own kernels.
NBITS_FP16 = [c for c in NBITS_CASES if c[0] == 4] + [NBITS_CASES[8], NBITS_CASES[11]]


@pytest.mark.parametrize(
    "case,dtype",
    [(c, np.float32) for c in NBITS_CASES] + [(c, np.float16) for c in NBITS_FP16],
    ids=lambda v: "-".join(map(str, v)) if isinstance(v, tuple) else np.dtype(v).name,
)
def test_matmul_nbits_matches_cpu_builder(case, dtype):
    check_nbits(*case, dtype)


@pytest.mark.parametrize("dtype", [np.float32, np.float16], ids=["fp32", "fp16"])
@pytest.mark.parametrize(
    "case",
    [(4, 32, "packed", 200, 37), (8, 64, "none", 160, 17), (4, 16, "float", 72, 19)],
    ids=str,
)
def test_matmul_nbits_accuracy_level_4(case, dtype):
    """The int8 rounding of A is the CPU's, so the usual tolerances hold."""
    check_nbits(*case, dtype, accuracy_level=4)


@pytest.mark.parametrize("dtype", [np.float32, np.float16], ids=["fp32", "fp16"])
@pytest.mark.parametrize("bias_kind", ["const", "input"])
def test_matmul_nbits_bias(bias_kind, dtype):
    check_nbits(4, 32, "packed", 96, 37, dtype, bias_kind=bias_kind)


def test_matmul_nbits_long_k_and_wide_n():
    """K beyond one shared-memory segment for one row; N wide enough for 4 columns per task."""
    check_nbits(4, 128, "none", 8960, 24, np.float16, rows=(1, 8))
    check_nbits(4, 32, "packed", 896, 20000, np.float16, rows=(1, 3, 17))


@pytest.mark.parametrize("dtype", [np.float32, np.float16], ids=["fp32", "fp16"])
@pytest.mark.parametrize("accuracy_level", [0, 4])
@pytest.mark.parametrize("bias_kind", [None, "const"])
def test_matmul_nbits_gemm_in_tiles(bias_kind, accuracy_level, dtype, monkeypatch):
    """A prefill's weight dequantised a few rows at a time (N = 37 in tiles of 8), each
    tile's GEMM written into its columns of the output, the bias added once."""
    from onnxep.providers_cuda.ops import op_matmul_nbits

    k = 200
    monkeypatch.setattr(op_matmul_nbits, "GEMM_TILE_BYTES", 8 * k * 4)
    check_nbits(4, 32, "packed", k, 37, dtype, accuracy_level=accuracy_level,
                 bias_kind=bias_kind, rows=(40, 300))  # fmt: skip


def test_matmul_nbits_lead_dims_and_empty_rows():
    cp = device_cupy()
    cpu, cuda = builders()
    rng = np.random.default_rng(1)
    k, n = 64, 10
    b, scales, zp = nbits_consts(rng, k, n, 4, 32, "packed", np.float32)
    node = nbits_node(k, n, 4, 32, np.float32, b, scales, zp)
    fn, ref = cuda(node, device_xp()), cpu(node, np)
    for shape in [(2, 3, k), (k,), (0, k), (2, 0, k)]:
        a = rng.standard_normal(shape).astype(np.float32)
        (got,) = fn(cp.asarray(a), cp.asarray(b), cp.asarray(scales), cp.asarray(zp))
        (want,) = ref(a, b, scales, zp)
        extra = _nbits_extra(a, b, scales, zp, k, n, 4, 32, want, False)
        _assert_close(cp.asnumpy(got), want, 1e-5, 1e-4, f"A of shape {shape}", extra)


def test_matmul_nbits_default_g_idx_is_accepted_and_reordering_declined():
    cp = device_cupy()
    cpu, cuda = builders()
    rng = np.random.default_rng(2)
    k, n, block = 96, 12, 32
    b, scales, zp = nbits_consts(rng, k, n, 4, block, "packed", np.float32)
    g_idx = (np.arange(k) // block).astype(np.int32)
    node = nbits_node(k, n, 4, block, np.float32, b, scales, zp, g_idx=g_idx)
    a = rng.standard_normal((3, k)).astype(np.float32)
    (got,) = cuda(node, device_xp())(cp.asarray(a))
    (want,) = cpu(node, np)(a, b, scales, zp, g_idx)
    extra = _nbits_extra(a, b, scales, zp, k, n, 4, block, want, False)
    _assert_close(cp.asnumpy(got), want, 1e-5, 1e-4, "default g_idx", extra)
    shuffled = rng.permutation(g_idx).astype(np.int32)
    node = nbits_node(k, n, 4, block, np.float32, b, scales, zp, g_idx=shuffled)
    with pytest.raises(NotSupported, match="g_idx that reorders"):
        cuda(node, device_xp())


def test_matmul_nbits_declines_what_it_cannot_repack():
    _, cuda = builders()
    rng = np.random.default_rng(3)
    b, scales, zp = nbits_consts(rng, 64, 8, 4, 32, "packed", np.float32)
    node = nbits_node(64, 8, 4, 32, np.float32, b, scales, zp, const=False)
    with pytest.raises(NotSupported, match="B .input 1. must be a constant initializer"):
        cuda(node, device_xp())
    node = nbits_node(64, 8, 4, 32, np.float32, b[:, :1], scales, zp)
    with pytest.raises(NotSupported, match="B must hold"):
        cuda(node, device_xp())
    for attrs, why in [
        ({"bits": 3}, "bits=3"),
        ({"block_size": 24}, "block_size=24"),
        ({"weight_prepacked": 1}, "weight_prepacked"),
    ]:
        node = nbits_node(64, 8, 4, 32, np.float32, b, scales, zp)
        node.attrs = {**node.attrs, **attrs}
        with pytest.raises(NotSupported, match=why):
            cuda(node, device_xp())


def test_matmul_nbits_omitted_projection():
    cp = device_cupy()
    _, cuda = builders()
    n = 6
    bias = np.arange(n, dtype=np.float32)
    node = nbits_node(
        32,
        n,
        4,
        32,
        np.float32,
        np.zeros((n, 0, 16), np.uint8),
        np.zeros((0,), np.float32),
        None,
        bias=bias,
    )
    a = cp.ones((2, 32), dtype=np.float32)
    (got,) = cuda(node, device_xp())(a, None, None, None, None, cp.asarray(bias))
    np.testing.assert_array_equal(cp.asnumpy(got), np.broadcast_to(bias, (2, n)))


def test_matmul_nbits_inside_stream_capture():
    """Both paths record into a CUDA graph and replay with the eager results."""
    cp = device_cupy()
    cpu, cuda = builders()
    rng = np.random.default_rng(4)
    k, n = 200, 37
    b, scales, zp = nbits_consts(rng, k, n, 4, 32, "packed", np.float16)
    node = nbits_node(k, n, 4, 32, np.float16, b, scales, zp)
    fn, ref = cuda(node, device_xp()), cpu(node, np)
    stream = cp.cuda.Stream(non_blocking=True)
    for m in (1, 17):
        a = rng.standard_normal((m, k)).astype(np.float16)
        a_dev = cp.asarray(a)
        with stream:
            fn(a_dev)  # warm-up: cuBLAS's handle and workspace are made outside capture
            stream.begin_capture()
            (got,) = fn(a_dev)
            graph = stream.end_capture()
            graph.launch()
        stream.synchronize()
        (want,) = ref(a, b, scales, zp)
        extra = _nbits_extra(a, b, scales, zp, k, n, 4, 32, want.astype(np.float32), m > 8)
        _assert_close(cp.asnumpy(got), want, 2.5e-3, 1e-3, f"captured M={m}", extra)


# ------------------------------------------------------------ GatherBlockQuantized


def _gbq_node(data, scales, zp, bits, block, gaxis, qaxis, idx_dtype, idx_rank, const=True):
    ins = (
        _vi("data", data, const=const),
        _vi("indices", dtype=idx_dtype, shape=(None,) * idx_rank),
        _vi("scales", scales, const=const),
    ) + (() if zp is None else (_vi("zero_points", zp, const=const),))
    attrs = {"bits": bits, "block_size": block, "gather_axis": gaxis, "quantize_axis": qaxis}
    return NodeInfo(
        "GatherBlockQuantized",
        MS,
        "gbq",
        1,
        attrs,
        ins,
        (_vi("out", dtype=scales.dtype),),
        opsets={"": 21, MS: 1},
    )


def _gbq_builders():
    from onnxep.providers.ops.op_gather_block_quantized import gather_block_quantized as cpu
    from onnxep.providers_cuda.ops.op_gather_block_quantized import (
        gather_block_quantized as cuda,
    )

    return cpu, cuda


def _gbq_table(rng, shape, bits, block, qaxis, with_zp, sdtype):
    """uint8 data of logical ``shape`` (packed along the last axis), scales, zero points."""
    per = 8 // bits
    phys = list(shape)
    phys[-1] = -(-shape[-1] // per)
    data = rng.integers(0, 256, phys, dtype=np.uint8)
    sshape = list(shape)
    sshape[-1] = phys[-1] * per
    sshape[qaxis] = -(-sshape[qaxis] // block)
    scales = rng.uniform(0.01, 0.2, sshape).astype(sdtype)
    zp = None
    if with_zp:
        zshape = list(sshape)
        zshape[-1] = -(-sshape[-1] // per)
        zp = rng.integers(0, 256, zshape, dtype=np.uint8)
    return data, scales, zp


GBQ_CASES = [
    # (logical data shape, bits, block, gather_axis, quantize_axis)
    ((9, 96), 4, 32, 0, 1),
    ((9, 100), 4, 16, 0, -1),  # the last block runs past the row
    ((7, 128), 4, 128, 0, 1),
    ((5, 64), 8, 64, 0, 1),
    ((6, 48), 2, 16, 0, 1),
    ((4, 6, 40), 8, 16, 1, 2),
    ((40, 3, 5), 8, 16, 2, 0),  # quantized along the first axis, gathered along the last
]


@pytest.mark.parametrize("sdtype", [np.float32, np.float16], ids=["fp32", "fp16"])
@pytest.mark.parametrize("idx_dtype", [np.int64, np.int32], ids=["i64", "i32"])
@pytest.mark.parametrize("with_zp", [False, True], ids=["nozp", "zp"])
@pytest.mark.parametrize("case", GBQ_CASES, ids=str)
def test_gather_block_quantized_matches_cpu_builder(case, with_zp, idx_dtype, sdtype):
    cp = device_cupy()
    cpu, cuda = _gbq_builders()
    shape, bits, block, g, q = case
    rng = np.random.default_rng(len(shape) * 31 + bits + block)
    data, scales, zp = _gbq_table(rng, shape, bits, block, q, with_zp, sdtype)
    dg = data.shape[g]
    idx = rng.integers(-dg, dg, (2, 3)).astype(idx_dtype)  # negatives count from the end
    for const in (True, False):
        node = _gbq_node(data, scales, zp, bits, block, g, q, idx_dtype, 2, const=const)
        (want,) = cpu(node, np)(data, idx, scales, zp)
        dev = [cp.asarray(v) for v in (data, idx, scales)] + (
            [] if zp is None else [cp.asarray(zp)]
        )
        (got,) = cuda(node, device_xp())(*dev)
        # Both compute (q - zp) * scale once in float32: equal bit for bit.
        _assert_close(cp.asnumpy(got), want, 0, 0, f"GatherBlockQuantized {case} const={const}")


def test_gather_block_quantized_out_of_range_indices_give_zeros():
    """The schema's rule (and the CPU kernel's): an index outside [-s, s-1] gives a zero slice."""
    cp = device_cupy()
    cpu, cuda = _gbq_builders()
    rng = np.random.default_rng(5)
    data, scales, zp = _gbq_table(rng, (6, 64), 4, 32, 1, True, np.float16)
    node = _gbq_node(data, scales, zp, 4, 32, 0, 1, np.int64, 1)
    idx = np.array([2, 6, -1, -7, 5, 2**40], np.int64)
    (got,) = cuda(node, device_xp())(*(cp.asarray(v) for v in (data, idx, scales, zp)))
    got = cp.asnumpy(got)
    (want,) = cpu(node, np)(data, idx, scales, zp)
    _assert_close(got, want, 0, 0, "out-of-range indices")
    assert not got[[1, 3, 5]].any() and got[[0, 2, 4]].any()


def test_gather_block_quantized_declines_packing_across_the_quantized_axis():
    _, cuda = _gbq_builders()
    rng = np.random.default_rng(6)
    data, scales, _ = _gbq_table(rng, (64, 6), 4, 32, 0, False, np.float32)
    node = _gbq_node(data, scales, None, 4, 32, 1, 0, np.int64, 1)
    with pytest.raises(NotSupported, match="quantize_axis must be the last axis"):
        cuda(node, device_xp())


# ---------------------------------------------------------------- through sessions


def _session_model(op, inputs, initializers, attrs, out_dtype):
    elem = {
        np.dtype(np.float32): TensorProto.FLOAT,
        np.dtype(np.float16): TensorProto.FLOAT16,
        np.dtype(np.int64): TensorProto.INT64,
    }
    node = helper.make_node(op, list(inputs) + list(initializers), ["Y"], domain=MS, **attrs)
    graph = helper.make_graph(
        [node],
        "g",
        [
            helper.make_tensor_value_info(n, elem[np.dtype(a.dtype)], a.shape)
            for n, a in inputs.items()
        ],
        [helper.make_tensor_value_info("Y", elem[np.dtype(out_dtype)], None)],
        [numpy_helper.from_array(a, n) for n, a in initializers.items()],
    )
    return helper.make_model(
        graph,
        opset_imports=[helper.make_opsetid("", 21), helper.make_opsetid(MS, 1)],
        ir_version=10,
    )


def _both(model, feeds):
    cuda = onnxep.InferenceSession(
        model, providers=["cuda"], sess_options=onnxep.SessionOptions(disable_fallback=True)
    )
    cpu = onnxep.InferenceSession(model, providers=["cpu"])
    return cuda.run(None, feeds)[0], cpu.run(None, feeds)[0]


@pytest.mark.parametrize("dtype", [np.float32, np.float16], ids=["fp32", "fp16"])
@pytest.mark.parametrize("shape", [(1, 1, 96), (1, 17, 96)], ids=["decode", "prefill"])
def test_matmul_nbits_session(shape, dtype):
    rng = np.random.default_rng(7)
    k, n = 96, 37
    b, scales, zp = nbits_consts(rng, k, n, 4, 32, "packed", dtype)
    bias = rng.standard_normal(n).astype(dtype)
    inits = {"B": b, "scales": scales, "zero_points": zp}
    node_inputs = {"A": rng.standard_normal(shape).astype(dtype)}
    model = _session_model(
        "MatMulNBits", node_inputs, inits, {"K": k, "N": n, "bits": 4, "block_size": 32}, dtype
    )
    # bias (input 5) after an omitted g_idx
    model.graph.node[0].input.extend(["", "bias"])
    model.graph.initializer.append(numpy_helper.from_array(bias, "bias"))
    got, want = _both(model, node_inputs)
    atol, rtol = TOL[np.dtype(dtype)]
    fp16_weights = shape[1] > 8 and np.dtype(dtype) == np.float16
    y0 = want.astype(np.float32) - bias.astype(np.float32)
    extra = _nbits_extra(node_inputs["A"], b, scales, zp, k, n, 4, 32, y0, fp16_weights)
    _assert_close(got, want, atol, rtol, f"session MatMulNBits {shape} {np.dtype(dtype)}", extra)


def test_gather_block_quantized_session():
    rng = np.random.default_rng(8)
    data, scales, zp = _gbq_table(rng, (50, 64), 4, 32, 1, True, np.float16)
    ids = {"ids": rng.integers(0, 50, (1, 7)).astype(np.int64)}
    model = _session_model(
        "GatherBlockQuantized",
        ids,
        {"data": data, "scales": scales, "zero_points": zp},
        {"bits": 4, "block_size": 32, "gather_axis": 0, "quantize_axis": 1},
        np.float16,
    )
    model.graph.node[0].input[:] = ["data", "ids", "scales", "zero_points"]
    got, want = _both(model, ids)
    _assert_close(got, want, 0, 0, "session GatherBlockQuantized")


# ------------------------------------------------------------ MatMulNBits: split K


@pytest.fixture
def split_k(monkeypatch):
    """Every ``nbits_cuda`` GEMV splits K three ways, whatever the device's size (the nodes
    the tensor-core GEMV would take run this one too)."""
    from onnxep.providers_cuda.ops import nbits_cuda as K_
    from onnxep.providers_cuda.ops import op_matmul_nbits

    monkeypatch.setattr(op_matmul_nbits, "MMA_GEMV", False)
    real = K_.gemv_geometry

    def geometry(n, chunks, bits, mt, sms, force=None, splits=None):
        return real(n, chunks, bits, mt, sms, force, 3)

    monkeypatch.setattr(K_, "gemv_geometry", geometry)


@pytest.fixture
def nbits_launches(monkeypatch):
    """The MatMulNBits kernels launched in the test, by name (without template arguments)."""
    import types

    from onnxep.providers_cuda.ops import nbits_cuda as K_

    seen: list[str] = []
    real = K_.module

    def module(exprs):
        mod = real(exprs)

        def get_function(name):
            fn = mod.get_function(name)

            def launch(*args, **kw):
                seen.append(name.split("<")[0])
                return fn(*args, **kw)

            return launch

        return types.SimpleNamespace(get_function=get_function)

    monkeypatch.setattr(K_, "module", module)
    return seen


@pytest.mark.parametrize("dtype", [np.float32, np.float16], ids=["fp32", "fp16"])
@pytest.mark.parametrize(
    "case",
    [(4, 32, "packed", 200, 37), (4, 16, "packed", 72, 19), (8, 64, "float", 160, 17),
     (2, 32, "none", 100, 11), (4, 128, "none", 8960, 24)],
    ids=str,
)  # fmt: skip
def test_matmul_nbits_split_k_matches_cpu_builder(case, dtype, split_k, nbits_launches):
    check_nbits(*case, dtype, rows=(1, 3, 8))
    check_nbits(4, 32, "packed", 96, 37, dtype, bias_kind="const", rows=(2,))
    # The last split of each block's tasks merges in the same launch: one per product.
    assert nbits_launches == ["nbits_gemv"] * 4


@pytest.mark.parametrize(("k", "n"), [(4864, 896), (8960, 1536), (896, 4864)])
def test_matmul_nbits_decode_shapes_repeat_bit_for_bit(k, n):
    """The down projections split K on a large GPU; results must not vary run to run."""
    cp = device_cupy()
    rng = np.random.default_rng(9)
    b, scales, zp = nbits_consts(rng, k, n, 4, 32, "packed", np.float16)
    node = nbits_node(k, n, 4, 32, np.float16, b, scales, zp)
    cpu, cuda = builders()
    fn = cuda(node, device_xp())
    a = rng.standard_normal((1, k)).astype(np.float16)
    dev = [cp.asarray(v) for v in (b, scales, zp)]
    (got,) = fn(cp.asarray(a), *dev)
    (again,) = fn(cp.asarray(a), *dev)
    assert cp.array_equal(got.view(cp.uint16), again.view(cp.uint16))
    (want,) = cpu(node, np)(a, b, scales, zp)
    extra = _nbits_extra(a, b, scales, zp, k, n, 4, 32, want.astype(np.float32), False)
    _assert_close(cp.asnumpy(got), want, 2.5e-3, 1e-3, f"K={k} N={n}", extra)


def test_matmul_nbits_split_k_inside_stream_capture(split_k):
    cp = device_cupy()
    cpu, cuda = builders()
    rng = np.random.default_rng(10)
    k, n = 600, 45
    b, scales, zp = nbits_consts(rng, k, n, 4, 32, "packed", np.float16)
    bias = rng.standard_normal(n).astype(np.float16)
    node = nbits_node(k, n, 4, 32, np.float16, b, scales, zp, bias=bias)
    fn = cuda(node, device_xp())
    a = cp.asarray(rng.standard_normal((3, k)).astype(np.float16))
    stream = cp.cuda.Stream(non_blocking=True)
    with stream:
        (eager,) = fn(a)
        stream.begin_capture()
        (got,) = fn(a)
        graph = stream.end_capture()
        for _ in range(3):  # each replay finds the split tickets the last one put back to zero
            got.fill(0)
            graph.launch()
            stream.synchronize()
            assert cp.array_equal(got.view(cp.uint16), eager.view(cp.uint16))
