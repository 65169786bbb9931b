"""gpu_mem_limit: running out raises the provider's error, and the session stays usable."""

from __future__ import annotations

import numpy as np
import pytest
from _models import unary_pair

import onnxep
from onnxep.errors import RunError
from onnxep.providers_cuda.errors import DeviceOutOfMemory

LIMIT = 64 << 20


def test_out_of_memory_then_a_smaller_run_succeeds():
    sess = onnxep.InferenceSession(
        unary_pair(shape=["n"]), providers=[("cuda", {"gpu_mem_limit": LIMIT})]
    )
    small = np.linspace(-1, 1, 1000, dtype=np.float32)
    sess.run(None, {"x": small})
    big = np.ones(LIMIT // 4 + 1, np.float32)  # the input alone is over the limit
    with pytest.raises(DeviceOutOfMemory, match="gpu_mem_limit") as info:
        sess.run(None, {"x": big})
    assert isinstance(info.value, MemoryError) and isinstance(info.value, RunError)
    assert "session stays usable" in str(info.value)
    pool = sess.providers[0].pool
    assert pool.used_bytes() < LIMIT // 2  # the failed run's arrays went back
    y, z = sess.run(None, {"x": small})
    np.testing.assert_allclose(z, -small)
    np.testing.assert_allclose(y, np.maximum(small, 0) + 1)


def test_a_run_that_fits_the_limit_runs():
    sess = onnxep.InferenceSession(
        unary_pair(shape=["n"]), providers=[("cuda", {"gpu_mem_limit": LIMIT})]
    )
    x = np.ones(LIMIT // 16, np.float32)  # x, r, y, z: four quarter-limit arrays at most
    y, _ = sess.run(None, {"x": x})
    assert float(y[0]) == 2.0
