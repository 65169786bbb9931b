"""Programmatic dependent launch (providers_cuda/launch.py) on the GPU: a chain of dependent
warp-per-output GEMVs, each reading the vector the one before wrote, gives the same bytes
launched with the attribute as without it, eagerly and replayed from a captured CUDA graph
(a missing or misplaced ``pdl_wait`` would let a GEMV read its input before the previous one
wrote it). The kernel's source order (weights prefetched, then the wait, then every access
to A and every store) is checked on the CPU in tests/test_gemv_nt_cuda_emulated.py.
"""

from __future__ import annotations

import numpy as np
import pytest

cupy = pytest.importorskip("cupy", reason="the CUDA tests need CuPy and a GPU")


def _sm90() -> bool:
    try:
        return cupy.cuda.runtime.getDeviceProperties(0)["major"] >= 9
    except Exception:
        return False


pytestmark = pytest.mark.skipif(
    not _sm90(), reason="programmatic dependent launch needs compute capability 9.0 or newer"
)


def _gemv(pdl: bool, monkeypatch):
    from onnxep.providers_cuda.ops.gemv_nt_cuda import GemvNT
    from onnxep.providers_cuda.xp import cuda_namespace

    monkeypatch.setenv("ONNXEP_CUDA_PDL", "1" if pdl else "0")
    return GemvNT(cuda_namespace(), np.float16)


def _chain(gemv, x, weights):
    for w in weights:
        x = gemv(x, w)
    return x


@pytest.mark.parametrize("captured", [False, True])
def test_dependent_gemv_chain_is_byte_equal_with_and_without_the_attribute(monkeypatch, captured):
    from onnxep.providers_cuda.launch import programmatic_launch

    rng = np.random.default_rng(0)
    shapes = [(1152, 896), (896, 1152), (4864, 896), (896, 4864)] * 6  # (N, K), chained
    weights = [
        cupy.asarray((rng.standard_normal(s) / np.sqrt(s[1])).astype(np.float16)) for s in shapes
    ]
    x0 = cupy.asarray(rng.standard_normal((1, 896)).astype(np.float16))
    outs = {}
    for pdl in (False, True):
        gemv = _gemv(pdl, monkeypatch)
        assert programmatic_launch() is pdl
        stream = cupy.cuda.Stream(non_blocking=True)
        with stream:
            if captured:
                _chain(gemv, x0, weights)  # compiled and planned before the capture
                stream.begin_capture()
                y = _chain(gemv, x0, weights)
                graph = stream.end_capture()
                for _ in range(3):
                    graph.launch(stream)
            else:
                for _ in range(3):
                    y = _chain(gemv, x0, weights)
            stream.synchronize()
        outs[pdl] = cupy.asnumpy(y)
    assert np.isfinite(outs[False]).all()
    assert outs[True].tobytes() == outs[False].tobytes()
    # and the chain is the product it claims to be (float64 on the host, fp16's rounding)
    ref = cupy.asnumpy(x0).astype(np.float64)
    for w in weights:
        ref = (ref @ cupy.asnumpy(w).astype(np.float64).T).astype(np.float16).astype(np.float64)
    np.testing.assert_allclose(outs[True].astype(np.float64), ref, rtol=0.05, atol=0.05)


def test_the_provider_reports_whether_it_launches_dependent_kernels(monkeypatch):
    from onnxep.providers_cuda.provider import CUDAProvider

    monkeypatch.delenv("ONNXEP_CUDA_PDL", raising=False)

    assert CUDAProvider({}).describe()["programmatic_launch"] is True
    monkeypatch.setenv("ONNXEP_CUDA_PDL", "0")
    assert CUDAProvider({}).describe()["programmatic_launch"] is False
