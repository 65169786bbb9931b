"""The recurrent kernels' input projection (``recurrent_jit.project_rows``): a few rows take
the compiled GEMM (``weight_gemm``) at any thread count where its rule runs it at all,
more rows keep the thread rule; the result agrees with OpenBLAS's within float32
rounding, and a GRU node through it with onnxruntime."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from conftest import make_model, tensor
from onnx import helper, numpy_helper

import onnxep
from onnxep.providers_cpu import jit
from onnxep.providers_cpu.ops import recurrent_jit as rj
from onnxep.providers_cpu.ops import weight_gemm

pytestmark = pytest.mark.skipif(not jit.ENABLED, reason="numba not installed")


def _weights(k=256, g=384, dirs=2):
    rng = np.random.default_rng(0)
    W = (rng.standard_normal((dirs, g, k)) * 0.1).astype(np.float32)
    Wt = rj.transposed_w(W)
    bias = rng.standard_normal((dirs, g)).astype(np.float32)
    return Wt, bias, rj.weight_products(Wt)


def _project(rows, Wt, bias, packed):
    proj = np.empty((Wt.shape[0], rows.shape[0], Wt.shape[2]), np.float32)
    rj.project_rows(rows, Wt, bias, packed, proj)
    return proj


def _rows(m, k=256):
    return np.random.default_rng(m).standard_normal((m, k)).astype(np.float32)


@pytest.mark.parametrize("m", [5, 14, 16, 17, 40])
def test_few_rows_take_the_compiled_gemm_at_one_thread(m, monkeypatch):
    if not weight_gemm.runs_at(2):
        pytest.skip("the compiled GEMM's rule does not run it on this machine")
    monkeypatch.setattr(rj, "run_threads", lambda: 1)
    Wt, bias, packed = _weights()
    rows = _rows(m)
    got = _project(rows, Wt, bias, packed)
    compiled = np.stack([packed[d](rows, bias[d]) for d in range(2)])
    blas = np.stack([rows @ Wt[d] + bias[d] for d in range(2)])
    few = m <= rj.PACKED_ROWS and m * 256 * 384 >= weight_gemm.MIN_MACS
    want = compiled if few or weight_gemm.runs_at(1) else blas
    assert got.tobytes() == want.tobytes()
    np.testing.assert_allclose(got, blas, rtol=1e-5, atol=1e-5)


def test_rule_off_keeps_openblas(monkeypatch):
    monkeypatch.setattr(weight_gemm, "MODE", "0")
    Wt, bias, packed = _weights()
    rows = _rows(14)
    got = _project(rows, Wt, bias, packed)
    blas = np.stack([np.matmul(rows, Wt[d]) + bias[d] for d in range(2)])
    assert got.tobytes() == blas.tobytes()


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("steps,batch", [(7, 2), (3, 5), (9, 2)])
def test_gru_node_against_onnxruntime(steps, batch, threads):
    hidden, n_in = 128, 256
    rng = np.random.default_rng(steps * batch)
    W = (rng.standard_normal((2, 3 * hidden, n_in)) * 0.1).astype(np.float32)
    R = (rng.standard_normal((2, 3 * hidden, hidden)) * 0.1).astype(np.float32)
    B = (rng.standard_normal((2, 6 * hidden)) * 0.1).astype(np.float32)
    node = helper.make_node(
        "GRU", ["x", "W", "R", "B", "", "h0"], ["y", "yh"], direction="bidirectional",
        hidden_size=hidden, linear_before_reset=1,
    )  # fmt: skip
    model = make_model(
        [node],
        [tensor("x", [steps, batch, n_in]), tensor("h0", [2, batch, hidden])],
        [tensor("y", None), tensor("yh", None)],
        [numpy_helper.from_array(a, n) for a, n in ((W, "W"), (R, "R"), (B, "B"))],
    ).SerializeToString()
    feed = {
        "x": rng.standard_normal((steps, batch, n_in)).astype(np.float32),
        "h0": rng.standard_normal((2, batch, hidden)).astype(np.float32),
    }
    so = onnxep.SessionOptions(intra_op_num_threads=threads)
    got = onnxep.InferenceSession(model, so, providers=["cpu"]).run(None, feed)
    want = ort.InferenceSession(model, providers=["CPUExecutionProvider"]).run(None, feed)
    for g, w in zip(got, want, strict=True):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=2e-6)
