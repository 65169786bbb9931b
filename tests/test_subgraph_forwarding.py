"""Subgraphs of host Identity steps only hand their feeds on (compiled_graph.forwarded_feeds).

Such a branch returns its feeds, graph inputs then outer values, in the order its outputs
name them, without an executor call; anything else, and every branch of a profiled session,
keeps its executor.
"""

import numpy as np
import pytest
from onnx import TensorProto, helper

import onnxep
from onnxep.compiled_graph import forwarded_feeds

ort = pytest.importorskip("onnxruntime")


def _vi(name, elem=TensorProto.FLOAT):
    return helper.make_tensor_value_info(name, elem, None)


def _if_model(then_nodes, then_outs, else_nodes, else_outs) -> bytes:
    """o1, o2 = If(c) over a = Relu(x) and b = Neg(y), values the branches read from outside."""
    then = helper.make_graph(then_nodes, "then", [], [_vi(n) for n in then_outs])
    other = helper.make_graph(else_nodes, "else", [], [_vi(n) for n in else_outs])
    graph = helper.make_graph(
        [
            helper.make_node("Relu", ["x"], ["a"]),
            helper.make_node("Neg", ["y"], ["b"]),
            helper.make_node("If", ["c"], ["o1", "o2"], then_branch=then, else_branch=other),
        ],
        "g",
        [helper.make_tensor_value_info("c", TensorProto.BOOL, []), _vi("x"), _vi("y")],
        [_vi("o1"), _vi("o2")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    return model.SerializeToString()


# then: (b, a) through a chain of two Identities for a (outputs swapped against the
# outer values' order); else: (a, b) through one Identity each
_FORWARDING = _if_model(
    [
        helper.make_node("Identity", ["a"], ["t1"]),
        helper.make_node("Identity", ["t1"], ["t2"]),
        helper.make_node("Identity", ["b"], ["t3"]),
    ],
    ["t3", "t2"],
    [
        helper.make_node("Identity", ["a"], ["e1"]),
        helper.make_node("Identity", ["b"], ["e2"]),
    ],
    ["e1", "e2"],
)

# the same, but the else branch adds: it keeps its executor
_ADDING = _if_model(
    [
        helper.make_node("Identity", ["b"], ["t1"]),
        helper.make_node("Identity", ["a"], ["t2"]),
    ],
    ["t1", "t2"],
    [
        helper.make_node("Add", ["a", "a"], ["e1"]),
        helper.make_node("Identity", ["b"], ["e2"]),
    ],
    ["e1", "e2"],
)


def _feeds(c: bool, n: int = 5, m: int = 3) -> dict:
    rng = np.random.default_rng(n * 10 + m)
    return {
        "c": np.array(c),
        "x": rng.standard_normal(n).astype(np.float32),
        "y": rng.standard_normal(m).astype(np.float32),
    }


def _reference(model: bytes, f: dict) -> list[np.ndarray]:
    a, b = np.maximum(f["x"], 0), -f["y"]
    if f["c"]:
        return [b, a]
    return [a + a, b] if model is _ADDING else [a, b]


def _branches(sess) -> dict:
    return {g.name: g for g in sess.compiled.graphs[1:]}


def _check_runs(sess, model: bytes) -> None:
    theirs = ort.InferenceSession(model, providers=["CPUExecutionProvider"])
    # two rounds: the first run of a plan goes through the checked loop, later ones not
    for _ in range(2):
        for c in (True, False):
            for n, m in ((5, 3), (1, 4), (0, 2)):
                f = _feeds(c, n, m)
                ours = sess.run(None, f)
                want = _reference(model, f)
                for o, t, w in zip(ours, theirs.run(None, f), want, strict=True):
                    assert o.dtype == w.dtype and o.shape == w.shape
                    np.testing.assert_array_equal(o, t)
                    np.testing.assert_array_equal(o, w)


def test_identity_branches_forward_their_feeds_in_the_outputs_order():
    sess = onnxep.InferenceSession(_FORWARDING, providers=["cpu"])
    branches = _branches(sess)
    # the outer values bind in the order the branch reads them: then reads a, then b
    assert branches["then"].forwards == (1, 0)
    assert branches["else"].forwards == (0, 1)
    for g in branches.values():
        assert g.forwards == forwarded_feeds(g.plan)
        assert all(s.op_type == "Identity" for s in g.plan.steps)
    assert sess.compiled.main.forwards is None  # the top level always runs its executor
    _check_runs(sess, _FORWARDING)


def test_forwarding_branches_make_no_executor_call(monkeypatch):
    sess = onnxep.InferenceSession(_FORWARDING, providers=["cpu"])

    def no_call(feeds):
        raise AssertionError("a forwarding branch ran its executor")

    for g in _branches(sess).values():
        monkeypatch.setattr(g.executor, "run", no_call)
    _check_runs(sess, _FORWARDING)


def test_a_branch_with_another_op_keeps_its_executor():
    sess = onnxep.InferenceSession(_ADDING, providers=["cpu"])
    branches = _branches(sess)
    assert branches["then"].forwards == (1, 0)
    assert any(s.op_type == "Add" for s in branches["else"].plan.steps)
    assert forwarded_feeds(branches["else"].plan) is None
    assert branches["else"].forwards is None
    _check_runs(sess, _ADDING)


def test_profiled_sessions_run_every_branch_through_its_executor(tmp_path):
    # the profiler times each step, so a profiled branch keeps its steps
    so = onnxep.SessionOptions()
    so.enable_profiling = True
    so.profile_file_prefix = str(tmp_path / "prof")
    sess = onnxep.InferenceSession(_FORWARDING, so, providers=["cpu"])
    assert sess.profiler is not None
    branches = _branches(sess)
    assert all(g.forwards is None for g in branches.values())
    assert forwarded_feeds(branches["then"].plan) == (1, 0)
    _check_runs(sess, _FORWARDING)
    assert sess.end_profiling()


def test_an_output_listed_twice_keeps_its_executor():
    # the executor copies a repeated output (the caller may write into one of the two);
    # handing the feed on twice would give two outputs one buffer
    model = _if_model(
        [helper.make_node("Identity", ["b"], ["t1"]), helper.make_node("Identity", ["a"], ["t2"])],
        ["t1", "t2"],
        [helper.make_node("Identity", ["a"], ["e1"])],
        ["e1", "e1"],
    )
    sess = onnxep.InferenceSession(model, providers=["cpu"])
    branches = _branches(sess)
    assert branches["then"].forwards == (1, 0)
    assert branches["else"].forwards is None
    for _ in range(2):
        f = _feeds(False)
        o1, o2 = sess.run(None, f)
        a = np.maximum(f["x"], 0)
        np.testing.assert_array_equal(o1, a)
        np.testing.assert_array_equal(o2, a)
        assert not np.shares_memory(o1, o2)


def test_a_loop_body_of_identities_forwards_inputs_and_outer_values():
    # body (i, cond, v) -> (cond, v, a): graph inputs come first among the feeds, the
    # outer value a after them; the scan output stacks a once an iteration
    body = helper.make_graph(
        [
            helper.make_node("Identity", ["cond_in"], ["cond_out"]),
            helper.make_node("Identity", ["v_in"], ["v_out"]),
            helper.make_node("Identity", ["a"], ["scan"]),
        ],
        "body",
        [
            helper.make_tensor_value_info("i", TensorProto.INT64, []),
            helper.make_tensor_value_info("cond_in", TensorProto.BOOL, []),
            _vi("v_in"),
        ],
        [
            helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []),
            _vi("v_out"),
            _vi("scan"),
        ],
    )
    graph = helper.make_graph(
        [
            helper.make_node("Relu", ["x"], ["a"]),
            helper.make_node("Loop", ["trips", "cond", "v"], ["v_last", "stacked"], body=body),
        ],
        "g",
        [
            helper.make_tensor_value_info("trips", TensorProto.INT64, []),
            helper.make_tensor_value_info("cond", TensorProto.BOOL, []),
            _vi("v"),
            _vi("x"),
        ],
        [_vi("v_last"), _vi("stacked")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    data = model.SerializeToString()
    sess = onnxep.InferenceSession(data, providers=["cpu"])
    (loop_body,) = _branches(sess).values()
    assert loop_body.forwards == (1, 2, 3)
    theirs = ort.InferenceSession(data, providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(1)
    for trips in (3, 1):
        f = {
            "trips": np.array(trips, np.int64),
            "cond": np.array(True),
            "v": rng.standard_normal(4).astype(np.float32),
            "x": rng.standard_normal(2).astype(np.float32),
        }
        ours = sess.run(None, f)
        want = [f["v"], np.stack([np.maximum(f["x"], 0)] * trips)]
        for o, t, w in zip(ours, theirs.run(None, f), want, strict=True):
            np.testing.assert_array_equal(o, t)
            np.testing.assert_array_equal(o, w)
        assert not np.shares_memory(ours[0], f["v"])  # the top level guards its feeds


def test_a_branch_returning_an_outer_value_without_a_node_is_refused_with_the_fix():
    """A branch whose output is an enclosing graph's value with no node in between is not a
    valid ONNX subgraph: onnxruntime refuses it and says to add an Identity node; so does
    onnxep, at session creation, naming the value."""
    bare = _if_model(
        [],
        ["a", "b"],
        [helper.make_node("Identity", ["a"], ["e1"]), helper.make_node("Identity", ["b"], ["e2"])],
        ["e1", "e2"],
    )
    with pytest.raises(onnxep.errors.InvalidGraph, match=r"'a'.*add an Identity node"):
        onnxep.InferenceSession(bare, providers=["cpu"])
    with pytest.raises(Exception, match="Identity"):
        ort.InferenceSession(bare, providers=["CPUExecutionProvider"])
