"""Plugin failures are contained and visible: broken providers, refused kernels, rogue passes."""

from __future__ import annotations

import logging

import numpy as np
import onnx_ir as ir
import pytest
from conftest import make_model, tensor
from onnx import helper

import onnxep
from onnxep.errors import NotImplementedOp, ProviderError
from onnxep.plugins.host import unregister_plugin
from onnxep.providers import FusionPass, KernelSpec, Provider, ProviderInfo, hookimpl, kernel
from onnxep.providers.registry import KernelRegistry
from onnxep.rewrites.contract import GraphState
from onnxep.tools.cli import main

#: naming an unusable provider is an error only under disable_fallback (else a warning)
STRICT = onnxep.SessionOptions(disable_fallback=True)


@kernel("Relu", since=6, dtypes=["float"])
def _relu(node, xp):
    return lambda x: (xp.maximum(x, 0),)


def _provider_plugin(name, create=None, kernels=None, rewrites=None):
    """A plugin offering provider ``name``; each given callable replaces one hook's body."""

    class Plugin:
        @hookimpl
        def onnxep_provider_info(self):
            return ProviderInfo(name=name, device="cpu")

        @hookimpl
        def onnxep_create_provider(self, options):
            return create(options) if create else Provider(name, options)

        @hookimpl
        def onnxep_kernels(self, provider):
            if provider.name != name:
                return None
            return kernels(provider) if kernels else _relu.__onnxep_kernels__

        @hookimpl
        def onnxep_graph_rewrites(self, provider, level):
            if rewrites and provider is not None and provider.name == name:
                return rewrites(provider, level)
            return None

    return Plugin()


def _cpu_plugin(kernels=None, rewrites=None):
    """A plugin offering no provider, adding kernels or passes to ``cpu``."""

    class Plugin:
        @hookimpl
        def onnxep_kernels(self, provider):
            return kernels(provider) if kernels and provider.name == "cpu" else None

        @hookimpl
        def onnxep_graph_rewrites(self, provider, level):
            if rewrites and level == "extended" and provider is not None:
                return rewrites(provider) if provider.name == "cpu" else None
            return None

    return Plugin()


@pytest.fixture
def registered():
    """Register plugin objects for one test; every one is unregistered afterwards."""
    plugins = []

    def add(plugin, name):
        onnxep.register_provider(plugin, name=name)
        plugins.append(plugin)
        return plugin

    yield add
    for p in plugins:
        unregister_plugin(p)


def _relu_model(opset=17):
    return make_model(
        [helper.make_node("Relu", ["x"], ["y"], name="relu")],
        [tensor("x", [4])],
        [tensor("y", [4])],
        opset=opset,
    )


X = np.array([-1, 0, 1, 2], np.float32)


def _records(plugin):
    return [f for f in onnxep.plugin_failures() if f.name == plugin]


# -- a provider that fails to start ----------------------------------------------------


def _raise(exc):
    def hook(*_):
        raise exc

    return hook


def test_default_selection_skips_a_provider_that_fails_to_start(registered):
    lost = RuntimeError("device lost (start test)")
    registered(_provider_plugin("flaky", create=_raise(lost)), "flaky-plugin")
    sess = onnxep.InferenceSession(_relu_model())
    assert "flaky" not in sess.get_providers()
    np.testing.assert_array_equal(sess.run(None, {"x": X})[0], [0, 0, 1, 2])
    onnxep.InferenceSession(_relu_model())  # a second session records nothing new
    (rec,) = _records("flaky-plugin")
    assert (rec.kind, rec.hook, rec.provider) == ("hook", "onnxep_create_provider", "flaky")
    assert "device lost (start test)" in rec.error and "is broken" in str(rec)
    (status,) = [s for s in onnxep.get_all_providers() if s.name == "flaky"]
    assert status.broken and not status.available and "device lost" in status.reason
    assert "flaky" not in onnxep.get_available_providers()
    with pytest.raises(ProviderError, match="'flaky' failed to start.*device lost") as err:
        onnxep.InferenceSession(_relu_model(), STRICT, providers=["flaky"])
    assert err.value.__cause__ is lost


def test_naming_a_provider_that_fails_to_start_carries_the_plugin_error(registered):
    registered(_provider_plugin("flaky2", create=_raise(OSError("no such device"))), "flaky2")
    with pytest.raises(ProviderError, match="'flaky2' failed to start") as err:
        onnxep.InferenceSession(_relu_model(), STRICT, providers=["flaky2", "cpu"])
    assert isinstance(err.value.__cause__, OSError)
    with pytest.warns(UserWarning, match="'flaky2' is skipped: failed to start.*no such device"):
        sess = onnxep.InferenceSession(_relu_model(), providers=["flaky2", "cpu"])
    assert sess.get_providers() == ["cpu"]


def test_options_that_fail_break_only_that_session(registered):
    def create(options):
        if options.get("device") == "gpu":
            raise ValueError("this provider has no 'gpu' device")
        return Provider("picky", options)

    registered(_provider_plugin("picky", create=create), "picky")
    with pytest.raises(ProviderError, match="no 'gpu' device"):
        onnxep.InferenceSession(_relu_model(), STRICT, providers=[("picky", {"device": "gpu"})])
    assert not _records("picky")
    sess = onnxep.InferenceSession(_relu_model(), providers=["picky"])
    assert sess.placement()["relu"].provider == "picky"


def test_onnxep_providers_starts_each_provider_and_shows_the_broken_one(registered, capsys):
    registered(_provider_plugin("flaky3", create=_raise(RuntimeError("bad firmware"))), "fl3")
    assert main(["providers"]) == 0
    out = capsys.readouterr().out
    (row,) = [line for line in out.splitlines() if line.startswith("flaky3 ")]
    assert " broken " in row
    assert "why: failed to start: plugin 'fl3' (register_provider) failed in hook" in out
    assert "bad firmware" in out and "plugins that failed:" in out


# -- a provider whose own kernels or passes fail ---------------------------------------


@pytest.mark.parametrize("hook", ["onnxep_kernels", "onnxep_graph_rewrites"])
def test_own_hook_raising_breaks_the_provider(registered, hook):
    err = KeyError(f"table corrupted in {hook}")
    if hook == "onnxep_kernels":
        plugin = _provider_plugin("halfbuilt", kernels=_raise(err))
    else:
        plugin = _provider_plugin("halfbuilt", rewrites=_raise(err))
    registered(plugin, "halfbuilt")
    with pytest.raises(ProviderError, match=f"'halfbuilt' failed to start.*{hook}") as info:
        onnxep.InferenceSession(_relu_model(), STRICT, providers=["halfbuilt"])
    assert info.value.__cause__ is err
    sess = onnxep.InferenceSession(_relu_model())
    assert sess.get_providers() == [p for p in onnxep.get_available_providers()]
    assert "halfbuilt" not in sess.get_providers()
    (rec,) = _records("halfbuilt")
    assert rec.hook == hook and "provider 'halfbuilt' is broken" in str(rec)
    (status,) = [s for s in onnxep.get_all_providers() if s.name == "halfbuilt"]
    assert status.broken and hook in status.reason


def test_another_plugins_kernels_failing_is_that_plugins_failure(registered):
    registered(_cpu_plugin(kernels=_raise(RuntimeError("mystery table missing"))), "adder")
    model = make_model(
        [helper.make_node("Mystery", ["x"], ["y"], name="mystery", domain="test.missing")],
        [tensor("x", [4])],
        [tensor("y", [4])],
        extra_opsets=[("test.missing", 1)],
    )
    with pytest.raises(NotImplementedOp) as err:
        onnxep.InferenceSession(model, providers=["cpu"])
    # the decline says which kernels are missing, not just "no kernel"
    assert "no kernel for test.missing::Mystery" in str(err.value)
    assert "plugin 'adder' failed to add its kernels: RuntimeError: mystery table" in str(err.value)
    sess = onnxep.InferenceSession(_relu_model(), providers=["cpu"])
    np.testing.assert_array_equal(sess.run(None, {"x": X})[0], [0, 0, 1, 2])
    (rec,) = _records("adder")
    assert (rec.hook, rec.provider, rec.effect) == ("onnxep_kernels", "cpu", "")
    assert {s.name: s for s in onnxep.get_all_providers()}["cpu"].available


def test_failures_are_recorded_and_logged_once(registered, caplog):
    registered(_cpu_plugin(kernels=_raise(RuntimeError("logged once, please"))), "noisy")
    with caplog.at_level(logging.WARNING, logger="onnxep"):
        for _ in range(3):
            onnxep.InferenceSession(_relu_model(), providers=["cpu"])
    assert len(_records("noisy")) == 1
    logged = [r for r in caplog.records if "logged once, please" in r.getMessage()]
    assert len(logged) == 1


# -- kernel registrations set aside ------------------------------------------------------


def test_kernel_conflict_reads_as_a_refused_registration(registered, capsys):
    @kernel("Relu", since=14)
    def relu(node, xp):
        return lambda x: (x * 0,)  # wrong on purpose: must never run

    registered(_cpu_plugin(kernels=lambda p: relu.__onnxep_kernels__), "clash")
    sess = onnxep.InferenceSession(_relu_model(opset=14), providers=["cpu"])
    np.testing.assert_array_equal(sess.run(None, {"x": X})[0], [0, 0, 1, 2])
    (rec,) = _records("clash")
    assert rec.kind == "refused" and not rec.failed
    assert str(rec).startswith("plugin 'clash' (register_provider) kernel registration refused")
    assert "failed in hook" not in str(rec)
    assert main(["providers"]) == 0
    out = capsys.readouterr().out
    assert "kernel registrations set aside:" in out
    assert "registered by 'clash' is ignored: 'cpu' registered it first" in out


def test_shadowed_kernel_is_recorded_with_both_sources(registered):
    @kernel("MatMul", since=10)
    def matmul(node, xp):
        return lambda a, b: (a @ b,)

    registered(_cpu_plugin(kernels=lambda p: matmul.__onnxep_kernels__), "old_matmul")
    sess = onnxep.InferenceSession(_relu_model(), providers=["cpu"])
    spec = sess.providers[0].registry.lookup("", "MatMul", 17)
    assert spec.source == "cpu" and spec.since_version == 13
    (rec,) = _records("old_matmul")
    assert rec.kind == "shadowed" and rec.provider == "cpu"
    assert (
        "kernel ai.onnx::MatMul registered by 'old_matmul' (since opset 10) is shadowed by "
        "'cpu''s kernel since opset 13"
    ) in rec.error


def test_shadowing_is_decided_per_source_and_by_the_first_version_above():
    reg = KernelRegistry()
    for v in (1, 9, 13):
        reg.add(_spec("MatMul", v), source="own")
    reg.add(_spec("Relu", 14), source="own")
    assert reg.check_shadowed("own") == []
    for v in (6, 11):
        reg.add(_spec("MatMul", v), source="late")
    reg.add(_spec("Relu", 20), source="late")  # newer than the own one: an override
    (rec,) = reg.check_shadowed("late")
    assert (rec.op_type, rec.versions, rec.by, rec.by_since) == ("MatMul", (6, 11), "own", 13)
    assert reg.check_shadowed("late") == []  # recorded once
    reg.add(_spec("MatMul", 15), source="later")
    assert reg.check_shadowed("later") == []


def _spec(op, since):
    return KernelSpec(op, _relu, since_version=since)


# -- fusion passes held to their contract -----------------------------------------------


class _Rogue(FusionPass):
    """Replaces every ``victim`` op node by one ``emit`` node, asking no one."""

    def __init__(self, name, victim, emit, domain=""):
        super().__init__()
        self.name, self.victim, self.emit, self.domain = name, victim, emit, domain

    def call(self, model):
        graph = model.graph
        changed = False
        for node in list(graph):
            if node.op_type != self.victim:
                continue
            new = ir.node(self.emit, list(node.inputs), domain=self.domain, name=f"{node.name}_x")
            graph.insert_before(node, new)
            out = new.outputs[0]
            out.type, out.shape = node.outputs[0].type, node.outputs[0].shape
            node.outputs[0].replace_all_uses_with(out, replace_graph_outputs=True)
            graph.remove(node, safe=True)
            self.count += 1
            changed = True
        return ir.passes.PassResult(model, changed)


class _Raising(FusionPass):
    name = "raising_pass"

    def call(self, model):
        model.graph.remove(next(iter(model.graph)), safe=False)  # half done, then it fails
        raise RuntimeError("pattern table exploded")


def _add_relu():
    return make_model(
        [
            helper.make_node("Add", ["x", "y"], ["s"], name="add"),
            helper.make_node("Relu", ["s"], ["r"], name="relu"),
        ],
        [tensor("x", [2, 4]), tensor("y", [2, 4])],
        [tensor("r", [2, 4])],
    )


def _check_rolled_back(sess, pass_name, plugin, *phrases):
    rep = sess.placement()
    assert pass_name in rep.skipped_rewrites
    assert rep.rewrites[pass_name] == 0
    (rec,) = _records(plugin)
    assert rec.kind == "contract" and rec.provider == "cpu" and "rolled back" in str(rec)
    assert f"fusion pass {pass_name!r} for provider 'cpu'" in rec.error
    for phrase in phrases:
        assert phrase in rec.error
    x = np.arange(8, dtype=np.float32).reshape(2, 4) - 4
    (r,) = sess.run(None, {"x": x, "y": x})
    np.testing.assert_array_equal(r, np.maximum(2 * x, 0))


def test_fusion_pass_rewriting_another_providers_node_is_rolled_back(registered, toy_dist):
    # toy owns Add; the CPU pass replaces it by Sum (which cpu has a kernel for)
    registered(_cpu_plugin(rewrites=lambda p: [_Rogue("steal_add", "Add", "Sum")]), "thief")
    sess = onnxep.InferenceSession(_add_relu(), providers=["toy", "cpu"])
    assert sess.placement()["add"].provider == "toy"
    _check_rolled_back(
        sess, "steal_add", "thief", "removed node 'add' (ai.onnx::Add), which 'cpu' does not own"
    )


def test_fusion_pass_emitting_an_op_without_a_kernel_is_rolled_back(registered):
    rogue = _Rogue("fast_relu", "Relu", "FastRelu", domain="com.rogue")
    registered(_cpu_plugin(rewrites=lambda p: [rogue]), "emitter")
    sess = onnxep.InferenceSession(_add_relu(), providers=["cpu"])
    assert sess.placement()["relu"].op_type == "Relu"
    _check_rolled_back(
        sess,
        "fast_relu",
        "emitter",
        "emitted node 'relu_x' (com.rogue::FastRelu), for which 'cpu' has no kernel",
    )


def test_fusion_pass_that_raises_is_rolled_back(registered):
    registered(_cpu_plugin(rewrites=lambda p: [_Raising()]), "raiser")
    sess = onnxep.InferenceSession(_add_relu(), providers=["cpu"])
    assert len(sess.placement()) == 2
    _check_rolled_back(sess, "raising_pass", "raiser", "RuntimeError: pattern table exploded")


def test_a_pass_within_its_contract_is_kept(registered):
    # Relu is the CPU's, and cpu has a kernel for Neg: the contract holds
    registered(_cpu_plugin(rewrites=lambda p: [_Rogue("relu_to_neg", "Relu", "Neg")]), "fine")
    sess = onnxep.InferenceSession(_add_relu(), providers=["cpu"])
    rep = sess.placement()
    assert rep.rewrites["relu_to_neg"] == 1 and "relu_to_neg" not in rep.skipped_rewrites
    assert [n.op_type for n in rep] == ["Add", "Neg"]
    assert not _records("fine")


def test_graph_state_restores_every_kind_of_change():
    model = ir.serde.deserialize_model(_add_relu())
    before_proto = ir.serde.serialize_model(model)
    state = GraphState(model)
    graph = model.graph
    add, relu = list(graph)
    neg = ir.node("Neg", [add.outputs[0]], name="neg")
    graph.insert_after(add, neg)
    relu.replace_input_with(0, neg.outputs[0])
    relu.attributes["alpha"] = ir.AttrFloat32("alpha", 0.5)
    relu.outputs[0].name = "renamed"
    graph.outputs[0] = neg.outputs[0]
    graph.remove(relu, safe=False)
    add.op_type = "Sub"
    graph.inputs[0].name = "x_renamed"
    extra = ir.Value(name="extra", const_value=ir.tensor(np.ones(4, np.float32), name="extra"))
    graph.register_initializer(extra)
    add.replace_input_with(1, extra)
    assert not state.same_as(GraphState(model))
    state.restore(model)
    assert state.same_as(GraphState(model))
    assert ir.serde.serialize_model(model) == before_proto
    assert [u.node.name for u in add.outputs[0].uses()] == ["relu"]  # Neg holds no use


def test_options_the_provider_refuses_are_an_error_not_a_skip(registered):
    """A typo in a provider's options is the caller's mistake: an error naming it, as in
    onnxruntime, not a warning and a run on the rest of the list."""
    from onnxep.errors import ConfigError

    def create(options):
        if "colour" in options:
            raise ConfigError("unknown option 'colour'")
        return Provider("fussy", options)

    registered(_provider_plugin("fussy", create=create), "fussy")
    with pytest.raises(ProviderError, match="'fussy' failed to start.*unknown option 'colour'"):
        onnxep.InferenceSession(_relu_model(), providers=[("fussy", {"colour": "blue"}), "cpu"])
    assert onnxep.InferenceSession(_relu_model(), providers=["fussy"]).get_providers()[0] == "fussy"
