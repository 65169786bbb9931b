"""onnxruntime's IOBinding flow works unchanged."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import make_model, tensor
from onnx import helper

import onnxep
from onnxep.errors import InvalidArgument


@pytest.fixture
def sess():
    m = make_model(
        [helper.make_node("Relu", ["x"], ["y"]), helper.make_node("Neg", ["x"], ["z"])],
        [tensor("x", [3])],
        [tensor("y", [3]), tensor("z", [3])],
    )
    return onnxep.InferenceSession(m, providers=["cpu"])


def test_bind_run_and_read(sess):
    x = np.array([-1.0, 0.0, 2.0], np.float32)
    io = sess.io_binding()
    io.bind_cpu_input("x", x)
    io.bind_output("z")
    sess.run_with_iobinding(io)
    (z,) = io.copy_outputs_to_cpu()
    np.testing.assert_array_equal(z, -x)
    out = io.get_outputs()[0]
    assert out.shape() == [3] and out.data_type() == "tensor(float)"
    io.clear_binding_outputs()
    sess.run_with_iobinding(io)
    assert len(io.copy_outputs_to_cpu()) == 2


def test_bad_names_are_clear(sess):
    io = sess.io_binding()
    with pytest.raises(InvalidArgument, match="unknown input 'q'"):
        io.bind_cpu_input("q", np.zeros(3, np.float32))
    with pytest.raises(InvalidArgument, match="unknown output 'w'"):
        io.bind_output("w")
