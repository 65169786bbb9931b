"""The CUDA index kernels (Gather, GatherElements, GatherND, ScatterElements, ScatterND).

Each case is checked twice: its kernel built directly (launches counted, so
a case that silently took the generic kernel fails) against the CPU
provider's generic kernel, and as a one-node model on ``providers=["cuda"]``
with ``disable_fallback=True`` against ``providers=["cpu"]``. Out-of-range
indices must raise RunError on the run's output copy -- quoting the node,
the index, where it sits and the valid range -- with the session usable
afterwards; a run must read back nothing but its outputs; a captured launch
must replay with new indices and report a bad one at the next sync.

tests/test_cuda_index_emulated.py runs the same builder cases through the
CPU emulator of these kernels (no GPU needed).
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pytest
from onnx import helper, numpy_helper

import onnxep
from onnxep.errors import RunError
from onnxep.providers.node import NodeInfo, ValueInfo
from onnxep.providers_cuda import error_flag

F16, F32, F64 = np.float16, np.float32, np.float64
I32, I64 = np.int32, np.int64


# ----------------------------------------------------------------------------- the cases


@dataclass
class IndexCase:
    """One node: inputs (data, indices[, updates]), attributes, opset; ``bad`` is the out-of-range
    entry's (value, position, axis, dim) when the case must raise."""

    id: str
    op: str
    inputs: tuple[np.ndarray, ...]
    attrs: dict[str, Any] = field(default_factory=dict)
    opset: int = 18
    bad: tuple[int, tuple[int, ...], int, int] | None = None
    kernel: str = ""  # the kernel name (without template arguments) it must launch


def random_data(shape, dtype, seed):
    rng = np.random.default_rng(seed)
    if np.dtype(dtype).kind == "b":
        return rng.random(shape) < 0.5
    if np.dtype(dtype).kind in "iu":
        return rng.integers(-50, 50, shape).astype(dtype)
    return (rng.standard_normal(shape) * 3).astype(dtype)


def quarter_data(shape, dtype, seed):
    """Multiples of 1/4 below 8 in size: float16 sums of a few are exact in any order, so a
    reduction's duplicates may be combined in any order (the GPU's atomics pick one)."""
    return (np.random.default_rng(seed).integers(-32, 32, shape) / 4).astype(dtype)


def _i(values, dtype=I64):
    return np.asarray(values, dtype=dtype)


def gather_case(id, data, idx, axis=0, **kw):
    return IndexCase(id, "Gather", (data, idx), {"axis": axis}, kernel="ix_gather", **kw)


def elements_case(id, data, idx, axis=0, **kw):
    return IndexCase(
        id, "GatherElements", (data, idx), {"axis": axis}, kernel="ix_gather_elements", **kw
    )


def nd_case(id, data, idx, b=0, **kw):
    return IndexCase(id, "GatherND", (data, idx), {"batch_dims": b}, kernel="ix_gather_nd", **kw)


def scatter_case(id, data, idx, upd, axis=0, reduction="none", op="ScatterElements", **kw):
    attrs = {"axis": axis} | ({} if op == "Scatter" else {"reduction": reduction})
    kw.setdefault("opset", 10 if op == "Scatter" else 18)
    return IndexCase(id, op, (data, idx, upd), attrs, kernel="ix_scatter_elements", **kw)


def scatter_nd_case(id, data, idx, upd, reduction="none", **kw):
    return IndexCase(
        id, "ScatterND", (data, idx, upd), {"reduction": reduction}, kernel="ix_scatter_nd", **kw
    )


CASES = [
    # Gather: row copies in units of 4 (f32 rows of 7), 16 (f16 rows of 16 and 896), 8 (i64
    # rows of 3 -> 24 bytes), 1 (bool); negative indices, a scalar index, the last axis.
    gather_case("gather-f32-rows", random_data((5, 7), F32, 1), _i([[0, -1], [4, 2]])),
    gather_case("gather-f16-vec16", random_data((3, 16), F16, 2), _i([2, -3, 1], I32)),
    gather_case("gather-f16-embedding", random_data((50, 896), F16, 3), _i([[7, 49, -50]])),
    gather_case("gather-i64-axis1", random_data((2, 5, 3), I64, 4), _i([[-5, 4, 0]], I32), axis=1),
    gather_case(
        "gather-f32-last-axis", random_data((4, 6), F32, 5), _i([[5, -6, 0], [1, 2, 3]]), axis=-1
    ),
    gather_case("gather-f16-scalar-index", random_data((6, 4), F16, 6), _i(-2)),
    gather_case("gather-bool", random_data((3, 5), bool, 7), _i([4, -1]), axis=1),
    gather_case(
        "gather-f32-bad-high",
        random_data((5, 3), F32, 8),
        _i([[1, 5], [0, 2]]),
        bad=(5, (0, 1), 0, 5),
    ),
    gather_case(
        "gather-f16-bad-low",
        random_data((2, 4, 2), F16, 9),
        _i([0, -5], I32),
        axis=1,
        bad=(-5, (1,), 1, 4),
    ),
    # GatherElements: indices shorter than data off the axis, each axis, both index types.
    elements_case(
        "elements-f32-axis1",
        random_data((3, 4, 5), F32, 10),
        np.random.default_rng(11).integers(-4, 4, (3, 2, 5)),
        axis=1,
    ),
    elements_case(
        "elements-f16-short", random_data((4, 3, 2), F16, 12), _i([[[1], [-4], [3]]] * 2, I32)
    ),
    elements_case("elements-i64-1d", random_data((6,), I64, 13), _i([5, -6, 0, 2])),
    elements_case(
        "elements-f32-last",
        random_data((2, 3, 4), F32, 14),
        np.random.default_rng(15).integers(-4, 4, (2, 3, 4)).astype(I32),
        axis=-1,
    ),
    elements_case(
        "elements-f32-bad",
        random_data((3, 4), F32, 16),
        _i([[0, 1], [2, -5], [1, 0]]),
        axis=1,
        bad=(-5, (1, 1), 1, 4),
    ),
    # GatherND: scalars, rows, batch dims, a 16-byte slice.
    nd_case("nd-f32-rows", random_data((4, 5, 3), F32, 17), _i([[1, -1], [3, 0]])),
    nd_case(
        "nd-f16-batch",
        random_data((2, 3, 4, 8), F16, 18),
        _i([[[2, -1], [0, 3]], [[-3, 1], [1, 1]]], I32),
        b=1,
    ),
    nd_case("nd-i64-scalars", random_data((3, 4), I64, 19), _i([[2, 3], [-3, -4]])),
    nd_case("nd-f32-k1", random_data((2, 3), F32, 20), _i([[1], [-2], [0]])),
    nd_case(
        "nd-f32-bad", random_data((4, 5), F32, 21), _i([[1, 2], [3, 5]]), bad=(5, (1, 1), 1, 5)
    ),
    # ScatterElements: each reduction, each reducible dtype, the deprecated Scatter.
    scatter_case(
        "scatter-f32-none",
        random_data((4, 5), F32, 22),
        _i([[0, -1, 2, 3, 1], [1, 0, -4, 2, 3]]),
        random_data((2, 5), F32, 23),
    ),
    scatter_case(
        "scatter-f16-add",
        quarter_data((3, 4), F16, 24),
        _i([[1, 1, -1], [0, 3, 3], [2, 2, 2]], I32),
        quarter_data((3, 3), F16, 25),
        axis=1,
        reduction="add",
    ),
    scatter_case(
        "scatter-i64-mul",
        random_data((5,), I64, 26) % 5,
        _i([1, 1, -4, 0]),
        _i([3, -2, 2, 7]),
        reduction="mul",
    ),
    scatter_case(
        "scatter-f32-max-nan",
        random_data((2, 6), F32, 27),
        _i([[0, 0, 5], [-1, 2, 2]]),
        np.array([[1.0, np.nan, 0.5], [9.0, -9.0, 30.0]], F32),
        axis=1,
        reduction="max",
    ),
    scatter_case(
        "scatter-i32-min",
        random_data((3, 3), I32, 28),
        _i([[2, 0, 1], [2, -3, 1]], I32),
        _i([[-60, 3, 70], [-70, -1, 80]], I32),
        reduction="min",
    ),
    scatter_case(
        "scatter-f64-add",
        random_data((4,), F64, 29),
        _i([3, 3, -1, 0]),
        random_data((4,), F64, 30),
        reduction="add",
    ),
    scatter_case(
        "scatter-f16-min",
        random_data((2, 3), F16, 31),
        _i([[1, 1, 0]]),
        random_data((1, 3), F16, 32),
        axis=1,
        reduction="min",
    ),
    scatter_case(
        "scatter-deprecated",
        random_data((3, 4), F32, 33),
        _i([[2, -1, 0, 1]]),
        random_data((1, 4), F32, 34),
        op="Scatter",
    ),
    scatter_case(
        "scatter-f32-bad",
        random_data((3, 4), F32, 35),
        _i([[0, 1, 3, 1]]),
        random_data((1, 4), F32, 36),
        bad=(3, (0, 2), 0, 3),
    ),
    # ScatterND: rows and elements, each reduction.
    scatter_nd_case(
        "scatternd-f32-rows",
        random_data((4, 5), F32, 37),
        _i([[-1], [1]]),
        random_data((2, 5), F32, 38),
    ),
    scatter_nd_case(
        "scatternd-f16-add",
        quarter_data((2, 3, 8), F16, 39),
        _i([[1, 2], [0, 0], [1, -1]], I32),
        quarter_data((3, 8), F16, 40),
        reduction="add",
    ),
    scatter_nd_case(
        "scatternd-i64-mul",
        random_data((4, 4), I64, 41) % 4,
        _i([[0, 1], [0, 1], [3, -1]]),
        _i([2, -3, 5]),
        reduction="mul",
    ),
    scatter_nd_case(
        "scatternd-f32-max",
        random_data((5,), F32, 42),
        _i([[4], [4], [-5], [2]]),
        random_data((4,), F32, 43),
        reduction="max",
    ),
    scatter_nd_case(
        "scatternd-i32-min",
        random_data((3, 4), I32, 44),
        _i([[2, 2], [2, 2]]),
        _i([-99, -98], I32),
        reduction="min",
    ),
    scatter_nd_case(
        "scatternd-f64-none",
        random_data((3, 2), F64, 45),
        _i([[0], [2]]),
        random_data((2, 2), F64, 46),
    ),
    scatter_nd_case(
        "scatternd-f32-bad",
        random_data((3, 2), F32, 47),
        _i([[2], [-4]]),  # clamped to [[2], [0]]: still distinct rows
        random_data((2, 2), F32, 48),
        bad=(-4, (1, 0), 0, 3),
    ),
]
GOOD = [c for c in CASES if c.bad is None]
BAD = [c for c in CASES if c.bad is not None]
BAD_GATHERS = [c for c in BAD if c.op.startswith("Gather")]


def node_for(case: IndexCase) -> NodeInfo:
    names = ("data", "indices", "updates")
    ins = tuple(ValueInfo(n, "tensor", a.dtype, tuple(a.shape)) for n, a in zip(names, case.inputs))
    out = ValueInfo("out", "tensor", case.inputs[0].dtype, None)
    return NodeInfo(
        case.op,
        name=f"{case.id}-node",
        opset=case.opset,
        attrs=case.attrs,
        inputs=ins,
        outputs=(out,),
    )


def builders(op: str):
    """(the CUDA builder, the generic builder) of ``op``."""
    from onnxep.providers.ops import (
        op_gather,
        op_gather_elements,
        op_gather_nd,
        op_scatter_elements,
        op_scatter_nd,
    )
    from onnxep.providers_cuda.ops import op_gather as c_gather
    from onnxep.providers_cuda.ops import op_gather_elements as c_elements
    from onnxep.providers_cuda.ops import op_gather_nd as c_nd
    from onnxep.providers_cuda.ops import op_scatter_elements as c_scatter
    from onnxep.providers_cuda.ops import op_scatter_nd as c_scatter_nd

    return {
        "Gather": (c_gather.gather, op_gather.gather),
        "GatherElements": (c_elements.gather_elements, op_gather_elements.gather_elements),
        "GatherND": (c_nd.gather_nd, op_gather_nd.gather_nd),
        "ScatterElements": (c_scatter.scatter_elements, op_scatter_elements.scatter_elements),
        "Scatter": (c_scatter.scatter_old, op_scatter_elements.scatter_old),
        "ScatterND": (c_scatter_nd.scatter_nd, op_scatter_nd.scatter_nd),
    }[op]


def tolerance(dtype) -> tuple[float, float]:
    """(rtol, atol): reductions may combine duplicates in another order than NumPy."""
    return {F16: (1e-3, 2.5e-3), F32: (1e-5, 1e-5), F64: (1e-12, 1e-12)}.get(
        np.dtype(dtype).type, (0, 0)
    )


def assert_matches(got: np.ndarray, want: np.ndarray, what: str) -> None:
    assert got.dtype == want.dtype and got.shape == want.shape, (
        what,
        got.dtype,
        got.shape,
        want.dtype,
        want.shape,
    )
    rtol, atol = tolerance(want.dtype)
    if rtol == 0:
        np.testing.assert_array_equal(got, want, err_msg=what)
    else:
        np.testing.assert_allclose(got.astype(F64), want.astype(F64), rtol, atol, err_msg=what)


def clamped(case: IndexCase) -> IndexCase:
    """The case with its bad index replaced by 0 (what the other entries must equal); cases
    pick indices so that a plain scatter still writes distinct places."""
    value, pos, _, _ = case.bad
    idx = case.inputs[1].copy()
    assert idx[pos] == value
    idx[pos] = 0
    return IndexCase(
        case.id, case.op, (case.inputs[0], idx, *case.inputs[2:]), case.attrs, case.opset
    )


# ----------------------------------------------------------------------------- builder checks


class _Counted:
    def __init__(self, launch, name, device):
        self.launch, self.name, self.device = launch, name, device

    def __call__(self, *args):
        self.device.counts[self.name.split("<")[0]] += 1
        self.device.instances[self.name] += 1
        return self.launch(*args)


class CountingDevice:
    """A device door that counts launches by kernel name (``counts``, template arguments
    dropped) and by instantiation (``instances``)."""

    def __init__(self, device):
        self._device = device
        self.counts: Counter = Counter()
        self.instances: Counter = Counter()

    def kernels(self, body, names, signature):
        real = self._device.kernels(body, names, signature)
        return {n: _Counted(k, n, self) for n, k in real.items()}

    def __getattr__(self, name):
        return getattr(self._device, name)


def run_built(case: IndexCase, xp, upload, download, flag, sync) -> list[np.ndarray]:
    """The CUDA kernel of ``case`` built under ``flag``, run on uploaded inputs; outputs after
    ``sync`` (which raises what the flag holds)."""
    cuda, _ = builders(case.op)
    with error_flag.building(flag):
        fn = cuda(node_for(case), xp)
    outs = fn(*[upload(a) for a in case.inputs])
    sync()
    return [download(o) for o in outs]


def expected(case: IndexCase) -> list[np.ndarray]:
    _, cpu = builders(case.op)
    return list(cpu(node_for(case), np)(*[a.copy() for a in case.inputs]))


def check_good(case, xp, upload, download, flag, sync, counts) -> None:
    got = run_built(case, xp, upload, download, flag, sync)
    assert counts[case.kernel] == 1, (case.id, dict(counts))
    for g, w in zip(got, expected(case), strict=True):
        assert_matches(g, w, case.id)


def check_bad(case, xp, upload, download, flag, sync, counts) -> None:
    """The bad index raises at the sync, naming the node, value, position, axis and range; the
    other entries are right and a gather's bad rows are zeros; the flag is clear afterwards."""
    value, pos, axis, dim = case.bad
    where = "indices[" + ", ".join(map(str, pos)) + "]"
    with pytest.raises(RunError) as info:
        run_built(case, xp, upload, download, flag, sync)
    msg = str(info.value)
    assert f"{case.op} node '{case.id}-node'" in msg, msg
    assert f"indices value {value} at {where} is out of range for axis {axis} of size {dim}" in msg
    assert f"valid values are {-dim} to {dim - 1}" in msg, msg
    assert counts[case.kernel] == 1
    sync()  # cleared: nothing more to raise
    got = run_built(clamped(case), xp, upload, download, flag, sync)
    want = expected(clamped(case))
    for g, w in zip(got, want, strict=True):
        assert_matches(g, w, case.id)


def check_zero_rows(case, xp, upload, download, flag, sync, counts) -> None:
    """A gather writes zeros where its index is bad, and the right values elsewhere."""
    cuda, _ = builders(case.op)
    with error_flag.building(flag):
        fn = cuda(node_for(case), xp)
    (out,) = fn(*[upload(a) for a in case.inputs])
    with pytest.raises(RunError):
        sync()
    got = download(out)
    (want,) = expected(clamped(case))
    _, pos, axis, _ = case.bad
    bad = np.zeros(case.inputs[1].shape, bool)
    bad[pos] = True
    if case.op == "GatherND":
        bad = bad.any(axis=-1)
    if case.op == "Gather":  # the bad entry's slice along the axis of the output
        sel = (slice(None),) * (axis % case.inputs[0].ndim) + (bad,)
    else:
        sel = (bad,)
    assert not got[sel].any()
    keep = np.ones(got.shape, bool)
    keep[sel] = False
    np.testing.assert_array_equal(got[keep], want[keep])


# ----------------------------------------------------------------------------- on the GPU


@pytest.fixture
def gpu_device(monkeypatch):
    """(cupy, upload, download, flag, sync, counting device) on a fresh stream."""
    import cupy

    from onnxep.providers_cuda.ops import index_cuda

    stream = cupy.cuda.Stream(non_blocking=True)
    with stream:
        flag = error_flag.ErrorFlag.on_device(cupy, stream)
        counting = CountingDevice(index_cuda.device_for(cupy))
        monkeypatch.setattr(index_cuda, "device_for", lambda xp: counting)

        def sync():
            flag.before_sync()
            stream.synchronize()
            flag.after_sync()

        yield cupy, cupy.asarray, cupy.asnumpy, flag, sync, counting


@pytest.fixture
def gpu(gpu_device):
    """(cupy, upload, download, flag, sync, launch counts)."""
    *rest, device = gpu_device
    return (*rest, device.counts)


@pytest.mark.parametrize("case", GOOD, ids=lambda c: c.id)
def test_builder_matches_cpu(case, gpu):
    check_good(case, *gpu)


@pytest.mark.parametrize("case", BAD, ids=lambda c: c.id)
def test_builder_reports_bad_index(case, gpu):
    check_bad(case, *gpu)


@pytest.mark.parametrize("case", BAD_GATHERS, ids=lambda c: c.id)
def test_gathers_write_zeros_for_a_bad_index(case, gpu):
    check_zero_rows(case, *gpu)


def check_row_units(xp, upload, download, flag, sync, device, address) -> None:
    """16-byte rows of float16 gather in 16-byte units from an aligned table, in 2-byte units
    from a view 2 bytes off (and right both ways)."""
    base = random_data((33 * 16 + 1,), F16, 50)
    ids = _i([3, -1, 0])
    for offset, unit in ((0, "uint4"), (1, "unsigned short")):
        host = base[offset : offset + 33 * 16].reshape(33, 16)
        table = upload(base)[offset : offset + 33 * 16].reshape(33, 16)
        assert (address(table) % 16 == 0) == (offset == 0)
        case = gather_case(f"units-{offset}", host, ids)
        with error_flag.building(flag):
            fn = builders("Gather")[0](node_for(case), xp)
        (got,) = fn(table, upload(ids))
        sync()
        np.testing.assert_array_equal(download(got), host[ids])
        assert device.instances[f"ix_gather<{unit}, long long>"] == 1, dict(device.instances)


def test_rows_copy_in_the_widest_aligned_units(gpu_device):
    check_row_units(*gpu_device, lambda a: a.data.ptr)


# ----------------------------------------------------------------------------- sessions


def model_for(case: IndexCase, data_as_constant: bool = False):
    from onnx.helper import np_dtype_to_tensor_dtype

    names = ["data", "indices", "updates"][: len(case.inputs)]
    node = helper.make_node(case.op, names, ["out"], name=f"{case.id}-node", **case.attrs)
    ins, inits = [], []
    for n, a in zip(names, case.inputs):
        if n == "data" and data_as_constant:
            inits.append(numpy_helper.from_array(a, n))
        else:
            ins.append(helper.make_tensor_value_info(n, np_dtype_to_tensor_dtype(a.dtype), a.shape))
    elem = np_dtype_to_tensor_dtype(case.inputs[0].dtype)
    out = helper.make_tensor_value_info("out", elem, None)
    graph = helper.make_graph([node], case.id, ins, [out], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", case.opset)])


def feeds_for(case: IndexCase, data_as_constant: bool = False) -> dict[str, np.ndarray]:
    names = ["data", "indices", "updates"]
    return {n: a for n, a in zip(names, case.inputs) if not (n == "data" and data_as_constant)}


def _sessions(case, data_as_constant=False):
    m = model_for(case, data_as_constant)
    gpu = onnxep.InferenceSession(m, onnxep.SessionOptions(disable_fallback=True), ["cuda"])
    cpu = onnxep.InferenceSession(m, providers=["cpu"])
    return gpu, cpu


@pytest.mark.parametrize("case", GOOD, ids=lambda c: c.id)
def test_session_matches_cpu(case):
    gpu, cpu = _sessions(case)
    f = feeds_for(case)
    (want,) = cpu.run(None, f)
    (got,) = gpu.run(None, f)
    assert_matches(got, want, case.id)


def check_session_raises(case, gpu, cpu) -> None:
    """A good run, the bad run (RunError from the step that copies the output, quoting the
    index node, the index, where it sits and the axis), then a good run again."""
    good = clamped(case)
    (want,) = cpu.run(None, feeds_for(good))
    assert_matches(gpu.run(None, feeds_for(good))[0], want, case.id)
    value, pos, axis, dim = case.bad
    with pytest.raises(RunError) as info:
        gpu.run(None, feeds_for(case))
    msg = str(info.value)
    assert "copy out" in msg, msg  # the step that read the output
    where = "indices[" + ", ".join(map(str, pos)) + "]"
    assert re.search(
        rf"{case.op} node '{re.escape(case.id)}-node': indices value {value} at "
        rf"{re.escape(where)} is out of range for axis {axis} of size {dim}",
        msg,
    ), msg
    assert_matches(gpu.run(None, feeds_for(good))[0], want, case.id)


@pytest.mark.parametrize("case", BAD, ids=lambda c: c.id)
def test_session_raises_on_the_output_copy_and_stays_usable(case):
    gpu, cpu = _sessions(case)
    check_session_raises(case, gpu, cpu)
    assert gpu.providers[0].error_flag.raised == 1


def test_a_bad_first_run_raises_too():
    case = BAD[0]
    gpu, _ = _sessions(case)
    with pytest.raises(RunError, match=rf"Gather node '{case.id}-node': indices value 5"):
        gpu.run(None, feeds_for(case))


def test_a_run_reads_back_only_its_outputs():
    """An embedding lookup and a GatherND on device data: the only device-to-host read of a run
    is its output, the index kernels ran (not the generic kernels, whose bounds check reads a
    flag back), and the flag costs no read of its own."""
    from onnxep.providers_cuda.ops import index_cuda

    real = index_cuda.device_for
    nodes = [
        helper.make_node("Gather", ["table", "ids"], ["rows"], name="embed"),
        helper.make_node("GatherND", ["rows", "pick"], ["out"], name="pick"),
    ]
    table = random_data((64, 96), F16, 60)
    graph = helper.make_graph(
        nodes,
        "g",
        [
            helper.make_tensor_value_info("ids", 7, [2, 3]),
            helper.make_tensor_value_info("pick", 7, [2, 2]),
        ],
        [helper.make_tensor_value_info("out", 10, None)],
        [numpy_helper.from_array(table, "table")],
    )
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    mp = pytest.MonkeyPatch()
    counting: dict[str, CountingDevice] = {}

    def counted(xp):
        dev = real(xp)
        return counting.setdefault("dev", CountingDevice(dev)) if dev is not None else None

    mp.setattr(index_cuda, "device_for", counted)
    try:
        sess = onnxep.InferenceSession(m, onnxep.SessionOptions(disable_fallback=True), ["cuda"])
    finally:
        mp.undo()
    cuda = sess.providers[0]
    f = {"ids": _i([[1, -1, 5], [63, 0, 2]]), "pick": _i([[0, 2], [1, -1]])}
    sess.run(None, f)
    before, flag_reads = cuda.transfer_counts(), cuda.error_flag.reads
    (got,) = sess.run(None, f)
    after = cuda.transfer_counts()
    assert after["device_to_host"] - before["device_to_host"] == 1
    assert cuda.error_flag.reads - flag_reads == 1  # rides on the output's own wait
    assert counting["dev"].counts == Counter({"ix_gather": 2, "ix_gather_nd": 2})
    rows = table[f["ids"]]
    np.testing.assert_array_equal(got, rows[[0, 1], [2, -1]])


def test_capture_replays_new_indices_and_reports_a_bad_one():
    """The Gather launch records into a CUDA graph (a host read inside capture would fail it);
    replays with new indices written into the same buffer give the new rows, and a replay with
    a bad index raises at the next sync and leaves the flag clear."""
    import cupy

    case = gather_case("captured", random_data((40, 128), F16, 70), _i([3, -1, 17]))
    stream = cupy.cuda.Stream(non_blocking=True)
    pool = cupy.cuda.MemoryPool()
    with cupy.cuda.using_allocator(pool.malloc), stream:
        flag = error_flag.ErrorFlag.on_device(cupy, stream)
        with error_flag.building(flag):
            fn = builders("Gather")[0](node_for(case), cupy)
        table = cupy.asarray(case.inputs[0])
        ids = cupy.asarray(case.inputs[1])
        fn(table, ids)  # warm-up: module loaded, plan made, pool blocks cached
        stream.synchronize()
        stream.begin_capture()
        (out,) = fn(table, ids)
        graph = stream.end_capture()

    def sync():
        flag.before_sync()
        stream.synchronize()
        flag.after_sync()

    for step, new in enumerate(([0, 39, -40], [5, 5, -2])):
        ids.set(_i(new), stream=stream)
        graph.launch(stream)
        sync()
        np.testing.assert_array_equal(cupy.asnumpy(out), case.inputs[0][new], err_msg=str(step))
    ids.set(_i([1, 40, 2]), stream=stream)
    graph.launch(stream)
    with pytest.raises(RunError, match=r"indices value 40 at indices\[1\] .* size 40"):
        sync()
    got = cupy.asnumpy(out)
    assert not got[1].any()  # the bad row is zeros
    np.testing.assert_array_equal(got[[0, 2]], case.inputs[0][[1, 2]])
    sync()  # cleared
