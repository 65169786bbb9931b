"""The pattern-fusion machinery: ownership, escaping intermediates, kernels, switches, reports.

Fusions run per provider. The ``fusions`` provider registered here runs the
generic kernel library (the CPU reference of every fused op) and contributes
exactly the pass list the CUDA plugin contributes (``standard_fusions()``), so
these tests exercise the CUDA provider's rewrites on a machine without a GPU;
the CUDA kernels themselves are tested on the emulator
(test_fusions_cuda_emulated.py) and on the GPU (tests/cuda/test_cuda_fusions.py).
The per-fusion cases are in test_fusions_ops.py, the exported decoders in
test_fusions_models.py.
"""

from __future__ import annotations

import contextlib
import threading

import numpy as np
import onnx_ir as ir
import pytest
from onnx import TensorProto, helper, numpy_helper
from test_fusions_graphs import make_model, tensor

import onnxep
from onnxep.plugins.host import unregister_plugin
from onnxep.providers import KernelLibrary, Provider, ProviderInfo, hookimpl
from onnxep.providers.fusions import PatternFusionPass, standard_fusions
from onnxep.providers.fusions.reporting import (
    ANOTHER_CONSUMER,
    GRAPH_OUTPUT,
    SPANS_PROVIDERS,
    no_kernel,
)
from onnxep.providers.fusions.silu import FuseSiLU

NAME = "fusions"
ALL = [p.name for p in standard_fusions()]


class _FusionsProvider(Provider):
    def __init__(self, options):
        super().__init__(NAME, options, device="cpu", xp=np)


class _Plugin:
    """The generic kernels and the CUDA provider's fusion passes, on NumPy."""

    def __init__(self, passes=standard_fusions, kernels=None):
        self.passes, self.kernels = passes, kernels

    @hookimpl
    def onnxep_provider_info(self):
        return ProviderInfo(name=NAME, device="cpu", description="fusion tests")

    @hookimpl
    def onnxep_create_provider(self, options):
        return _FusionsProvider(options)

    @hookimpl
    def onnxep_kernels(self, provider):
        if provider.name != NAME:
            return None
        lib = KernelLibrary.from_package("onnxep.providers.ops")
        return lib if self.kernels is None else KernelLibrary(s for s in lib if self.kernels(s))

    @hookimpl
    def onnxep_graph_rewrites(self, provider, level):
        if level == "extended" and provider is not None and provider.name == NAME:
            return self.passes()
        return None


@contextlib.contextmanager
def fusions_provider():
    """Register the ``fusions`` provider while inside; ``register(...)`` customises it."""
    plugins = []

    def register(**kw):
        plugin = _Plugin(**kw)
        onnxep.register_provider(plugin, name=f"{NAME}-plugin")
        plugins.append(plugin)
        return NAME

    try:
        yield register
    finally:
        for p in plugins:
            unregister_plugin(p)


@pytest.fixture
def fusions():
    with fusions_provider() as register:
        yield register


def session(model, provider=NAME, off=(), **opts):
    options = onnxep.SessionOptions(disabled_rewrites=list(off), **opts)
    return onnxep.InferenceSession(model, options, providers=[provider])


def fusion(sess, name, provider=NAME):
    """The report of pass ``name`` of ``provider`` in a session's placement."""
    (rep,) = [f for f in sess.placement().fusions if f.name == name and f.provider == provider]
    return rep


def ops(sess):
    return [n.op_type for n in sess.placement()]


def const(name, value, dtype=np.float32):
    return numpy_helper.from_array(np.asarray(value, dtype), name)


# -- a model the tests below share: y = x * sigmoid(x), with hooks to make things escape --


def _silu_model(escape=None, dtype=TensorProto.FLOAT):
    nodes = [
        helper.make_node("Sigmoid", ["x"], ["s"], name="sig"),
        helper.make_node("Mul", ["x", "s"], ["y"], name="mul"),
    ]
    outputs = [tensor("y", [2, 8], dtype)]
    if escape == "output":
        outputs.append(tensor("s", [2, 8], dtype))
    elif escape == "consumer":
        nodes.append(helper.make_node("Neg", ["s"], ["n"], name="neg"))
        outputs.append(tensor("n", [2, 8], dtype))
    return make_model(nodes, [tensor("x", [2, 8], dtype)], outputs)


X = np.linspace(-6, 6, 16, dtype=np.float32).reshape(2, 8)


def test_fires_and_reports_per_rule(fusions):
    sess = session(_silu_model(), fusions())
    assert ops(sess) == ["SiLU"]
    rep = fusion(sess, "fuse_silu")
    assert (rep.fired, rep.state, rep.exact, rep.refused) == (1, "on", True, {})
    assert sum(rep.by_rule.values()) == 1
    assert sess.placement().rewrites["fuse_silu"] == 1


@pytest.mark.parametrize(
    ("escape", "reason"), [("output", GRAPH_OUTPUT), ("consumer", ANOTHER_CONSUMER)]
)
def test_refuses_an_escaping_intermediate_and_says_why(fusions, escape, reason):
    sess = session(_silu_model(escape), fusions())
    assert "SiLU" not in ops(sess)
    rep = fusion(sess, "fuse_silu")
    assert rep.fired == 0
    assert rep.refused == {reason: ("mul",)}  # once, though the manager ran the pass twice
    (y, *_) = sess.run(None, {"x": X})
    np.testing.assert_allclose(y, X / (1 + np.exp(-X)), rtol=1e-6)


def test_switched_off_stays_off_and_says_so(fusions):
    sess = session(_silu_model(), fusions(), off=["fuse_silu"])
    assert ops(sess) == ["Sigmoid", "Mul"]
    assert fusion(sess, "fuse_silu").state == "off"
    assert "fuse_silu" in sess.placement().skipped_rewrites
    assert "cpu/fuse_rms_norm" in sess.placement().format()


def test_switch_in_plugins_toml(fusions, tmp_path):
    cfg = tmp_path / "plugins.toml"
    cfg.write_text("[rewrites]\nfuse_silu = false\n")
    sess = session(_silu_model(), fusions(), plugins_config=str(cfg))
    assert fusion(sess, "fuse_silu").state == "off" and ops(sess) == ["Sigmoid", "Mul"]


def test_no_kernel_for_the_fused_op_is_a_refusal(fusions):
    name = fusions(kernels=lambda spec: spec.domain != "onnxep")
    sess = session(_silu_model(), name)
    assert ops(sess) == ["Sigmoid", "Mul"]
    assert fusion(sess, "fuse_silu").refused == {no_kernel("onnxep", "SiLU"): ("mul",)}
    assert not [f for f in onnxep.plugin_failures() if f.name == f"{NAME}-plugin"]


def test_a_match_spanning_providers_is_refused(fusions, toy_dist):
    # toy claims float Relu ahead of the fusions provider: the Relu inside the pattern is
    # toy's, so the match spans providers.
    nodes = [
        helper.make_node("Sigmoid", ["x"], ["s"], name="sig"),
        helper.make_node("Relu", ["s"], ["r"], name="relu"),
        helper.make_node("Mul", ["x", "r"], ["y"], name="mul"),
    ]
    model = make_model(nodes, [tensor("x", [2, 8])], [tensor("y", [2, 8])])
    rule_model = _relu_silu_rule()
    sess = onnxep.InferenceSession(model, providers=["toy", fusions(passes=rule_model)])
    assert sess.placement()["relu"].provider == "toy"
    rep = fusion(sess, "fuse_relu_silu")
    assert rep.refused == {SPANS_PROVIDERS: ("mul",)}
    np.testing.assert_allclose(sess.run(None, {"x": X})[0], X / (1 + np.exp(-X)), rtol=1e-6)


def _relu_silu_rule():
    from onnxscript.rewriter import pattern

    def target(op, x):
        return op.Mul(x, op.Relu(op.Sigmoid(x)))

    def replacement(op, x):
        return op.SiLU(x, _domain="onnxep")

    class FuseReluSiLU(PatternFusionPass):
        name = "fuse_relu_silu"

        def make_rules(self):
            return [pattern.RewriteRule(target, replacement, name="relu_silu")]

    return lambda: [FuseReluSiLU()]


def test_a_match_wholly_another_providers_is_not_a_refusal(fusions, toy_dist):
    # The pass of a provider that owns none of the nodes says nothing about them.
    nodes = [helper.make_node("Relu", ["x"], ["r"], name="relu")]
    model = make_model(nodes, [tensor("x", [2, 8])], [tensor("r", [2, 8])])
    sess = onnxep.InferenceSession(model, providers=["toy", fusions(passes=_relu_silu_rule())])
    assert fusion(sess, "fuse_relu_silu").refused == {}


def test_a_failed_check_is_a_refusal_with_the_checks_reason(fusions):
    model = make_model(
        [
            helper.make_node("Sigmoid", ["x"], ["s"], name="sig"),
            helper.make_node("Mul", ["x", "s"], ["y"], name="mul"),
        ],
        [tensor("x", [2, 8], TensorProto.INT32)],
        [tensor("y", [2, 8], TensorProto.INT32)],
    )
    # ONNX has no int Sigmoid; the model is only matched, never run
    p = FuseSiLU()
    run_pass(p, model)
    assert p.refusals == {"dtype int32 is not a float type": ["mul"]}


def run_pass(p, model_proto, owns=lambda n: True, emit=True, opset=17):
    """Run one bound pass on a model, as the session does, outside any session; the IR."""
    model = ir.serde.deserialize_model(model_proto)

    class _Registry:
        def lookup(self, *_):
            return object() if emit else None

    class _Prov:
        name = "test"
        registry = _Registry()

    p.bind(_Prov(), owns, {"": opset})
    p(model)
    return model


def test_refusals_of_a_match_fused_later_are_forgotten():
    p = FuseSiLU()
    model = _silu_model("output")
    run_pass(p, model)
    assert p.refusals == {GRAPH_OUTPUT: ["mul"]}
    p.fire(next(iter(p.refused.values()))[0], "silu")
    assert p.refusals == {}


def test_report_formats_and_serialises(fusions):
    sess = session(_silu_model("consumer"), fusions())
    rep = sess.placement()
    text = rep.format()
    assert f"{NAME}/fuse_silu: fired 0" in text
    assert f"refused 1 x {ANOTHER_CONSUMER}: mul" in text
    # the CPU provider runs its own fuse_silu too: this is the test provider's
    (entry,) = [
        f for f in rep.to_dict()["fusions"] if f["name"] == "fuse_silu" and f["provider"] == NAME
    ]
    assert entry["refused"] == {ANOTHER_CONSUMER: ["mul"]}
    assert entry["provider"] == NAME and entry["state"] == "on" and entry["exact"] is True


def test_explain_prints_fires_and_refusals(fusions, tmp_path, capsys):
    from onnxep.tools.cli import main

    path = tmp_path / "silu.onnx"
    path.write_bytes(_silu_model("consumer").SerializeToString())
    assert main(["explain", str(path), "--providers", fusions()]) == 0
    out = capsys.readouterr().out
    assert "fusions (provider/pass):" in out
    assert f"{NAME}/fuse_silu: fired 0" in out and f"refused 1 x {ANOTHER_CONSUMER}" in out


def test_basic_level_runs_no_fusion(fusions):
    level = onnxep.GraphOptimizationLevel.ORT_ENABLE_BASIC
    sess = session(_silu_model(), fusions(), graph_optimization_level=level)
    assert ops(sess) == ["Sigmoid", "Mul"] and sess.placement().fusions == []


def test_rules_are_compiled_once_per_thread():
    # onnxscript rules keep match state: sessions on one thread share them, threads do not
    a, b = FuseSiLU(), FuseSiLU()
    assert [id(r) for r, _ in a.rules] == [id(r) for r, _ in b.rules]
    other = []
    t = threading.Thread(target=lambda: other.append(FuseSiLU()))
    t.start()
    t.join()
    assert not {id(r) for r, _ in a.rules} & {id(r) for r, _ in other[0].rules}


def test_the_cuda_plugin_contributes_the_standard_fusions_and_conv_activation():
    from onnxep.providers_cuda.plugin import plugin

    class _Named:
        name = "cuda"

    passes = plugin.onnxep_graph_rewrites(provider=_Named(), level="extended")
    # Conv + Relu/Clip comes last: its FusedConv runs the Relu in cuDNN's epilogue.
    assert [p.name for p in passes] == [*ALL, "fuse_conv_activation"]
    assert plugin.onnxep_graph_rewrites(provider=_Named(), level="basic") is None


def test_the_cpu_provider_contributes_its_fusions():
    from onnxep.providers_cpu import jit
    from onnxep.providers_cpu.plugin import plugin

    class _Named:
        name = "cpu"

    passes = plugin.onnxep_graph_rewrites(provider=_Named(), level="extended")
    assert [p.name for p in passes] == [
        "fuse_rms_norm",
        "fuse_layer_norm",
        "fuse_conv_activation",
        "fuse_silu",
        "fuse_swiglu",
        "fuse_shared_input_matmuls",
        "fuse_dynamic_quantize_matmul",
        "fuse_conv_integer_to_float",
        "fuse_step_gemms",
        "fuse_lstm_cell",
        "fuse_gru_cell",
    ] + (["fuse_elementwise_chains"] if jit.wanted() else [])  # its gain is the compiled pass
    assert isinstance(passes[0], PatternFusionPass)


def test_every_fusion_has_a_switch_in_plugins_toml():
    import tomllib
    from pathlib import Path

    cfg = tomllib.loads((Path(__file__).parents[1] / "plugins.toml").read_text())
    assert set(ALL) <= set(cfg["rewrites"])


def test_a_rule_that_breaks_mid_rewrite_rolls_the_pass_back(fusions):
    from onnxscript.rewriter import pattern

    def target(op, x):
        return op.Mul(x, op.Sigmoid(x))

    def replacement(op, x):
        raise RuntimeError("replacement table exploded")

    class FuseBroken(PatternFusionPass):
        name = "fuse_broken"

        def make_rules(self):
            return [pattern.RewriteRule(target, replacement, name="broken")]

    sess = session(_silu_model(), fusions(passes=lambda: [FuseBroken(), FuseSiLU()]))
    rep = fusion(sess, "fuse_broken")
    assert (rep.state, rep.fired) == ("rolled back", 0)
    assert f"{NAME}/fuse_broken: rolled back" in sess.placement().format()
    assert ops(sess) == ["SiLU"]  # the passes after it still ran
    (rec,) = [f for f in onnxep.plugin_failures() if f.name == f"{NAME}-plugin"]
    assert "replacement table exploded" in rec.error
