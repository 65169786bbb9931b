"""ReduceSum/ReduceMean routing on CUDA (``providers_cuda/ops/reduce_routing.py``), on the CPU.

The rule is a pure function of outputs, group size, dtype and SM count; the
builder tests run the CUDA builder through the g++ kernel emulator (NumPy
arrays) with CuPy's CUB accelerator reported on or off, and check both the
route each shape took and that the result equals the CPU kernel's.
"""

from __future__ import annotations

import cuda_emulator as emu
import numpy as np
import pytest

from onnxep.providers.node import NodeInfo, ValueInfo
from onnxep.providers.ops import op_reduce_mean as cpu_mean
from onnxep.providers.ops import op_reduce_sum as cpu_sum
from onnxep.providers_cuda.ops import op_reduce_mean as cuda_mean
from onnxep.providers_cuda.ops import op_reduce_sum as cuda_sum
from onnxep.providers_cuda.ops import reduce_cuda as K
from onnxep.providers_cuda.ops import reduce_routing as R

F32, F16 = np.dtype(np.float32), np.dtype(np.float16)
H200_SMS = 132


def route(outputs, group, dtype=F32, sms=H200_SMS, library=True):
    return K.route_for((outputs, group, 1), dtype, sms, library)


def test_outputs_that_fill_the_device_take_the_kernel_whatever_the_group():
    fill = K.FILL_PER_SM * H200_SMS
    for group in (1, 10**6, 10**9):
        assert route(fill, group).path == R.KERNEL


def test_few_outputs_over_huge_groups_go_to_cub_only_as_one_device_wide_sum():
    big = K.BLOCK * K.SPLIT_GRAIN + 1
    assert route(1, big).path == R.LIBRARY
    # several outputs: CUB's segmented reduce gives each one block, no better than the outputs
    several = route(2, 10**7)
    assert several.path == R.KERNEL and "segmented" in several.reason


def test_small_groups_stay_on_the_kernel():
    at = K.BLOCK * K.SPLIT_GRAIN
    assert route(1, at).path == R.KERNEL
    assert route(1, at + 1).path == R.LIBRARY


def test_float16_stays_on_the_kernel_because_cub_sums_it_in_float16():
    r = route(1, 10**7, F16)
    assert r.path == R.KERNEL and "float16" in r.reason


def test_no_accelerator_no_outputs_and_oversized_groups_stay_on_the_kernel():
    assert route(1, 10**7, library=False).path == R.KERNEL
    assert route(0, 10**7).path == R.KERNEL
    assert route(1, R.CUB_MAX_ITEMS + 1).path == R.KERNEL


def test_the_rule_scales_with_the_sm_count_alone():
    # the same shape fills a small device and not a large one
    outputs = K.FILL_PER_SM * 4
    assert route(outputs, 10**7, sms=4).path == R.KERNEL
    assert route(outputs, 10**7, sms=H200_SMS).path == R.KERNEL  # several outputs: split
    assert route(1, 10**7, sms=4).path == R.LIBRARY


def test_route_describes_itself():
    text = route(1, 10**7).describe()
    assert text.startswith("CuPy's CUB reduction") and "1 outputs" in text
    assert route(10**6, 8).describe().startswith("our block-reduction kernel")


def test_cub_enabled_is_false_without_cupy(monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "cupy", None)  # importing it raises ImportError
    monkeypatch.setitem(sys.modules, "cupy._core", None)
    assert R.cub_enabled() is False


# ----------------------------------------------------------------------------- the builder


def _node(op: str, shape, axes, keepdims=1) -> NodeInfo:
    ins = [
        ValueInfo("x", "tensor", np.dtype(np.float32), shape),
        ValueInfo("axes", "tensor", np.dtype(np.int64), (len(axes),), np.array(axes)),
    ]
    opset = 13 if op == "ReduceSum" else 18
    return NodeInfo(op, "", "r", opset, {"keepdims": keepdims}, tuple(ins), (ValueInfo("y"),))


@pytest.fixture
def emulated(monkeypatch):
    emu.install(monkeypatch)


@pytest.mark.parametrize("library", [True, False], ids=["cub-on", "cub-off"])
@pytest.mark.parametrize(
    ("op", "cuda", "cpu"),
    [("ReduceSum", cuda_sum.reduce_sum, cpu_sum.reduce_sum),
     ("ReduceMean", cuda_mean.reduce_mean, cpu_mean.reduce_mean)],
)  # fmt: skip
@pytest.mark.parametrize("keepdims", [0, 1])
def test_builder_routes_and_matches_the_cpu(
    emulated, monkeypatch, library, op, cuda, cpu, keepdims
):
    monkeypatch.setattr(K, "cub_enabled", lambda: library)
    shape, axes = (1, 9000), [1]
    node = _node(op, shape, axes, keepdims)
    run = cuda(node, np)
    x = np.random.default_rng(0).uniform(0.5, 1.5, shape).astype(np.float32)
    got = run(x, np.array(axes))[0]
    want = cpu(node, np)(x, np.array(axes))[0]
    assert got.shape == want.shape and got.dtype == want.dtype
    np.testing.assert_allclose(got, want, rtol=1e-5)
    (taken,) = run.routes.values()
    assert taken.path == (R.LIBRARY if library else R.KERNEL)


def test_the_route_is_logged_once_per_shape(emulated, monkeypatch, caplog):
    import logging

    monkeypatch.setattr(K, "cub_enabled", lambda: True)
    x = np.ones((1, 9000), np.float32)
    with caplog.at_level(logging.DEBUG, logger="onnxep"):
        run = cuda_sum.reduce_sum(_node("ReduceSum", (1, 9000), [1]), np)  # planned here
        run(x, np.array([1]))
        run(x, np.array([1]))
    notes = [r.getMessage() for r in caplog.records if "CUB" in r.getMessage()]
    assert len(notes) == 1 and notes[0].startswith("ReduceSum r (1, 9000): CuPy's CUB"), notes


def test_builder_keeps_many_outputs_on_the_kernel_even_with_cub(emulated, monkeypatch):
    monkeypatch.setattr(K, "cub_enabled", lambda: True)
    node = _node("ReduceSum", (64, 33), [1])
    run = cuda_sum.reduce_sum(node, np)
    x = np.random.default_rng(1).standard_normal((64, 33)).astype(np.float32)
    np.testing.assert_allclose(run(x, np.array([1]))[0], x.sum(1, keepdims=True), rtol=1e-5)
    assert [r.path for r in run.routes.values()] == [R.KERNEL]
