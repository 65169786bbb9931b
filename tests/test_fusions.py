"""Extended rewrites: fusions match structure, keep escaping intermediates, can be switched off."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from onnx import helper, numpy_helper
from test_fusions_graphs import make_model, tensor

import onnxep

DATA = Path(__file__).parent / "data"


def _rms_model(escape: bool = False, eps: float = 1e-6):
    w = numpy_helper.from_array(np.linspace(0.5, 1.5, 16).astype(np.float32), "w")
    two = numpy_helper.from_array(np.array(2.0, np.float32), "two")
    e = numpy_helper.from_array(np.array(eps, np.float32), "eps")
    axes = numpy_helper.from_array(np.array([-1], np.int64), "axes")
    nodes = [
        helper.make_node("Pow", ["x", "two"], ["p"]),
        helper.make_node("ReduceMean", ["p", "axes"], ["m"], keepdims=1),
        helper.make_node("Add", ["m", "eps"], ["a"]),
        helper.make_node("Sqrt", ["a"], ["s"]),
        helper.make_node("Reciprocal", ["s"], ["r"]),
        helper.make_node("Mul", ["x", "r"], ["n"]),
        helper.make_node("Mul", ["n", "w"], ["y"]),
    ]
    outputs = [tensor("y", ["B", "S", 16])]
    if escape:
        outputs.append(tensor("m", ["B", "S", 1]))
    return make_model(
        nodes, [tensor("x", ["B", "S", 16])], outputs, inits=[w, two, e, axes], opset=18
    )


def _run(model, **opts):
    sess = onnxep.InferenceSession(model, onnxep.SessionOptions(**opts), providers=["cpu"])
    x = np.random.default_rng(0).standard_normal((2, 3, 16)).astype(np.float32)
    return sess, sess.run(None, {"x": x})


def test_rms_norm_fuses_and_matches_unfused():
    fused, out = _run(_rms_model())
    assert fused.placement().rewrites["fuse_rms_norm"] == 1
    assert [n.op_type for n in fused.placement()] == ["SimplifiedLayerNormalization"]
    # the CPU's elementwise chains off too: the unfused graph's seven nodes
    plain, ref = _run(_rms_model(), disabled_rewrites=["fuse_rms_norm", "fuse_elementwise_chains"])
    assert len(plain.placement()) == 7
    assert plain.placement().skipped_rewrites == ["fuse_rms_norm", "fuse_elementwise_chains"]
    np.testing.assert_allclose(out[0], ref[0], rtol=1e-5, atol=1e-6)


def test_rms_norm_refuses_when_an_intermediate_escapes():
    sess, _ = _run(_rms_model(escape=True), disabled_rewrites=["fuse_elementwise_chains"])
    assert sess.placement().rewrites["fuse_rms_norm"] == 0
    assert len(sess.placement()) == 7


def test_basic_level_does_not_fuse():
    sess, _ = _run(
        _rms_model(), graph_optimization_level=onnxep.GraphOptimizationLevel.ORT_ENABLE_BASIC
    )
    assert "fuse_rms_norm" not in sess.placement().rewrites


def test_exported_decoder_fused_matches_unfused():
    path = str(DATA / "llama_kv.onnx")
    rng = np.random.default_rng(0)
    fused = onnxep.InferenceSession(path, providers=["cpu"])
    plain = onnxep.InferenceSession(
        path, onnxep.SessionOptions(disabled_rewrites=["fuse_rms_norm"]), providers=["cpu"]
    )
    assert fused.placement().rewrites["fuse_rms_norm"] == 5  # 2 layers x 2 + final norm
    f = {"input_ids": rng.integers(0, 512, (1, 6)).astype(np.int64)}
    for arg in fused.get_inputs()[1:]:
        f[arg.name] = rng.standard_normal((1, 2, 4, 64)).astype(np.float32)
    for a, b in zip(fused.run(None, f), plain.run(None, f)):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)


def test_fusion_leaves_nodes_another_provider_owns(toy_dist):
    # The toy provider claims Add (the eps add inside the pattern) ahead of the CPU,
    # so the CPU provider's fusion may not swallow it.
    sess = onnxep.InferenceSession(_rms_model(), providers=["toy", "cpu"])
    rep = sess.placement()
    assert rep.rewrites.get("fuse_rms_norm", 0) == 0
    assert "toy" in rep.counts()
    x = np.random.default_rng(0).standard_normal((2, 3, 16)).astype(np.float32)
    (plain,) = onnxep.InferenceSession(
        _rms_model(), onnxep.SessionOptions(disabled_rewrites=["fuse_rms_norm"]), providers=["cpu"]
    ).run(None, {"x": x})
    np.testing.assert_allclose(sess.run(None, {"x": x})[0], plain, rtol=1e-5, atol=1e-6)
