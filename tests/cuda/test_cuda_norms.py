"""The CUDA norm kernel (SimplifiedLayerNormalization, SkipSimplifiedLayerNormalization,
LayerNormalization, SkipLayerNormalization) against the CPU provider.

LayerNormalization and SkipLayerNormalization share their kernel, ``norm_rows``,
and are tested here too. One-node models run with ``providers=["cuda"]`` and
``disable_fallback=True`` and are compared output by output with
``providers=["cpu"]`` at the project's per-dtype tolerances; each case also
names whether ``norm_rows`` must launch (once) or the generic kernel is the
right path. tests/test_cuda_kernels_emulated.py runs the same cases through the CPU
emulator of the kernels; the builder tests here (misaligned inputs, CUDA graph
capture) need CuPy.
"""

from __future__ import annotations

import zlib
from collections import Counter
from dataclasses import dataclass

import numpy as np
import pytest
from onnx import helper
from test_cuda_reduce import LENGTHS, check_model, count_launches, misaligned

from onnxep.testing import compare_output

F32, F16 = np.float32, np.float16
MSFT = "com.microsoft"
#: Output lists of SkipSimplifiedLayerNormalization: all four, and genai's (output, sum).
ALL_OUTS = ("y", "mean", "inv_std_var", "sum")
SUM_OUTS = ("y", "", "", "sum")


@pytest.fixture
def launches(monkeypatch):
    return count_launches(monkeypatch)


#: Case kind -> (op, domain, whether it takes a skip input).
OPS = {
    "rms": ("SimplifiedLayerNormalization", None, False),
    "skip": ("SkipSimplifiedLayerNormalization", MSFT, True),
    "ln": ("LayerNormalization", "", False),
    "skipln": ("SkipLayerNormalization", MSFT, True),
}


@dataclass(frozen=True)
class NormCase:
    op: str  # a key of OPS
    x: tuple[int, ...]
    w: tuple[int, ...]  # scale / gamma
    fused: bool  # whether norm_rows must launch (else the generic kernel runs)
    dtype: type = F32
    domain: str = ""  # SimplifiedLayerNormalization's ("" or com.microsoft)
    axis: int | None = None
    outputs: tuple[str, ...] = ("y",)  # "" skips an optional output
    skip: tuple[int, ...] | None = None  # skip's shape (default: x's)
    beta: bool = False  # LayerNormalization's B, SkipLayerNormalization's beta (w's shape)
    bias: bool = False  # the skip norms' bias (one row)
    stash_type: int | None = None
    eps: float = 1e-6

    @property
    def id(self) -> str:
        dims = "x".join(map(str, self.x))
        bits = [self.op, np.dtype(self.dtype).name, dims, "w" + "x".join(map(str, self.w))]
        if self.domain:
            bits.append("msft")
        if self.axis is not None:
            bits.append(f"axis{self.axis}")
        if self.skip is not None:
            bits.append("skip" + "x".join(map(str, self.skip)))
        bits += [name for name, on in (("beta", self.beta), ("bias", self.bias)) if on]
        if self.stash_type is not None:
            bits.append(f"stash{self.stash_type}")
        bits.append("out-" + "-".join(o or "_" for o in self.outputs))
        return "-".join(bits)


def norm_model(case: NormCase):
    elem = helper.np_dtype_to_tensor_dtype(np.dtype(case.dtype))
    rng = np.random.default_rng(zlib.crc32(case.id.encode()))
    op, domain, has_skip = OPS[case.op]
    domain = case.domain if domain is None else domain

    def arr(shape):
        return rng.standard_normal(shape).astype(case.dtype)

    attrs = {"epsilon": case.eps}
    if case.axis is not None:
        attrs["axis"] = case.axis
    if case.stash_type is not None:
        attrs["stash_type"] = case.stash_type
    names = ["x", "skip", "gamma"] if has_skip else ["x", "scale"]
    feeds = {"x": arr(case.x), names[-1]: arr(case.w)}
    if has_skip:
        feeds["skip"] = arr(case.skip or case.x)
    if case.beta:
        feeds["beta"] = arr(case.w)
    if case.op in ("ln", "skipln"):  # the layer norms' beta/B slot comes before the bias
        names.append("beta" if case.beta else "")
    if case.bias:
        feeds["bias"] = arr(case.w[-1:])
        names.append("bias")
    while not names[-1]:
        names.pop()
    node = helper.make_node(op, names, list(case.outputs), domain=domain, **attrs)
    ins = [helper.make_tensor_value_info(k, elem, list(feeds[k].shape)) for k in names if k]
    outs = []
    for name in case.outputs:
        if name:
            stat = name in ("mean", "inv_std_var")
            outs.append(helper.make_tensor_value_info(name, 1 if stat else elem, None))
    graph = helper.make_graph([node], op, ins, outs)
    imports = [helper.make_opsetid("", 17), helper.make_opsetid(MSFT, 1)]
    model = helper.make_model(graph, opset_imports=imports)
    return model, {k: feeds[k] for k in names if k}


def _norm_cases() -> list[NormCase]:
    cases = []
    for dt in (F32, F16):
        for n in LENGTHS:
            cases.append(NormCase("rms", (2, 3, n), (n,), True, dt))
            cases.append(NormCase("skip", (2, 3, n), (n,), True, dt))
            cases.append(NormCase("skip", (2, 3, n), (n,), True, dt, bias=True, outputs=ALL_OUTS))
            cases.append(NormCase("ln", (2, 3, n), (n,), True, dt, beta=True))
            cases.append(
                NormCase("skipln", (2, 3, n), (n,), True, dt, beta=True, bias=True,
                         outputs=ALL_OUTS)
            )  # fmt: skip
        cases += [
            NormCase("rms", (4, 896), (896,), True, dt, MSFT, outputs=("y", "inv_std_var")),
            NormCase("rms", (2, 3, 64), (3, 64), True, dt, axis=1),
            NormCase("rms", (2, 3, 64), (1, 64), True, dt, axis=-1),
            NormCase("rms", (2, 3, 7), (3, 7), True, dt, axis=-2, outputs=("y", "inv_std_var")),
            NormCase("skip", (2, 3, 64), (64,), True, dt, outputs=SUM_OUTS),
            NormCase("skip", (2, 3, 896), (896,), True, dt, skip=(3, 896), bias=True),
            NormCase("skip", (2, 3, 64), (64,), True, dt, skip=(1, 3, 64), outputs=SUM_OUTS),
            NormCase("skip", (5, 4097), (4097,), True, dt, outputs=("y", "", "inv_std_var")),
            NormCase("skip", (1, 1, 896), (896,), True, dt, bias=True, outputs=SUM_OUTS),
            NormCase("ln", (4, 896), (896,), True, dt, outputs=("y", "mean", "inv_std_var")),
            NormCase("ln", (2, 3, 64), (3, 64), True, dt, axis=1, beta=True),
            NormCase("ln", (2, 3, 7), (3, 7), True, dt, axis=-2, beta=True, outputs=("y", "mean")),
            NormCase("skipln", (2, 3, 64), (64,), True, dt, outputs=SUM_OUTS),
            NormCase("skipln", (2, 3, 896), (896,), True, dt, skip=(3, 896), beta=True),
            NormCase("skipln", (2, 3, 64), (64,), True, dt, bias=True, outputs=ALL_OUTS),
            # what the kernel leaves to the generic kernel (still on the device)
            NormCase("rms", (2, 3, 64), (1,), False, dt),
            NormCase("rms", (2, 3, 64), (64,), False, dt, stash_type=11),
            NormCase("skip", (2, 3, 64), (64,), False, dt, skip=(2, 1, 64)),
            NormCase("ln", (2, 3, 64), (1,), False, dt, beta=True),
            NormCase("skipln", (2, 3, 64), (64,), False, dt, skip=(2, 1, 64), beta=True),
        ]  # fmt: skip
    for op in OPS:
        cases.append(NormCase(op, (2, 3, 64), (64,), False, np.float64, beta=op == "ln"))
    cases.append(NormCase("rms", (0, 64), (64,), True, outputs=("y", "inv_std_var")))
    cases.append(NormCase("ln", (0, 64), (64,), True, outputs=("y", "mean", "inv_std_var")))
    return cases


NORM_CASES = _norm_cases()


def check_norm(case: NormCase, provider: str, launches: Counter) -> None:
    model, feeds = norm_model(case)
    expect = {"norm_rows"} if case.fused and case.x[0] else set()
    check_model(model, feeds, provider, launches, expect, case.id)
    if expect:
        assert launches["norm_rows"] == 1, f"{case.id}: norm_rows launched {launches['norm_rows']}x"


@pytest.mark.parametrize("case", NORM_CASES, ids=lambda c: c.id)
def test_norm_matches_cpu(case, launches):
    check_norm(case, "cuda", launches)


# ----------------------------------------------------------------------------- builders on CuPy


def _nodes():
    from onnxep.providers.node import NodeInfo, ValueInfo

    def node(op, domain, names, dt, shapes, outs):
        ins = tuple(ValueInfo(n, "tensor", np.dtype(dt), s) for n, s in zip(names, shapes))
        outputs = tuple(ValueInfo(o, "tensor") if o else None for o in outs)
        return NodeInfo(op, domain, op, 17, {"epsilon": 1e-6}, ins, outputs)

    return node


NORM_BUILDERS = ("rms", "skip", "ln", "skipln")


def norm_builders(dt):
    """(node, CUDA builder, CPU builder) of each op in NORM_BUILDERS, for rows of 256."""
    from onnxep.providers.ops import op_layer_normalization as cpu_ln
    from onnxep.providers.ops import op_simplified_layer_normalization as cpu_rms
    from onnxep.providers.ops import op_skip_layer_normalization as cpu_skipln
    from onnxep.providers.ops import op_skip_simplified_layer_normalization as cpu_skip
    from onnxep.providers_cuda.ops import op_layer_normalization as cuda_ln
    from onnxep.providers_cuda.ops import op_simplified_layer_normalization as cuda_rms
    from onnxep.providers_cuda.ops import op_skip_layer_normalization as cuda_skipln
    from onnxep.providers_cuda.ops import (
        op_skip_simplified_layer_normalization as cuda_skip,
    )

    node = _nodes()
    row, rows = (256,), (3, 256)
    rms = node("SimplifiedLayerNormalization", "", ["x", "scale"], dt, [rows, row], ["y"])
    skip = node(
        "SkipSimplifiedLayerNormalization",
        MSFT,
        ["x", "skip", "gamma", "bias"],
        dt,
        [rows, rows, row, row],
        ["y", "", "", "sum"],
    )
    ln = node(
        "LayerNormalization", "", ["x", "scale", "b"], dt, [rows, row, row], ["y", "mean", "inv"]
    )
    skipln = node(
        "SkipLayerNormalization",
        MSFT,
        ["x", "skip", "gamma", "beta", "bias"],
        dt,
        [rows, rows, row, row, row],
        ["y", "mean", "inv", "sum"],
    )
    return (
        (rms, cuda_rms.simplified_layer_normalization, cpu_rms.simplified_layer_normalization),
        (skip, cuda_skip.skip_simplified_layer_normalization,
         cpu_skip.skip_simplified_layer_normalization),
        (ln, cuda_ln.layer_normalization, cpu_ln.layer_normalization),
        (skipln, cuda_skipln.skip_layer_normalization, cpu_skipln.skip_layer_normalization),
    )  # fmt: skip


def run_misaligned(xp, to_host, dt, which):
    """Each operand in turn 2-4 bytes off a 16-byte boundary: the vector path must be refused
    and the answer unchanged."""
    node, build, ref = norm_builders(dt)[which]
    shapes = [v.shape for v in node.inputs]
    for bad in range(len(shapes)):
        args, host = [], []
        for k, s in enumerate(shapes):
            if k == bad:
                a, h = misaligned(xp, s, dt, k)
            else:
                h = np.random.default_rng(k).uniform(0.5, 1.5, s).astype(dt)
                a = xp.asarray(h)
            args.append(a)
            host.append(h)
        got = build(node, xp)(*args)
        want = ref(node, np)(*host)
        for j, (g, w) in enumerate(zip(got, want)):
            if w is None:
                assert g is None
                continue
            res = compare_output(f"{node.op_type} out {j} (operand {bad} misaligned)",
                                 to_host(g), w, "kernel", "numpy")  # fmt: skip
            assert all(r.ok for r in res), [r.describe() for r in res]


@pytest.mark.parametrize("which", range(4), ids=NORM_BUILDERS)
@pytest.mark.parametrize("dt", [F32, F16])
def test_misaligned_operands_take_the_scalar_path(dt, which):
    import cupy

    run_misaligned(cupy, cupy.asnumpy, dt, which)


def test_skip_norm_captures_and_replays():
    """No host read or synchronization: a CUDA graph records the call and replays it with
    new input values."""
    import cupy

    node, build, ref = norm_builders(F16)[1]
    rng = np.random.default_rng(11)
    host = [rng.standard_normal(v.shape).astype(F16) for v in node.inputs]
    pool = cupy.cuda.MemoryPool()
    stream = cupy.cuda.Stream(non_blocking=True)
    with cupy.cuda.using_allocator(pool.malloc), stream:
        run = build(node, cupy)
        args = [cupy.asarray(h) for h in host]
        run(*args)
        stream.synchronize()
        stream.begin_capture()
        outs = run(*args)
        graph = stream.end_capture()
    for step in range(2):
        host[0] = (rng.standard_normal(host[0].shape) * (step + 2)).astype(F16)
        args[0].set(host[0], stream=stream)
        graph.launch(stream)
        stream.synchronize()
        want = ref(node, np)(*host)
        for j in (0, 3):
            res = compare_output(f"replay {step} out {j}", cupy.asnumpy(outs[j]), want[j],
                                 "cuda", "numpy")  # fmt: skip
            assert all(r.ok for r in res), [r.describe() for r in res]
