"""CUDA-graph capture on the GPU: replays equal eager runs, seams, fallbacks, decode.

The planning and the runner's bookkeeping are tested on the CPU
(tests/test_capture_plan.py, with a fake device); here the real graphs run.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import onnxep
from onnxep.generation.spec import decode_spec
from onnxep.plugins.host import unregister_plugin
from onnxep.providers import hookimpl, kernel

ROOT = Path(__file__).resolve().parents[2]
DOMAIN = "test.capture"


@kernel("HostDouble", domain=DOMAIN, capture_safe=False, capture_note="reads its input on the host")
def host_double(node, xp):
    import cupy as cp

    return lambda x: (cp.asarray(cp.asnumpy(x) * 2),)


@kernel("SneakyDouble", domain=DOMAIN)
def sneaky_double(node, xp):
    # Declares itself capture-safe but synchronizes with the host: its capture fails.
    import cupy as cp

    return lambda x: (cp.asarray(cp.asnumpy(x) * 2),)


class TestKernels:
    @hookimpl
    def onnxep_kernels(self, provider):
        if provider.name != "cuda":
            return None
        return [*host_double.__onnxep_kernels__, *sneaky_double.__onnxep_kernels__]


@pytest.fixture
def test_kernels():
    plugin = TestKernels()
    onnxep.register_provider(plugin, name="capture-test-kernels")
    yield
    unregister_plugin(plugin)


def _model(middle: str | None) -> onnx.ModelProto:
    """x [4, 8] @ w [8, 8] + b -> Relu -> <middle> -> Mul(x) -> Tanh."""
    rng = np.random.default_rng(0)
    w = helper.make_tensor("w", TensorProto.FLOAT, [8, 8], rng.standard_normal(64).tolist())
    b = helper.make_tensor("b", TensorProto.FLOAT, [8], rng.standard_normal(8).tolist())
    nodes = [
        helper.make_node("MatMul", ["x", "w"], ["mm"], name="matmul"),
        helper.make_node("Add", ["mm", "b"], ["a"], name="add"),
        helper.make_node("Relu", ["a"], ["r"], name="relu"),
    ]
    if middle is None:
        nodes.append(helper.make_node("Identity", ["r"], ["m"], name="middle"))
    else:
        nodes.append(helper.make_node(middle, ["r"], ["m"], name="middle", domain=DOMAIN))
    nodes += [
        helper.make_node("Mul", ["m", "x"], ["p"], name="mul"),
        helper.make_node("Tanh", ["p"], ["y"], name="tanh"),
    ]
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 8])],
        [w, b],
    )
    opsets = [helper.make_opsetid("", 17), helper.make_opsetid(DOMAIN, 1)]
    return helper.make_model(graph, opset_imports=opsets)


def _reference(x: np.ndarray, model: onnx.ModelProto, middle: str | None) -> np.ndarray:
    w, b = (onnx.numpy_helper.to_array(t) for t in model.graph.initializer)
    r = np.maximum(x @ w + b, 0)
    m = r if middle is None else 2 * r
    return np.tanh(m * x)


def _cuda(model, capture, **extra):
    return onnxep.InferenceSession(
        model.SerializeToString(), providers=[("cuda", {"capture": capture, **extra}), "cpu"]
    )


def _check_runs(sess, model, middle, runs=6):
    rng = np.random.default_rng(1)
    for _ in range(runs):
        x = rng.standard_normal((4, 8)).astype(np.float32)
        (y,) = sess.run(None, {"x": x})
        np.testing.assert_allclose(y, _reference(x, model, middle), rtol=1e-4, atol=1e-5)


def test_a_safe_chain_is_one_graph_and_replays_right():
    model = _model(None)
    sess = _cuda(model, "whole")
    assert sess.capture_plan().mode == "whole"
    _check_runs(sess, model, None)
    s = sess.capture_stats()
    assert (s["captures"], s["replays"], s["fallbacks"]) == (1, 3, 0), s


def test_an_unsafe_step_in_the_middle_runs_segmented(test_kernels, tmp_path, capsys, monkeypatch):
    model = _model("HostDouble")
    sess = _cuda(model, "auto")
    cp = sess.capture_plan()
    assert cp.mode == "segmented", cp.format()
    assert [r.name for r in cp.seams] == ["middle"]
    _check_runs(sess, model, "HostDouble")
    s = sess.capture_stats()
    assert s["captures"] == 1 and s["replays"] == 3 and s["segments"] == 2, s
    path = tmp_path / "m.onnx"
    onnx.save(model, path)
    from onnxep.tools.cli import main

    monkeypatch.setenv("ONNXEP_CUDA_CAPTURE", "auto")  # explain takes the default options
    assert main(["explain", str(path), "--providers", "cuda,cpu"]) == 0
    out = capsys.readouterr().out
    assert "capture: segmented (asked: auto)" in out
    assert "seam 'middle' (HostDouble): reads its input on the host" in out


def test_whole_refuses_naming_the_seam(test_kernels):
    with pytest.raises(onnxep.errors.ConfigError, match="'middle' \\(HostDouble\\)"):
        _cuda(_model("HostDouble"), "whole")


def test_a_failing_capture_falls_back_with_its_reason(test_kernels):
    model = _model("SneakyDouble")
    sess = _cuda(model, "auto", capture_warmup=0)
    _check_runs(sess, model, "SneakyDouble")
    s = sess.capture_stats()
    assert s["fallbacks"] == 1 and "capture failed at 'middle'" in s["failures"][0], s
    assert s["policy"] == "segmented" and s["replays"] >= 1, s


def _grid_model() -> onnx.ModelProto:
    """y = tanh(r + grid), r = relu(x), grid = range(0.0, float(W), 1.0) + 0.5 from r's
    shape, the grid's shape feeding an Expand: a float value the host computes from shapes
    alone and uploads, as a YOLOv8 head builds its anchor grid."""
    f32 = TensorProto.FLOAT
    consts = [
        helper.make_tensor("axis", TensorProto.INT64, [], [3]),
        helper.make_tensor("zero", f32, [], [0.0]),
        helper.make_tensor("one", f32, [], [1.0]),
        helper.make_tensor("half", f32, [], [0.5]),
    ]
    nodes = [
        helper.make_node("Relu", ["x"], ["r"], name="relu"),
        helper.make_node("Shape", ["r"], ["shape"], name="shape"),
        helper.make_node("Gather", ["shape", "axis"], ["w"], name="width"),
        helper.make_node("Cast", ["w"], ["wf"], to=f32, name="cast"),
        helper.make_node("Range", ["zero", "wf", "one"], ["rg"], name="range"),
        helper.make_node("Add", ["rg", "half"], ["grid"], name="grid"),
        # the grid's own shape sizes a tensor, so the grid is computed on the host
        helper.make_node("Shape", ["grid"], ["gshape"], name="grid_shape"),
        helper.make_node("Expand", ["grid", "gshape"], ["e"], name="expand"),
        helper.make_node("Add", ["r", "e"], ["a"], name="add"),
        helper.make_node("Tanh", ["a"], ["y"], name="tanh"),
    ]
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", f32, [1, 3, 5, "W"])],
        [helper.make_tensor_value_info("y", f32, [1, 3, 5, "W"])],
        consts,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_a_shape_derived_upload_is_captured_with_the_graph():
    sess = _cuda(_grid_model(), "whole")
    roles = sess.capture_plan().roles
    assert any(r.role == "frozen" and r.op_type == "Copy" for r in roles), roles
    rng = np.random.default_rng(2)
    for width in (7,) * 4 + (9,) * 4 + (7,):  # two warm-up runs a shape, then a capture
        x = rng.standard_normal((1, 3, 5, width)).astype(np.float32)
        (y,) = sess.run(None, {"x": x})
        want = np.tanh(np.maximum(x, 0) + np.arange(width) + 0.5)
        np.testing.assert_allclose(y, want, rtol=1e-5, atol=1e-6)
    s = sess.capture_stats()
    # one capture per width, every later run a replay, nothing fell back
    assert (s["captures"], s["replays"], s["fallbacks"]) == (2, 3, 0), s


def test_graph_id_minus_one_runs_eagerly():
    model = _model(None)
    sess = _cuda(model, "auto", capture_warmup=0)
    opts = onnxep.RunOptions()
    opts.add_run_config_entry("gpu_graph_id", "-1")
    x = np.ones((4, 8), np.float32)
    for _ in range(3):
        (y,) = sess.run(None, {"x": x}, opts)
        np.testing.assert_allclose(y, _reference(x, model, None), rtol=1e-4, atol=1e-5)
    assert sess.capture_stats()["captures"] == 0


@pytest.fixture(scope="module")
def decoders(tmp_path_factory) -> dict[str, str]:
    sys.path.insert(0, str(ROOT))
    from bench.factory import build_genai_decoder, build_hybrid_decoder

    out = tmp_path_factory.mktemp("capture-decode")
    paths = {}
    for dtype in ("fp16", "int4"):
        path = out / dtype / "model.onnx"
        build_genai_decoder("tiny", seed=1, dtype=dtype, out_path=path)
        paths[dtype] = str(path)
    path = out / "hybrid" / "model.onnx"
    build_hybrid_decoder("tiny", seed=1, out_path=path)
    paths["hybrid"] = str(path)
    return paths


@pytest.mark.parametrize("dtype", ["fp16", "int4", "hybrid"])
def test_captured_decode_equals_eager_and_cpu(dtype, decoders):
    prompt = np.random.default_rng(7).integers(0, 512, 8)
    path = decoders[dtype]
    cap = 8 + 64  # one capacity for both decodes: the same step shapes, so one capture
    cpu = onnxep.generate(onnxep.InferenceSession(path, providers=["cpu"]), prompt, 64)
    eager_sess = onnxep.InferenceSession(path, providers=[("cuda", {"capture": "off"}), "cpu"])
    eager = onnxep.generate(eager_sess, prompt, 64, capacity=cap)
    assert eager.full_mask and eager.capture_stats["replays"] == 0, eager.capture_stats
    sess = onnxep.InferenceSession(path, providers=[("cuda", {"capture": "auto"}), "cpu"])
    first = onnxep.generate(sess, prompt, 32, capacity=cap)
    mid = sess.capture_stats()
    got = onnxep.generate(sess, prompt, 64, capacity=cap)
    end = sess.capture_stats()
    np.testing.assert_array_equal(first.token_ids, eager.token_ids[:, :32])
    np.testing.assert_array_equal(got.token_ids, eager.token_ids)
    np.testing.assert_array_equal(got.token_ids, cpu.token_ids)
    assert end["fallbacks"] == 0, end["failures"]
    # the first decode: 2 warm-up steps, one capture, then replays of the same graph
    assert first.capture_stats["captures"] == 1, first.capture_stats
    assert first.capture_stats["replays"] == 32 - 1 - 3, first.capture_stats
    # the second decode binds KV buffers of its own: the graph baked on the first decode's
    # is never replayed on them; one new capture at its first decode step, then replays
    assert end["captures"] == mid["captures"] + 1, end
    assert got.capture_stats["rebinds"] == 1, got.capture_stats
    assert got.capture_stats["replays"] == 64 - 2, got.capture_stats
    # the graph reads and writes the bound caches in place: no cache copy on any step,
    # the replays copy only the host feeds (ids, mask, positions) into the graph's buffers
    # and the recurrent and conv states (the hybrid) are updated in place, never copied
    spec = decode_spec(sess.get_inputs(), sess.get_outputs())
    host_feeds = len(sess.get_inputs()) - len(spec.states)
    if any(s.grow_axis is None for s in spec.states):
        assert "updated in place" in got.state_note, got.state_note
    for res in (first, got):
        assert res.copied_outputs == [0] * len(res.copied_outputs), res.copied_outputs
        c = res.capture_stats
        assert c["copies"] <= c["replays"] * host_feeds, (c, host_feeds)
