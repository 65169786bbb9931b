"""The CUDA reduction, Softmax and RMS-norm kernels, run on the CPU through an emulator.

The cases are the GPU tests' own (tests/cuda/test_cuda_reduce.py and
test_cuda_norms.py): the same one-node models, the same expected kernels, the
same comparison with the CPU provider. Here the provider is ``cudaemu`` (the
CUDA provider's kernel library on NumPy arrays) and the CUDA C is compiled
with g++ and run by tests/cuda_emulator.py, which reports barrier and shuffle
misuse, misaligned vector accesses, out-of-bounds writes and wrongly typed
arguments. The emulated device has 4 SMs, so the split reductions split.
The default run takes a representative subset of the cases (every kernel
path in both dtypes); ``-m slow`` runs them all (about a minute of CPU).
Host-side planning (views, splits, geometry, operand checks) is tested
directly below.
"""

from __future__ import annotations

import re
import shutil
import subprocess

import cuda_emulator as emu
import numpy as np
import pytest

from onnxep.providers.node import NodeInfo, ValueInfo
from onnxep.providers.ops import op_reduce_sum as cpu_sum
from onnxep.providers_cuda.ops import norm_runners as N
from onnxep.providers_cuda.ops import op_reduce_sum as cuda_sum
from onnxep.providers_cuda.ops import reduce_cuda as K

F32, F16 = np.float32, np.float16

gpu_reduce = emu.gpu_test_module("test_cuda_reduce")
gpu_norms = emu.gpu_test_module("test_cuda_norms")


@pytest.fixture
def launches(emulated, monkeypatch):
    return gpu_reduce.count_launches(monkeypatch)


# ----------------------------------------------------------------------------- the GPU cases


def _quick_reduce(c) -> bool:
    """A representative subset for the default run (every path, both dtypes, every length for
    one sum and one max); the rest run with ``-m slow``."""
    if c.op not in gpu_reduce.BASIC_REDUCTIONS:
        return c.dtype == np.float16 or c.values == "special" or c.opset < 18 or c.axes_input
    if c.shape == (300, 2000):
        return c.op == "ReduceMax"
    if c.shape[0] == 3 and len(c.shape) == 2:  # the row lengths, and empty rows
        return c.op in ("ReduceSum", "ReduceMax") or c.shape[1] == 0
    if c.shape == (2, 3, 5):
        return (c.op, c.dtype, c.keepdims) in (("ReduceSum", F32, 0), ("ReduceMax", F16, 1))
    return c.op in ("ReduceSum", "ReduceMax") or len(c.shape) == 3


def _quick_softmax(c) -> bool:
    if c.shape[0] == 3 and len(c.shape) == 2:
        return c.dtype == F32 or c.shape[1] == 4097
    if c.shape == (2, 5, 7):
        return (c.dtype == F16) == (c.opset == 13)
    return True


def _quick_norm(c) -> bool:
    if c.x[:2] == (2, 3) and c.x[2] in gpu_reduce.LENGTHS and c.w == c.x[2:] and c.skip is None:
        picked = [
            ("rms", F16, False),
            ("skip", F32, True),
            ("ln", F32, False),
            ("skipln", F16, True),
        ]
        return (c.op, c.dtype, c.bias) in picked
    return c.dtype != F32 or not c.fused


def _params(cases, quick):
    return [pytest.param(c, id=c.id, marks=() if quick(c) else pytest.mark.slow) for c in cases]


@pytest.mark.parametrize("case", _params(gpu_reduce.REDUCE_CASES, _quick_reduce))
def test_reduce(case, emulated, launches):
    gpu_reduce.check_reduce(case, emulated, launches)


@pytest.mark.parametrize("case", _params(gpu_reduce.SOFTMAX_CASES, _quick_softmax))
def test_softmax(case, emulated, launches):
    gpu_reduce.check_softmax(case, emulated, launches)


@pytest.mark.parametrize("case", _params(gpu_norms.NORM_CASES, _quick_norm))
def test_norm(case, emulated, launches):
    gpu_norms.check_norm(case, emulated, launches)


_ONE_OF_EACH = [
    gpu_reduce.ReduceCase("ReduceSum", (2, 50000), (1,), gpu_reduce.RS, values="positive"),
    gpu_reduce.ReduceCase("ReduceMax", (3, 4097, 5), (1,), gpu_reduce.CS, np.float16),
    gpu_reduce.ReduceCase("ReduceMean", (3, 4097), (1,), gpu_reduce.R),
    gpu_reduce.SoftmaxCase((3, 4097), -1, gpu_reduce.SR, np.float16),
    gpu_reduce.SoftmaxCase((4, 33, 5), 1, gpu_reduce.SC),
    gpu_norms.NormCase(
        "skip", (2, 3, 896), (896,), True, np.float16, bias=True, outputs=gpu_norms.ALL_OUTS
    ),
    gpu_norms.NormCase("rms", (4, 4097), (4097,), True),
]


@pytest.mark.parametrize("case", _ONE_OF_EACH, ids=lambda c: c.id)
def test_fiber_order_does_not_change_results(case, emulated, launches, fiber_order):
    """A missing barrier would let one thread read what another has not written yet; running
    every thread in reverse order makes such a read see stale data."""
    check = {
        gpu_reduce.ReduceCase: gpu_reduce.check_reduce,
        gpu_reduce.SoftmaxCase: gpu_reduce.check_softmax,
        gpu_norms.NormCase: gpu_norms.check_norm,
    }[type(case)]
    check(case, emulated, launches)


@pytest.mark.parametrize("i", range(4))
def test_misaligned_reduce_and_softmax(i, emulated):
    what, build, ref, node, shape, dt = gpu_reduce.builder_cases()[i]
    x, host = gpu_reduce.misaligned(np, shape, dt, i)
    assert x.ctypes.data % 16
    args = (x, node.const_input(1)) if node.op_type.startswith("Reduce") else (x,)
    (got,) = build(node, np)(*args)
    (want,) = ref(node, np)(host, *args[1:])
    np.testing.assert_allclose(got.astype(np.float64), want.astype(np.float64), 1e-3, 2.5e-3)


@pytest.mark.parametrize("which", range(4), ids=gpu_norms.NORM_BUILDERS)
@pytest.mark.parametrize("dt", [np.float32, np.float16])
def test_misaligned_norm_operands(dt, which, emulated):
    gpu_norms.run_misaligned(np, np.asarray, dt, which)


# ----------------------------------------------------------------------------- the emulator itself


def test_the_emulator_reports_a_wrongly_typed_argument(emulated):
    from onnxep.providers_cuda.ops import reduce_source as S

    fns = K.compile_kernels(S.REDUCE_BODY, ["reduce_rows<float, 0>"])
    x, y = np.ones((2, 8), np.float32), np.empty(2, np.float32)
    ints = (np.int64(2), np.int64(8), np.int64(8), np.int32(1), np.int32(32))
    with pytest.raises(emu.EmulatorError, match="argument 8 must be int32"):
        fns["reduce_rows<float, 0>"]((1,), (256,), (x, y, None, *ints, 1))
    fns["reduce_rows<float, 0>"]((1,), (256,), (x, y, None, *ints, np.int32(1)))
    np.testing.assert_array_equal(y, [8, 8])


def test_the_emulator_reports_out_of_bounds_writes_and_misaligned_vectors(emulated):
    from onnxep.providers_cuda.ops import reduce_source as S

    fns = K.compile_kernels(S.REDUCE_BODY, ["reduce_rows<float, 0>"])
    x, y = np.ones((4, 8), np.float32), np.empty(2, np.float32)
    rows = (np.int64(4), np.int64(8), np.int64(8), np.int32(1), np.int32(32), np.int32(0))
    with pytest.raises(emu.EmulatorError, match="out of bounds"):
        fns["reduce_rows<float, 0>"]((1,), (256,), (x, y, None, *rows))  # y holds 2 of 4 rows
    base = np.ones(33, np.float32)
    bad = base[1:].reshape(4, 8)  # 4 bytes off: vector loads must not be used on it
    y = np.empty(4, np.float32)
    with pytest.raises(emu.EmulatorError, match="misaligned"):
        fns["reduce_rows<float, 0>"]((1,), (256,), (bad, y, None, *rows[:-1], np.int32(1)))


# ----------------------------------------------------------------------------- host-side planning


@pytest.mark.parametrize(
    ("shape", "axes", "view"),
    [
        ((2, 3, 5), (2,), (6, 5, 1)),
        ((2, 3, 5), (0,), (1, 2, 15)),
        ((2, 3, 5), (1,), (2, 3, 5)),
        ((2, 3, 5), (0, 1), (1, 6, 5)),
        ((2, 3, 5), (0, 1, 2), (1, 30, 1)),
        ((2, 3, 5), (0, 2), None),
        ((4, 1, 6, 1), (0, 2), (1, 24, 1)),
        ((4, 1, 6), (1,), (24, 1, 1)),
        ((3, 0), (1,), (3, 0, 1)),
        ((2, 1, 3, 1, 5), (0, 2, 4), (1, 30, 1)),
        ((2, 1, 3, 1, 5), (0, 1, 4), None),
        ((7,), (0,), (1, 7, 1)),
        ((), (), (1, 1, 1)),
    ],
)
def test_reduce_view(shape, axes, view):
    assert K.reduce_view(shape, axes) == view


@pytest.mark.parametrize("sms", [4, 132])
@pytest.mark.parametrize("items", [1, 3, 100, 1000])
@pytest.mark.parametrize("n", [0, 5, 4096, 50001, 10**7])
@pytest.mark.parametrize("align", [1, 4, 8])
def test_split_layout_covers_the_reduction(n, items, sms, align):
    splits, chunk = K.split_layout(n, items, sms, 4096, align)
    assert splits >= 1
    if splits == 1:
        assert chunk == n
        return
    assert chunk % align == 0 and chunk >= 4096 // 2
    assert (splits - 1) * chunk < n <= splits * chunk  # no empty split, nothing left over
    assert items < K.FILL_PER_SM * sms  # only reductions too few to fill the device split
    assert items * splits <= 2 * K.FILL_PER_SM * sms + items


def test_row_threads_gives_short_rows_a_warp_and_long_rows_a_block():
    assert [K.row_threads(n) for n in (1, 7, 64, 256)] == [32] * 4
    assert K.row_threads(896) == 128
    assert K.row_threads(4097) == 1024
    assert K.row_threads(10**6) == 1024


def test_plans_stay_inside_launch_limits():
    for shape, axes in [((1, 10**6), (1,)), ((10**6, 3), (0,)), ((5, 7, 9), (1,)), ((9, 3), (1,))]:
        for dt in (np.float32, np.float16):
            p = K.plan_reduce(shape, np.dtype(dt), axes, True, 132)
            assert 1 <= p.grid[0] <= K.MAX_GRID and p.block[0] in (32, 64, 128, 256, 512, 1024)
            assert p.out_shape == tuple(1 if k in axes else d for k, d in enumerate(shape))


@pytest.mark.parametrize(
    ("shape", "target", "rows"),
    [
        ((2, 3, 8), (2, 3, 8), 6),
        ((3, 8), (2, 3, 8), 3),
        ((1, 3, 8), (2, 3, 8), 3),
        ((8,), (2, 3, 8), 1),
        ((1, 1, 8), (2, 3, 8), 1),
        ((2, 1, 8), (2, 3, 8), None),  # broadcast in the middle
        ((2, 3, 1), (2, 3, 8), None),  # broadcast along the row
        ((5, 2, 3, 8), (2, 3, 8), None),  # more dims than the input
        ((1, 1), (4, 1), 1),
    ],
)
def test_trailing_rows(shape, target, rows):
    assert N.trailing_rows(shape, target) == rows


@pytest.mark.parametrize(
    ("shape", "target", "a", "fits"),
    [
        ((8,), (2, 3, 8), 2, True),
        ((1, 1, 8), (2, 3, 8), 2, True),
        ((3, 8), (2, 3, 8), 1, True),
        ((1, 3, 8), (2, 3, 8), 1, True),
        ((3, 8), (2, 3, 8), 2, False),  # varies along a dim that is not normalised
        ((2, 8), (2, 3, 8), 2, False),
        ((1, 1, 1, 8), (2, 3, 8), 2, False),  # would add a dim to the output
        ((1,), (2, 3, 8), 2, False),  # broadcast along the row
        ((8,), (2, 3, 8), 1, False),  # broadcast along a normalised dim
    ],
)
def test_fits_axes(shape, target, a, fits):
    assert N.fits_axes(shape, target, a) == fits


def _reduce_node(opset, attrs, axes_const=None, has_axes=False):
    ins = [ValueInfo("x", "tensor", np.dtype(np.float32), (2, 3))]
    if has_axes:
        ins.append(ValueInfo("axes", "tensor", np.dtype(np.int64), (1,), axes_const))
    return NodeInfo("ReduceSum", "", "r", opset, attrs, tuple(ins), (ValueInfo("y"),))


def test_static_axes():
    assert K.static_axes(_reduce_node(11, {"axes": [1, -1]}), 13) == (1, -1)
    assert K.static_axes(_reduce_node(11, {}), 13) == K.ALL_AXES
    assert K.static_axes(_reduce_node(13, {}, np.array([0]), True), 13) == (0,)
    assert K.static_axes(_reduce_node(13, {}, None, True), 13) == K.RUN_TIME
    assert K.static_axes(_reduce_node(13, {}), 13) == K.ALL_AXES
    assert K.static_axes(_reduce_node(13, {"noop_with_empty_axes": 1}), 13) == K.NO_REDUCTION
    empty = np.zeros(0, np.int64)
    assert K.static_axes(_reduce_node(13, {"noop_with_empty_axes": 1}, empty, True), 13) == (
        K.NO_REDUCTION
    )


def test_builders_import_and_decline_without_touching_the_device(monkeypatch):
    """Nodes the kernels leave to the generic kernel never compile anything."""

    def no_device(*a, **k):
        raise AssertionError("compiled for a node the generic kernel runs")

    monkeypatch.setattr(K, "compile_kernels", no_device)
    node = _reduce_node(13, {}, None, True)  # axes known per run only
    run = cuda_sum.reduce_sum(node, np)
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    np.testing.assert_array_equal(run(x, np.array([1]))[0], cpu_sum.reduce_sum(node, np)(x, [1])[0])
    ints = NodeInfo("ReduceSum", "", "r", 13, {}, (ValueInfo("x", "tensor", np.dtype(np.int64)),),
                    (ValueInfo("y"),))  # fmt: skip
    assert cuda_sum.reduce_sum(ints, np)(np.arange(4).reshape(2, 2))[0].tolist() == [[6]]


@pytest.mark.slow  # nvcc takes about a minute for all instantiations
@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not installed here")
@pytest.mark.parametrize("which", ["reduce", "softmax", "norm"])
def test_cuda_source_compiles_with_nvcc(which, tmp_path):
    """The emulator compiles the kernels with g++; nvcc (NVRTC's front end) checks the CUDA
    itself, every template instantiation, for sm_90."""
    from onnxep.providers_cuda.ops import op_softmax
    from onnxep.providers_cuda.ops import reduce_source as S
    from onnxep.providers_cuda.ops.norm_cuda import NORM_BODY, NORM_NAMES

    body, names = {
        "reduce": (S.REDUCE_BODY, S.ALL_REDUCE_NAMES),
        "softmax": (op_softmax.SOFTMAX_BODY, op_softmax.SOFTMAX_NAMES),
        "norm": (NORM_BODY, NORM_NAMES),
    }[which]
    refs = "".join(f"  p[{i}] = (void*)&{n};\n" for i, n in enumerate(names))
    cu = tmp_path / f"{which}.cu"
    cu.write_text(f"{S.PRIMITIVES}{body}\n__global__ void take_all(void** p) {{\n{refs}}}\n")
    cmd = ["nvcc", "-std=c++17", "-arch=sm_90", "-cubin", "-Xptxas", "-v", "-o",
           str(tmp_path / f"{which}.cubin"), str(cu)]  # fmt: skip
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-4000:]
    built = re.findall(r"Compiling entry function '(\w+)'", res.stderr)
    assert len(built) == len(names) + 1, res.stderr[-4000:]
    spills = re.findall(r"(\d+) bytes spill stores", res.stderr)
    assert spills and not any(int(b) for b in spills), "a kernel spills registers"
