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
