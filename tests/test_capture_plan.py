"""Capture planning and the captured runner, on the CPU: a fake device whose "graphs" re-run
the recorded steps into the buffers they were captured with, as a CUDA graph replays."""

from __future__ import annotations

from contextlib import nullcontext

import numpy as np
import pytest
from conftest import make_model, tensor
from onnx import helper

import onnxep
from onnxep.capture.plan import CaptureRefused, check_mode
from onnxep.capture.runner import graph_id_of
from onnxep.errors import ConfigError
from onnxep.plugins.host import unregister_plugin
from onnxep.providers import CaptureConfig, Provider, ProviderInfo, hookimpl, kernel


class Dev(np.ndarray):
    """An array on the fake device."""


def _dev(x):
    return np.array(x, copy=True).view(Dev)


STATE = {"capturing": False, "fail_op": None}


@kernel("Relu", since=14)
def relu(node, xp):
    return lambda x: (_dev(np.maximum(x, 0)),)


@kernel("Add", since=14)
def add(node, xp):
    return lambda a, b: (_dev(np.add(a, b)),)


@kernel("Mul", since=14)
def mul(node, xp):
    def run(a, b):
        if STATE["capturing"] and STATE["fail_op"] == "Mul":
            raise RuntimeError("operation not permitted when stream is capturing")
        return (_dev(np.multiply(a, b)),)

    return run


@kernel("Neg", since=13, capture_safe=False, capture_note="synchronizes with the host")
def neg(node, xp):
    return lambda x: (_dev(np.negative(x)),)


@kernel(
    "HostHalf",
    domain="test.fake",
    host_outputs=(0,),
    capture_safe=False,
    capture_note="hands its result over on the host",
)
def host_half(node, xp):
    # a device step whose output lives on the host, as control flow's can
    return lambda x: (np.asarray(x) / 2,)


@kernel("Reshape", since=14, host_inputs=(1,))
def reshape(node, xp):
    return lambda x, shape: (_dev(np.reshape(x, tuple(int(d) for d in shape))),)


class FakeGraph:
    def __init__(self, run, state, outputs):
        self.run, self.state, self.outputs, self.fresh = run, state, outputs, True


class FakeBackend:
    def memory(self):
        return type("Mem", (), {"allocating": staticmethod(nullcontext)})()

    def capture(self, run, state, outputs):
        STATE["capturing"] = True
        try:
            run()  # the fake records by running; its first launch then does nothing
        finally:
            STATE["capturing"] = False
        return FakeGraph(run, state, list(outputs))

    def constant(self, value, memory):
        return _dev(value)

    def launch(self, g):
        if g.fresh:
            g.fresh = False
            return
        kept = {s: g.state[s] for s in g.outputs if g.state[s] is not None}
        g.run()
        for s, buf in kept.items():
            np.copyto(buf, g.state[s])  # a replay writes into the captured buffers
            g.state[s] = buf

    def fixed(self, value):
        return _dev(value)

    def copy_into(self, dst, src):
        np.copyto(dst, src)

    def duplicate(self, value):
        return _dev(value)

    def is_device(self, value):
        return isinstance(value, Dev)

    def address(self, value):
        return value.ctypes.data


class FakeDevice(Provider):
    def __init__(self, options):
        super().__init__("fakegpu", options, device="fakegpu")

    def from_host(self, value):
        return value if isinstance(value, Dev) else _dev(value)

    def to_host(self, value):
        return np.array(value, copy=True) if isinstance(value, Dev) else value


class FakePlugin:
    def __init__(self):
        self.options = {}

    @hookimpl
    def onnxep_provider_info(self):
        return ProviderInfo(name="fakegpu", device="fakegpu")

    @hookimpl
    def onnxep_create_provider(self, options):
        return FakeDevice(options)

    @hookimpl
    def onnxep_kernels(self, provider):
        if provider.name != "fakegpu":
            return None
        return [
            *relu.__onnxep_kernels__,
            *add.__onnxep_kernels__,
            *mul.__onnxep_kernels__,
            *neg.__onnxep_kernels__,
            *reshape.__onnxep_kernels__,
            *host_half.__onnxep_kernels__,
        ]

    @hookimpl
    def onnxep_capture_policy(self, provider, options):
        if provider.name != "fakegpu":
            return None
        return CaptureConfig(
            mode=options.get("capture", "auto"),
            backend=FakeBackend,
            capturing=frozenset({"fakegpu"}),
            warmup=int(options.get("warmup", 2)),
            cache_size=int(options.get("cache", 8)),
        )


@pytest.fixture
def fake():
    plugin = FakePlugin()
    onnxep.register_provider(plugin, name="fake-capture-plugin")
    STATE.update(capturing=False, fail_op=None)
    yield plugin
    unregister_plugin(plugin)


def _session(model, **options):
    return onnxep.InferenceSession(model, providers=[("fakegpu", options), "cpu"])


def _chain(middle="Relu"):
    """x, y -> Add -> <middle> -> Mul(y) -> Relu: a device chain with one node to vary."""
    return make_model(
        [
            helper.make_node("Add", ["x", "y"], ["a"], name="add"),
            helper.make_node(middle, ["a"], ["m"], name="middle"),
            helper.make_node("Mul", ["m", "y"], ["p"], name="mul"),
            helper.make_node("Relu", ["p"], ["z"], name="relu"),
        ],
        [tensor("x", [2, 3]), tensor("y", [2, 3])],
        [tensor("z", [2, 3])],
    )


def _expected(x, y, middle):
    a = x + y
    m = np.maximum(a, 0) if middle == "Relu" else -a
    return np.maximum(m * y, 0)


def _feeds(seed):
    rng = np.random.default_rng(seed)
    return {k: rng.standard_normal((2, 3)).astype(np.float32) for k in ("x", "y")}


def test_modes_are_checked():
    assert check_mode(" Segmented ") == "segmented"
    with pytest.raises(ConfigError, match="one of off, whole, segmented, auto"):
        check_mode("always")


def test_all_safe_chain_plans_one_whole_graph(fake):
    sess = _session(_chain())
    cp = sess.capture_plan()
    assert cp.mode == "whole" and cp.seams == [] and len(cp.segments) == 1
    roles = {r.name: r.role for r in cp.roles}
    assert roles["add"] == roles["relu"] == "capture"
    assert [r.role for r in cp.roles].count("stage") == 2  # x and y uploaded before the graph
    assert cp.roles[-1].role == "output"
    assert sess.capture_stats()["policy"] == "whole"


def test_unsafe_kernel_is_a_seam_with_its_note(fake):
    sess = _session(_chain("Neg"))
    cp = sess.capture_plan()
    assert cp.mode == "segmented"
    assert [(r.name, r.reason) for r in cp.seams] == [("middle", "synchronizes with the host")]
    assert len(cp.segments) == 2
    text = cp.format()
    assert "seam 'middle' (Neg): synchronizes with the host" in text
    assert "graph 0" in text and "graph 1" in text


def test_whole_names_every_seam(fake):
    with pytest.raises(CaptureRefused, match=r"'middle' \(Neg\): synchronizes with the host"):
        _session(_chain("Neg"), capture="whole")


def test_off_and_cpu_only_sessions_do_not_capture(fake):
    assert _session(_chain(), capture="off").capture_plan().mode == "off"
    sess = onnxep.InferenceSession(_chain(), providers=["cpu"])
    assert sess.capture_plan() is None
    assert sess.capture_stats()["policy"] == "off"


def test_host_compute_and_reads_back_are_seams(fake):
    # Softmax has no fake kernel: it runs on the CPU between two device runs.
    model = make_model(
        [
            helper.make_node("Add", ["x", "y"], ["a"], name="add"),
            helper.make_node("Softmax", ["a"], ["s"], name="softmax"),
            helper.make_node("Relu", ["s"], ["z"], name="relu"),
        ],
        [tensor("x", [2, 3]), tensor("y", [2, 3])],
        [tensor("z", [2, 3])],
    )
    cp = _session(model).capture_plan()
    seams = {r.name: r.reason for r in cp.seams}
    assert seams["softmax"] == "runs on the host (provider 'cpu')"
    assert any("reads a device value back" in r for r in seams.values())
    assert any("uploads a value the host computes" in r for r in seams.values())
    assert cp.mode == "segmented" and len(cp.segments) == 2


def test_shape_math_on_the_host_is_frozen_not_a_seam(fake):
    model = make_model(
        [
            helper.make_node("Relu", ["x"], ["r"], name="relu"),
            helper.make_node("Shape", ["y"], ["shp"], name="shape"),
            helper.make_node("Reshape", ["r", "shp"], ["z"], name="reshape"),
        ],
        [tensor("x", [6]), tensor("y", ["a", "b"])],
        [tensor("z", ["a", "b"])],
    )
    sess = _session(model)
    cp = sess.capture_plan()
    assert cp.mode == "whole", cp.format()
    assert {r.name: r.role for r in cp.roles}["shape"] == "frozen"
    for seed in range(5):
        x = np.arange(6, dtype=np.float32) - seed
        y = np.zeros((2, 3), np.float32)
        (z,) = sess.run(None, {"x": x, "y": y})
        np.testing.assert_array_equal(z, np.maximum(x, 0).reshape(2, 3))
    assert sess.capture_stats()["replays"] == 2


@pytest.mark.parametrize("middle", ["Relu", "Neg"])
def test_replays_give_the_eager_results(fake, middle):
    sess = _session(_chain(middle))
    for seed in range(8):
        f = _feeds(seed)
        (z,) = sess.run(None, f)
        assert type(z) is np.ndarray
        np.testing.assert_allclose(z, _expected(f["x"], f["y"], middle), rtol=1e-6)
    stats = sess.capture_stats()
    assert stats["captures"] == 1 and stats["replays"] == 5  # 2 warm-up runs, 1 capture
    assert stats["segments"] == (1 if middle == "Relu" else 2)


def test_outputs_are_not_the_graphs_buffers(fake):
    sess = _session(_chain(), warmup=0)
    f = _feeds(0)
    (z1,) = sess.run(None, f)
    (z2,) = sess.run(None, _feeds(1))
    np.testing.assert_allclose(z1, _expected(f["x"], f["y"], "Relu"), rtol=1e-6)
    outs = sess.compiled.run(_feeds(2), on_device=True)
    outs2 = sess.compiled.run(_feeds(3), on_device=True)
    assert outs[0] is not outs2[0]
    f2 = _feeds(2)
    np.testing.assert_allclose(outs[0], _expected(f2["x"], f2["y"], "Relu"), rtol=1e-6)


def test_graph_ids_and_shapes_key_the_cache(fake):
    sess = _session(_chain(), warmup=1, cache=2)
    opts = {g: onnxep.RunOptions() for g in (-1, 1, 2)}
    for g, o in opts.items():
        o.add_run_config_entry("gpu_graph_id", str(g))
    assert graph_id_of(opts[1]) == 1
    for _ in range(3):
        sess.run(None, _feeds(0), opts[-1])
    assert sess.capture_stats()["captures"] == 0  # -1 runs eagerly
    for _ in range(3):
        sess.run(None, _feeds(0), opts[1])
        sess.run(None, _feeds(0), opts[2])
    s = sess.capture_stats()
    assert (s["captures"], s["replays"], s["invalidations"]) == (2, 2, 0)
    for _ in range(2):
        sess.run(None, _feeds(0))  # graph id 0: a third key, the oldest is dropped
    assert sess.capture_stats()["invalidations"] == 1
    bad = onnxep.RunOptions()
    bad.add_run_config_entry("gpu_graph_id", "first")
    with pytest.raises(ConfigError, match="gpu_graph_id"):
        sess.run(None, _feeds(0), bad)


def test_a_failing_capture_falls_back_and_makes_a_seam(fake):
    STATE["fail_op"] = "Mul"
    sess = _session(_chain(), warmup=0)
    results = []
    for seed in range(4):
        f = _feeds(seed)
        (z,) = sess.run(None, f)
        results.append(np.allclose(z, _expected(f["x"], f["y"], "Relu"), rtol=1e-6))
    assert all(results)
    s = sess.capture_stats()
    assert s["fallbacks"] == 1 and s["policy"] == "segmented"
    assert "capture failed at 'mul' (Mul)" in s["failures"][0]
    assert "not permitted" in s["reason"] or "capture failed" in s["reason"]
    assert s["captures"] == 1 and s["replays"] == 2
    assert "mul" in {r.name for r in sess.capture_plan().seams}


def test_an_upload_of_shape_math_is_baked_in(fake):
    model = make_model(
        [
            helper.make_node("Shape", ["y"], ["shp"], name="shape"),
            helper.make_node("Cast", ["shp"], ["c"], name="cast", to=1),
            helper.make_node("Add", ["x", "c"], ["z"], name="add"),
        ],
        [tensor("x", [2]), tensor("y", ["a", "b"])],
        [tensor("z", [2])],
    )
    sess = _session(model, warmup=0)
    cp = sess.capture_plan()
    assert cp.mode == "whole", cp.format()
    assert any(r.role == "frozen" and r.op_type == "Copy" for r in cp.roles)
    for n in range(2, 6):
        x = np.array([n, -n], np.float32)
        (z,) = sess.run(None, {"x": x, "y": np.zeros((3, 4), np.float32)})
        np.testing.assert_array_equal(z, x + np.array([3, 4], np.float32))
    (z,) = sess.run(None, {"x": x, "y": np.zeros((5, 1), np.float32)})  # another shape key
    np.testing.assert_array_equal(z, x + np.array([5, 1], np.float32))
    assert sess.capture_stats()["captures"] == 2


def test_an_upload_of_a_device_steps_host_output_is_a_seam(fake):
    model = make_model(
        [
            helper.make_node("Relu", ["x"], ["r"], name="relu"),
            helper.make_node("HostHalf", ["r"], ["h"], name="half", domain="test.fake"),
            helper.make_node("Add", ["h", "x"], ["z"], name="add"),
        ],
        [tensor("x", [2, 3])],
        [tensor("z", [2, 3])],
        extra_opsets=[("test.fake", 1)],
    )
    sess = _session(model)
    roles = {r.name: (r.role, r.reason) for r in sess.capture_plan().roles}
    assert roles["copy h cpu->fakegpu"] == ("seam", "uploads a value the host computes on each run")
    for seed in range(5):
        x = np.random.default_rng(seed).standard_normal((2, 3)).astype(np.float32)
        (z,) = sess.run(None, {"x": x})
        np.testing.assert_allclose(z, np.maximum(x, 0) / 2 + x, rtol=1e-6)
    s = sess.capture_stats()
    assert s["fallbacks"] == 0 and s["replays"] == 2, s


def test_explain_shows_the_segmentation(fake, tmp_path, capsys):
    import onnx

    from onnxep.tools.cli import main

    path = tmp_path / "chain.onnx"
    onnx.save(_chain("Neg"), path)
    assert main(["explain", str(path), "--providers", "fakegpu,cpu"]) == 0
    out = capsys.readouterr().out
    assert "capture: segmented (asked: auto)" in out
    assert "seam 'middle' (Neg): synchronizes with the host" in out


def test_cuda_capture_options(monkeypatch):
    # The options module imports no CuPy: checked here, without a GPU.
    from onnxep.providers_cuda.options import DEFAULT_CAPTURE, parse_options

    monkeypatch.delenv("ONNXEP_CUDA_CAPTURE", raising=False)
    o = parse_options({})
    assert (o.capture, o.capture_source, o.capture_warmup, o.capture_cache) == (
        DEFAULT_CAPTURE,
        "default",
        2,
        8,
    )
    o = parse_options({"capture": "Segmented", "capture_warmup": 0, "capture_cache": "3"})
    assert (o.capture, o.capture_source, o.capture_warmup, o.capture_cache) == (
        "segmented",
        "option",
        0,
        3,
    )
    assert parse_options({"enable_cuda_graph": "1"}).capture == "whole"
    monkeypatch.setenv("ONNXEP_CUDA_CAPTURE", "off")
    o = parse_options({"capture": "whole"})
    assert (o.capture, o.capture_source) == ("off", "environment")
    with pytest.raises(ConfigError, match=r"\$ONNXEP_CUDA_CAPTURE must be one of"):
        monkeypatch.setenv("ONNXEP_CUDA_CAPTURE", "sometimes")
        parse_options({})
    monkeypatch.delenv("ONNXEP_CUDA_CAPTURE")
    with pytest.raises(ConfigError, match="the capture option must be one of"):
        parse_options({"capture": True})
    with pytest.raises(ConfigError, match="capture_warmup must be an integer of at least 0"):
        parse_options({"capture_warmup": -1})
    with pytest.raises(ConfigError, match="capture_cache must be an integer of at least 1"):
        parse_options({"capture_cache": 0})


def test_hand_built_plan_roles():
    from onnxep.capture.plan import plan_capture, segments_of
    from onnxep.compile.plan import Plan, Step

    def step(name, op, ins, outs, provider="gpu", kind="kernel", **kw):
        return Step(lambda *a: a, ins, outs, name, op, provider, kind, **kw)

    # slots: 2 = x (feed), 3 = n (feed, a host scalar), 4.. = values
    steps = [
        step("up x", "Copy", (2,), (4,), kind="copy"),
        step("relu", "Relu", (4,), (5,)),
        step("if", "If", (5,), (6,)),
        step("topk", "TopK", (6, 3), (7,)),  # reads the fed host scalar as a parameter
        step("tanh", "Tanh", (7,), (8,)),
        step("sigmoid", "Sigmoid", (8,), (9,)),
        step("down", "Copy", (9,), (10,), provider="cpu", kind="copy"),
    ]
    plan = Plan(steps, [None] * 11, (2, 3), (10,), [str(i) for i in range(11)], output_copies=1)
    cp = plan_capture(plan, {"gpu"}, "auto")
    assert [r.role for r in cp.roles] == [
        "stage",
        "capture",
        "seam",
        "seam",
        "capture",
        "capture",
        "output",
    ]
    assert cp.roles[2].reason == "control flow runs through the host"
    assert "host value that can change" in cp.roles[3].reason
    assert [(s.start, s.stop) for s in cp.segments] == [(1, 2), (4, 6)]
    assert segments_of(cp.roles) == cp.segments
    forced = plan_capture(plan, {"gpu"}, "segmented", forced={4: "capture failed"})
    assert [(s.start, s.stop) for s in forced.segments] == [(1, 2), (5, 6)]
    other = plan_capture(plan, {"other"}, "auto")
    assert other.mode == "off" and other.roles[0].role == "seam"


def test_io_binding_runs_replay_too(fake):
    sess = _session(_chain(), warmup=1)
    io = sess.io_binding()
    opts = onnxep.RunOptions()
    opts.add_run_config_entry("gpu_graph_id", "3")
    for seed in range(4):
        f = _feeds(seed)
        for k, v in f.items():
            io.bind_cpu_input(k, v)
        io.bind_output("z", "cpu")
        sess.run_with_iobinding(io, opts)
        (z,) = io.copy_outputs_to_cpu()
        np.testing.assert_allclose(z, _expected(f["x"], f["y"], "Relu"), rtol=1e-6)
    s = sess.capture_stats()
    assert (s["captures"], s["replays"]) == (1, 2)


def test_a_buffer_bound_as_input_and_output_is_read_in_place_and_keys_the_graph(fake):
    """x is a state: bound as input and as output z, each run reads it and writes the next.
    The graph reads that buffer where it is, so another buffer bound there is a new key:
    it never replays a graph baked on the first one (whose result would then be wrong)."""
    sess = _session(_chain(), warmup=1)
    y = _feeds(0)["y"]
    io = sess.io_binding()
    io.bind_cpu_input("y", y)

    def bind(buf):
        io.bind_input("x", buf)
        io.bind_output("z", buf)

    def step(buf):
        want = _expected(np.asarray(buf).copy(), y, "Relu")
        sess.run_with_iobinding(io)
        np.testing.assert_allclose(np.asarray(buf), want, rtol=1e-6)

    a, b = _dev(_feeds(1)["x"]), _dev(_feeds(2)["x"] + 1)
    bind(a)
    for _ in range(4):  # a warm-up run, a capture, replays
        step(a)
    s = sess.capture_stats()
    assert (s["captures"], s["replays"], s["rebinds"]) == (1, 2, 0), s
    # the replays staged y alone: x is read in place (z, a fresh result, is copied into it)
    assert s["copies"] == 2 and io.copied_outputs == ["z"]
    bind(b)
    for _ in range(2):
        step(b)
    s = sess.capture_stats()
    assert (s["captures"], s["replays"], s["rebinds"]) == (2, 3, 1), s
    bind(a)  # the first buffer again: its graph, still cached, replays
    step(a)
    s = sess.capture_stats()
    assert (s["captures"], s["replays"]) == (2, 4), s


def test_bound_in_place_graphs_stay_within_the_cache(fake):
    sess = _session(_chain(), warmup=0, cache=2)
    y = _feeds(0)["y"]
    io = sess.io_binding()
    io.bind_cpu_input("y", y)
    bufs = [_dev(_feeds(seed)["x"]) for seed in range(3)]
    for buf in bufs:
        want = _expected(np.asarray(buf).copy(), y, "Relu")
        io.bind_input("x", buf)
        io.bind_output("z", buf)
        sess.run_with_iobinding(io)
        np.testing.assert_allclose(np.asarray(buf), want, rtol=1e-6)
    s = sess.capture_stats()
    assert (s["captures"], s["rebinds"], s["invalidations"]) == (3, 2, 1), s


class WrongPolicy:
    """A plugin whose capture policy is not a CaptureConfig: its failure, recorded."""

    @hookimpl
    def onnxep_capture_policy(self, provider, options):
        return {"mode": "whole"} if provider.name == "fakegpu" else None


def test_a_wrong_capture_policy_is_the_plugins_recorded_failure(fake):
    wrong = WrongPolicy()
    onnxep.register_provider(wrong, name="wrong-capture-plugin")
    try:
        sess = _session(_chain(), capture="whole", warmup=0)
        feeds = _feeds(0)
        np.testing.assert_allclose(
            sess.run(None, feeds)[0], _expected(feeds["x"], feeds["y"], "Relu"), rtol=1e-6
        )
        # the right plugin's config still applies; the wrong answer is set aside, recorded
        assert sess.capture_stats()["policy"] == "whole"
        (failure,) = [f for f in onnxep.plugin_failures() if f.name == "wrong-capture-plugin"]
        assert failure.hook == "onnxep_capture_policy" and failure.provider == "fakegpu"
        assert "returned a dict, not a CaptureConfig or None" in failure.error
    finally:
        unregister_plugin(wrong)
