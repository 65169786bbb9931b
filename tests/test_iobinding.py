"""onnxruntime's IOBinding flow works unchanged."""

from __future__ import annotations

import re

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


def _raw_bound_run(sess, buf: np.ndarray, x: np.ndarray):
    io = sess.io_binding()
    io.bind_cpu_input("x", x)
    io.bind_output("z", "cpu", 0, np.float32, buf.shape, buf.ctypes.data)
    sess.run_with_iobinding(io)
    return io


@pytest.mark.parametrize("reader", ["copy_outputs_to_cpu", "get_outputs"])
def test_results_outlive_the_callers_bound_buffer(sess, reader):
    """A result never aliases memory onnxep does not own: once the caller reuses (or frees)
    the buffer it bound by pointer, the result keeps its values, as onnxruntime's copy does."""
    x = np.array([-1.0, 0.0, 2.0], np.float32)
    buf = np.zeros(3, np.float32)
    io = _raw_bound_run(sess, buf, x)
    np.testing.assert_array_equal(buf, -x)  # the run wrote into the caller's memory
    if reader == "copy_outputs_to_cpu":
        (z,) = io.copy_outputs_to_cpu()
    else:
        z = io.get_outputs()[0].numpy()
    assert not np.shares_memory(z, buf)
    buf[:] = 123.0  # the caller frees or reuses its memory
    np.testing.assert_array_equal(z, -x)


def test_a_copied_result_survives_the_next_run_into_the_same_buffer(sess):
    buf = np.zeros(3, np.float32)
    io = sess.io_binding()
    io.bind_output("z", buf)
    io.bind_cpu_input("x", np.array([1.0, 2.0, 3.0], np.float32))
    sess.run_with_iobinding(io)
    (first,) = io.copy_outputs_to_cpu()
    io.bind_cpu_input("x", np.array([7.0, 8.0, 9.0], np.float32))
    sess.run_with_iobinding(io)
    np.testing.assert_array_equal(first, [-1.0, -2.0, -3.0])
    np.testing.assert_array_equal(buf, [-7.0, -8.0, -9.0])  # still written in place


def test_freed_pointer_buffer_leaves_the_result_intact(sess):
    import gc

    x = np.array([-1.0, 0.0, 2.0], np.float32)
    buf = np.zeros(3, np.float32)
    io = _raw_bound_run(sess, buf, x)
    (z,) = io.copy_outputs_to_cpu()
    del buf
    gc.collect()
    scratch = [np.full(3, 99.0, np.float32) for _ in range(64)]  # likely reuses the memory
    np.testing.assert_array_equal(z, -x)
    assert scratch


@pytest.mark.parametrize("element_type", [np.float32, np.dtype("float32"), 1])
def test_element_type_as_onnx_int_or_numpy_dtype(sess, element_type):
    """onnxruntime's helpers pass the ONNX element type as its TensorProto int (1: FLOAT)."""
    x = np.array([-1.0, 0.0, 2.0], np.float32)
    out = np.zeros(3, np.float32)
    io = sess.io_binding()
    io.bind_input("x", "cpu", 0, element_type, x.shape, x.ctypes.data)
    io.bind_output("z", "cpu", 0, element_type, out.shape, out.ctypes.data)
    sess.run_with_iobinding(io)
    np.testing.assert_array_equal(out, -x)


def test_unknown_element_type_is_one_sentence(sess):
    x = np.zeros(3, np.float32)
    io = sess.io_binding()
    with pytest.raises(InvalidArgument, match="element_type 999 is not an ONNX element type"):
        io.bind_input("x", "cpu", 0, 999, x.shape, x.ctypes.data)
    with pytest.raises(InvalidArgument, match="neither a NumPy dtype nor an ONNX"):
        io.bind_input("x", "cpu", 0, "no-such-type", x.shape, x.ctypes.data)


def test_read_only_output_buffer_is_refused_at_bind_time(sess):
    buf = np.zeros(3, np.float32)
    buf.flags.writeable = False  # what np.from_dlpack gives for a read-only producer
    io = sess.io_binding()
    with pytest.raises(InvalidArgument, match="output 'z' is read-only"):
        io.bind_output("z", buf)
    io.bind_cpu_input("x", np.ones(3, np.float32))  # the binding stays usable
    io.bind_output("z")
    sess.run_with_iobinding(io)
    np.testing.assert_array_equal(io.copy_outputs_to_cpu()[0], -np.ones(3, np.float32))


def test_read_only_dlpack_import_of_an_ortvalue():
    """An onnxruntime OrtValue imported through DLPack: as an input it is read in place, as
    an output buffer it is refused in one sentence (nothing may write into it)."""
    ort = pytest.importorskip("onnxruntime")
    m = make_model([helper.make_node("Neg", ["x"], ["z"])], [tensor("x", [3])], [tensor("z", [3])])
    sess = onnxep.InferenceSession(m, providers=["cpu"])
    x = np.array([1.0, -2.0, 3.0], np.float32)
    value = ort.OrtValue.ortvalue_from_numpy(x)
    if not hasattr(value, "__dlpack__"):
        pytest.skip("this onnxruntime's OrtValue has no __dlpack__")
    io = sess.io_binding()
    io.bind_input("x", value)
    io.bind_output("z")
    sess.run_with_iobinding(io)
    np.testing.assert_array_equal(io.copy_outputs_to_cpu()[0], -x)
    out = ort.OrtValue.ortvalue_from_numpy(np.zeros(3, np.float32))
    imported = np.from_dlpack(out)
    if imported.flags.writeable:
        io.bind_output("z", out)  # writable memory: written in place
        sess.run_with_iobinding(io)
        np.testing.assert_array_equal(out.numpy(), -x)
    else:
        with pytest.raises(InvalidArgument, match="read-only"):
            io.bind_output("z", out)


def test_provider_declares_the_device_methods_io_binding_uses():
    """The SDK's Provider declares adopt, wrap_pointer, copy_into and transfer_counts: a
    provider that does not override one says which feature it lacks, and the core asks
    ``implements`` before it calls one."""
    from onnxep.errors import NotSupported
    from onnxep.providers import Provider

    class Plain(Provider):
        pass

    class Adopting(Provider):
        def adopt(self, value):
            return value

    plain = Plain("plain", device="elsewhere")
    for method, args, feature in [
        ("adopt", (np.ones(2),), "takes no bound device arrays (adopt)"),
        ("wrap_pointer", (0, (2,), np.float32), "cannot wrap a raw device pointer"),
        ("copy_into", (np.ones(2), np.ones(2)), "cannot write into a bound device buffer"),
        ("transfer_counts", (), "does not count its copies"),
    ]:
        assert not plain.implements(method)
        with pytest.raises(NotSupported, match=re.escape(f"provider 'plain' {feature}")):
            getattr(plain, method)(*args)
    assert Adopting("a").implements("adopt") and not Adopting("a").implements("copy_into")
    on_instance = Plain("p")
    on_instance.run_context = lambda: None  # an option may set one on the instance
    assert on_instance.implements("run_context") and not plain.implements("run_context")


def test_an_input_bound_to_an_output_buffer_is_seen_whichever_is_bound_first(sess):
    """Binding an output onto an input's buffer, then moving it off, as a decoder binds
    its past/present caches output by output: each run reads and writes the right memory."""
    x = np.array([-1.0, 0.0, 2.0], np.float32)
    other = np.zeros(3, np.float32)
    io = sess.io_binding()
    io.bind_cpu_input("x", x)
    io.bind_output("z", other)
    io.bind_output("y", x)  # Relu in place over the input's own buffer
    sess.run_with_iobinding(io)
    np.testing.assert_array_equal(x, [0.0, 0.0, 2.0])
    np.testing.assert_array_equal(other, [1.0, -0.0, -2.0])
    moved = np.full(3, 7.0, np.float32)
    io.bind_output("y", moved)  # off the input's buffer
    x[:] = [-3.0, 4.0, -5.0]
    sess.run_with_iobinding(io)
    np.testing.assert_array_equal(moved, [0.0, 4.0, 0.0])
    np.testing.assert_array_equal(x, [-3.0, 4.0, -5.0])
