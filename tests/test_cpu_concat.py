"""The CPU Concat (``providers_cpu/ops/op_concat.py``, ``block_copy.py``): against
np.concatenate and onnxruntime over axes (negative ones too), dtypes, odd and empty shapes,
batches and views; the blocks at glibc's slow copy distance copied bit for bit by the
other route; mixed dtypes and bad shapes handled as the generic kernel handles them."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from conftest import make_model, tensor
from onnx import TensorProto, helper

import onnxep
from onnxep.providers_cpu.ops import block_copy, op_concat

ELEM = {
    np.float32: TensorProto.FLOAT,
    np.float64: TensorProto.DOUBLE,
    np.float16: TensorProto.FLOAT16,
    np.int64: TensorProto.INT64,
    np.int32: TensorProto.INT32,
    np.uint8: TensorProto.UINT8,
    np.bool_: TensorProto.BOOL,
}


def _model(n: int, axis: int, dtype=np.float32, opset: int = 13) -> bytes:
    names = [f"x{i}" for i in range(n)]
    return make_model(
        [helper.make_node("Concat", names, ["y"], axis=axis)],
        [tensor(nm, None, ELEM[dtype]) for nm in names],
        [tensor("y", None, ELEM[dtype])],
        opset=opset,
    ).SerializeToString()


def _values(shape, dtype, rng):
    if dtype is np.bool_:
        return rng.random(shape) < 0.5
    if np.issubdtype(dtype, np.integer):
        return rng.integers(0, 100, shape).astype(dtype)
    return rng.standard_normal(shape).astype(dtype)


# (input shapes, axis): channel joins of a batch of one (the kernel's runs), odd sizes,
# small outputs (the generic kernel), outer axes past one, empty blocks and empty outputs
CASES = [
    ([(1, 16, 40, 40)] * 3, 1),
    ([(1, 16, 40, 40)] * 3, -3),
    ([(1, 128, 10, 10), (1, 64, 10, 10)], 1),
    ([(1, 7, 33, 31), (1, 5, 33, 31), (1, 1, 33, 31)], 1),
    ([(1, 3, 17, 19), (1, 3, 17, 23)], -1),
    ([(1, 1, 50, 41), (1, 1, 9, 41)], 2),
    ([(1, 2100, 4), (1, 2100, 4)], -1),
    ([(4100,), (3,)], 0),
    ([(2, 3), (2, 5)], 1),
    ([(2, 16, 20, 20), (2, 8, 20, 20)], 1),
    ([(3, 1024), (1, 1024)], 0),
    ([(1, 0, 40, 40), (1, 16, 40, 40), (1, 0, 40, 40)], 1),
    ([(1, 16, 40, 40), (1, 0, 40, 40)], 1),
    ([(0, 4), (0, 5)], -1),
    ([(1, 64, 20, 20)], 1),
]


@pytest.mark.parametrize("dtype", [np.float32, np.int64, np.uint8, np.bool_, np.float16])
@pytest.mark.parametrize(("shapes", "axis"), CASES)
def test_against_numpy_and_onnxruntime(shapes, axis, dtype):
    rng = np.random.default_rng(0)
    xs = [_values(s, dtype, rng) for s in shapes]
    model = _model(len(xs), axis, dtype)
    feeds = {f"x{i}": x for i, x in enumerate(xs)}
    sess = onnxep.InferenceSession(model, providers=["cpu"])
    want = np.concatenate(xs, axis=axis)
    for _ in range(2):
        got = sess.run(None, feeds)[0]
        assert got.shape == want.shape and got.dtype == want.dtype
        np.testing.assert_array_equal(got, want)
        assert got.flags.c_contiguous and got.flags.writeable
    peer = ort.InferenceSession(model, providers=["CPUExecutionProvider"])
    np.testing.assert_array_equal(got, peer.run(None, feeds)[0])


def test_opset_1_default_axis_and_views():
    """Concat-1's default axis (1); non-contiguous inputs (transposed views) are copied
    by NumPy's strided loop, the same values."""
    rng = np.random.default_rng(1)
    a = rng.standard_normal((1, 40, 40, 16)).astype(np.float32).transpose(0, 3, 1, 2)
    b = rng.standard_normal((1, 8, 40, 40)).astype(np.float32)
    run = op_concat.concat(_Node(None, 1), np)
    (got,) = run(a, b)
    np.testing.assert_array_equal(got, np.concatenate([a, b], axis=1))
    (got,) = op_concat.concat(_Node(-3, 13), np)(b, a, b)
    np.testing.assert_array_equal(got, np.concatenate([b, a, b], axis=1))


class _Node:
    """A Concat node as the kernel's builder reads it."""

    op_type = "Concat"
    name = "concat"

    def __init__(self, axis, opset):
        self.axis, self.opset = axis, opset

    def attr(self, name, default=None):
        assert name == "axis"
        return default if self.axis is None else self.axis


def _placed(shape, dtype, page_offset: int, pool: list) -> np.ndarray:
    """An array of ``shape`` whose data starts ``page_offset`` bytes into a 4 KB page
    (its buffer kept alive in ``pool``)."""
    nbytes = int(np.prod(shape)) * np.dtype(dtype).itemsize
    raw = np.empty(nbytes + 8192, np.uint8)
    pool.append(raw)
    skip = (page_offset - raw.ctypes.data) % 4096
    return raw[skip : skip + nbytes].view(dtype).reshape(shape)


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.float16, np.int64, np.uint8])
@pytest.mark.parametrize("distance", [16, 48, 1, 63])
def test_a_block_at_the_slow_distance_takes_the_other_copy_with_the_same_bits(
    dtype, distance, monkeypatch
):
    """The output placed so that each block lands ``distance`` bytes after its source
    modulo 4096: those blocks go through ``copy_run`` (no memmove), NaN payloads, -0 and
    infinities kept; the others through NumPy's assignment."""
    rng = np.random.default_rng(2)
    pool: list = []
    shapes = [(1, 16, 16, 16), (1, 8, 16, 16), (1, 1, 16, 16)]  # 16 KB, 8 KB, 1 KB (float32)
    xs = []
    for s in shapes:
        x = _placed(s, dtype, 0, pool)
        x[...] = _values(s, dtype, rng)
        xs.append(x)
    if np.issubdtype(dtype, np.floating):
        bits = xs[0].reshape(-1).view(f"u{xs[0].itemsize}")
        bits[0] = np.iinfo(bits.dtype).max  # a NaN with a payload
        xs[0].reshape(-1)[4:7] = [-0.0, np.inf, -np.inf]
    size = sum(x.nbytes for x in xs)
    out_at = [None]

    def empty(shape, dt):
        # block 0 starts at the output's start: distance ``distance`` from its source
        out_at[0] = _placed(shape, dt, distance, pool)
        return out_at[0]

    copied = []
    real = op_concat.copy_run
    monkeypatch.setattr(op_concat, "_empty", empty)
    monkeypatch.setattr(
        op_concat, "copy_run", lambda dst, src: (copied.append(src.shape), real(dst, src))
    )
    (got,) = op_concat.concat(_Node(1, 13), np)(*xs)
    assert got is out_at[0] and got.nbytes == size
    want = np.concatenate(xs, axis=1)
    np.testing.assert_array_equal(got.view(f"u{got.itemsize}"), want.view(f"u{got.itemsize}"))
    # which blocks were at the slow distance: those of 4 KB to 1 MB whose own distance is it
    off, slow = 0, []
    for x in xs:
        if block_copy.REP_MIN <= x.nbytes < block_copy.REP_MAX and block_copy.slow_distance(
            got.ctypes.data + off, x.ctypes.data
        ):
            slow.append(x.shape)
        off += x.nbytes
    assert copied == slow and shapes[0] in copied


def test_away_from_the_slow_distance_numpy_copies_every_block(monkeypatch):
    pool: list = []
    xs = [_placed((1, 16, 16, 16), np.float32, 0, pool) for _ in range(2)]
    for i, x in enumerate(xs):
        x[...] = i
    monkeypatch.setattr(op_concat, "_empty", lambda s, d: _placed(s, d, 64, pool))
    monkeypatch.setattr(op_concat, "copy_run", lambda dst, src: pytest.fail("not slow"))
    (got,) = op_concat.concat(_Node(1, 13), np)(*xs)
    np.testing.assert_array_equal(got, np.concatenate(xs, axis=1))


def test_slow_distance_rule():
    assert [block_copy.slow_distance(4096 * 3 + d, 4096) for d in (0, 1, 16, 63, 64, 4095)] == [
        False, True, True, True, False, False,
    ]  # fmt: skip
    # the destination before the source: fast
    assert not block_copy.slow_distance(4096 - 16, 4096)


def test_copy_run_keeps_bits_of_every_width():
    rng = np.random.default_rng(3)
    for dt in (np.uint8, np.float16, np.float32, np.float64, np.complex64, np.complex128):
        src = rng.integers(0, 255, 4096 * 3, dtype=np.uint8).view(dt).reshape(2, -1)
        dst = np.empty_like(src)
        block_copy.copy_run(dst, src)
        assert dst.tobytes() == src.tobytes()


def test_mixed_dtypes_and_bad_shapes_as_the_generic_kernel():
    """The kernel hands anything it does not copy itself to the generic kernel: its
    promotion of mixed dtypes (the session refuses such a model before it runs) and
    NumPy's error for mismatched shapes or an axis out of range."""
    run = op_concat.concat(_Node(1, 13), np)
    a = np.ones((1, 16, 40, 40), np.float32)
    b = np.ones((1, 16, 40, 40), np.float64)
    (got,) = run(a, b)
    assert got.dtype == np.concatenate([a, b], axis=1).dtype
    with pytest.raises(ValueError):
        run(a, np.ones((1, 16, 40, 41), np.float32))
    with pytest.raises((ValueError, np.exceptions.AxisError)):
        op_concat.concat(_Node(4, 13), np)(a, a)
    with pytest.raises((ValueError, np.exceptions.AxisError)):
        op_concat.concat(_Node(-5, 13), np)(a, a)
    names = ["x0", "x1"]
    model = make_model(
        [helper.make_node("Concat", names, ["y"], axis=1)],
        [tensor("x0", [1, 2], TensorProto.FLOAT), tensor("x1", [1, 2], TensorProto.DOUBLE)],
        [tensor("y", None, TensorProto.FLOAT)],
        opset=13,
    ).SerializeToString()
    with pytest.raises(Exception, match="(?i)type|dtype"):
        sess = onnxep.InferenceSession(model, providers=["cpu"])
        sess.run(None, {"x0": np.ones((1, 2), np.float32), "x1": np.ones((1, 2), np.float64)})
