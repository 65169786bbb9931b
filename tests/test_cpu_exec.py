"""The CPU executor's per-node work: constants folded inside subgraphs, kernels called directly.

Each optimisation is checked twice: its results equal onnxruntime's and the unoptimised
path's on real exports (torch.onnx, the real-model corpus), and a counter in the session's
report shows it applied, so a change that silently stops it fails here.
"""

from __future__ import annotations

import warnings
from collections import Counter

import numpy as np
import onnx
import pytest

import onnxep

ort = pytest.importorskip("onnxruntime")


def _ort(path, feeds):
    so = ort.SessionOptions()
    so.log_severity_level = 4
    return ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"]).run(None, feeds)


@pytest.fixture(scope="module")
def if_lstm(tmp_path_factory):
    """A scripted torch module whose If branches each run an LSTM, exported by torch.onnx's
    TorchScript exporter: each branch rebuilds the LSTM's gate-reordered weights from
    Constants with Slice and Concat on every run, as silero VAD's export does."""
    torch = pytest.importorskip("torch")
    path = tmp_path_factory.mktemp("if_lstm") / "if_lstm.onnx"
    src = path.with_suffix(".py")
    # torch.jit.script reads the class's source, so the module lives in a file.
    src.write_text(
        "import torch\n"
        "class M(torch.nn.Module):\n"
        "    def __init__(self):\n"
        "        super().__init__()\n"
        "        self.a = torch.nn.LSTM(8, 16, batch_first=True)\n"
        "        self.b = torch.nn.LSTM(8, 16, batch_first=True)\n"
        "    def forward(self, x):\n"
        "        if bool(x.sum() > 0):\n"
        "            y = self.a(x)[0]\n"
        "        else:\n"
        "            y = self.b(x)[0] * 2.0\n"
        "        return y\n"
    )
    import importlib.util

    spec = importlib.util.spec_from_file_location("if_lstm_module", src)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    torch.manual_seed(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(
            torch.jit.script(mod.M()),
            (torch.randn(2, 5, 8),),
            str(path),
            dynamo=False,
            input_names=["x"],
            output_names=["y"],
            opset_version=15,
            dynamic_axes={"x": {0: "b", 1: "t"}},
        )
    return path


def _branch_ops(path) -> Counter:
    proto = onnx.load(str(path))
    ops: Counter = Counter()
    for node in proto.graph.node:
        for a in node.attribute:
            if a.type == onnx.AttributeProto.GRAPH:
                ops.update(n.op_type for n in a.g.node)
    return ops


def test_subgraph_constants_fold_and_keep_results(if_lstm):
    # The export really builds its weights in the branches: the case the pass exists for.
    assert _branch_ops(if_lstm)["Constant"] >= 60
    sess = onnxep.InferenceSession(str(if_lstm), providers=["cpu"])
    off = onnxep.InferenceSession(
        str(if_lstm),
        onnxep.SessionOptions(disabled_rewrites=["fold_subgraph_constants"]),
        providers=["cpu"],
    )
    rep = sess.placement()
    assert rep.rewrites["fold_subgraph_constants"] >= 60
    left = Counter(n.op_type for n in rep if n.node.startswith("sub_graph"))
    # what is left per branch: the LSTM and the zero state built from the batch size
    assert left["Constant"] == left["Slice"] == 0, left
    assert left["LSTM"] == 2
    assert off.placement().skipped_rewrites == ["fold_subgraph_constants"]
    assert Counter(n.op_type for n in off.placement())["Slice"] == 24
    rng = np.random.default_rng(0)
    for sign in (1.0, -1.0):  # one run through each branch
        x = (np.abs(rng.standard_normal((3, 4, 8))) * sign).astype(np.float32)
        got = sess.run(None, {"x": x})[0]
        np.testing.assert_array_equal(got, off.run(None, {"x": x})[0])
        np.testing.assert_allclose(got, _ort(if_lstm, {"x": x})[0], rtol=1e-5, atol=1e-6)


def test_outer_scope_initializer_folds_in_a_branch():
    """A branch slicing an initializer of the main graph folds: the value is a constant in
    every run, wherever it is read from."""
    from onnx import TensorProto, helper, numpy_helper

    w = numpy_helper.from_array(np.arange(12, dtype=np.float32).reshape(3, 4), "w")
    starts = numpy_helper.from_array(np.array([1], np.int64), "starts")
    ends = numpy_helper.from_array(np.array([3], np.int64), "ends")

    def branch(name, op):
        return helper.make_graph(
            [
                helper.make_node("Slice", ["w", "starts", "ends"], [f"{name}_w"]),
                helper.make_node(op, ["x", f"{name}_w"], [f"{name}_y"]),
            ],
            name,
            [],
            [helper.make_tensor_value_info(f"{name}_y", TensorProto.FLOAT, [2, 4])],
        )

    graph = helper.make_graph(
        [
            helper.make_node(
                "If",
                ["c"],
                ["y"],
                then_branch=branch("then", "Add"),
                else_branch=branch("else", "Mul"),
            )
        ],
        "g",
        [
            helper.make_tensor_value_info("c", TensorProto.BOOL, []),
            helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4]),
        ],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 4])],
        [w, starts, ends],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10)
    sess = onnxep.InferenceSession(model, providers=["cpu"])
    assert sess.placement().rewrites["fold_subgraph_constants"] == 2
    x = np.ones((2, 4), np.float32)
    theirs = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    for c in (True, False):
        feeds = {"c": np.array(c), "x": x}
        np.testing.assert_array_equal(sess.run(None, feeds)[0], theirs.run(None, feeds)[0])


@pytest.mark.realmodels
def test_silero_vad_branches_fold():
    """Silero VAD (torch.onnx, If branches holding its LSTMs): its branch constants fold and
    its outputs stay onnxruntime's."""
    from real_models import CORPUS, feeds, fetch

    model = next(m for m in CORPUS if m.name == "silero-vad-op15")
    path = fetch(model)
    inputs = feeds(model, onnx.load(str(path)))
    sess = onnxep.InferenceSession(str(path), providers=["cpu"])
    assert sess.placement().rewrites["fold_subgraph_constants"] >= 100
    for g, w in zip(sess.run(None, inputs), _ort(path, inputs)):
        np.testing.assert_allclose(g, w, rtol=1e-4, atol=2e-5)


def _chain(n: int):
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from bench.overhead import chain_model

    return chain_model(n)


def test_elementwise_steps_are_called_directly():
    """The executor benchmark's chain of Adds: every step is called as NumPy's ufunc itself;
    its result is the kernel's (the first, checked run goes through the kernel)."""
    model = _chain(50)
    # the chain left unfused (onnxep::ElementwiseChain would make it one step): the
    # direct calls are what a chain too short to fuse, or numba off, runs
    so = onnxep.SessionOptions(disabled_rewrites=["fuse_elementwise_chains"])
    sess = onnxep.InferenceSession(model, so, providers=["cpu"])
    rep = sess.placement()
    assert (rep.direct_steps, rep.steps) == (50, 50)
    assert "steps called directly (no kernel dispatch): 50 of 50" in rep.format()
    assert rep.in_place_steps == 49  # each Add after the first writes into its input
    x = np.linspace(-1, 1, 4, dtype=np.float32)
    fed = x.copy()
    first = sess.run(None, {"x": x})[0]  # checked loop: the kernels' own run
    second = sess.run(None, {"x": x})[0]  # generated code: the direct calls
    np.testing.assert_array_equal(first, second)
    np.testing.assert_array_equal(x, fed)  # the feed is never a buffer to write into
    theirs = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    np.testing.assert_array_equal(second, theirs.run(None, {"x": x})[0])


def test_scalar_results_keep_the_kernel():
    """A 0-d result: NumPy's ufunc gives a scalar there, the kernel an array, so the step
    keeps the kernel; so does a step whose input type is one the kernel upcasts."""
    from onnx import TensorProto, helper

    graph = helper.make_graph(
        [
            helper.make_node("Add", ["a", "b"], ["s"]),
            helper.make_node("Cast", ["s"], ["h"], to=TensorProto.BFLOAT16),
            helper.make_node("Neg", ["h"], ["n"]),
            helper.make_node("Cast", ["n"], ["y"], to=TensorProto.FLOAT),
        ],
        "g",
        [
            helper.make_tensor_value_info("a", TensorProto.FLOAT, []),
            helper.make_tensor_value_info("b", TensorProto.FLOAT, []),
        ],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10)
    sess = onnxep.InferenceSession(model, providers=["cpu"])
    assert sess.placement().direct_steps == 0
    feeds = {"a": np.array(1.5, np.float32), "b": np.array(2.0, np.float32)}
    for _ in range(2):  # checked run, then generated code
        y = sess.run(None, feeds)[0]
        assert isinstance(y, np.ndarray) and y.shape == () and y == -3.5


def test_torch_encoder_equal_through_direct_calls():
    """A torch.onnx export of a pre-norm transformer block (many small elementwise ops):
    the direct calls apply, and every run equals the checked first run and onnxruntime."""
    torch = pytest.importorskip("torch")
    import tempfile
    from pathlib import Path

    nn = torch.nn

    class Block(nn.Module):
        def __init__(self, d: int = 32, heads: int = 4) -> None:
            super().__init__()
            self.heads = heads
            self.norm1, self.norm2 = nn.LayerNorm(d), nn.LayerNorm(d)
            self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
            self.up, self.down = nn.Linear(d, 2 * d), nn.Linear(2 * d, d)

        def forward(self, x):
            b, t, d = x.shape
            q, k, v = self.qkv(self.norm1(x)).chunk(3, dim=-1)
            q, k, v = (z.reshape(b, t, self.heads, -1).transpose(1, 2) for z in (q, k, v))
            att = torch.softmax(q @ k.transpose(-1, -2) / (d // self.heads) ** 0.5, dim=-1)
            x = x + self.proj((att @ v).transpose(1, 2).reshape(b, t, d))
            h = self.up(self.norm2(x))
            return x + self.down(h * torch.sigmoid(1.702 * h))

    torch.manual_seed(0)
    layer = Block().eval()
    x = torch.randn(2, 6, 32)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "enc.onnx"
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            torch.onnx.export(layer, (x,), str(path), dynamo=False, input_names=["x"])
        sess = onnxep.InferenceSession(str(path), providers=["cpu"])
        assert sess.placement().direct_steps >= 5
        # the two residual Adds write into their bias Add's result; the other elementwise
        # steps read a MatMul's result, a feed or a value read twice
        assert sess.placement().in_place_steps >= 2
        feeds = {"x": x.numpy()}
        first = sess.run(None, feeds)[0]
        again = sess.run(None, feeds)[0]
        np.testing.assert_array_equal(first, again)
        np.testing.assert_allclose(again, _ort(path, feeds)[0], rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("mode", ["reflect", "constant"])
def test_pad_without_np_pad_equals_onnxruntime(mode, monkeypatch):
    """Reflect and constant Pad are slices and one concatenate (np.pad spends tens of
    microseconds in Python per call): results onnxruntime's, over ranks and widths."""
    from onnx import TensorProto, helper

    rng = np.random.default_rng(1)
    cases = []
    for shape in [(1, 512), (2, 3, 5, 7), (4,), (3, 1, 6)]:
        for _ in range(6):
            # reflect mirrors at most n - 1 elements of an axis of n
            top = [n if mode == "constant" else n - 1 for n in shape]
            width = [int(rng.integers(0, t + 1)) for t in top for _ in (0, 1)]
            pads = width[0::2] + width[1::2]
            cases.append((rng.standard_normal(shape).astype(np.float32), pads))
    graph = helper.make_graph(
        [helper.make_node("Pad", ["x", "pads", "v"], ["y"], mode=mode)],
        "g",
        [
            helper.make_tensor_value_info("x", TensorProto.FLOAT, None),
            helper.make_tensor_value_info("pads", TensorProto.INT64, [None]),
            helper.make_tensor_value_info("v", TensorProto.FLOAT, []),
        ],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=10)
    theirs = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    sess = onnxep.InferenceSession(model, providers=["cpu"])
    feeds = [{"x": x, "pads": np.array(p), "v": np.array(2.5, np.float32)} for x, p in cases]
    wants = [theirs.run(None, f)[0] for f in feeds]

    def no_pad(*args, **kwargs):
        raise AssertionError("np.pad was called: the fast Pad path no longer applies")

    monkeypatch.setattr(np, "pad", no_pad)
    for f, want in zip(feeds, wants):
        np.testing.assert_array_equal(sess.run(None, f)[0], want)


def test_gather_of_constant_indices_checks_once(monkeypatch):
    """Constant indices are range-scanned when the kernel is built, not per run; an axis
    too short for them still fails with the index named."""
    from onnx import TensorProto, helper, numpy_helper

    import onnxep.providers.ops.op_gather as op_gather

    indices = numpy_helper.from_array(np.array([[0, -1], [2, -3]], np.int64), "i")
    graph = helper.make_graph(
        [helper.make_node("Gather", ["x", "i"], ["y"], axis=1)],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, "n"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 2, 2])],
        [indices],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10)
    theirs = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    sess = onnxep.InferenceSession(model, providers=["cpu"])
    scans = []
    checked = op_gather.checked_indices
    monkeypatch.setattr(
        op_gather, "checked_indices", lambda *a, **k: scans.append(1) or checked(*a, **k)
    )
    for n in (3, 5, 3):
        x = np.arange(2 * n, dtype=np.float32).reshape(2, n)
        np.testing.assert_array_equal(sess.run(None, {"x": x})[0], theirs.run(None, {"x": x})[0])
    assert scans == []
    with pytest.raises(onnxep.errors.RunError, match="indices value 2 .* axis 1 of size 2"):
        sess.run(None, {"x": np.zeros((2, 2), np.float32)})
    assert sess.run(None, {"x": np.ones((2, 3), np.float32)})[0].shape == (2, 2, 2)


def test_squeeze_with_fixed_axes_works_out_each_shape_once(monkeypatch):
    """Constant axes: the output shape is worked out and checked once per input shape; a
    shape whose axis is not 1 still fails, naming it."""
    from onnx import TensorProto, helper, numpy_helper

    import onnxep.providers.ops.op_squeeze as op_squeeze

    axes = numpy_helper.from_array(np.array([-1], np.int64), "axes")
    graph = helper.make_graph(
        [helper.make_node("Squeeze", ["x", "axes"], ["y"])],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["a", "b"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["a"])],
        [axes],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10)
    theirs = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    sess = onnxep.InferenceSession(model, providers=["cpu"])
    worked = []
    norm = op_squeeze.norm_axes
    monkeypatch.setattr(op_squeeze, "norm_axes", lambda *a: worked.append(1) or norm(*a))
    for n in (3, 3, 4, 3, 4):
        x = np.arange(n, dtype=np.float32).reshape(n, 1)
        np.testing.assert_array_equal(sess.run(None, {"x": x})[0], theirs.run(None, {"x": x})[0])
    assert len(worked) == 2  # shapes (3, 1) and (4, 1)
    with pytest.raises(onnxep.errors.RunError, match="axis 1 has size 2, not 1"):
        sess.run(None, {"x": np.zeros((3, 2), np.float32)})


def test_reduce_mean_is_np_mean_bit_for_bit(monkeypatch):
    """ReduceMean of floats as np.mean's own sum and division, without its wrapper: the
    same bits as np.mean, close to onnxruntime; integers keep the general path."""
    from onnx import TensorProto, helper

    rng = np.random.default_rng(2)
    xs = [rng.standard_normal(s).astype(np.float32) for s in [(1, 128, 4), (3, 5, 7), (6,)]]
    wants = [np.mean(x, axis=-1, keepdims=True) for x in xs]
    graph = helper.make_graph(
        [helper.make_node("ReduceMean", ["x"], ["y"], axes=[-1])],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, None)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=10)
    theirs = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    peers = [theirs.run(None, {"x": x})[0] for x in xs]
    sess = onnxep.InferenceSession(model, providers=["cpu"])

    def no_mean(*args, **kwargs):
        raise AssertionError("np.mean was called: the direct float mean no longer applies")

    monkeypatch.setattr(np, "mean", no_mean)
    for x, want, peer in zip(xs, wants, peers):
        got = sess.run(None, {"x": x})[0]
        np.testing.assert_array_equal(got, want)
        np.testing.assert_allclose(got, peer, rtol=1e-6, atol=1e-7)


def test_branch_plans_are_generated_once(if_lstm, monkeypatch):
    """Each branch is planned at session creation and its code generated on its second
    run; later runs of either branch plan and generate nothing."""
    import onnxep.execute.executor as executor

    made = []
    generate = executor.straight_line
    monkeypatch.setattr(
        executor, "straight_line", lambda *a, **k: made.append(1) or generate(*a, **k)
    )
    sess = onnxep.InferenceSession(str(if_lstm), providers=["cpu"])
    pos = {"x": np.ones((1, 3, 8), np.float32)}
    neg = {"x": -np.ones((1, 3, 8), np.float32)}
    for _ in range(2):
        sess.run(None, pos)
        sess.run(None, neg)
    settled = len(made)
    assert settled == 3  # the main graph and its two branches
    for _ in range(5):
        sess.run(None, pos)
        sess.run(None, neg)
    assert len(made) == settled


def test_in_place_only_into_dead_unshared_intermediates():
    """A value another step still reads (here through a Reshape view that is a graph
    output) is never written into; a result that outgrows its buffer (dims the model
    names alike but the feeds size differently) falls back to a new array."""
    from onnx import TensorProto, helper, numpy_helper

    c = numpy_helper.from_array(np.full((4,), 2.0, np.float32), "c")
    shape = numpy_helper.from_array(np.array([-1], np.int64), "shape")
    f = TensorProto.FLOAT
    graph = helper.make_graph(
        [
            helper.make_node("Relu", ["a"], ["t"]),
            helper.make_node("Reshape", ["t", "shape"], ["view"]),
            helper.make_node("Mul", ["t", "c"], ["u"]),
            helper.make_node("Neg", ["u"], ["n"]),
            helper.make_node("Add", ["n", "b"], ["grown"]),
        ],
        "g",
        [
            helper.make_tensor_value_info("a", f, ["batch", 4]),
            helper.make_tensor_value_info("b", f, ["batch", 4]),
        ],
        [
            helper.make_tensor_value_info("view", f, None),
            helper.make_tensor_value_info("grown", f, ["batch", 4]),
        ],
        [c, shape],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10)
    # unfused: Mul -> Neg -> Add would be one onnxep::ElementwiseChain (its values are
    # checked below all the same), and this is about the plan's in-place steps
    so = onnxep.SessionOptions(disabled_rewrites=["fuse_elementwise_chains"])
    sess = onnxep.InferenceSession(model, so, providers=["cpu"])
    fused = onnxep.InferenceSession(model, providers=["cpu"])
    # Neg writes into Mul's result, Add into Neg's; Mul not into t, which the view shares.
    assert sess.placement().in_place_steps == 2
    theirs = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(3)
    for rows_a, rows_b in [(2, 2), (1, 3), (2, 2), (1, 3)]:  # checked runs, then generated
        feeds = {
            "a": rng.standard_normal((rows_a, 4)).astype(np.float32),
            "b": rng.standard_normal((rows_b, 4)).astype(np.float32),
        }
        got, want = sess.run(None, feeds), theirs.run(None, feeds)
        np.testing.assert_array_equal(got[0], np.maximum(feeds["a"], 0).reshape(-1))
        for g, f, w in zip(got, fused.run(None, feeds), want):
            np.testing.assert_array_equal(g, w)
            np.testing.assert_array_equal(f, w)
