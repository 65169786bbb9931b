"""ReduceSum/ReduceMean routing on the GPU: the CUB path's result, its capture, and float16.

The routing rule itself is tested on the CPU (tests/test_reduce_routing.py);
here a whole-array float32 reduction over a huge group must run CuPy's CUB
reduction (no kernel of ours launches) and match the CPU, the same shape in
float16 must stay on our split kernel (CUB would sum it in float16), and the
CUB path must record into a CUDA graph and replay with new inputs.
"""

from __future__ import annotations

import numpy as np
import pytest
from test_cuda_reduce import FINISH, ROWS, ReduceCase, check_model, count_launches, reduce_model

from onnxep.testing import compare_output

F32, F16 = np.float32, np.float16


def _cub_on() -> bool:
    from onnxep.providers_cuda.ops.reduce_routing import cub_enabled

    return cub_enabled()


@pytest.fixture
def launches(monkeypatch):
    return count_launches(monkeypatch)


@pytest.mark.parametrize("op", ["ReduceSum", "ReduceMean"])
@pytest.mark.parametrize("keepdims", [0, 1])
def test_float32_whole_array_over_a_huge_group_runs_cub(op, keepdims, launches):
    case = ReduceCase(op, (1, 300000), None, frozenset(), F32, keepdims, values="positive")
    expect = set() if _cub_on() else {ROWS, FINISH}
    model, feeds = reduce_model(case)
    check_model(model, feeds, "cuda", launches, expect, case.id)


@pytest.mark.parametrize("op", ["ReduceSum", "ReduceMean"])
def test_float16_over_a_huge_group_stays_on_the_split_kernel(op, launches):
    case = ReduceCase(op, (1, 300000), None, frozenset(), F16, values="positive")
    model, feeds = reduce_model(case)
    check_model(model, feeds, "cuda", launches, {ROWS, FINISH}, case.id)


def test_cub_route_is_captured_and_replays_new_inputs():
    import cupy

    from onnxep.providers.node import NodeInfo, ValueInfo
    from onnxep.providers.ops import op_reduce_sum
    from onnxep.providers_cuda.ops import op_reduce_sum as cuda_sum
    from onnxep.providers_cuda.ops.reduce_routing import LIBRARY

    if not _cub_on():
        pytest.skip("CuPy's CUB accelerator is off here: nothing takes the library path")
    shape = (300000,)
    x_info = ValueInfo("x", "tensor", np.dtype(F32), shape)
    node = NodeInfo("ReduceSum", "", "r", 13, {"keepdims": 0}, (x_info,), (ValueInfo("y"),))
    rng = np.random.default_rng(3)
    pool = cupy.cuda.MemoryPool()
    stream = cupy.cuda.Stream(non_blocking=True)
    with cupy.cuda.using_allocator(pool.malloc), stream:
        run = cuda_sum.reduce_sum(node, cupy)
        x = cupy.asarray(rng.uniform(0.5, 1.5, shape).astype(F32))
        run(x)
        assert [r.path for r in run.routes.values()] == [LIBRARY]
        stream.synchronize()
        stream.begin_capture()
        (out,) = run(x)
        graph = stream.end_capture()
    for step in range(2):
        host = rng.uniform(0.5, 1.5, shape).astype(F32) * (step + 1)
        x.set(host, stream=stream)
        graph.launch(stream)
        stream.synchronize()
        (want,) = op_reduce_sum.reduce_sum(node, np)(host)
        res = compare_output(f"replay {step}", cupy.asnumpy(out), want, "cuda", "numpy")
        assert all(r.ok for r in res), [r.describe() for r in res]
