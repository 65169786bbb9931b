"""Bad input gets a clear error naming what was wrong, and the session stays usable."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from conftest import make_model, tensor
from onnx import helper, numpy_helper

import onnxep
from onnxep.errors import InvalidArgument, InvalidGraph, InvalidModel, RunError


@pytest.fixture
def sess():
    m = make_model(
        [helper.make_node("Relu", ["x"], ["y"])],
        [tensor("x", ["batch", 3])],
        [tensor("y", ["batch", 3])],
    )
    return onnxep.InferenceSession(m, providers=["cpu"])


GOOD = np.ones((2, 3), np.float32)


@pytest.mark.parametrize(
    "feed, pattern",
    [
        ({}, "missing input 'x'"),
        ({"x": GOOD, "q": GOOD}, "unknown input\\(s\\) 'q'.*inputs are 'x'"),
        (
            {"x": GOOD.astype(np.float64)},
            "'x' has dtype float64 but the model declares tensor\\(float\\)",
        ),
        ({"x": np.ones((2, 3, 1), np.float32)}, "'x' has rank 3 .*declares rank 2"),
        ({"x": np.ones((2, 4), np.float32)}, "'x' has 4 at dim 1 .*fixes it to 3"),
        ({"x": object()}, "'x' must be a numpy array"),
    ],
)
def test_bad_feeds_are_named_and_session_survives(sess, feed, pattern):
    with pytest.raises(InvalidArgument, match=pattern):
        sess.run(None, feed)
    np.testing.assert_array_equal(sess.run(None, {"x": GOOD})[0], GOOD)


def test_bad_feed_type_is_value_error(sess):
    with pytest.raises(ValueError):
        sess.run(None, [GOOD])


def test_unparsable_file(tmp_path):
    p = tmp_path / "junk.onnx"
    p.write_bytes(b"\x00\x01 not a model at all \xff" * 10)
    with pytest.raises(InvalidModel, match="junk.onnx"):
        onnxep.InferenceSession(str(p), providers=["cpu"])


def test_missing_file(tmp_path):
    with pytest.raises(InvalidModel, match="does not exist"):
        onnxep.InferenceSession(str(tmp_path / "nope.onnx"))


def test_undefined_input_is_invalid_graph():
    m = make_model(
        [helper.make_node("Relu", ["ghost"], ["y"], name="r")],
        [tensor("x", [1])],
        [tensor("y", [1])],
    )
    with pytest.raises(InvalidGraph, match="'r' reads 'ghost'"):
        onnxep.InferenceSession(m, providers=["cpu"])


def test_double_assignment_is_invalid_graph():
    m = make_model(
        [helper.make_node("Relu", ["x"], ["y"]), helper.make_node("Relu", ["x"], ["y"])],
        [tensor("x", [1])],
        [tensor("y", [1])],
    )
    with pytest.raises(InvalidGraph, match="assigned twice"):
        onnxep.InferenceSession(m, providers=["cpu"])


def test_cycle_is_invalid_graph():
    m = make_model(
        [helper.make_node("Add", ["x", "b"], ["a"]), helper.make_node("Relu", ["a"], ["b"])],
        [tensor("x", [1])],
        [tensor("b", [1])],
    )
    with pytest.raises(InvalidGraph, match="cycle"):
        onnxep.InferenceSession(m, providers=["cpu"])


def test_unsorted_nodes_are_sorted(rng):
    m = make_model(
        [helper.make_node("Relu", ["a"], ["y"]), helper.make_node("Add", ["x", "x"], ["a"])],
        [tensor("x", [2])],
        [tensor("y", [2])],
    )
    sess = onnxep.InferenceSession(m, providers=["cpu"])
    np.testing.assert_array_equal(sess.run(None, {"x": np.array([-1, 2], np.float32)})[0], [0, 4])


def _external_model(tmp_path, location):
    w = numpy_helper.from_array(np.arange(4, dtype=np.float32), "w")
    m = make_model(
        [helper.make_node("Add", ["x", "w"], ["y"])],
        [tensor("x", [4])],
        [tensor("y", [4])],
        inits=[w],
    )
    folder = tmp_path / "model"
    folder.mkdir()
    onnx.save(
        m, str(folder / "m.onnx"), save_as_external_data=True, location="w.bin", size_threshold=0
    )
    if location != "w.bin":
        t = [t for t in m.graph.initializer][0]
        loaded = onnx.load(str(folder / "m.onnx"), load_external_data=False)
        for e in loaded.graph.initializer[0].external_data:
            if e.key == "location":
                e.value = location
        onnx.save(loaded, str(folder / "m.onnx"))
        del t
    return folder / "m.onnx"


def test_external_data_loads_from_path(tmp_path):
    path = _external_model(tmp_path, "w.bin")
    sess = onnxep.InferenceSession(str(path), providers=["cpu"])
    np.testing.assert_array_equal(sess.run(None, {"x": np.zeros(4, np.float32)})[0], [0, 1, 2, 3])
    with pytest.raises(InvalidModel, match="load it from its file path"):
        onnxep.InferenceSession(path.read_bytes(), providers=["cpu"])


def test_external_data_outside_folder_is_refused(tmp_path):
    path = _external_model(tmp_path, "../secret.bin")
    (tmp_path / "secret.bin").write_bytes(np.arange(4, dtype=np.float32).tobytes())
    with pytest.raises(InvalidModel, match="outside the model's folder"):
        onnxep.InferenceSession(str(path), providers=["cpu"])


def test_kernel_failure_names_node_and_session_survives():
    m = make_model(
        [helper.make_node("MatMul", ["a", "b"], ["y"], name="mm")],
        [tensor("a", ["M", "K"]), tensor("b", ["K2", "N"])],
        [tensor("y", ["M", "N"])],
    )
    sess = onnxep.InferenceSession(m, providers=["cpu"])
    with pytest.raises(RunError, match="MatMul node 'mm' on provider 'cpu' failed"):
        sess.run(None, {"a": np.ones((2, 3), np.float32), "b": np.ones((4, 5), np.float32)})
    (y,) = sess.run(None, {"a": np.ones((2, 3), np.float32), "b": np.ones((3, 5), np.float32)})
    assert y.shape == (2, 5)


def test_kernel_failure_after_warm_runs_still_names_the_node():
    m = make_model(
        [
            helper.make_node("Relu", ["a"], ["r"], name="relu"),
            helper.make_node("MatMul", ["r", "b"], ["y"], name="mm"),
        ],
        [tensor("a", ["M", "K"]), tensor("b", ["K2", "N"])],
        [tensor("y", ["M", "N"])],
    )
    sess = onnxep.InferenceSession(m, providers=["cpu"])
    good = {"a": np.ones((2, 3), np.float32), "b": np.ones((3, 5), np.float32)}
    for _ in range(3):
        assert sess.run(None, good)[0].shape == (2, 5)
    with pytest.raises(RunError, match="MatMul node 'mm' on provider 'cpu' failed"):
        sess.run(None, {"a": np.ones((2, 3), np.float32), "b": np.ones((4, 5), np.float32)})


def test_kernel_returning_a_bare_array_is_caught():
    from onnxep.providers import Provider, ProviderInfo, hookimpl, kernel

    @kernel("Relu", since=6)
    def relu(node, xp):
        return lambda x: xp.maximum(x, 0)  # a bug: not a tuple

    class Plugin:
        @hookimpl
        def onnxep_provider_info(self):
            return ProviderInfo(name="buggy", device="cpu")

        @hookimpl
        def onnxep_create_provider(self, options):
            return Provider("buggy", options)

        @hookimpl
        def onnxep_kernels(self, provider):
            return relu.__onnxep_kernels__ if provider.name == "buggy" else None

    from onnxep.plugins.host import unregister_plugin

    plugin = Plugin()
    onnxep.register_provider(plugin)
    try:
        m = make_model(
            [helper.make_node("Relu", ["x"], ["y"], name="r")],
            [tensor("x", [2])],
            [tensor("y", [2])],
        )
        sess = onnxep.InferenceSession(m, providers=["buggy"])
        with pytest.raises(
            RunError, match="Relu node 'r' on provider 'buggy' failed.*expected a tuple"
        ):
            sess.run(None, {"x": np.ones(2, np.float32)})
    finally:
        unregister_plugin(plugin)


def test_a_model_path_that_is_not_a_regular_file_is_refused_at_once():
    """/dev/zero used to be read until memory ran out."""
    with pytest.raises(onnxep.errors.InvalidModel, match="not a regular file"):
        onnxep.InferenceSession("/dev/zero", providers=["cpu"])
