"""placement="measured": the candidates timed, the fastest kept, and the report saying why.

The costs are made known by a real provider plugin installed through an entry point:
``lag`` runs correct NumPy kernels on its own "device" (copies in and out) and sleeps
``LAUNCH_MS`` per kernel, modelling a device's launch cost. Its plugin also gives the CPU
provider a kernel for ``costs.test::Dense`` (a MatMul) that costs ``HOST_DENSE_MS`` more
than lag's, modelling a host slower than the device at dense algebra. A model of many
tiny ops must then land on the CPU, one of a few Dense ops on lag. The tests assert the
choice and the report, never the runtime's own timings.
"""

from __future__ import annotations

import json
import sys
import warnings

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from conftest import make_model, tensor, write_distribution
from onnx import TensorProto, helper, numpy_helper

import onnxep
from onnxep.errors import ConfigError, InvalidArgument
from onnxep.testing import compare_output

try:
    import torch
except ImportError:  # the exported-model test skips
    torch = None

LAUNCH_MS = 3.0
HOST_DENSE_MS = 40.0

LAG_PROVIDER = f'''
import dataclasses
import time
import numpy as np
from onnxep.providers import KernelLibrary, Provider, ProviderInfo, hookimpl, kernel

LAUNCH_S = {LAUNCH_MS / 1e3}
HOST_DENSE_S = {HOST_DENSE_MS / 1e3}
#: every kernel lag builds: its node and how often it ran
BUILT = []


class LagProvider(Provider):
    """NumPy arrays on a 'lag' device: copies in and out, a sleep per kernel launch."""

    def __init__(self, options):
        super().__init__("lag", options, device="lag", xp=np)

    def to_host(self, x):
        return np.array(x, copy=True)

    def from_host(self, x):
        return np.array(x, copy=True)


def launched(node, fn):
    record = {{"node": node.name, "calls": 0}}
    BUILT.append(record)

    def run(*args):
        record["calls"] += 1
        time.sleep(LAUNCH_S)
        return fn(*args)

    return run


def slowed(spec):
    """A generic kernel that pays lag's launch cost."""
    def build(node, xp):
        return launched(node, spec.builder(node, xp))

    return dataclasses.replace(spec, builder=build)


@kernel("Add", since=14, dtypes=["float"])
def add(node, xp):
    return launched(node, lambda a, b: (a + b,))


@kernel("Mul", since=14, dtypes=["float"])
def mul(node, xp):
    return launched(node, lambda a, b: (a * b,))


@kernel("Relu", since=14, dtypes=["float"])
def relu(node, xp):
    return launched(node, lambda x: (np.maximum(x, 0),))


@kernel("Dense", domain="costs.test", since=1, dtypes=["float"])
def dense(node, xp):
    return launched(node, lambda a, b: (a @ b,))


@kernel("Dense", domain="costs.test", since=1, dtypes=["float"])
def host_dense(node, xp):
    def run(a, b):
        time.sleep(HOST_DENSE_S)
        return (a @ b,)

    return run


class Plugin:
    @hookimpl
    def onnxep_provider_info(self):
        return ProviderInfo(name="lag", device="lag", version="0.1.0")

    @hookimpl
    def onnxep_create_provider(self, options):
        return LagProvider(options)

    @hookimpl
    def onnxep_kernels(self, provider):
        if provider.name == "lag":
            mine = [*add.__onnxep_kernels__, *mul.__onnxep_kernels__,
                    *relu.__onnxep_kernels__, *dense.__onnxep_kernels__]
            if not provider.options.get("generic"):
                return mine
            # option generic: every op of the SDK's generic library too, each paying a launch
            ops = set((s.domain, s.op_type) for s in mine)
            lib = KernelLibrary.from_package("onnxep.providers.ops")
            return [*(slowed(s) for s in lib if (s.domain, s.op_type) not in ops), *mine]
        if provider.name == "cpu":
            return list(host_dense.__onnxep_kernels__)


plugin = Plugin()
'''


@pytest.fixture
def lag(tmp_path, monkeypatch):
    """The installed ``onnxep_lag`` module (its ``BUILT`` list shows the kernels built)."""
    root = tmp_path / "site"
    root.mkdir()
    write_distribution(root, "onnxep_lag", "onnxep_lag", LAG_PROVIDER, {"lag": "onnxep_lag:plugin"})
    monkeypatch.syspath_prepend(str(root))
    onnxep.rediscover()
    import onnxep_lag

    yield onnxep_lag
    sys.modules.pop("onnxep_lag", None)
    onnxep.rediscover()


def measured(budget_ms=400.0, **kw):
    opts = onnxep.SessionOptions(placement="measured", placement_budget_ms=budget_ms, **kw)
    opts.log_severity_level = 3
    return opts


def tiny_ops_model(n=24):
    """A chain of ``n`` elementwise ops on a [1, 16] input: launch cost is all there is."""
    nodes, prev = [], "x"
    for i in range(n):
        op = ("Add", "Mul", "Relu")[i % 3]
        ins = [prev] if op == "Relu" else [prev, "c"]
        nodes.append(helper.make_node(op, ins, [f"t{i}"], name=f"{op.lower()}_{i}"))
        prev = f"t{i}"
    nodes.append(helper.make_node("Identity", [prev], ["y"], name="out"))
    c = numpy_helper.from_array(np.full([1, 16], 0.5, np.float32), "c")
    return make_model(nodes, [tensor("x", ["batch", 16])], [tensor("y", ["batch", 16])], [c])


def dense(name, a, w, out):
    return helper.make_node("Dense", [a, w], [out], name=name, domain="costs.test")


def weights(rng, *names, n=64):
    return [
        numpy_helper.from_array((rng.standard_normal([n, n]) / 8).astype(np.float32), k)
        for k in names
    ]


def heavy_model(rng):
    """Two Dense ops and a Relu: the host's Dense costs far more than lag's launches."""
    nodes = [
        dense("dense_0", "x", "w0", "h"),
        helper.make_node("Relu", ["h"], ["r"], name="relu"),
        dense("dense_1", "r", "w1", "y"),
    ]
    return make_model(
        nodes,
        [tensor("x", ["batch", 64])],
        [tensor("y", ["batch", 64])],
        weights(rng, "w0", "w1"),
        extra_opsets=[("costs.test", 1)],
    )


def island_model(rng):
    """A 4-node lag island (two Dense) -> Softmax (CPU) -> a 3-node lag island -> Softmax."""
    c = numpy_helper.from_array(np.full([1, 64], 0.25, np.float32), "c")
    nodes = [
        dense("dense_0", "x", "w0", "a0"),
        helper.make_node("Relu", ["a0"], ["a1"], name="relu_0"),
        dense("dense_1", "a1", "w1", "a2"),
        helper.make_node("Relu", ["a2"], ["a3"], name="relu_1"),
        helper.make_node("Softmax", ["a3"], ["s0"], name="softmax_0", axis=-1),
        helper.make_node("Add", ["s0", "c"], ["b0"], name="add_0"),
        helper.make_node("Mul", ["b0", "c"], ["b1"], name="mul_0"),
        helper.make_node("Add", ["b1", "c"], ["b2"], name="add_1"),
        helper.make_node("Softmax", ["b2"], ["y"], name="softmax_1", axis=-1),
    ]
    return make_model(
        nodes,
        [tensor("x", [2, 64])],
        [tensor("y", [2, 64])],
        [*weights(rng, "w0", "w1"), c],
        extra_opsets=[("costs.test", 1)],
    )


def ops_of(model) -> list[str]:
    return [n.op_type for n in model.graph.node]


def numpy_heavy(model, x):
    w = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
    return np.maximum(x @ w["w0"], 0) @ w["w1"]


# -- the choice -------------------------------------------------------------------------


def test_many_tiny_ops_land_on_the_cpu(lag, rng):
    model = tiny_ops_model()
    # the CPU's elementwise chains off: the 24 nodes stay nodes, whichever provider runs them
    sess = onnxep.InferenceSession(
        model, measured(disabled_rewrites=["fuse_elementwise_chains"]), providers=["lag", "cpu"]
    )
    rep = sess.placement()
    m = rep.measured
    assert m is not None and m.chosen == "cpu-only"
    assert sess.get_providers() == ["cpu"]
    assert rep.counts() == {"cpu": 25}
    assert [c.name for c in m.candidates] == ["priority", "cpu-only", "islands-to-cpu"]
    assert m["priority"].providers == ("lag", "cpu") and m["priority"].counts == {
        "lag": 24,
        "cpu": 1,
    }
    assert m["priority"].runs >= 1 and m["cpu-only"].runs >= 1
    assert m["priority"].median_ms > m["cpu-only"].median_ms
    # 24 lag nodes are one island, not fewer than 8: the same placement as the list as given
    assert "same placement as 'priority'" in m["islands-to-cpu"].skipped
    assert m["islands-to-cpu"].runs == 0
    assert "faster than the list as given" in m.reason
    assert m.feeds == {"x": "float32[1, 16]"}  # the free dim 'batch' made 1
    assert m.budget_ms == 400.0
    x = rng.standard_normal([3, 16]).astype(np.float32)
    ref = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    np.testing.assert_allclose(sess.run(None, {"x": x})[0], ref.run(None, {"x": x})[0], rtol=1e-6)


def test_a_few_heavy_ops_stay_on_the_device(lag, rng):
    model = heavy_model(rng)
    sess = onnxep.InferenceSession(model, measured(), providers=["lag", "cpu"])
    m = sess.placement().measured
    assert m.chosen == "priority", m.format()
    assert sess.get_providers() == ["lag", "cpu"]
    assert sess.placement().counts() == {"lag": 3}
    assert m["cpu-only"].median_ms > HOST_DENSE_MS  # two host Dense ops at least
    assert "the list as given was fastest" in m.reason
    # the whole device part is one island of 3 nodes: moved whole, it is the CPU-only placement
    assert "same placement as 'cpu-only'" in m["islands-to-cpu"].skipped
    x = rng.standard_normal([2, 64]).astype(np.float32)
    np.testing.assert_allclose(sess.run(None, {"x": x})[0], numpy_heavy(model, x), rtol=1e-5)


def test_small_islands_between_host_nodes_move_to_the_cpu(lag, rng):
    model = island_model(rng)
    opts = measured(placement_island_nodes=4)
    sess = onnxep.InferenceSession(model, opts, providers=["lag", "cpu"])
    rep = sess.placement()
    m = rep.measured
    assert m.chosen == "islands-to-cpu", m.format()
    assert m["islands-to-cpu"].counts == {"lag": 4, "cpu": 5}
    assert m["priority"].counts == {"lag": 7, "cpu": 2}
    assert m["islands-to-cpu"].copies < m["priority"].copies
    assert m.island_nodes == 4
    assert {n.node: n.provider for n in rep}["add_0"] == "cpu"
    assert {n.node: n.provider for n in rep}["dense_1"] == "lag"
    (lag_name, why), *_ = rep["mul_0"].declined
    assert lag_name == "lag" and "an island of 3 node(s) (fewer than 4)" in why
    assert "placement measured" in rep.format() and "chose 'islands-to-cpu'" in rep.format()
    x = rng.standard_normal([2, 64]).astype(np.float32)
    plain = onnxep.InferenceSession(model, providers=["lag", "cpu"])
    np.testing.assert_allclose(sess.run(None, {"x": x})[0], plain.run(None, {"x": x})[0])


class VoiceActivity(torch.nn.Module if torch else object):
    """Conv1d front end, an LSTM, a dense head: a voice-activity model's shape, small."""

    def __init__(self):
        super().__init__()
        self.c1 = torch.nn.Conv1d(1, 16, 5, stride=2)
        self.c2 = torch.nn.Conv1d(16, 16, 3)
        self.lstm = torch.nn.LSTM(16, 32, batch_first=True)
        self.head = torch.nn.Linear(32, 1)

    def forward(self, audio):
        h = torch.relu(self.c2(torch.relu(self.c1(audio))))
        out, _ = self.lstm(h.transpose(1, 2))
        return torch.sigmoid(self.head(out[:, -1]))


@pytest.mark.skipif(torch is None, reason="needs torch to export the model")
def test_an_exported_voice_activity_model_lands_on_the_cpu(lag, rng, tmp_path):
    """A torch export (Conv1d + LSTM + Linear), on lag running the SDK's generic kernels:
    each of its nodes pays a launch, so the CPU alone is faster."""
    torch.manual_seed(0)
    path = tmp_path / "vad.onnx"
    x = torch.randn(1, 1, 200)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(
            VoiceActivity().eval(), (x,), str(path), dynamo=False, input_names=["audio"]
        )
    model = onnx.load(str(path))
    assert "LSTM" in ops_of(model) and "Conv" in ops_of(model)
    providers = [("lag", {"generic": True}), "cpu"]
    sess = onnxep.InferenceSession(str(path), measured(), providers=providers)
    m = sess.placement().measured
    assert m.chosen == "cpu-only", m.format()
    assert m["priority"].counts.get("lag", 0) >= 6  # lag claims the model's compute nodes
    assert m.feeds == {"audio": "float32[1, 1, 200]"}
    feeds = {"audio": rng.standard_normal([1, 1, 200]).astype(np.float32)}
    ref = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    [r] = compare_output("y", sess.run(None, feeds)[0], ref.run(None, feeds)[0], ["cpu"], "ort")
    assert r.ok, r
    priority = onnxep.InferenceSession(str(path), providers=providers)
    [r] = compare_output("y", priority.run(None, feeds)[0], ref.run(None, feeds)[0], ["lag"], "ort")
    assert r.ok, r


def test_the_fallback_warning_leaves_out_the_nodes_it_moved(lag, rng, caplog):
    opts = measured(placement_island_nodes=4)
    opts.log_severity_level = 2
    with caplog.at_level("WARNING", logger="onnxep"):
        sess = onnxep.InferenceSession(island_model(rng), opts, providers=["lag", "cpu"])
    assert sess.placement().measured.chosen == "islands-to-cpu"
    [warning] = [r.getMessage() for r in caplog.records if "fell back" in r.getMessage()]
    assert warning.startswith("2 node(s) fell back from 'lag'") and warning.endswith(": Softmax")


def test_islands_inside_a_branch_move_too(lag, rng):
    """The rule applies in subgraphs: an If's branches, two small lag islands, move to the
    CPU, which makes the islands candidate the CPU-only placement."""
    c = numpy_helper.from_array(np.full([4], 2.0, np.float32), "c")
    then = helper.make_graph(
        [
            helper.make_node("Add", ["x", "c"], ["a"], name="then_add"),
            helper.make_node("Mul", ["a", "c"], ["t"], name="then_mul"),
        ],
        "then",
        [],
        [tensor("t", [4])],
    )
    other = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["e"], name="else_relu")], "else", [], [tensor("e", [4])]
    )
    node = helper.make_node("If", ["cond"], ["y"], name="if", then_branch=then, else_branch=other)
    model = make_model(
        [node], [tensor("x", [4]), tensor("cond", [], TensorProto.BOOL)], [tensor("y", [4])], [c]
    )
    sess = onnxep.InferenceSession(model, measured(), providers=["lag", "cpu"])
    m = sess.placement().measured
    assert m["priority"].counts == {"cpu": 1, "lag": 3}
    assert "same placement as 'cpu-only'" in m["islands-to-cpu"].skipped
    assert m.chosen == "cpu-only"
    out = sess.run(None, {"x": np.arange(4, dtype=np.float32), "cond": np.array(True)})[0]
    np.testing.assert_array_equal(out, (np.arange(4) + 2.0) * 2.0)


def test_the_kept_plan_is_fresh(lag, rng):
    """The plans timed are thrown away: the session's own kernels have not run yet."""
    sess = onnxep.InferenceSession(heavy_model(rng), measured(), providers=["lag", "cpu"])
    assert sess.placement().measured.chosen == "priority"
    timed = [b for b in lag.BUILT if b["calls"]]
    assert timed, "the measurement ran lag's kernels"
    kept = lag.BUILT[-3:]  # the session's plan is compiled last
    assert [b["calls"] for b in kept] == [0, 0, 0]
    sess.run(None, {"x": np.ones([1, 64], np.float32)})
    assert [b["calls"] for b in kept] == [1, 1, 1]


def test_the_budget_bounds_the_timed_runs(lag, rng):
    sess = onnxep.InferenceSession(
        tiny_ops_model(), measured(budget_ms=1.0), providers=["lag", "cpu"]
    )
    m = sess.placement().measured
    assert m["priority"].runs == 1 and m["cpu-only"].runs == 1  # one round, however short
    assert "raise placement_budget_ms" in m.reason
    assert m.spent_ms < 1000


def test_priority_is_the_default_and_times_nothing(lag, rng):
    before = len(lag.BUILT)
    sess = onnxep.InferenceSession(heavy_model(rng), providers=["lag", "cpu"])
    assert sess.placement().measured is None
    assert len(lag.BUILT) - before == 3  # one plan, built once
    assert "placement measured" not in sess.placement().format()


def test_one_distinct_placement_is_not_timed(rng):
    sess = onnxep.InferenceSession(tiny_ops_model(), measured(), providers=["cpu"])
    m = sess.placement().measured
    assert m.chosen == "priority"
    assert "only distinct placement" in m.reason
    assert [c.name for c in m.candidates] == ["priority"]


def test_given_shapes_and_int_ranges_make_the_feeds(lag, rng):
    opts = measured(placement_shapes={"x": [5, 16]})
    sess = onnxep.InferenceSession(tiny_ops_model(), opts, providers=["lag", "cpu"])
    assert sess.placement().measured.feeds == {"x": "float32[5, 16]"}
    opts = measured()
    opts.add_free_dimension_override_by_name("batch", 3)
    sess = onnxep.InferenceSession(tiny_ops_model(), opts, providers=["lag", "cpu"])
    assert sess.placement().measured.feeds == {"x": "float32[3, 16]"}


# -- switches and refusals --------------------------------------------------------------


def test_plugins_toml_switches_it_on(lag, rng, tmp_path):
    cfg = tmp_path / "plugins.toml"
    cfg.write_text('[placement]\nmode = "measured"\nbudget_ms = 300\nisland_nodes = 5\n')
    opts = onnxep.SessionOptions(plugins_config=str(cfg))
    sess = onnxep.InferenceSession(tiny_ops_model(), opts, providers=["lag", "cpu"])
    m = sess.placement().measured
    assert m.chosen == "cpu-only" and m.budget_ms == 300 and m.island_nodes == 5
    opts = onnxep.SessionOptions(plugins_config=str(cfg), placement="priority")
    sess = onnxep.InferenceSession(tiny_ops_model(), opts, providers=["lag", "cpu"])
    assert sess.placement().measured is None  # the session's option wins


@pytest.mark.parametrize(
    "toml, words",
    [
        ('mode = "fastest"', "must be one of priority, measured"),
        ("budget_ms = 0", "above 0"),
        ("island_nodes = -1", "whole number"),
        ("rounds = 3", "unknown key 'placement.rounds'"),
    ],
)
def test_plugins_toml_placement_checked(tmp_path, toml, words):
    cfg = tmp_path / "plugins.toml"
    cfg.write_text(f"[placement]\n{toml}\n")
    with pytest.raises(ConfigError, match=words):
        onnxep.InferenceSession(tiny_ops_model(), onnxep.SessionOptions(plugins_config=str(cfg)))


@pytest.mark.parametrize(
    "kw, words",
    [
        ({"placement": "fast"}, "must be one of priority, measured"),
        ({"placement": "measured", "placement_budget_ms": -5}, "milliseconds above 0"),
        ({"placement": "measured", "placement_island_nodes": 2.5}, "whole number"),
        ({"placement": "measured", "disable_fallback": True}, "cannot both be set"),
    ],
)
def test_bad_settings_refused(lag, kw, words):
    with pytest.raises(InvalidArgument, match=words):
        onnxep.InferenceSession(
            tiny_ops_model(), onnxep.SessionOptions(**kw), providers=["lag", "cpu"]
        )


def test_an_input_of_unknown_rank_is_refused_with_how_to_give_it(lag):
    model = tiny_ops_model()
    del model.graph.input[0].type.tensor_type.shape.dim[:]
    model.graph.input[0].type.tensor_type.ClearField("shape")
    with pytest.raises(InvalidArgument, match=r"input 'x'.*rank.*placement_shapes"):
        onnxep.InferenceSession(model, measured(), providers=["lag", "cpu"])
    sess = onnxep.InferenceSession(
        model, measured(placement_shapes={"x": [1, 16]}), providers=["lag", "cpu"]
    )
    assert sess.placement().measured.chosen == "cpu-only"


def test_feeds_the_model_cannot_run_are_refused(lag):
    """A Reshape to 32 elements cannot take the 1 x 16 feed a free dim of 1 gives."""
    nodes = [
        helper.make_node("Add", ["x", "x"], ["a"], name="add"),
        helper.make_node("Reshape", ["a", "shape"], ["y"], name="reshape"),
    ]
    shape = numpy_helper.from_array(np.array([2, 16], np.int64), "shape")
    model = make_model(nodes, [tensor("x", ["n", 16])], [tensor("y", [2, 16])], [shape])
    with pytest.raises(InvalidArgument, match=r"could not run the model on its timing feeds"):
        onnxep.InferenceSession(model, measured(), providers=["lag", "cpu"])
    sess = onnxep.InferenceSession(
        model, measured(placement_shapes={"x": [2, 16]}), providers=["lag", "cpu"]
    )
    assert sess.placement().measured is not None


def test_a_sequence_input_is_refused(lag):
    seq = helper.make_tensor_sequence_value_info("xs", TensorProto.FLOAT, [2])
    nodes = [
        helper.make_node("SequenceAt", ["xs", "i"], ["a"], name="at"),
        helper.make_node("Add", ["a", "a"], ["y"], name="add"),
    ]
    i = numpy_helper.from_array(np.array(0, np.int64), "i")
    model = make_model(nodes, [seq], [tensor("y", [2])], [i])
    with pytest.raises(InvalidArgument, match=r"input 'xs'.*only tensors"):
        onnxep.InferenceSession(model, measured(), providers=["lag", "cpu"])


# -- the CLI ----------------------------------------------------------------------------


def test_explain_shows_the_measurement(lag, tmp_path, capsys):
    from onnxep.tools.cli import main

    path = tmp_path / "tiny.onnx"
    onnx.save(tiny_ops_model(), str(path))
    argv = ["explain", str(path), "--providers", "lag,cpu", "--placement", "measured"]
    assert main([*argv, "--placement-budget-ms", "200", "--shape", "x=2,16"]) == 0
    out = capsys.readouterr().out
    assert "placement measured (budget 200 ms" in out
    assert "feeds: x float32[2, 16]" in out
    assert "priority [lag, cpu]: median" in out and "chose 'cpu-only'" in out
    assert main([*argv, "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["measured"]["chosen"] == "cpu-only"
    assert [c["name"] for c in doc["measured"]["candidates"]][:2] == ["priority", "cpu-only"]
    assert doc["measured"]["candidates"][0]["runs"] >= 1
