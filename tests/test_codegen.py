"""Runs after the first use generated straight-line code and the shape cache: same results."""

from __future__ import annotations

import numpy as np
import pytest

import onnxep
from onnxep.tools.conformance import excluded_reason, load_cases, run_case


@pytest.mark.parametrize("category", ["node", "pytorch-converted", "pytorch-operator"])
def test_backend_cases_give_the_same_results_on_repeated_runs(category):
    failures = []
    for case in load_cases(category):
        if excluded_reason(case.name, category):
            continue
        r = run_case(case, category, ["cpu"], repeat=3)
        if not r.ok:
            failures.append(f"{r.name}: {r.reason}")
    assert not failures, "\n".join(failures[:20])


def test_shape_cache_hits_and_keys_by_shape():
    from pathlib import Path

    path = Path(__file__).parent / "data" / "llama_kv.onnx"
    sess = onnxep.InferenceSession(str(path), providers=["cpu"])
    rng = np.random.default_rng(0)

    def feeds(seq, past):
        f = {"input_ids": rng.integers(0, 512, (1, seq)).astype(np.int64)}
        for arg in sess.get_inputs()[1:]:
            f[arg.name] = rng.standard_normal((1, 2, past, 64)).astype(np.float32)
        return f

    steps = [s for s in sess.compiled.plan.steps if s.shape_only]
    assert any(s.op_type == "Shape" for s in steps)
    assert any(s.op_type == "Range" for s in steps)
    a, b = feeds(3, 5), feeds(4, 2)
    want_a, want_b = sess.run(None, a), sess.run(None, b)  # checked first runs
    for _ in range(3):
        for f, want in ((a, want_a), (b, want_b)):
            for x, y in zip(sess.run(None, f), want):
                np.testing.assert_array_equal(x, y)
    cache = sess.compiled.executor.shape_cache
    assert cache.hits >= 4 and len(cache.entries) == 2


def test_subgraph_caches_shapes_of_the_outer_values_it_reads():
    # An If branch that tests an outer value's rank (silero VAD's LSTM branch): the branch
    # plan's Shape/Size/Equal glue is cached per the shapes of its inputs, outer values
    # included, and a run with another rank takes the other answer.
    from onnx import TensorProto, helper

    ort = pytest.importorskip("onnxruntime")
    rank_is_2 = [
        helper.make_node("Shape", ["x"], ["sh"]),
        helper.make_node("Size", ["sh"], ["rank"]),
        helper.make_node("Equal", ["rank", "two"], ["eq"]),
        helper.make_node("Cast", ["eq"], ["eqf"], to=TensorProto.FLOAT),
        helper.make_node("Mul", ["x", "eqf"], ["out"]),
    ]
    two = helper.make_tensor("two", TensorProto.INT64, [], [2])
    body = helper.make_graph(
        rank_is_2,
        "then",
        [],
        [helper.make_tensor_value_info("out", TensorProto.FLOAT, None)],
        [two],
    )
    neg = helper.make_graph(
        [helper.make_node("Neg", ["x"], ["o2"])],
        "else",
        [],
        [helper.make_tensor_value_info("o2", TensorProto.FLOAT, None)],
    )
    graph = helper.make_graph(
        [
            helper.make_node("Relu", ["xin"], ["x"]),
            helper.make_node("If", ["c"], ["y"], then_branch=body, else_branch=neg),
        ],
        "g",
        [
            helper.make_tensor_value_info("c", TensorProto.BOOL, []),
            helper.make_tensor_value_info("xin", TensorProto.FLOAT, None),
        ],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
    )
    data = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString()
    sess = onnxep.InferenceSession(data, providers=["cpu"])
    theirs = ort.InferenceSession(data, providers=["CPUExecutionProvider"])
    branch = next(g for g in sess.compiled.graphs[1:] if len(g.plan.steps) > 1)
    cached = {s.op_type for s in branch.plan.steps if s.shape_only}
    assert {"Shape", "Size", "Equal", "Cast"} <= cached
    assert not any(s.shape_only for s in branch.plan.steps if s.op_type == "Mul")
    rng = np.random.default_rng(0)
    for _ in range(3):
        for shape in ((2, 3), (2, 3, 1), (4, 1), (5,)):
            f = {"c": np.array(True), "xin": rng.standard_normal(shape).astype(np.float32)}
            np.testing.assert_array_equal(sess.run(None, f)[0], theirs.run(None, f)[0])
    assert branch.executor.shape_cache.hits >= 6
