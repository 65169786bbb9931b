"""The executor's provider hooks: run contexts around every run, and outputs left on the device."""

from __future__ import annotations

import contextlib
import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
from conftest import make_model, tensor
from onnx import helper

import onnxep
from onnxep.errors import RunError
from onnxep.plugins.host import unregister_plugin
from onnxep.providers import Provider, ProviderInfo, hookimpl, kernel


class ToyArray(np.ndarray):
    """An array in the toy device's memory: a NumPy subclass, so it can be told apart."""


class ToyDevice(Provider):
    """A device provider whose arrays are :class:`ToyArray` and whose run context is recorded."""

    def __init__(self, options):
        super().__init__("toydev", options, device="toy", xp=np)
        self.current = threading.local()
        self.entered = 0
        self.fail_enter = False

    def to_host(self, x):
        return np.array(x, copy=True).view(np.ndarray)

    def from_host(self, x):
        return np.array(x, copy=True).view(ToyArray)

    @contextlib.contextmanager
    def _context(self):
        if self.fail_enter:
            raise RuntimeError("device 0 is lost")
        self.entered += 1
        self.current.on = True
        try:
            yield self
        finally:
            self.current.on = False

    def run_context(self):
        return self._context()


def _inside(provider, fn):
    def run(*args):
        if not getattr(provider.current, "on", False):
            raise AssertionError("kernel ran outside its provider's run context")
        return fn(*args)

    return run


class _Plugin:
    @hookimpl
    def onnxep_provider_info(self):
        return ProviderInfo(name="toydev", device="toy")

    @hookimpl
    def onnxep_create_provider(self, options):
        return ToyDevice(options)

    @hookimpl
    def onnxep_kernels(self, provider):
        if provider.name != "toydev":
            return None

        @kernel("Add", since=7)
        def add(node, xp):
            return _inside(provider, lambda a, b: (xp.add(a, b),))

        @kernel("Relu", since=6)
        def relu(node, xp):
            return _inside(provider, lambda x: (xp.maximum(x, 0),))

        return [*add.__onnxep_kernels__, *relu.__onnxep_kernels__]


@pytest.fixture
def toydev():
    plugin = _Plugin()
    onnxep.register_provider(plugin, name="toydev-plugin")

    def session(model, **kw):
        return onnxep.InferenceSession(model, providers=["toydev", "cpu"], **kw)

    yield session
    unregister_plugin(plugin)


@pytest.fixture
def chain():
    """x, y -> Add (toy) -> s; Relu (toy) -> r, an output; Softmax (cpu) of s -> out."""
    return make_model(
        [
            helper.make_node("Add", ["x", "y"], ["s"], name="add"),
            helper.make_node("Relu", ["s"], ["r"], name="relu"),
            helper.make_node("Softmax", ["s"], ["out"], name="softmax", axis=-1),
        ],
        [tensor("x", [2, 4]), tensor("y", [2, 4])],
        [tensor("r", [2, 4]), tensor("out", [2, 4])],
    )


def _feeds():
    x = np.arange(8, dtype=np.float32).reshape(2, 4) - 3
    return {"x": x, "y": np.ones((2, 4), np.float32)}


def _want(f):
    s = f["x"] + f["y"]
    e = np.exp(s - s.max(-1, keepdims=True))
    return np.maximum(s, 0), e / e.sum(-1, keepdims=True)


def test_run_context_is_entered_around_every_run(toydev, chain):
    sess = toydev(chain)
    prov = sess.providers[0]
    assert sess.placement()["add"].provider == "toydev"
    f = _feeds()
    for _ in range(3):  # the checked first run, then generated code
        for got, want in zip(sess.run(None, f), _want(f)):
            np.testing.assert_allclose(got, want, rtol=1e-6)
    assert prov.entered == 3
    assert not prov.current.on  # left after the run
    with ThreadPoolExecutor(4) as pool:
        outs = list(pool.map(lambda _: sess.run(None, f)[0], range(8)))
    for o in outs:
        np.testing.assert_array_equal(o, _want(f)[0])
    assert prov.entered == 11


def test_run_context_on_the_profiled_and_device_paths(toydev, chain, tmp_path):
    so = onnxep.SessionOptions()
    so.enable_profiling = True
    so.profile_file_prefix = str(tmp_path / "prof")
    sess = toydev(chain, sess_options=so)
    f = _feeds()
    np.testing.assert_array_equal(sess.run(None, f)[0], _want(f)[0])
    np.testing.assert_array_equal(sess.compiled.run(f, on_device=True)[0], _want(f)[0])
    assert sess.providers[0].entered == 2


def test_a_failing_run_context_names_the_provider_and_leaves_the_session_usable(toydev, chain):
    sess = toydev(chain)
    prov = sess.providers[0]
    prov.fail_enter = True
    with pytest.raises(RunError, match="provider 'toydev' could not set up its run context.*lost"):
        sess.run(None, _feeds())
    prov.fail_enter = False
    np.testing.assert_array_equal(sess.run(None, _feeds())[0], _want(_feeds())[0])


def test_providers_without_a_run_context_add_nothing(add_relu_model):
    sess = onnxep.InferenceSession(add_relu_model, providers=["cpu"])
    assert sess.compiled.executor.contexts == ()


def test_outputs_stay_on_the_device_that_made_them(toydev, chain):
    sess = toydev(chain)
    f = _feeds()
    for _ in range(3):  # the checked first run, then the generated function
        r, out = sess.compiled.run(f, on_device=True)
        assert type(r) is ToyArray  # made by the toy provider, not copied to the host
        assert type(out) is np.ndarray  # made by the CPU provider
        for got, want in zip((r, out), _want(f)):
            np.testing.assert_allclose(np.asarray(got), want, rtol=1e-6)
        host_r, _ = sess.run(None, f)
        assert type(host_r) is np.ndarray
    (only_out,) = sess.compiled.run(f, ["out"], on_device=True)
    np.testing.assert_allclose(only_out, _want(f)[1], rtol=1e-6)
    plan = sess.compiled.plan
    assert plan.output_copies == 1
    assert len(plan.on_device().steps) == len(plan.steps) - 1


def test_on_device_keeps_an_output_whose_host_copy_is_made_early(toydev):
    # r is both an output and read by the CPU Softmax: its host copy is not a trailing
    # output copy, and its device slot must survive to the end of the device run.
    m = make_model(
        [
            helper.make_node("Relu", ["x"], ["r"], name="relu"),
            helper.make_node("Softmax", ["r"], ["sm"], name="softmax"),
            helper.make_node("Relu", ["sm"], ["out"], name="relu2"),
        ],
        [tensor("x", [3])],
        [tensor("r", [3]), tensor("out", [3])],
    )
    sess = toydev(m)
    x = np.array([-1, 0, 2], np.float32)
    for _ in range(2):
        r, out = sess.compiled.run({"x": x}, on_device=True)
        assert type(r) is ToyArray and type(out) is ToyArray
        np.testing.assert_array_equal(np.asarray(r), np.maximum(x, 0))
        np.testing.assert_allclose(np.asarray(out), sess.run(None, {"x": x})[1])


def test_run_on_device_checks_feeds_like_run(toydev, chain):
    sess = toydev(chain)
    with pytest.raises(onnxep.errors.InvalidArgument, match="missing input 'y'"):
        sess.compiled.run({"x": _feeds()["x"]}, on_device=True)
    with pytest.raises(onnxep.errors.InvalidArgument, match="unknown output 'q'"):
        sess.compiled.run(_feeds(), ["q"], on_device=True)
