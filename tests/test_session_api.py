"""The onnxruntime-shaped session API: construction forms, metadata, provider names."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from conftest import make_model, save, tensor
from onnx import helper

import onnxep
from onnxep.errors import ConfigError


@pytest.fixture
def relu_model():
    m = make_model(
        [helper.make_node("Relu", ["x"], ["y"], name="relu")],
        [tensor("x", ["batch", 3])],
        [tensor("y", ["batch", 3])],
    )
    m.producer_name = "unit-test"
    m.model_version = 7
    helper.set_model_props(m, {"author": "onnxep"})
    return m


@pytest.mark.parametrize("form", ["proto", "bytes", "path", "pathlike"])
def test_model_forms(relu_model, tmp_path, form):
    path = save(relu_model, tmp_path / "m.onnx")
    model = {
        "proto": relu_model,
        "bytes": relu_model.SerializeToString(),
        "path": str(path),
        "pathlike": path,
    }[form]
    sess = onnxep.InferenceSession(model, providers=["cpu"])
    x = np.array([[-1, 0, 2]], np.float32)
    (y,) = sess.run(None, {"x": x})
    np.testing.assert_array_equal(y, [[0, 0, 2]])


def test_inputs_outputs_and_meta(relu_model):
    sess = onnxep.InferenceSession(relu_model, providers=["CPUExecutionProvider"])
    (i,) = sess.get_inputs()
    assert (i.name, i.shape, i.type) == ("x", ["batch", 3], "tensor(float)")
    (o,) = sess.get_outputs()
    assert (o.name, o.type) == ("y", "tensor(float)")
    meta = sess.get_modelmeta()
    assert meta.producer_name == "unit-test" and meta.version == 7
    assert meta.custom_metadata_map == {"author": "onnxep"}
    assert sess.get_providers() == ["cpu"]


def test_provider_tuples_and_options(relu_model):
    sess = onnxep.InferenceSession(relu_model, providers=[("cpu", {"threads": 2})])
    assert sess.get_provider_options()["cpu"] == {"threads": 2}
    sess = onnxep.InferenceSession(
        relu_model, providers=["CPUExecutionProvider"], provider_options=[{"a": 1}]
    )
    assert sess.get_provider_options()["cpu"] == {"a": 1}
    with pytest.raises(ConfigError, match="provider_options has 2 entries for 1 providers"):
        onnxep.InferenceSession(relu_model, providers=["cpu"], provider_options=[{}, {}])
    with pytest.raises(ConfigError, match="name or a \\(name, options\\) tuple"):
        onnxep.InferenceSession(relu_model, providers=[42])


def test_default_providers_are_available_ones(relu_model):
    sess = onnxep.InferenceSession(relu_model)
    assert sess.get_providers() == onnxep.get_available_providers()
    assert sess.get_providers()[-1] == "cpu"


def test_output_names_select(relu_model):
    sess = onnxep.InferenceSession(relu_model, providers=["cpu"])
    x = np.ones((1, 3), np.float32)
    assert len(sess.run(["y"], {"x": x})) == 1
    with pytest.raises(ValueError, match="unknown output 'z'"):
        sess.run(["z"], {"x": x})


def test_overridable_initializer_defaults(rng):
    w = onnx.numpy_helper.from_array(np.full((3,), 2.0, np.float32), "w")
    m = make_model(
        [helper.make_node("Add", ["x", "w"], ["y"])],
        [tensor("x", [3]), tensor("w", [3])],
        [tensor("y", [3])],
        inits=[w],
    )
    sess = onnxep.InferenceSession(m, providers=["cpu"])
    assert [a.name for a in sess.get_inputs()] == ["x"]
    assert [a.name for a in sess.get_overridable_initializers()] == ["w"]
    x = np.zeros(3, np.float32)
    np.testing.assert_array_equal(sess.run(None, {"x": x})[0], [2, 2, 2])
    np.testing.assert_array_equal(sess.run(None, {"x": x, "w": x + 5})[0], [5, 5, 5])


def test_graph_optimization_levels(relu_model):
    for level in onnxep.GraphOptimizationLevel:
        opts = onnxep.SessionOptions(graph_optimization_level=level)
        sess = onnxep.InferenceSession(relu_model, opts, providers=["cpu"])
        assert sess.run(None, {"x": np.ones((1, 3), np.float32)})[0].shape == (1, 3)


def test_run_with_an_empty_output_list_returns_every_output():
    """onnxruntime treats ``run([], feeds)`` as ``run(None, feeds)``."""
    m = make_model(
        [helper.make_node("Relu", ["x"], ["y"]), helper.make_node("Neg", ["x"], ["z"])],
        [tensor("x", [2])],
        [tensor("y", [2]), tensor("z", [2])],
    )
    sess = onnxep.InferenceSession(m, providers=["cpu"])
    x = np.array([-1.0, 2.0], np.float32)
    every = sess.run(None, {"x": x})
    got = sess.run([], {"x": x})
    assert len(got) == 2
    for a, b in zip(got, every):
        np.testing.assert_array_equal(a, b)
