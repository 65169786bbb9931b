"""The CPU provider's MatMulNBits against onnxruntime, on models onnxruntime's own quantizer made.

A small torch MLP is exported, then quantized by
``onnxruntime.quantization.matmul_nbits_quantizer`` (4 and 8 bits, symmetric and with zero
points, accuracy_level 0 and 4, a K that is not a whole number of blocks); onnxep ``["cpu"]``
runs it on decode-sized inputs (the packed-weight loop, when numba is installed) and
prefill-sized ones (the float32 weight), with the packed loop and without, and with the
float32 copy refused by ``ONNXEP_NBITS_FLOAT_MB`` (blocks dequantized per run).
"""

from __future__ import annotations

import io

import numpy as np
import onnx
import pytest

import onnxep
from onnxep.providers_cpu import jit

torch = pytest.importorskip("torch")
ort = pytest.importorskip("onnxruntime")
quantizer = pytest.importorskip("onnxruntime.quantization.matmul_nbits_quantizer")


def _mlp(k: int) -> onnx.ModelProto:
    torch.manual_seed(0)
    m = torch.nn.Sequential(
        torch.nn.Linear(k, 96), torch.nn.GELU(), torch.nn.Linear(96, 72, bias=False)
    ).eval()
    buf = io.BytesIO()
    torch.onnx.export(
        m,
        (torch.randn(2, 3, k),),
        buf,
        input_names=["x"],
        dynamic_axes={"x": {0: "b", 1: "s"}},
        opset_version=17,
        dynamo=False,
    )
    return onnx.load_from_string(buf.getvalue())


_CACHE: dict = {}


def _quantized(bits: int, symmetric: bool, level: int, k: int) -> bytes:
    key = (bits, symmetric, level, k)
    if key not in _CACHE:
        q = quantizer.MatMulNBitsQuantizer(
            _mlp(k), bits=bits, block_size=32, is_symmetric=symmetric, accuracy_level=level
        )
        q.process()
        model = q.model.model
        assert sum(n.op_type == "MatMulNBits" for n in model.graph.node) == 2
        _CACHE[key] = model.SerializeToString()
    return _CACHE[key]


def _compare(model: bytes, rows: int, k: int) -> None:
    x = np.random.default_rng(rows).standard_normal((1, rows, k)).astype(np.float32)
    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    want = ort.InferenceSession(model, so, providers=["CPUExecutionProvider"]).run(None, {"x": x})
    got = onnxep.InferenceSession(model, providers=["cpu"]).run(None, {"x": x})
    scale = np.abs(want[0]).max()
    # onnxruntime adds the blocks in its own order (and, at level 4, rounds A the same way)
    np.testing.assert_allclose(got[0], want[0], rtol=1e-4, atol=2e-5 * scale)


@pytest.mark.parametrize("rows", [1, 3, 20])
@pytest.mark.parametrize(
    "bits,symmetric,level,k",
    [(4, True, 4, 64), (4, False, 4, 80), (4, False, 0, 64), (8, True, 4, 64), (8, False, 0, 80)],
)
@pytest.mark.parametrize("compiled", [True, False], ids=["compiled", "numpy"])
def test_quantizer_model_matches_onnxruntime(
    bits, symmetric, level, k, rows, compiled, monkeypatch
):
    if compiled and not jit.ENABLED:
        pytest.skip("numba not installed: only the NumPy path runs here")
    from onnxep.providers_cpu.ops import op_matmul_nbits as kern

    monkeypatch.setattr(jit, "ENABLED", compiled)
    monkeypatch.setattr(kern, "PACKED_MIN_BYTES", 0)  # these weights are small: packed anyway
    _compare(_quantized(bits, symmetric, level, k), rows, k)


@pytest.mark.parametrize("rows", [1, 20])
def test_float_copy_refused_dequantizes_blocks_per_run(rows, monkeypatch):
    """With the float32 copy over the limit, blocks are dequantized per run: same results."""
    from onnxep.providers_cpu.ops import op_matmul_nbits as kern

    monkeypatch.setenv("ONNXEP_NBITS_FLOAT_MB", "0")
    monkeypatch.setattr(kern, "CHUNK_BYTES", 4 * 64 * 10)  # 10 columns a block: several blocks
    monkeypatch.setattr(jit, "ENABLED", False)
    _compare(_quantized(4, False, 4, 64), rows, 64)


def test_packed_loop_runs_decode_rows(monkeypatch):
    if not jit.ENABLED:
        pytest.skip("numba not installed")
    from onnxep.providers_cpu.ops import op_matmul_nbits as kern

    monkeypatch.setattr(kern, "PACKED_MIN_BYTES", 0)
    calls = []
    real = kern.packed_matmul
    monkeypatch.setattr(kern, "packed_matmul", lambda *a: calls.append(a[0].shape) or real(*a))
    model = _quantized(4, True, 4, 64)
    sess = onnxep.InferenceSession(model, providers=["cpu"])
    sess.run(None, {"x": np.ones((1, 2, 64), np.float32)})
    sess.run(None, {"x": np.ones((1, 20, 64), np.float32)})
    assert calls == [(2, 64), (2, 96)]  # both projections on the decode rows, none on prefill


def test_bad_float_limit_is_named(monkeypatch):
    monkeypatch.setenv("ONNXEP_NBITS_FLOAT_MB", "lots")
    with pytest.raises(onnxep.errors.OnnxepError, match="ONNXEP_NBITS_FLOAT_MB"):
        onnxep.InferenceSession(_quantized(4, True, 4, 64), providers=["cpu"])


@pytest.mark.parametrize("k", [64, 80])
def test_compiled_int8_rounding_is_the_generic_one_bit_for_bit(k):
    """Level 4's rounded A from the compiled loop equals ``contrib.int8_blocks`` exactly."""
    if not jit.ENABLED:
        pytest.skip("numba not installed")
    from onnxep.providers.ops import contrib
    from onnxep.providers_cpu.ops import op_matmul_nbits as kern

    a = np.random.default_rng(0).standard_normal((5, k)).astype(np.float32)
    a[1, :32] = 0  # an all-zero block
    got = kern.int8_round(a, -(-k // 32), 32)
    assert got.tobytes() == contrib.int8_blocks(a, 32, np).tobytes()


# --- jit_nbits: level 4, 4-bit decode rows on AVX2 (vpmaddubsw tiles over packed records)


def _nbits_model(k, n, bits, block, level, zp, seed=0):
    """One MatMulNBits node with random weights (every nibble value), scales and zero points."""
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(seed)
    kb = -(-k // block)
    b = rng.integers(0, 256, size=(n, kb, block * bits // 8), dtype=np.uint8)
    s = (rng.random(n * kb, dtype=np.float32) * 0.02 + 0.001).astype(np.float32)
    inits = [numpy_helper.from_array(b, "b"), numpy_helper.from_array(s, "s")]
    if zp:
        z = rng.integers(0, 256, size=(n * -(-kb * bits // 8),), dtype=np.uint8)
        inits.append(numpy_helper.from_array(z, "z"))
    node = helper.make_node(
        "MatMulNBits",
        ["a", "b", "s"] + (["z"] if zp else []),
        ["y"],
        domain="com.microsoft",
        K=k,
        N=n,
        bits=bits,
        block_size=block,
        accuracy_level=level,
    )
    graph = helper.make_graph(
        [node],
        "g",
        [helper.make_tensor_value_info("a", onnx.TensorProto.FLOAT, [None, k])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [None, n])],
        initializer=inits,
    )
    opsets = [helper.make_opsetid("", 21), helper.make_opsetid("com.microsoft", 1)]
    return helper.make_model(graph, opset_imports=opsets).SerializeToString()


def _tiles_here():
    from onnxep.providers_cpu import jit_nbits

    if not jit_nbits.usable(4, 32):
        pytest.skip("no numba or no AVX2 here: the AVX2 tiles do not run")


@pytest.mark.parametrize("rows", [1, 2, 3, 5, 8])
@pytest.mark.parametrize(
    "k,n,block,zp",
    [
        (200, 13, 32, False),  # K not whole blocks, an odd count of them (a padded pair), N odd
        (200, 13, 32, True),
        (64, 1, 32, True),  # one column: a group of four mostly padding
        (96, 7, 64, False),  # blocks of 64: one block a record
        (300, 6, 128, True),
        (896, 20, 32, True),
    ],
)
def test_avx2_tiles_match_onnxruntime(k, n, block, zp, rows, monkeypatch):
    _tiles_here()
    from onnxep.providers_cpu.ops import op_matmul_nbits as kern

    monkeypatch.setattr(kern, "PACKED_MIN_BYTES", 0)
    model = _nbits_model(k, n, 4, block, 4, zp, seed=k + n)
    sess = onnxep.InferenceSession(model, providers=["cpu"])
    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    want_s = ort.InferenceSession(model, so, providers=["CPUExecutionProvider"])
    a = np.random.default_rng(rows).standard_normal((rows, k)).astype(np.float32)
    a[0, :32] = 0  # an all-zero block of A
    got, want = sess.run(None, {"a": a})[0], want_s.run(None, {"a": a})[0]
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=2e-5 * np.abs(want).max())


@pytest.mark.parametrize("m", [1, 2, 3, 4, 5])
@pytest.mark.parametrize(
    "k,n,block", [(64, 4, 32), (96, 5, 32), (33, 9, 32), (256, 3, 64), (384, 7, 128)]
)
@pytest.mark.parametrize("zp", [False, True], ids=["sym", "zp"])
def test_avx2_tile_sums_are_exact(m, k, n, block, zp):
    """Integer A at +-127 (block scale 1), nibbles at 0 and 15, zero points at 0 and 15:
    every product pair at vpmaddubsw's largest (2 * 127 * 15) and even + odd at 7620 in int16.
    With weight scales 1 the output is the integer sum, exactly."""
    _tiles_here()
    from onnxep.providers_cpu import jit_nbits
    from onnxep.providers_cpu.ops import op_matmul_nbits as kern

    rng = np.random.default_rng(m * k + n)
    kb = -(-k // block)
    a = rng.choice(np.array([-127, 127, -126, 3], np.float32), size=(m, k))
    a[:, ::block] = 127  # each block's largest magnitude 127: A's scale is 1, q = a
    nib = rng.choice(np.array([0, 15], np.uint8), size=(n, kb * block))
    nib[:, k:] = rng.integers(0, 16, size=(n, kb * block - k))  # past K: must not count
    w = (nib[:, 0::2] | (nib[:, 1::2] << 4)).astype(np.uint8)
    z = rng.choice(np.array([0, 15], np.uint8), size=(n, kb)) if zp else None
    packed = kern.Tiled(jit_nbits.pack(w, np.ones((n, kb), np.float32), z, block // 32), zp)
    got = kern.packed_matmul(a, packed, n, kb, 4, block, True)
    zz = (z if zp else np.full((n, kb), 8)).astype(np.int64)
    wq = nib[:, :k].astype(np.int64) - np.repeat(zz, block, axis=1)[:, :k]
    want = a.astype(np.int64) @ wq.T
    assert np.abs(want).max() < 1 << 24  # exact in float32 too
    np.testing.assert_array_equal(got, want.astype(np.float32))


def test_avx2_tiles_run_for_level_4_only(monkeypatch):
    """Level 4, 4 bits: the tiles (jit_nbits' packed records); level 0 and 8 bits: the
    portable loop, on its transposed copy; both match onnxruntime above and in the
    quantizer-model tests."""
    _tiles_here()
    from onnxep.providers_cpu import jit_nbits
    from onnxep.providers_cpu.ops import op_matmul_nbits as kern

    monkeypatch.setattr(kern, "PACKED_MIN_BYTES", 0)
    seen = []
    real = jit_nbits.loop
    monkeypatch.setattr(jit_nbits, "loop", lambda *a, **kw: seen.append(a[0]) or real(*a, **kw))
    a = np.ones((1, 64), np.float32)
    for bits, level in [(4, 4), (4, 0), (8, 4)]:
        seen.clear()
        onnxep.InferenceSession(_nbits_model(64, 8, bits, 32, level, False), providers=["cpu"]).run(
            None, {"a": a}
        )
        tiles = any(name in ("matvec", "drive_shared") for name in seen)
        assert tiles == (bits == 4 and level == 4), (bits, level, seen)


@pytest.mark.parametrize("rows", [1, 3])
@pytest.mark.parametrize("bits,level,zp", [(8, 4, True), (8, 0, False), (4, 0, True)])
def test_portable_loop_paths_match_onnxruntime(bits, level, zp, rows, monkeypatch):
    """8-bit weights and level 0 stay on the portable packed loop (K not whole blocks, N odd)."""
    if not jit.ENABLED:
        pytest.skip("numba not installed")
    from onnxep.providers_cpu.ops import op_matmul_nbits as kern

    monkeypatch.setattr(kern, "PACKED_MIN_BYTES", 0)
    model = _nbits_model(200, 13, bits, 32, level, zp, seed=bits)
    a = np.random.default_rng(rows).standard_normal((rows, 200)).astype(np.float32)
    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    want = ort.InferenceSession(model, so, providers=["CPUExecutionProvider"]).run(None, {"a": a})
    got = onnxep.InferenceSession(model, providers=["cpu"]).run(None, {"a": a})
    np.testing.assert_allclose(got[0], want[0], rtol=1e-4, atol=2e-5 * np.abs(want[0]).max())


def test_avx2_tiles_instructions():
    """The compiled tiles multiply with vpmaddubsw after vpsignb (the exact form) and vpmaddwd."""
    _tiles_here()
    import re

    from onnxep.providers_cpu import jit_nbits

    t1 = jit_nbits._tile_pairs(1, True)  # noqa: SLF001  (the intrinsic itself)

    def run(p, aa, asg, ascl, out):
        t1(p, aa, asg, ascl, 0, 0, out)

    f = jit.nb.njit(cache=False)(run)  # numba shows no code it read from its disk cache
    p = jit_nbits.pack(np.zeros((4, 32), np.uint8), np.ones((4, 2), np.float32), None, 1)
    f(p, np.zeros((1, 64), np.uint8), np.zeros((1, 64), np.int8), np.ones((1, 2), np.float32),
      np.zeros((1, 4), np.float32))  # fmt: skip
    ops = re.findall(r"^\s+(v\w+)", "\n".join(f.inspect_asm().values()), re.MULTILINE)
    for op in ("vpsignb", "vpmaddubsw", "vpmaddwd", "vcvtdq2ps", "vfmadd231ps"):
        assert op in ops, op


@pytest.mark.parametrize("rows", [1, 3])
def test_avx2_tiles_split_over_threads_same_bits(rows, monkeypatch):
    """Column groups split over two threads give the one-thread result bit for bit (each
    column is summed whole by one tile), columns past N untouched by the padded group."""
    _tiles_here()
    from onnxep.providers_cpu.ops import op_matmul_nbits as kern

    model = _nbits_model(256, 203, 4, 32, 4, True, seed=3)
    a = np.random.default_rng(rows).standard_normal((rows, 256)).astype(np.float32)
    one = onnxep.InferenceSession(
        model, onnxep.SessionOptions(intra_op_num_threads=1), providers=["cpu"]
    ).run(None, {"a": a})[0]
    monkeypatch.setattr(kern, "SHARED_MIN_BYTES", 0)  # every product shared
    two = onnxep.InferenceSession(
        model, onnxep.SessionOptions(intra_op_num_threads=2), providers=["cpu"]
    ).run(None, {"a": a})[0]
    assert one.shape == (rows, 203) and one.tobytes() == two.tobytes()


# --- the tiles shared with helper threads (nbits_threads, jit_nbits._drive_shared)


def _packed_case(k, n, block, zp, rows, seed=0):
    from onnxep.providers_cpu import jit_nbits
    from onnxep.providers_cpu.ops import op_matmul_nbits as kern

    rng = np.random.default_rng(seed)
    kb = -(-k // block)
    w = rng.integers(0, 256, size=(n, kb * block // 2), dtype=np.uint8)
    s = (rng.random((n, kb), dtype=np.float32) * 0.02 + 0.001).astype(np.float32)
    z = rng.integers(0, 16, size=(n, kb), dtype=np.uint8) if zp else None
    packed = kern.Tiled(jit_nbits.pack(w, s, z, block // 32), zp)
    a = rng.standard_normal((rows, k)).astype(np.float32)
    return a, packed, kb


@pytest.mark.parametrize("rows", [1, 2, 3])
@pytest.mark.parametrize(
    "k,n,block,zp", [(200, 203, 32, True), (896, 77, 32, False), (320, 41, 64, True)]
)
def test_shared_driver_same_bits_as_one_thread(k, n, block, zp, rows):
    """The caller alone, the caller re-writing chunks "taken" by a helper that never ran,
    and real helpers: all give the one-thread bits, and the caller records who wrote what."""
    _tiles_here()
    from onnxep.providers_cpu import jit_nbits
    from onnxep.providers_cpu.ops import nbits_threads

    a, packed, kb = _packed_case(k, n, block, zp, rows, seed=k + n)
    subs, pairs = block // 32, block == 32
    one = np.empty((rows, n), np.float32)
    jit_nbits.loop("matvec", zp, subs)(a, packed.p, kb, block, pairs, one)
    aa, asg, asc = jit_nbits.loop("quantize_a")(a, kb, block, pairs)
    f = jit_nbits.loop("drive_shared", zp, subs)
    chunks = min(packed.p.shape[0], 7)
    for taken in (0, chunks):  # none taken yet; all taken by a helper that never finishes
        state = np.zeros(1 + chunks, np.int64)
        state[0] = taken
        out = np.full((rows, n), np.nan, np.float32)
        f(packed.p, aa, asg, asc, state, chunks, out, True)
        assert out.tobytes() == one.tobytes()
        assert (state[1:] == 2).all()  # every chunk written by the caller
    for _ in range(20):
        state = np.zeros(1 + chunks, np.int64)
        out = np.full((rows, n), np.nan, np.float32)
        nbits_threads.run_shared(f, (packed.p, aa, asg, asc, state, chunks, out), 2)
        assert out.tobytes() == one.tobytes()
        assert (state[1:] != 0).all()


def test_shared_helper_starting_late_touches_nothing():
    """A helper that runs after the caller took every chunk returns at once (the buffer a
    late helper could write is the run's own, never the node's output)."""
    _tiles_here()
    from onnxep.providers_cpu import jit_nbits

    a, packed, kb = _packed_case(64, 16, 32, False, 1)
    aa, asg, asc = jit_nbits.loop("quantize_a")(a, kb, 32, True)
    f = jit_nbits.loop("drive_shared", False, 1)
    state = np.array([4, 2, 2, 2, 2], np.int64)  # 4 chunks, all taken and written
    out = np.full((1, 16), 7.0, np.float32)
    f(packed.p, aa, asg, asc, state, 4, out, False)
    assert (out == 7.0).all() and state[0] == 5


@pytest.mark.parametrize("rows", [1, 4])
def test_shared_runs_match_one_thread_sessions(rows, monkeypatch):
    """Two-thread sessions, every weight shared, over many runs: the
    one-thread session's bits each time, with a bias and K not whole blocks."""
    _tiles_here()
    from onnxep.providers_cpu.ops import op_matmul_nbits as kern

    monkeypatch.setattr(kern, "SHARED_MIN_BYTES", 0)
    monkeypatch.setattr(kern, "SHARED_CHUNK_BYTES", 512)
    model = _nbits_model_bias(300, 211, zp=True)
    a = np.random.default_rng(rows).standard_normal((rows, 300)).astype(np.float32)
    one = onnxep.InferenceSession(
        model, onnxep.SessionOptions(intra_op_num_threads=1), providers=["cpu"]
    )
    two = onnxep.InferenceSession(
        model, onnxep.SessionOptions(intra_op_num_threads=2), providers=["cpu"]
    )
    want = one.run(None, {"a": a})[0]
    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    ref = ort.InferenceSession(model, so, providers=["CPUExecutionProvider"]).run(None, {"a": a})[0]
    np.testing.assert_allclose(want, ref, rtol=1e-4, atol=2e-5 * np.abs(ref).max())
    for _ in range(30):
        assert two.run(None, {"a": a})[0].tobytes() == want.tobytes()


def _nbits_model_bias(k, n, zp):
    """_nbits_model's MatMulNBits (4 bits, blocks of 32, level 4) with a bias input."""
    m = onnx.load_from_string(_nbits_model(k, n, 4, 32, 4, zp, seed=k))
    node = m.graph.node[0]
    while len(node.input) < 5:
        node.input.append("")
    node.input.append("bias")
    bias = np.random.default_rng(n).standard_normal(n).astype(np.float32)
    m.graph.initializer.append(onnx.numpy_helper.from_array(bias, "bias"))
    return m.SerializeToString()


def test_shared_after_fork_in_child():
    """A forked child (no helper threads of its own yet) runs shared products correctly."""
    _tiles_here()
    import multiprocessing as mp

    from onnxep.providers_cpu.ops import op_matmul_nbits as kern

    if "fork" not in mp.get_all_start_methods():
        pytest.skip("no fork here")
    a, packed, kb = _packed_case(256, 300, 32, True, 1, seed=5)
    want = kern.packed_matmul(a, packed, 300, kb, 4, 32, True)  # helpers started here
    ctx = mp.get_context("fork")
    with ctx.Pool(1) as pool:
        got = pool.apply(_child_product, (a, packed, kb))
    assert got.tobytes() == want.tobytes()


def _child_product(a, packed, kb):
    from onnxep.providers_cpu.ops import op_matmul_nbits as kern

    kern.SHARED_MIN_BYTES = 0
    return kern.packed_matmul(a, packed, 300, kb, 4, 32, True)


@pytest.mark.parametrize("k", [1, 31, 33, 64, 95])
@pytest.mark.parametrize("pairs", [True, False])
def test_quantize_a_pads_past_k_with_zeros(k, pairs):
    """The rounding reads A (M, K) itself: K short of whole blocks (odd K too) leaves zeros
    past K, and each block's values and scale are contrib.int8_blocks'."""
    if not jit.ENABLED:
        pytest.skip("numba not installed")
    from onnxep.providers.ops import contrib
    from onnxep.providers_cpu import jit_nbits

    a = np.random.default_rng(k).standard_normal((3, k)).astype(np.float32)
    kb = -(-k // 32)
    aa, asg, asc = jit_nbits.loop("quantize_a")(a, kb, 32, pairs)
    assert asg.shape[1] == 32 * (kb + kb % 2 if pairs else kb)
    assert np.count_nonzero(asg) <= 3 * k
    assert (aa == np.abs(asg.astype(np.int16))).all()
    got = np.zeros((3, kb * 32), np.float32)
    for b in range(kb):
        for j in range(32):
            at = (
                (b // 2) * 64 + (j % 2) * 32 + (b % 2) * 16 + j // 2
                if pairs
                else (b * 32 + (j % 2) * 16 + j // 2)
            )
            got[:, b * 32 + j] = asg[:, at] * asc[:, b]
    want = contrib.int8_blocks(a, 32, np)
    np.testing.assert_array_equal(got[:, :k], want)
