"""The CUDA RMS-norm kernels (SimplifiedLayerNormalization, SkipSimplifiedLayerNormalization)
against the CPU provider.

One-node models run with ``providers=["cuda"]`` and ``disable_fallback=True``
and are compared output by output with ``providers=["cpu"]`` at the
project's per-dtype tolerances; each case also names whether the fused
``rms_norm`` kernel must launch (once) or the generic kernel is the right
path. tests/test_cuda_kernels_emulated.py runs the same cases through the CPU
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


@dataclass(frozen=True)
class NormCase:
    op: str  # "rms" (SimplifiedLayerNormalization) or "skip" (SkipSimplifiedLayerNormalization)
    x: tuple[int, ...]
    w: tuple[int, ...]  # scale / gamma
    fused: bool  # whether rms_norm must launch (else the generic kernel runs)
    dtype: type = F32
    domain: str = ""
    axis: int | None = None
    outputs: tuple[str, ...] = ("y",)  # "" skips an optional output
    skip: tuple[int, ...] | None = None  # skip's shape (default: x's)
    bias: bool = False
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
        if self.bias:
            bits.append("bias")
        if self.stash_type is not None:
            bits.append(f"stash{self.stash_type}")
        bits.append("out-" + "-".join(o or "_" for o in self.outputs))
        return "-".join(bits)


def norm_model(case: NormCase):
    elem = helper.np_dtype_to_tensor_dtype(np.dtype(case.dtype))
    rng = np.random.default_rng(zlib.crc32(case.id.encode()))

    def arr(shape):
        return rng.standard_normal(shape).astype(case.dtype)

    attrs = {"epsilon": case.eps}
    if case.axis is not None:
        attrs["axis"] = case.axis
    if case.stash_type is not None:
        attrs["stash_type"] = case.stash_type
    if case.op == "rms":
        op, domain = "SimplifiedLayerNormalization", case.domain
        feeds = {"x": arr(case.x), "scale": arr(case.w)}
    else:
        op, domain = "SkipSimplifiedLayerNormalization", MSFT
        feeds = {"x": arr(case.x), "skip": arr(case.skip or case.x), "gamma": arr(case.w)}
        if case.bias:
            feeds["bias"] = arr(case.w[-1:])
    node = helper.make_node(op, list(feeds), list(case.outputs), domain=domain, **attrs)
    ins = [helper.make_tensor_value_info(k, elem, list(v.shape)) for k, v in feeds.items()]
    outs = []
    for name in case.outputs:
        if name:
            stat = name in ("mean", "inv_std_var")
            outs.append(helper.make_tensor_value_info(name, 1 if stat else elem, None))
    graph = helper.make_graph([node], op, ins, outs)
    imports = [helper.make_opsetid("", 17), helper.make_opsetid(MSFT, 1)]
    model = helper.make_model(graph, opset_imports=imports)
    return model, feeds


def _norm_cases() -> list[NormCase]:
    cases = []
    for dt in (F32, F16):
        for n in LENGTHS:
            cases.append(NormCase("rms", (2, 3, n), (n,), True, dt))
            cases.append(NormCase("skip", (2, 3, n), (n,), True, dt))
            cases.append(NormCase("skip", (2, 3, n), (n,), True, dt, bias=True, outputs=ALL_OUTS))
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
            # what the kernel leaves to the generic kernel (still on the device)
            NormCase("rms", (2, 3, 64), (1,), False, dt),
            NormCase("rms", (2, 3, 64), (64,), False, dt, stash_type=11),
            NormCase("skip", (2, 3, 64), (64,), False, dt, skip=(2, 1, 64)),
        ]  # fmt: skip
    cases.append(NormCase("rms", (2, 3, 64), (64,), False, np.float64))
    cases.append(NormCase("skip", (2, 3, 64), (64,), False, np.float64, bias=True))
    cases.append(NormCase("rms", (0, 64), (64,), True, outputs=("y", "inv_std_var")))
    return cases


NORM_CASES = _norm_cases()


def check_norm(case: NormCase, provider: str, launches: Counter) -> None:
    model, feeds = norm_model(case)
    expect = {"rms_norm"} if case.fused and case.x[0] else set()
    check_model(model, feeds, provider, launches, expect, case.id)
    if expect:
        assert launches["rms_norm"] == 1, f"{case.id}: rms_norm launched {launches['rms_norm']}x"


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


def norm_builders(dt):
    """(rms node, skip node, their CUDA builders, their CPU builders) for rows of 256."""
    from onnxep.providers.ops import op_simplified_layer_normalization as cpu_rms
    from onnxep.providers.ops import op_skip_simplified_layer_normalization as cpu_skip
    from onnxep.providers_cuda.ops import op_simplified_layer_normalization as cuda_rms
    from onnxep.providers_cuda.ops import op_skip_simplified_layer_normalization as cuda_skip

    node = _nodes()
    rms = node("SimplifiedLayerNormalization", "", ["x", "scale"], dt, [(3, 256), (256,)], ["y"])
    skip = node("SkipSimplifiedLayerNormalization", MSFT, ["x", "skip", "gamma", "bias"], dt,
                [(3, 256), (3, 256), (256,), (256,)], ["y", "", "", "sum"])  # fmt: skip
    return (
        (rms, cuda_rms.simplified_layer_normalization, cpu_rms.simplified_layer_normalization),
        (skip, cuda_skip.skip_simplified_layer_normalization,
         cpu_skip.skip_simplified_layer_normalization),
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


@pytest.mark.parametrize("which", [0, 1], ids=["rms", "skip"])
@pytest.mark.parametrize("dt", [F32, F16])
def test_misaligned_operands_take_the_scalar_path(dt, which):
    import cupy

    run_misaligned(cupy, cupy.asnumpy, dt, which)


def test_skip_norm_captures_and_replays():
    """No host read or synchronization: a CUDA graph records the call and replays it with
    new input values."""
    import cupy

    (_, (node, build, ref)) = norm_builders(F16)
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
