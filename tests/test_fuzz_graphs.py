"""Random small graphs run by onnxep's CPU provider and by onnx.reference, compared.

Hypothesis builds a valid graph of 1-6 nodes from elementwise ops (unary,
binary with random broadcasting, comparisons, Where, Cast), shape ops
(Reshape, Transpose, Squeeze, Unsqueeze, Concat, Slice, Expand, Flatten),
Gather with in-range indices and opset-18 reductions (axes as an input), on
float32, float64, int32 and int64 values of rank 0-4 with dims 1-4. The
generator tracks every value's shape and dtype itself, so a graph is valid
by construction; the reference's output shapes are checked against that
bookkeeping too. Integers must match exactly; floats within a tight
tolerance, NaN meeting NaN. Integer division gets a divisor with no zero.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import onnx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from onnx import helper, numpy_helper
from onnx.reference import ReferenceEvaluator

import onnxep
from onnxep.providers.dtypes import elem_type

OPSET = 18
NUMERIC = (np.dtype(np.float32), np.dtype(np.float64), np.dtype(np.int32), np.dtype(np.int64))
FLOATS = NUMERIC[:2]
#: (atol, rtol) per float dtype: a few ulps of the values these graphs make.
TOLERANCE = {np.dtype(np.float32): (1e-6, 1e-5), np.dtype(np.float64): (1e-12, 1e-11)}
MAX_RANK = 4


@dataclass(frozen=True)
class Val:
    name: str
    shape: tuple[int, ...]
    dtype: np.dtype

    @property
    def rank(self) -> int:
        return len(self.shape)


@dataclass
class Case:
    """A generated model, two sets of feeds and the output shapes the generator expects."""

    model: onnx.ModelProto
    feeds: tuple[dict[str, np.ndarray], dict[str, np.ndarray]]
    shapes: dict[str, tuple[int, ...]]

    def __repr__(self) -> str:
        g = self.model.graph
        lines = [f"input {k}: {v.dtype} {v.tolist()}" for k, v in self.feeds[0].items()]
        for t in g.initializer:
            a = numpy_helper.to_array(t)
            lines.append(f"initializer {t.name}: {a.dtype} {list(a.shape)} {a.tolist()}")
        for n in g.node:
            attrs = {a.name: helper.get_attribute_value(a) for a in n.attribute}
            lines.append(f"{', '.join(n.output)} = {n.op_type}({', '.join(n.input)}) {attrs}")
        lines.append(f"outputs: {', '.join(o.name for o in g.output)}")
        return "Case(\n  " + "\n  ".join(lines) + "\n)"


@dataclass
class Builder:
    """Adds nodes to a graph while tracking the shape and dtype of every value."""

    draw: st.DrawFn
    rng: np.random.Generator
    nodes: list[onnx.NodeProto] = field(default_factory=list)
    inputs: list[onnx.ValueInfoProto] = field(default_factory=list)
    inits: list[onnx.TensorProto] = field(default_factory=list)
    feeds: tuple[dict, dict] = field(default_factory=lambda: ({}, {}))
    pool: list[Val] = field(default_factory=list)
    produced: list[Val] = field(default_factory=list)
    used: set[str] = field(default_factory=set)
    count: int = 0

    def name(self, prefix: str) -> str:
        self.count += 1
        return f"{prefix}{self.count}"

    def values(self, shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
        if dtype == np.bool_:
            return self.rng.random(shape) < 0.5
        if dtype.kind == "i":
            return self.rng.integers(-10, 11, size=shape).astype(dtype)
        return self.floats(shape, dtype, self.draw(st.sampled_from(["normal", "whole", "special"])))

    def floats(self, shape: tuple[int, ...], dtype: np.dtype, kind: str) -> np.ndarray:
        if kind == "whole":  # ties for Equal/Less/Max, exact sums
            return self.rng.integers(-3, 4, size=shape).astype(dtype)
        x = (self.rng.standard_normal(shape) * 2).astype(dtype)
        if kind == "special":
            specials = np.array([np.nan, np.inf, -np.inf, 0.0, -0.0], dtype)
            x = np.where(self.rng.random(shape) < 0.3, self.rng.choice(specials, shape), x)
        return x.astype(dtype)

    def declare(self, v: Val) -> None:
        """A graph input whose dims are written fixed, symbolic or unknown, at random.

        Kernels are built knowing the static shapes where the model gives them;
        the other forms make them work the shapes out while running.
        """
        dims = [
            self.draw(st.sampled_from([d, f"{v.name}_d{i}", None])) for i, d in enumerate(v.shape)
        ]
        self.inputs.append(helper.make_tensor_value_info(v.name, elem_type(v.dtype), dims))

    def new_input(self, shape: tuple[int, ...], dtype: np.dtype) -> Val:
        v = Val(self.name("in"), tuple(shape), np.dtype(dtype))
        self.declare(v)
        if v.dtype.kind == "f":
            kind = self.draw(st.sampled_from(["normal", "whole", "special"]))
            for feeds in self.feeds:
                feeds[v.name] = self.floats(v.shape, v.dtype, kind)
        else:
            for feeds in self.feeds:
                feeds[v.name] = self.values(v.shape, v.dtype)
        self.pool.append(v)
        return v

    def const(self, array: np.ndarray, pooled: bool = False) -> Val:
        v = Val(self.name("c"), tuple(array.shape), array.dtype)
        self.inits.append(numpy_helper.from_array(array, v.name))
        if pooled:
            self.pool.append(v)
        return v

    def fresh(self, shape: tuple[int, ...], dtype: np.dtype) -> Val:
        """A new operand: a graph input mostly, sometimes a constant."""
        if self.draw(st.integers(0, 3)) == 0:
            return self.const(self.values(shape, np.dtype(dtype)), pooled=True)
        return self.new_input(shape, dtype)

    def pick(self, ok=lambda v: True) -> Val | None:
        """A pooled value passing ``ok``; shrinks towards the newest, so graphs chain."""
        cands = [v for v in reversed(self.pool) if ok(v)]
        if not cands:
            return None
        return cands[self.draw(st.integers(0, len(cands) - 1))]

    def node(self, op: str, ins: list[Val | None], shape, dtype, **attrs) -> Val:
        out = Val(self.name(f"{op.lower()}_"), tuple(int(d) for d in shape), np.dtype(dtype))
        names = [v.name if v is not None else "" for v in ins]
        self.used.update(n for n in names if n)
        self.nodes.append(helper.make_node(op, names, [out.name], name=out.name, **attrs))
        self.pool.append(out)
        self.produced.append(out)
        return out

    def ints(self, values) -> Val:
        return self.const(np.asarray(values, dtype=np.int64).reshape(-1))

    def shape_of(self, v: Val) -> Val:
        """``Shape(v)``: a shape computed while the graph runs, not written as a constant."""
        return self.node("Shape", [v], (v.rank,), np.int64)

    # --- shapes ---

    def broadcast_partner(self, shape: tuple[int, ...]) -> tuple[int, ...]:
        """A shape that broadcasts with ``shape``: each dim kept or 1 (a 1 may grow)."""
        out = []
        for d in shape:
            if d == 1:
                out.append(self.draw(st.integers(1, 4)))
            else:
                out.append(self.draw(st.sampled_from([d, 1])))
        if self.draw(st.booleans()):
            # a lower rank broadcasts from the right
            return tuple(out[self.draw(st.integers(0, len(out))) :])
        extra = self.draw(st.integers(0, MAX_RANK - len(out)))
        return tuple([self.draw(st.integers(1, 4)) for _ in range(extra)] + out)

    def partner(self, a: Val, dtype: np.dtype | None = None) -> Val:
        dtype = a.dtype if dtype is None else dtype
        b = None
        if self.draw(st.booleans()):
            b = self.pick(lambda v: v.dtype == dtype and _broadcasts(a.shape, v.shape))
        return b if b is not None else self.fresh(self.broadcast_partner(a.shape), dtype)


def _broadcasts(*shapes: tuple[int, ...]) -> bool:
    try:
        out = np.broadcast_shapes(*shapes)
    except ValueError:
        return False
    return len(out) <= MAX_RANK


def _numeric(v: Val) -> bool:
    return v.dtype in NUMERIC


def _float(v: Val) -> bool:
    return v.dtype in FLOATS


# --- one generator per op family: each adds nodes, or returns None if it does not apply ---


def unary(b: Builder, op: str) -> Val | None:
    floats_only = op in ("Sigmoid", "Tanh", "Exp", "SqrtAbs")
    a = b.pick(_float if floats_only else _numeric)
    if a is None:
        return None
    if op == "SqrtAbs":
        a = b.node("Abs", [a], a.shape, a.dtype)
        op = "Sqrt"
    return b.node(op, [a], a.shape, a.dtype)


def binary(b: Builder, op: str) -> Val | None:
    a = b.pick(_numeric)
    if a is None:
        return None
    if op == "Div" and a.dtype.kind == "i":
        shape = b.broadcast_partner(a.shape)
        mag = b.rng.integers(1, 6, size=shape)
        sign = np.where(b.rng.random(shape) < 0.5, -1, 1)
        c = b.const((mag * sign).astype(a.dtype))
    else:
        c = b.partner(a)
    ins = [a, c]
    if op in ("Max", "Min") and b.draw(st.booleans()):
        both = Val("", np.broadcast_shapes(a.shape, c.shape), a.dtype)
        ins.append(b.partner(both))  # variadic with three operands
    shape = np.broadcast_shapes(*(v.shape for v in ins))
    if len(shape) > MAX_RANK:
        return None
    out_dtype = np.bool_ if op in ("Equal", "Less", "Greater") else a.dtype
    return b.node(op, ins, shape, out_dtype)


def where(b: Builder, _op: str) -> Val | None:
    x = b.pick(_numeric)
    if x is None:
        return None
    y = b.partner(x)
    xy = np.broadcast_shapes(x.shape, y.shape)
    cond = b.pick(lambda v: v.dtype == np.bool_ and _broadcasts(xy, v.shape))
    if cond is None:
        cond = b.fresh(b.broadcast_partner(xy), np.dtype(np.bool_))
    shape = np.broadcast_shapes(cond.shape, x.shape, y.shape)
    if len(shape) > MAX_RANK:
        return None
    return b.node("Where", [cond, x, y], shape, x.dtype)


def cast(b: Builder, _op: str) -> Val | None:
    a = b.pick()
    if a is None:
        return None
    to = b.draw(st.sampled_from(FLOATS))  # to float only: float -> int is undefined past range
    return b.node("Cast", [a], a.shape, to, to=elem_type(to))


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def reshape(b: Builder, _op: str) -> Val | None:
    a = b.pick()
    if a is None:
        return None
    total = math.prod(a.shape)
    if b.draw(st.booleans()):
        v = b.pick(lambda v: v is not a and v.rank >= 1 and math.prod(v.shape) == total)
        if v is not None:
            return b.node("Reshape", [a, b.shape_of(v)], v.shape, a.dtype)
    rank = b.draw(st.integers(0 if total == 1 else 1, MAX_RANK))
    dims, rest = [], total
    for _ in range(rank - 1):
        d = b.draw(st.sampled_from(_divisors(rest)))
        dims.append(d)
        rest //= d
    if rank:
        dims.append(rest)
    spec = list(dims)
    if rank and b.draw(st.booleans()):
        spec[b.draw(st.integers(0, rank - 1))] = -1
    copies = [i for i in range(min(rank, a.rank)) if dims[i] == a.shape[i] and spec[i] != -1]
    if copies and b.draw(st.booleans()):
        spec[b.draw(st.sampled_from(copies))] = 0  # 0 copies the input's dim (allowzero=0)
    return b.node("Reshape", [a, b.ints(spec)], dims, a.dtype)


def transpose(b: Builder, _op: str) -> Val | None:
    a = b.pick()
    if a is None:
        return None
    if a.rank == 0 or b.draw(st.booleans()):
        return b.node("Transpose", [a], a.shape[::-1], a.dtype)  # no perm: reversed
    perm = b.draw(st.permutations(range(a.rank)))
    return b.node("Transpose", [a], [a.shape[p] for p in perm], a.dtype, perm=list(perm))


def squeeze(b: Builder, _op: str) -> Val | None:
    a = b.pick(lambda v: 1 in v.shape)
    if a is None:
        return None
    ones = [i for i, d in enumerate(a.shape) if d == 1]
    axes = b.draw(st.lists(st.sampled_from(ones), unique=True))
    if not axes:
        shape = [d for d in a.shape if d != 1]
        return b.node("Squeeze", [a], shape, a.dtype)
    shape = [d for i, d in enumerate(a.shape) if i not in axes]
    enc = [ax - a.rank if b.draw(st.booleans()) else ax for ax in axes]
    return b.node("Squeeze", [a, b.ints(enc)], shape, a.dtype)


def unsqueeze(b: Builder, _op: str) -> Val | None:
    a = b.pick(lambda v: v.rank < MAX_RANK)
    if a is None:
        return None
    out_rank = a.rank + b.draw(st.integers(1, MAX_RANK - a.rank))
    axes = b.draw(
        st.lists(
            st.integers(0, out_rank - 1),
            min_size=out_rank - a.rank,
            max_size=out_rank - a.rank,
            unique=True,
        )
    )
    rest = iter(a.shape)
    shape = [1 if i in axes else next(rest) for i in range(out_rank)]
    enc = [ax - out_rank if b.draw(st.booleans()) else ax for ax in axes]
    return b.node("Unsqueeze", [a, b.ints(enc)], shape, a.dtype)


def concat(b: Builder, _op: str) -> Val | None:
    a = b.pick(lambda v: v.rank >= 1)
    if a is None:
        return None
    axis = b.draw(st.integers(0, a.rank - 1))
    ins = [a]
    for _ in range(b.draw(st.integers(1, 2))):
        other = None
        if b.draw(st.booleans()):
            other = b.pick(
                lambda v: (
                    v.dtype == a.dtype
                    and v.rank == a.rank
                    and all(v.shape[i] == a.shape[i] for i in range(a.rank) if i != axis)
                )
            )
        if other is None:
            shape = list(a.shape)
            shape[axis] = b.draw(st.integers(1, 4))
            other = b.fresh(tuple(shape), a.dtype)
        ins.append(other)
    shape = list(a.shape)
    shape[axis] = sum(v.shape[axis] for v in ins)
    enc = axis - a.rank if b.draw(st.booleans()) else axis
    return b.node("Concat", ins, shape, a.dtype, axis=enc)


def _slice_axis(b: Builder, dim: int) -> tuple[int, int, int, int]:
    """(start, end, step) as written in the model, and the length they select (>= 1).

    Starts and ends are sometimes written negative or past the ends, which
    Slice clamps; the length is worked out on the unclamped range chosen first.
    """
    step = b.draw(st.sampled_from([1, 1, 2, 3, -1, -2]))
    big = 2**62
    if step > 0:
        s = b.draw(st.integers(0, dim - 1))
        e = b.draw(st.integers(s + 1, dim))
        ws = s - dim if b.draw(st.booleans()) else s
        we = b.draw(st.sampled_from([e, e - dim if e < dim else big, dim + 3 if e == dim else e]))
    else:
        s = b.draw(st.integers(0, dim - 1))
        e = b.draw(st.integers(-1, s - 1))
        ws = b.draw(st.sampled_from([s, s - dim, big if s == dim - 1 else s]))
        # A written -1 would mean the last element: "before the first" is -dim-1 or less.
        we = b.draw(st.sampled_from([-dim - 1, -big] if e == -1 else [e, e - dim]))
    return ws, we, step, len(range(s, e, step))


def slice_(b: Builder, _op: str) -> Val | None:
    a = b.pick(lambda v: v.rank >= 1)
    if a is None:
        return None
    if b.draw(st.booleans()):
        axes = list(range(a.rank))  # the axes input left out
        explicit = False
    else:
        axes = b.draw(st.lists(st.integers(0, a.rank - 1), min_size=1, unique=True))
        explicit = True
    shape = list(a.shape)
    starts, ends, steps = [], [], []
    for ax in axes:
        s, e, step, n = _slice_axis(b, a.shape[ax])
        starts.append(s)
        ends.append(e)
        steps.append(step)
        shape[ax] = n
    ins = [a, b.ints(starts), b.ints(ends)]
    with_steps = any(s != 1 for s in steps) or b.draw(st.booleans())
    if explicit:
        ins.append(b.ints([ax - a.rank if b.draw(st.booleans()) else ax for ax in axes]))
    elif with_steps:
        ins.append(b.ints(axes))  # steps are the fifth input: the axes must be written
    if with_steps:
        ins.append(b.ints(steps))
    return b.node("Slice", ins, shape, a.dtype)


def expand(b: Builder, _op: str) -> Val | None:
    a = b.pick()
    if a is None:
        return None
    if b.draw(st.booleans()):
        v = b.pick(lambda v: v.rank >= 1 and _broadcasts(a.shape, v.shape))
        if v is not None:
            shape = np.broadcast_shapes(a.shape, v.shape)
            return b.node("Expand", [a, b.shape_of(v)], shape, a.dtype)
    target = b.broadcast_partner(a.shape)
    shape = np.broadcast_shapes(a.shape, target)
    if len(shape) > MAX_RANK:
        return None
    return b.node("Expand", [a, b.ints(target)], shape, a.dtype)


def shape(b: Builder, _op: str) -> Val | None:
    a = b.pick(lambda v: v.rank >= 1)
    if a is None:
        return None
    r = a.rank
    lo = b.draw(st.integers(0, r - 1))
    hi = b.draw(st.integers(lo + 1, r))
    attrs = {}
    if lo or b.draw(st.booleans()):
        attrs["start"] = lo - r if b.draw(st.booleans()) else lo
    if hi < r:
        attrs["end"] = hi - r if b.draw(st.booleans()) else hi
    elif b.draw(st.booleans()):
        attrs["end"] = b.draw(st.sampled_from([r, r + 5]))  # past the end is clamped
    return b.node("Shape", [a], (hi - lo,), np.int64, **attrs)


def flatten(b: Builder, _op: str) -> Val | None:
    a = b.pick(lambda v: v.rank >= 1)
    if a is None:
        return None
    axis = b.draw(st.integers(-a.rank, a.rank))
    k = axis + a.rank if axis < 0 else axis
    shape = (math.prod(a.shape[:k]), math.prod(a.shape[k:]))
    return b.node("Flatten", [a], shape, a.dtype, axis=axis)


def gather(b: Builder, _op: str) -> Val | None:
    a = b.pick(lambda v: v.rank >= 1)
    if a is None:
        return None
    axis = b.draw(st.integers(0, a.rank - 1))
    dim = a.shape[axis]
    q = b.draw(st.integers(0, min(2, MAX_RANK - a.rank + 1)))
    ishape = tuple(b.draw(st.integers(1, 4)) for _ in range(q))
    idtype = np.dtype(b.draw(st.sampled_from([np.int64, np.int32])))
    if b.draw(st.booleans()):
        ind = b.const(b.rng.integers(-dim, dim, size=ishape).astype(idtype))
    else:
        ind = Val(b.name("idx"), ishape, idtype)
        b.declare(ind)
        for feeds in b.feeds:
            feeds[ind.name] = b.rng.integers(-dim, dim, size=ishape).astype(idtype)
    shape = a.shape[:axis] + ishape + a.shape[axis + 1 :]
    enc = axis - a.rank if b.draw(st.booleans()) else axis
    return b.node("Gather", [a, ind], shape, a.dtype, axis=enc)


def reduce(b: Builder, op: str) -> Val | None:
    a = b.pick(_numeric)
    if a is None:
        return None
    keepdims = b.draw(st.integers(0, 1))
    axes = b.draw(st.lists(st.integers(0, max(a.rank - 1, 0)), unique=True, max_size=a.rank))
    attrs = {"keepdims": keepdims}
    form = b.draw(st.sampled_from(["given", "left out", "empty, noop"]))
    if not axes and form == "empty, noop":
        attrs["noop_with_empty_axes"] = 1
        ins = [a, b.ints([])]
        return b.node(op, ins, a.shape, a.dtype, **attrs)
    if not axes:
        axes = list(range(a.rank))  # reduce everything
        ins = [a] if form == "left out" else [a, b.ints([])]
    else:
        ins = [a, b.ints([ax - a.rank if b.draw(st.booleans()) else ax for ax in axes])]
    if keepdims:
        shape = [1 if i in axes else d for i, d in enumerate(a.shape)]
    else:
        shape = [d for i, d in enumerate(a.shape) if i not in axes]
    return b.node(op, ins, shape, a.dtype, **attrs)


OPS = {
    **{op: unary for op in ("Abs", "Neg", "Relu", "Sigmoid", "Tanh", "Exp", "SqrtAbs")},
    **{op: binary for op in ("Add", "Sub", "Mul", "Div", "Max", "Min", "Equal", "Less", "Greater")},
    "Where": where,
    "Cast": cast,
    "Reshape": reshape,
    "Transpose": transpose,
    "Squeeze": squeeze,
    "Unsqueeze": unsqueeze,
    "Concat": concat,
    "Slice": slice_,
    "Expand": expand,
    "Flatten": flatten,
    "Shape": shape,
    "Gather": gather,
    **{op: reduce for op in ("ReduceSum", "ReduceMean", "ReduceMax", "ReduceMin")},
}
NAMES = sorted(OPS)


@st.composite
def graphs(draw: st.DrawFn) -> Case:
    b = Builder(draw, np.random.default_rng(draw(st.integers(0, 2**32 - 1))))
    for _ in range(draw(st.integers(1, 2))):
        rank = draw(st.integers(0, MAX_RANK))
        b.new_input(
            tuple(draw(st.integers(1, 4)) for _ in range(rank)), draw(st.sampled_from(NUMERIC))
        )
    target = draw(st.integers(1, 6))
    while len(b.nodes) < target:
        # The op is drawn by the seeded generator: Hypothesis's own draws favour the
        # first choice, which would make most nodes Abs.
        op = NAMES[b.rng.integers(len(NAMES))]
        OPS[op](b, op)
    leaves = [v for v in b.produced if v.name not in b.used]
    extra = [v for v in b.produced if v not in leaves and draw(st.booleans())]
    outs = leaves + extra
    graph = helper.make_graph(
        b.nodes,
        "fuzz",
        b.inputs,
        [helper.make_tensor_value_info(v.name, elem_type(v.dtype), v.shape) for v in outs],
        b.inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)])
    model.ir_version = 10
    return Case(model, b.feeds, {v.name: v.shape for v in outs})


def computed_in_float32(model: onnx.ModelProto) -> bool:
    """Whether any value of the graph is float32: a float64 output Cast from float32 work
    carries float32 rounding (NumPy's float32 sums vary by an ulp with data alignment)."""
    g = onnx.shape_inference.infer_shapes(model).graph
    infos = [*g.input, *g.value_info, *g.output]
    return any(v.type.tensor_type.elem_type == onnx.TensorProto.FLOAT for v in infos)


def assert_same(name: str, got: np.ndarray, want: np.ndarray, loosest=None) -> None:
    assert got.dtype == want.dtype, f"{name}: dtype {got.dtype}, reference {want.dtype}"
    assert got.shape == want.shape, f"{name}: shape {got.shape}, reference {want.shape}"
    if want.dtype in TOLERANCE:
        atol, rtol = TOLERANCE[loosest if loosest is not None else want.dtype]
        np.testing.assert_allclose(got, want, rtol=rtol, atol=atol, equal_nan=True, err_msg=name)
    else:
        np.testing.assert_array_equal(got, want, err_msg=name)


@settings(
    max_examples=500,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(case=graphs())
def test_random_graph_matches_reference(case: Case) -> None:
    names = [o.name for o in case.model.graph.output]
    sess = onnxep.InferenceSession(case.model.SerializeToString(), providers=["cpu"])
    loosest = np.dtype(np.float32) if computed_in_float32(case.model) else None
    # The first run is the checked loop, the second the generated code, on other values:
    # a value wrongly cached as depending on shapes only would show there.
    for run, feeds in enumerate(case.feeds, 1):
        # inf and NaN are expected here (Div by 0.0, Exp overflow): NumPy's warnings are noise.
        with np.errstate(all="ignore"):
            want = ReferenceEvaluator(case.model).run(None, feeds)
            got = sess.run(None, feeds)
        for name, w in zip(names, want):
            assert np.shape(w) == case.shapes[name], f"generator bookkeeping: {name} {np.shape(w)}"
        for name, g, w in zip(names, got, want):
            assert_same(f"run {run}, output {name}", np.asarray(g), np.asarray(w), loosest)


def _one_node(op: str, x: np.ndarray) -> onnx.ModelProto:
    t = elem_type(x.dtype)
    graph = helper.make_graph(
        [helper.make_node(op, ["x"], ["y"])],
        "g",
        [helper.make_tensor_value_info("x", t, list(x.shape))],
        [helper.make_tensor_value_info("y", t, list(x.shape))],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)])


@pytest.mark.parametrize("dtype", FLOATS)
def test_found_sigmoid_of_a_scalar(dtype):
    """Found by the fuzzer: the CPU Sigmoid wrote into the NumPy scalar a 0-d negation made."""
    x = np.array(0.5, dtype)
    m = _one_node("Sigmoid", x)
    (got,) = onnxep.InferenceSession(m, providers=["cpu"]).run(None, {"x": x})
    (want,) = ReferenceEvaluator(m).run(None, {"x": x})
    assert_same("y", np.asarray(got), want)
