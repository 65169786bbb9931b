"""IOBinding on the device: inputs read in place, outputs left on the device or written in place."""

from __future__ import annotations

import numpy as np
import pytest
from _models import unary_pair

import onnxep
from onnxep.errors import InvalidArgument

cupy = pytest.importorskip("cupy", reason="the CUDA tests need CuPy and a GPU")


@pytest.fixture
def sess():
    return onnxep.InferenceSession(unary_pair(shape=["n"]), providers=["cuda", "cpu"])


def _counts(sess):
    return sess.providers[0].transfer_counts()


def _delta(before, after):
    return {k: after[k] - before[k] for k in ("device_to_host", "host_to_device")}


def test_cupy_input_in_place_and_outputs_left_on_the_device(sess):
    x = cupy.linspace(-1, 1, 7, dtype=cupy.float32)
    io = sess.io_binding()
    io.bind_input("x", x)
    io.bind_output("y", "cuda")
    io.bind_output("z", "cuda")
    sess.run_with_iobinding(io)
    before = _counts(sess)
    sess.run_with_iobinding(io)
    assert _delta(before, _counts(sess)) == {"device_to_host": 0, "host_to_device": 0}
    y, z = io.get_outputs()
    assert isinstance(y.value, cupy.ndarray) and y.device_name() == "cuda"
    np.testing.assert_allclose(z.value.get(), -x.get())
    np.testing.assert_allclose(y.numpy(), np.maximum(x.get(), 0) + 1)


def test_torch_cuda_tensor_is_read_in_place(sess):
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("torch has no CUDA here")
    t = torch.linspace(-1, 1, 5, device="cuda")
    io = sess.io_binding()
    io.bind_input("x", t)
    io.bind_output("z", "cuda")
    assert io._inputs["x"].data.ptr == t.data_ptr()  # noqa: SLF001 - the proof of no copy
    before = _counts(sess)
    sess.run_with_iobinding(io)
    np.testing.assert_allclose(io.get_outputs()[0].numpy(), -t.cpu().numpy())
    t.mul_(3)  # the bound memory itself changes; the next run sees it
    torch.cuda.synchronize()
    sess.run_with_iobinding(io)
    np.testing.assert_allclose(io.get_outputs()[0].numpy(), -t.cpu().numpy())
    assert _counts(sess)["host_to_device"] == before["host_to_device"]


class _Foreign:
    """A device array as pycuda-style libraries hand it over: only the interface."""

    def __init__(self, arr):
        self._keep = arr
        self.__cuda_array_interface__ = arr.__cuda_array_interface__


def test_plain_cuda_array_interface_object_is_read_in_place(sess):
    base = cupy.arange(-3, 3, dtype=cupy.float32)
    io = sess.io_binding()
    io.bind_input("x", _Foreign(base))
    io.bind_output("z", "cuda")
    assert io._inputs["x"].data.ptr == base.data.ptr  # noqa: SLF001
    sess.run_with_iobinding(io)
    np.testing.assert_allclose(io.get_outputs()[0].numpy(), -base.get())
    base *= 2
    sess.run_with_iobinding(io)
    np.testing.assert_allclose(io.get_outputs()[0].numpy(), -base.get())


def test_bound_output_buffer_is_written_in_place(sess):
    x = cupy.linspace(-2, 2, 9, dtype=cupy.float32)
    buf = cupy.full(9, np.nan, dtype=cupy.float32)
    ptr = buf.data.ptr
    io = sess.io_binding()
    io.bind_input("x", x)
    io.bind_output("z", buf)
    sess.run_with_iobinding(io)
    assert buf.data.ptr == ptr and io.get_outputs()[0].value is buf
    np.testing.assert_allclose(buf.get(), -x.get())
    x2 = cupy.linspace(0, 1, 9, dtype=cupy.float32)
    io.bind_input("x", x2)
    before = _counts(sess)
    sess.run_with_iobinding(io)  # the same buffer, reused
    assert _delta(before, _counts(sess))["device_to_host"] == 0
    np.testing.assert_allclose(buf.get(), -x2.get())


def test_torch_output_buffer_is_written_in_place(sess):
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("torch has no CUDA here")
    x = torch.linspace(-1, 1, 4, device="cuda")
    out = torch.empty(4, device="cuda")
    io = sess.io_binding()
    io.bind_input("x", x)
    io.bind_output("z", out)
    sess.run_with_iobinding(io)
    torch.cuda.synchronize()
    assert torch.equal(out, -x)


def test_onnxruntime_pointer_forms(sess):
    x = cupy.linspace(-1, 1, 6, dtype=cupy.float32)
    out = cupy.zeros(6, dtype=cupy.float32)
    io = sess.io_binding()
    io.bind_input("x", "cuda", 0, np.float32, [6], x.data.ptr)
    io.bind_output("z", "cuda", 0, np.float32, [6], out.data.ptr)
    sess.run_with_iobinding(io)
    np.testing.assert_allclose(out.get(), -x.get())


def test_copy_outputs_to_cpu_copies_each_output_once(sess):
    io = sess.io_binding()
    io.bind_cpu_input("x", np.ones(5, np.float32))
    io.bind_output("y", "cuda")
    io.bind_output("z", "cuda")
    sess.run_with_iobinding(io)
    before = _counts(sess)
    y, z = io.copy_outputs_to_cpu()
    assert _delta(before, _counts(sess))["device_to_host"] == 2
    np.testing.assert_array_equal(y, np.full(5, 2, np.float32))
    np.testing.assert_array_equal(z, -np.ones(5, np.float32))


def test_bad_bindings_are_clear(sess):
    io = sess.io_binding()
    with pytest.raises(InvalidArgument, match="float64 array"):
        io.bind_input("x", cupy.zeros(3, cupy.float64))
    io.bind_input("x", cupy.zeros(3, cupy.float32))
    io.bind_output("z", cupy.zeros(4, cupy.float32))
    with pytest.raises(InvalidArgument, match="bind a matching buffer"):
        sess.run_with_iobinding(io)


@pytest.mark.parametrize("where", ["cuda", "cpu"])
def test_results_outlive_a_pointer_bound_buffer(sess, where):
    """A result never aliases memory the caller owns: after the caller overwrites (or frees)
    the buffer it bound by pointer, copy_outputs_to_cpu's and get_outputs' results keep
    their values, on the device and on the host."""
    x = cupy.asarray(np.array([-1.0, 0.0, 2.0, 3.0], np.float32))
    buf = cupy.zeros(4, cupy.float32) if where == "cuda" else np.zeros(4, np.float32)
    ptr = buf.data.ptr if where == "cuda" else buf.ctypes.data
    io = sess.io_binding()
    io.bind_input("x", x)
    io.bind_output("z", where, 0, np.float32, [4], ptr)
    sess.run_with_iobinding(io)
    (copied,) = io.copy_outputs_to_cpu()
    got = io.get_outputs()[0].numpy()
    expect = -x.get()
    buf[...] = 123.0
    cupy.cuda.Device().synchronize()
    del buf
    for r in (copied, got):
        assert isinstance(r, np.ndarray)
        np.testing.assert_array_equal(r, expect)
