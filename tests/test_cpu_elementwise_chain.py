"""Chains of float32 elementwise nodes fused into onnxep::ElementwiseChain on the CPU
(providers_cpu/elementwise_chains.py, ops/op_elementwise_chain.py, ops/chain_loops.py):
the fused node's values are the unfused nodes' bit for bit."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnx.reference import ReferenceEvaluator

import onnxep
from onnxep.providers.fusions.naming import graphs
from onnxep.providers_cpu import elementwise_chains, jit
from onnxep.providers_cpu.elementwise_chains import MIN_LINKS

pytest.importorskip("numba")
if not jit.ENABLED:
    pytest.skip("compiled loops off here (ONNXEP_CPU_JIT=0)", allow_module_level=True)
OFF = onnxep.SessionOptions(disabled_rewrites=["fuse_elementwise_chains"])


@pytest.fixture(autouse=True)
def three_links(request, monkeypatch):
    """Chains from three links on: the structure tests below build short chains (the
    threshold's own test uses the real one)."""
    if request.node.name != "test_short_chains_stay_unfused":
        monkeypatch.setattr(elementwise_chains, "MIN_LINKS", 3)


BINARY = ["Add", "Sub", "Mul", "Div"]
UNARY = ["Relu", "Neg", "Abs", "Sqrt", "Reciprocal"]


def _model(nodes, inputs, inits, out_shape=None, outputs=("y",)):
    graph = helper.make_graph(
        nodes,
        "chain",
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, s) for n, s in inputs],
        [helper.make_tensor_value_info(o, TensorProto.FLOAT, out_shape) for o in outputs],
        [numpy_helper.from_array(v, k) for k, v in inits.items()],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def _chains(sess) -> list[int]:
    return [
        len(n.attributes["ops"].value)
        for g in graphs(sess._compiled.model.graph)  # noqa: SLF001
        for n in g
        if n.op_type == "ElementwiseChain"
    ]


def _same(a: np.ndarray, b: np.ndarray) -> None:
    """Equal bits, NaN for NaN (its payload aside), -0 against -0."""
    assert a.dtype == b.dtype and a.shape == b.shape
    nan = np.isnan(a)
    np.testing.assert_array_equal(nan, np.isnan(b))
    np.testing.assert_array_equal(a[~nan].view(np.uint32), b[~nan].view(np.uint32))


def _both(model, feeds):
    fused = onnxep.InferenceSession(model.SerializeToString(), providers=["cpu"])
    plain = onnxep.InferenceSession(model.SerializeToString(), OFF, providers=["cpu"])
    got, want = fused.run(None, feeds), plain.run(None, feeds)
    for g, w in zip(got, want):
        _same(g, w)
    return fused, got


def _values(shape, rng, special=True):
    x = rng.normal(scale=3.0, size=shape).astype(np.float32)
    if special and x.size >= 6:
        flat = x.reshape(-1)
        flat[:6] = [0.0, -0.0, np.inf, -np.inf, np.nan, 1e-38]
    return x


def _random_chain(rng, out_shape, side_shapes, links, fed_every=3):
    """A chain of ``links`` random ops from input x; its operands' shapes drawn from
    ``side_shapes``, some constants, some fed."""
    nodes, inputs, inits, feeds = [], [("x", list(out_shape))], {}, {}
    feeds["x"] = _values(out_shape, rng)
    cur = "x"
    for i in range(links):
        name = "y" if i == links - 1 else f"t{i}"
        if rng.random() < 0.3:
            op = UNARY[rng.integers(len(UNARY))]
            nodes.append(helper.make_node(op, [cur], [name]))
        else:
            op = BINARY[rng.integers(len(BINARY))]
            shape = side_shapes[rng.integers(len(side_shapes))]
            side = f"s{i}"
            v = _values(shape, rng, special=False)
            if op == "Div":
                v[np.abs(v) < 0.1] = 0.5  # nonzero divisors mostly; zeros are tested apart
            if i % fed_every == 1:
                inputs.append((side, list(shape)))
                feeds[side] = v
            else:
                inits[side] = v
            pair = [side, cur] if rng.random() < 0.5 else [cur, side]
            nodes.append(helper.make_node(op, pair, [name]))
        cur = name
    return _model(nodes, inputs, inits), feeds


SHAPES = [
    ((2, 3, 5, 7), [(), (1,), (7,), (3, 1, 1), (1, 3, 1, 1), (2, 3, 5, 7), (5, 7), (1, 1, 5, 7)]),
    ((4,), [(), (4,), (1,)]),
    ((1, 10, 120), [(), (120,), (1, 10, 1), (1, 10, 120)]),
    ((3, 700), [(), (700,), (3, 1)]),  # more than one block of 512
    ((2, 64, 20, 20), [(1, 64, 1, 1), (64, 1, 1), ()]),  # runs of 400 as scalars
    ((2, 6, 3), [(6, 3), (1, 6, 1), (2, 1, 1)]),  # runs of 3: spread into the buffer
]


@pytest.mark.parametrize("seed", range(12))
@pytest.mark.parametrize("case", range(len(SHAPES)))
def test_random_chains_bit_for_bit(case, seed):
    out_shape, sides = SHAPES[case]
    rng = np.random.default_rng(seed * 31 + case)
    model, feeds = _random_chain(rng, out_shape, sides, links=int(rng.integers(3, 11)))
    sess, got = _both(model, feeds)
    assert _chains(sess), "the chain was not fused"
    ref = ReferenceEvaluator(model).run(None, feeds)
    with np.errstate(all="ignore"):
        np.testing.assert_allclose(got[0], ref[0], rtol=1e-6, atol=0, equal_nan=True)


def _line(ops, x_shape=(4,), c=None):
    c = np.array([1.5, -2.0, 0.0, 3.0], np.float32) if c is None else c
    nodes, cur = [], "x"
    for i, op in enumerate(ops):
        name = "y" if i == len(ops) - 1 else f"t{i}"
        ins = [cur] if op in UNARY else [cur, "c"]
        nodes.append(helper.make_node(op, ins, [name]))
        cur = name
    return _model(nodes, [("x", list(x_shape))], {"c": c})


def test_short_chains_stay_unfused():
    x = {"x": np.arange(4, dtype=np.float32)}
    ops = ["Add", "Mul", "Relu", "Sub", "Div", "Neg"]
    sess, _ = _both(_line(ops[: MIN_LINKS - 1]), x)
    assert _chains(sess) == []
    sess, _ = _both(_line(ops[:MIN_LINKS]), x)
    assert _chains(sess) == [MIN_LINKS]


def test_long_chain_is_one_node():
    # bench/overhead.py's shape: 500 Adds of a constant
    sess, got = _both(_line(["Add"] * 500), {"x": np.zeros(4, np.float32)})
    assert _chains(sess) == [500]
    assert len(sess._compiled.plan.steps) == 1  # noqa: SLF001


def test_special_values_and_division_by_zero():
    ops = ["Div", "Relu", "Sub", "Sqrt", "Neg", "Abs", "Reciprocal", "Mul"]
    x = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, -1.0, 1e-38, 2.0], np.float32)
    c = np.array([0.0, -0.0, 1.0, -1.0, 0.0, np.inf, 1e38, np.nan], np.float32)
    with np.errstate(all="ignore"):
        sess, _ = _both(_line(ops, (8,), c), {"x": x})
    assert _chains(sess) == [8]


def test_relu_turns_minus_zero_to_plus_zero():
    x = np.array([-0.0, 0.0, -1.0, np.nan], np.float32)
    sess, (y,) = _both(_line(["Neg", "Neg", "Relu"]), {"x": x})
    assert np.signbit(y[:3]).tolist() == [False, False, False] and np.isnan(y[3])


def test_intermediate_read_elsewhere_splits_the_chain():
    c = np.float32(0.5)
    nodes = [
        helper.make_node("Add", ["x", "c"], ["a"]),
        helper.make_node("Mul", ["a", "c"], ["b"]),
        helper.make_node("Sub", ["b", "c"], ["d"]),
        helper.make_node("Relu", ["d"], ["e"]),  # d is also read below: the chain ends at d
        helper.make_node("Mul", ["d", "e"], ["f"]),
        helper.make_node("Neg", ["f"], ["g"]),
        helper.make_node("Abs", ["g"], ["h"]),
        helper.make_node("Add", ["h", "c"], ["y"]),
    ]
    model = _model(nodes, [("x", [5])], {"c": np.array(c)}, outputs=("y", "b"))
    x = np.linspace(-2, 2, 5).astype(np.float32)
    sess, _ = _both(model, {"x": x})
    # x..b stops at b (a graph output: two links, left alone); d has two readers, so the
    # chain after it starts at e and takes f (whose other operand is d) through y
    assert sorted(_chains(sess)) == [5]


def test_square_of_the_chain_value_ends_a_chain():
    nodes = [
        helper.make_node("Add", ["x", "c"], ["a"]),
        helper.make_node("Mul", ["a", "c"], ["b"]),
        helper.make_node("Sub", ["b", "c"], ["d"]),
        helper.make_node("Mul", ["d", "d"], ["e"]),
        helper.make_node("Add", ["e", "c"], ["f"]),
        helper.make_node("Neg", ["f"], ["y"]),
    ]
    model = _model(nodes, [("x", [3])], {"c": np.array(1.5, np.float32)})
    sess, _ = _both(model, {"x": np.array([1.0, -2.0, 3.0], np.float32)})
    assert sorted(_chains(sess)) == [3, 3]


def test_more_fed_inputs_than_slots_split_the_chain():
    names = [f"f{i}" for i in range(6)]
    nodes, cur = [], "x"
    for i, n in enumerate(names):
        out = "y" if i == len(names) - 1 else f"t{i}"
        nodes.append(helper.make_node("Add", [cur, n], [out]))
        cur = out
    model = _model(nodes, [("x", [4])] + [(n, [4]) for n in names], {})
    rng = np.random.default_rng(0)
    feeds = {n: rng.normal(size=4).astype(np.float32) for n in ["x", *names]}
    sess, _ = _both(model, feeds)
    assert sorted(_chains(sess)) == [3, 3]


def test_shapes_outside_the_compiled_pass_take_numpy_steps():
    # (3, 1, 5) into (3, 4, 5): its varying dims are not one run; (4, 1) broadcasts the
    # chain's value up: both run as the unfused NumPy calls, same values and shapes
    nodes = [
        helper.make_node("Add", ["x", "a"], ["t0"]),
        helper.make_node("Mul", ["t0", "b"], ["t1"]),
        helper.make_node("Sub", ["t1", "a"], ["y"]),
    ]
    rng = np.random.default_rng(1)
    model = _model(
        nodes,
        [("x", None), ("a", None)],
        {"b": rng.normal(size=(4, 1)).astype(np.float32)},
    )
    for xs, as_ in [((3, 4, 5), (3, 1, 5)), ((5,), (3, 1, 5)), ((3, 4, 1), (1, 1, 5))]:
        feeds = {"x": _values(xs, rng), "a": _values(as_, rng)}
        sess, _ = _both(model, feeds)
        assert _chains(sess) == [3]


def test_strided_empty_and_scalar_inputs():
    nodes = [
        helper.make_node("Transpose", ["x"], ["xt"], perm=[1, 0]),
        helper.make_node("Add", ["xt", "c"], ["t0"]),
        helper.make_node("Mul", ["c", "t0"], ["t1"]),
        helper.make_node("Div", ["t1", "c"], ["y"]),
    ]
    model = _model(nodes, [("x", None)], {"c": np.array(1.25, np.float32)})
    rng = np.random.default_rng(2)
    for shape in [(5, 3), (0, 3), (1, 1), (600, 2)]:
        sess, got = _both(model, {"x": _values(shape, rng)})
        assert _chains(sess) == [3] and got[0].shape == shape[::-1]


def test_overridable_initializer_is_read_each_run():
    model = _line(["Add", "Mul", "Sub"])
    model.graph.input.append(helper.make_tensor_value_info("c", TensorProto.FLOAT, [4]))
    sess = onnxep.InferenceSession(model.SerializeToString(), providers=["cpu"])
    x = np.ones(4, np.float32)
    c2 = np.full(4, 2.0, np.float32)
    default, fed = sess.run(None, {"x": x})[0], sess.run(None, {"x": x, "c": c2})[0]
    np.testing.assert_array_equal(fed, ((x + c2) * c2) - c2)
    c = np.array([1.5, -2.0, 0.0, 3.0], np.float32)
    np.testing.assert_array_equal(default, ((x + c) * c) - c)


def test_chain_inside_an_if_branch():
    def branch(name, k):
        ops = [
            helper.make_node("Add", ["x", "c"], [f"{name}0"]),
            helper.make_node("Mul", [f"{name}0", "c"], [f"{name}1"]),
            helper.make_node("Add", [f"{name}1", "c"], [f"{name}2"]),
            helper.make_node("Mul", [f"{name}2", "c"], [f"{name}_out"]),
        ][:k]
        ops[-1].output[0] = f"{name}_out"
        return helper.make_graph(
            ops, name, [], [helper.make_tensor_value_info(f"{name}_out", TensorProto.FLOAT, None)]
        )

    nodes = [
        helper.make_node(
            "If", ["cond"], ["y"], then_branch=branch("th", 4), else_branch=branch("el", 3)
        )
    ]
    graph = helper.make_graph(
        nodes,
        "g",
        [
            helper.make_tensor_value_info("cond", TensorProto.BOOL, []),
            helper.make_tensor_value_info("x", TensorProto.FLOAT, [3]),
        ],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [numpy_helper.from_array(np.array([0.5, 2.0, -1.0], np.float32), "c")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    x = np.array([1.0, 2.0, 3.0], np.float32)
    for cond in (True, False):
        sess, _ = _both(model, {"cond": np.array(cond), "x": x})
        assert sorted(_chains(sess)) == [3, 4]


def test_without_numba_the_kernel_runs_numpy_steps(monkeypatch):
    model, feeds = _random_chain(np.random.default_rng(5), (2, 3, 4), [(), (4,), (3, 1)], 6)
    want = onnxep.InferenceSession(model.SerializeToString(), OFF, providers=["cpu"]).run(
        None, feeds
    )
    monkeypatch.setattr(jit, "ENABLED", False)
    sess = onnxep.InferenceSession(model.SerializeToString(), providers=["cpu"])
    assert _chains(sess) == [6]  # numba importable: fused, but the kernel was built without
    _same(sess.run(None, feeds)[0], want[0])


def test_pass_off_when_numba_is_not_wanted(monkeypatch):
    monkeypatch.setattr(jit, "wanted", lambda: False)
    sess = onnxep.InferenceSession(_line(["Add"] * 5).SerializeToString(), providers=["cpu"])
    assert _chains(sess) == []
