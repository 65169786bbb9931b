"""Elementwise steps whose constant operands the generated plan broadcasts once
(core/execute/broadcast_consts.py): the same bits as the model's own call, which the
first (checked) run makes, as onnxruntime and the reference; the call as written when a
value's shape is not the static one; errors naming the node."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnx.reference import ReferenceEvaluator

import onnxep
from onnxep.errors import RunError
from onnxep.execute.broadcast_consts import MAX_ELEMENTS, broadcast_constants

_TYPES = {
    np.dtype(np.float32): TensorProto.FLOAT,
    np.dtype(np.float64): TensorProto.DOUBLE,
    np.dtype(np.int32): TensorProto.INT32,
    np.dtype(np.int64): TensorProto.INT64,
    np.dtype(np.bool_): TensorProto.BOOL,
}
_UNFUSED = ["fuse_elementwise_chains"]


def _model(ops, shape, consts, dtype, out_dtype=None):
    """x -> op0(x, k0) -> op1(., k1) ...; ``consts`` the constant operands in order
    (a tuple (array, first) puts the constant first)."""
    nodes, inits = [], []
    for i, (op, c) in enumerate(zip(ops, consts)):
        first = isinstance(c, tuple)
        arr = c[0] if first else c
        inits.append(numpy_helper.from_array(arr, f"k{i}"))
        src = "x" if i == 0 else f"t{i - 1}"
        ins = [f"k{i}", src] if first else [src, f"k{i}"]
        nodes.append(helper.make_node(op, ins, [f"t{i}" if i < len(ops) - 1 else "y"]))
    t = _TYPES[np.dtype(dtype)]
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", t, shape)],
        [helper.make_tensor_value_info("y", _TYPES[np.dtype(out_dtype or dtype)], None)],
        inits,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=10)


def _session(model, **kw):
    so = onnxep.SessionOptions(disabled_rewrites=_UNFUSED, **kw)
    return onnxep.InferenceSession(model, so, providers=["cpu"])


def _same_bits(a, b):
    assert a.dtype == b.dtype and a.shape == b.shape
    np.testing.assert_array_equal(a.view(np.uint8), b.view(np.uint8))


def _special(rng, shape, dtype):
    x = rng.standard_normal(shape).astype(dtype)
    flat = x.reshape(-1)
    for k, v in enumerate([np.nan, np.inf, -np.inf, -0.0, 0.0, 1e-40, 3e38]):
        if k < flat.size:
            flat[(k * 7) % flat.size] = v
    return x


_SHAPES = [
    ((2, 4), (4,)),
    ((2, 4), (2, 1)),
    ((2, 4), (1, 4)),
    ((3, 5, 7), (5, 1)),
    ((3, 5, 7), (1, 1, 7)),
    ((3, 5, 7), (1, 5, 1)),
    ((1, 16, 8, 8), (1, 16, 1, 1)),
    ((1, 16, 8, 8), (16, 1, 1)),
    ((16, 64), (64,)),
    ((2, 4), (1, 1)),
    ((5,), (1,)),
    ((2, 3), ()),
]


@pytest.mark.parametrize("xs,cs", _SHAPES)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_float_chains_match_the_checked_run_onnxruntime_and_the_reference(xs, cs, dtype):
    ort = pytest.importorskip("onnxruntime")
    rng = np.random.default_rng(len(xs) * 31 + len(cs))
    ops = ["Add", "Mul", "Sub", "Div", "Sub", "Div"]
    consts = []
    for i, _ in enumerate(ops):
        c = _special(rng, cs, dtype) if i < 2 else rng.standard_normal(cs).astype(dtype)
        if i == 3:
            c.reshape(-1)[0] = 0.0  # division by zero, both signs of the dividend
        consts.append((c, True) if i in (4, 5) else c)  # constant first: k - x, k / x
    model = _model(ops, list(xs), consts, dtype)
    sess = _session(model)
    plan = sess.compiled.plan
    wide = broadcast_constants(plan)
    if cs != () and cs != xs:
        assert len(wide) == len(ops)
    x = _special(rng, xs, dtype)
    with np.errstate(all="ignore"):
        first = sess.run(None, {"x": x})[0]  # the checked loop: the kernels as written
        for _ in range(2):
            _same_bits(sess.run(None, {"x": x})[0], first)
        _same_bits(ReferenceEvaluator(model).run(None, {"x": x})[0], first)
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    theirs = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
    np.testing.assert_array_equal(theirs.run(None, {"x": x})[0], first)


@pytest.mark.parametrize(
    "op,dtype,out",
    [
        ("Equal", np.int32, np.bool_),
        ("Less", np.float32, np.bool_),
        ("Greater", np.float64, np.bool_),
        ("LessOrEqual", np.int64, np.bool_),
        ("BitwiseAnd", np.int32, None),
        ("BitwiseXor", np.int64, None),
        ("And", np.bool_, None),
        ("Or", np.bool_, None),
        ("Add", np.int32, None),
        ("Mul", np.int64, None),
    ],
)
def test_comparisons_logic_and_integers(op, dtype, out):
    rng = np.random.default_rng(7)
    if dtype is np.bool_:
        x, c = rng.random((4, 6)) > 0.5, rng.random((6,)) > 0.5
    else:
        x = rng.integers(-5, 5, (4, 6)).astype(dtype)
        c = rng.integers(-5, 5, (4, 1)).astype(dtype)
    model = _model([op], [4, 6], [c], dtype, out)
    sess = _session(model)
    assert broadcast_constants(sess.compiled.plan)
    first = sess.run(None, {"x": x})[0]
    _same_bits(sess.run(None, {"x": x})[0], first)
    _same_bits(ReferenceEvaluator(model).run(None, {"x": x})[0], first)


def test_a_constant_is_broadcast_once_and_shared_read_only():
    c = np.arange(4, dtype=np.float32)
    model = _model(["Add", "Mul", "Add"], [3, 4], [c, c.copy(), c], np.float32)
    model.graph.initializer[2].name = "k0"  # the third step reads k0 again
    model.graph.node[2].input[1] = "k0"
    del model.graph.initializer[2]
    sess = _session(model)
    wide = broadcast_constants(sess.compiled.plan)
    a, b, c2 = (wide[i].args[1] for i in sorted(wide))
    assert a is c2 and a is not b and a.shape == (3, 4) and not a.flags.writeable
    x = np.ones((3, 4), np.float32)
    first = sess.run(None, {"x": x})[0]
    _same_bits(sess.run(None, {"x": x})[0], first)


def test_what_is_left_alone():
    c = np.ones(64, np.float32)
    big = MAX_ELEMENTS // 64 + 1
    cases = [
        (_model(["Add"], [big, 64], [c], np.float32), "over the size bound"),
        (_model(["Add"], ["n", 64], [c], np.float32), "a symbolic dim"),
        (_model(["Add"], [4], [np.ones((3, 4), np.float32)], np.float32), "the constant widens"),
        (_model(["Add"], [3, 64], [np.ones((3, 64), np.float32)], np.float32), "same shape"),
        (_model(["Pow"], [3, 64], [np.full(64, 2, np.float32)], np.float32), "not exact"),
        (_model(["Max"], [3, 64], [c], np.float32), "not a ufunc step / not exact"),
    ]
    for model, why in cases:
        assert not broadcast_constants(_session(model).compiled.plan), why


def test_a_value_of_another_shape_takes_the_models_call():
    # The executor is given a value whose shape is not the static one (a plan run directly,
    # as a subgraph or IO binding may): the step broadcasts as the model wrote it.
    c = np.arange(4, dtype=np.float32)
    sess = _session(_model(["Add", "Mul"], [2, 4], [c, c], np.float32))
    ex = sess.compiled.executor
    x = np.ones((2, 4), np.float32)
    sess.run(None, {"x": x})
    sess.run(None, {"x": x})  # generated code from here on
    for shape in [(3, 4), (4,), (1, 2, 4)]:
        y = np.full(shape, 2, np.float32)
        _same_bits(ex.run([y])[0], (y + c) * c)


def test_an_incompatible_value_names_the_node():
    c = np.arange(4, dtype=np.float32)
    model = _model(["Add"], [2, 4], [c], np.float32)
    model.graph.node[0].name = "bias_add"
    sess = _session(model)
    ex = sess.compiled.executor
    x = np.ones((2, 4), np.float32)
    sess.run(None, {"x": x})
    with pytest.raises(RunError, match="Add node 'bias_add'.*broadcast"):
        ex.run([np.ones((2, 5), np.float32)])


def test_profiled_runs_give_the_same_bits(tmp_path):
    rng = np.random.default_rng(3)
    c = rng.standard_normal((1, 8)).astype(np.float32)
    model = _model(["Add", "Div", "Mul"], [5, 8], [c, c, c], np.float32)
    x = rng.standard_normal((5, 8)).astype(np.float32)
    plain = _session(model)
    plain.run(None, {"x": x})
    want = plain.run(None, {"x": x})[0]
    prof = _session(model, enable_profiling=True, profile_file_prefix=str(tmp_path / "p"))
    for _ in range(2):
        _same_bits(prof.run(None, {"x": x})[0], want)


def test_the_plan_budget(monkeypatch):
    from onnxep.execute import broadcast_consts

    monkeypatch.setattr(broadcast_consts, "MAX_BYTES", 1000)  # one [3, 64] float32 copy
    c = np.arange(64, dtype=np.float32)
    model = _model(["Add", "Mul", "Sub"], [3, 64], [c, c + 1, np.ones(1, np.float32)], np.float32)
    sess = _session(model)
    wide = broadcast_constants(sess.compiled.plan)
    assert sorted(wide) == [0, 2]  # the second copy is over budget; a size-1 one is a view
    assert wide[2].args[1].shape == () and wide[2].args[1].base is not None
    x = np.ones((3, 64), np.float32)
    first = sess.run(None, {"x": x})[0]
    _same_bits(sess.run(None, {"x": x})[0], first)
    _same_bits(first, (x + c) * (c + 1) - 1)
