"""The CPU provider's LSTM / GRU / RNN kernels against onnxruntime.

Real exports first: ``nn.LSTM`` / ``nn.GRU`` / ``nn.RNN`` through torch.onnx's TorchScript
and dynamo exporters (uni- and bidirectional, ``batch_first``, stacked layers, final
states as outputs; a packed sequence, which the TorchScript exporter writes as
``sequence_lens``). Then single nodes over the attributes exporters rarely write:
directions, ``layout`` 1 (onnxruntime refuses it, so its side runs the same node in
layout 0 on transposed tensors), ``sequence_lens`` with an empty sequence, initial
states, peepholes, ``clip``, ``input_forget``, ``linear_before_reset``, non-default
activations, float64 (against onnxruntime's float32 run). Every output is compared
within the parity kit's tolerances.

The attribute matrix runs on both CPU paths: the compiled whole-sequence loops
(recurrent_loops.py, numba) and the NumPy steps (``jit.ENABLED`` off, as with
``ONNXEP_CPU_JIT=0``); further cases check odd sizes against onnxruntime and the two
paths against each other, which path a node takes, and the compiled tanh's error bound.
"""

from __future__ import annotations

import io
import warnings

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import onnxep
from onnxep.errors import BoundsError, InvalidArgument, RunError
from onnxep.providers_cpu import jit
from onnxep.providers_cpu.ops import recurrent_jit
from onnxep.testing import compare_output

ort = pytest.importorskip("onnxruntime")
torch = pytest.importorskip("torch")


@pytest.fixture(params=["compiled", "numpy"])
def path(request, monkeypatch):
    """Each test on the compiled loops and on the NumPy steps (read when the session is made)."""
    compiled = request.param == "compiled"
    if compiled and not jit.ENABLED:
        pytest.skip("numba not installed: no compiled recurrence")
    monkeypatch.setattr(jit, "ENABLED", compiled)
    return request.param


def _ort_run(model: onnx.ModelProto, feeds: dict) -> list:
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return sess.run(None, feeds)


def _ours(model: onnx.ModelProto) -> onnxep.InferenceSession:
    return onnxep.InferenceSession(model.SerializeToString(), providers=["cpu"])


def _assert_close(got: list, want: list, names: list[str]) -> None:
    bad = []
    for name, g, w in zip(names, got, want):
        bad += [r.describe() for r in compare_output(name, g, w, "cpu", "onnxruntime") if not r.ok]
    assert not bad, "\n".join(bad)


# -- torch exports ------------------------------------------------------------------


class TorchRecurrent(torch.nn.Module):
    """One torch.nn LSTM / GRU / RNN, its outputs flattened (y, then each state)."""

    def __init__(self, kind: str, **kw) -> None:
        super().__init__()
        self.rnn = getattr(torch.nn, kind)(**kw)

    def forward(self, x):
        y, state = self.rnn(x)
        return (y, *state) if isinstance(state, tuple) else (y, state)


class _Packed(torch.nn.Module):
    def __init__(self, kind: str, **kw) -> None:
        super().__init__()
        self.rnn = getattr(torch.nn, kind)(batch_first=True, **kw)

    def forward(self, x, lens):
        from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

        packed = pack_padded_sequence(x, lens, batch_first=True, enforce_sorted=False)
        y, state = self.rnn(packed)
        y, _ = pad_packed_sequence(y, batch_first=True, total_length=x.shape[1])
        h = state[0] if isinstance(state, tuple) else state
        return y, h


EXPORTS = [
    ("LSTM", dict(num_layers=2), "torchscript"),
    ("LSTM", dict(bidirectional=True, batch_first=True), "torchscript"),
    ("LSTM", dict(num_layers=2, bidirectional=True, batch_first=True), "dynamo"),
    ("LSTM", dict(), "dynamo"),
    ("GRU", dict(num_layers=2, bidirectional=True), "torchscript"),
    ("GRU", dict(batch_first=True), "dynamo"),
    ("GRU", dict(bidirectional=True, batch_first=True), "dynamo"),
    ("RNN", dict(num_layers=2, bidirectional=True, batch_first=True), "torchscript"),
    ("RNN", dict(nonlinearity="relu"), "torchscript"),
]


def _export(net, args: tuple, exporter: str, names: list[str]) -> onnx.ModelProto:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if exporter == "dynamo":
            prog = torch.onnx.export(net, args, dynamo=True, opset_version=18, verbose=False)
            return prog.model_proto
        buf = io.BytesIO()
        torch.onnx.export(net, args, buf, dynamo=False, opset_version=17, input_names=names)
    return onnx.load_from_string(buf.getvalue())


@pytest.mark.parametrize(("kind", "kw", "exporter"), EXPORTS)
def test_torch_export_matches_onnxruntime(kind, kw, exporter):
    torch.manual_seed(0)
    net = TorchRecurrent(kind, input_size=5, hidden_size=7, **kw).eval()
    shape = (3, 6, 5) if kw.get("batch_first") else (6, 3, 5)
    x = torch.randn(*shape)
    model = _export(net, (x,), exporter, ["x"])
    assert kind in {n.op_type for n in model.graph.node}, f"the exporter wrote no {kind}"
    feeds = {model.graph.input[0].name: x.numpy()}
    got = _ours(model).run(None, feeds)
    _assert_close(got, _ort_run(model, feeds), [o.name for o in model.graph.output])
    with torch.no_grad():
        want = net(x)
    _assert_close(got, [t.numpy() for t in want], [o.name for o in model.graph.output])


@pytest.mark.parametrize("kind", ["LSTM", "GRU", "RNN"])
def test_packed_sequence_export_writes_sequence_lens(kind):
    torch.manual_seed(1)
    net = _Packed(kind, input_size=4, hidden_size=6, bidirectional=True).eval()
    x, lens = torch.randn(4, 7, 4), torch.tensor([7, 2, 5, 1])
    model = _export(net, (x, lens), "torchscript", ["x", "lens"])
    node = next(n for n in model.graph.node if n.op_type == kind)
    assert len(node.input) > 4 and node.input[4], "the exporter wrote no sequence_lens"
    feeds = {"x": x.numpy(), "lens": lens.numpy()}
    got = _ours(model).run(None, feeds)
    _assert_close(got, _ort_run(model, feeds), ["y", "h"])


# -- single nodes over the attributes -------------------------------------------------

GATES = {"LSTM": 4, "GRU": 3, "RNN": 1}
SLOTS = ["X", "W", "R", "B", "lens", "h0", "c0", "P"]


def _node_model(op, feeds, attrs, layout, dtype=TensorProto.FLOAT):
    ins = [n if n in feeds else "" for n in SLOTS]
    while ins[-1] == "":
        ins.pop()
    outs = ["Y", "Y_h"] + (["Y_c"] if op == "LSTM" else [])
    node = helper.make_node(op, ins, outs, layout=layout, **attrs)

    def info(k, v):
        return helper.make_tensor_value_info(
            k, TensorProto.INT32 if k == "lens" else dtype, list(v.shape)
        )

    graph = helper.make_graph(
        [node],
        "g",
        [info(k, v) for k, v in feeds.items()],
        [helper.make_tensor_value_info(o, dtype, None) for o in outs],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 22)], ir_version=10)


def _case(op, direction, layout=0, lens=None, init=False, peep=False, dt=np.float32, seed=0):
    rng = np.random.default_rng(seed)
    T, batch, n_in, H = 5, 3, 4, 6
    D = 2 if direction == "bidirectional" else 1
    g = GATES[op]

    def rand(*shape, scale=0.6):
        return (rng.standard_normal(shape) * scale).astype(dt)

    feeds = {
        "X": rand(*((batch, T, n_in) if layout else (T, batch, n_in)), scale=1.0),
        "W": rand(D, g * H, n_in),
        "R": rand(D, g * H, H),
        "B": rand(D, 2 * g * H),
    }
    if lens is not None:
        feeds["lens"] = np.array(lens, np.int32)
    if init:
        shape = (batch, D, H) if layout else (D, batch, H)
        feeds["h0"] = rand(*shape)
        if op == "LSTM":
            feeds["c0"] = rand(*shape)
    if peep:
        feeds["P"] = rand(D, 3 * H)
    return feeds, H


def _check_node(op, direction, layout=0, lens=None, init=False, peep=False, **attrs):
    feeds, H = _case(op, direction, layout, lens, init, peep)
    attrs = dict(direction=direction, hidden_size=H, **attrs)
    got = _ours(_node_model(op, feeds, attrs, layout)).run(None, feeds)
    if layout:
        # onnxruntime runs layout 0 only: the same node on transposed tensors
        f0 = {k: v.transpose(1, 0, 2) if k in ("X", "h0", "c0") else v for k, v in feeds.items()}
        want = _ort_run(_node_model(op, f0, attrs, 0), f0)
        want = [want[0].transpose(2, 0, 1, 3)] + [w.transpose(1, 0, 2) for w in want[1:]]
    else:
        want = _ort_run(_node_model(op, feeds, attrs, 0), feeds)
    _assert_close(got, want, ["Y", "Y_h", "Y_c"])


@pytest.mark.parametrize("op", ["LSTM", "GRU", "RNN"])
@pytest.mark.parametrize("direction", ["forward", "reverse", "bidirectional"])
@pytest.mark.parametrize("layout", [0, 1])
@pytest.mark.parametrize("lens", [None, [5, 2, 4], [5, 5, 5], [0, 5, 3]])
def test_directions_layouts_sequence_lens(op, direction, layout, lens, path):
    _check_node(op, direction, layout, lens, init=lens is not None)


@pytest.mark.parametrize(
    ("op", "direction", "layout", "lens", "peep", "attrs"),
    [
        ("LSTM", "bidirectional", 0, [3, 5, 1], True, dict(clip=0.7)),
        ("LSTM", "bidirectional", 1, [3, 5, 1], True, dict(input_forget=1)),
        ("LSTM", "forward", 0, None, False, dict(input_forget=1)),
        ("LSTM", "reverse", 0, [4, 1, 5], False, dict(clip=0.5)),
        ("LSTM", "forward", 0, None, True, dict(clip=0.4, input_forget=1)),
        ("GRU", "bidirectional", 0, [3, 5, 1], False, dict(clip=0.5, linear_before_reset=1)),
        ("GRU", "reverse", 1, None, False, dict(linear_before_reset=1)),
        ("GRU", "forward", 0, [2, 5, 4], False, dict(clip=0.3)),
        ("RNN", "bidirectional", 0, [2, 5, 3], False, dict(clip=0.8)),
    ],
)
def test_clip_peepholes_and_gate_options(op, direction, layout, lens, peep, attrs, path):
    _check_node(op, direction, layout, lens, init=True, peep=peep, **attrs)


@pytest.mark.parametrize(
    ("op", "acts", "extra"),
    [
        ("RNN", ["Relu", "Tanh"], {}),
        ("RNN", ["LeakyRelu", "Sigmoid"], dict(activation_alpha=[0.2])),
        ("GRU", ["HardSigmoid", "Softsign", "Sigmoid", "Tanh"], {}),
        ("LSTM", ["Sigmoid", "Tanh", "Tanh", "HardSigmoid", "Relu", "Softsign"], {}),
        ("LSTM", ["Sigmoid", "Tanh", "Relu"] * 2, {}),
    ],
)
def test_activations(op, acts, extra):
    _check_node(op, "bidirectional", init=True, activations=acts, **extra)


@pytest.mark.parametrize("op", ["LSTM", "GRU", "RNN"])
def test_float64(op):
    # onnxruntime's LSTM has no float64 kernel: its side runs the same values in float32
    feeds, H = _case(op, "bidirectional", lens=[5, 3, 1], init=True, dt=np.float64)
    attrs = dict(direction="bidirectional", hidden_size=H)
    got = _ours(_node_model(op, feeds, attrs, 0, TensorProto.DOUBLE)).run(None, feeds)
    assert all(g.dtype == np.float64 for g in got)
    f32 = {k: v.astype(np.float32) if v.dtype == np.float64 else v for k, v in feeds.items()}
    want = _ort_run(_node_model(op, f32, attrs, 0), f32)
    _assert_close([g.astype(np.float32) for g in got], want, ["Y", "Y_h", "Y_c"])


def test_sequence_lens_past_the_sequence_is_a_bounds_error():
    """The sentence and class the CUDA kernel's device-side check reports (BoundsError)."""
    feeds, H = _case("LSTM", "forward", lens=[6, 2, 4])
    sess = _ours(_node_model("LSTM", feeds, dict(hidden_size=H), 0))
    want = r"sequence_lens values must be in \[0, 5\] \(.*\), got sequence_lens\[0\] = 6"
    with pytest.raises(BoundsError, match=want):
        sess.run(None, feeds)
    with pytest.raises(Exception, match="sequence_lens"):  # onnxruntime refuses it too
        _ort_run(_node_model("LSTM", feeds, dict(hidden_size=H), 0), feeds)
    feeds["lens"] = np.array([5, 2, 4], np.int32)
    want = _ort_run(_node_model("LSTM", feeds, dict(hidden_size=H), 0), feeds)
    _assert_close(sess.run(None, feeds), want, ["Y", "Y_h", "Y_c"])  # the session still runs


def test_weights_of_the_wrong_shape_are_named():
    feeds, H = _case("GRU", "bidirectional")
    feeds["R"] = feeds["R"][:, :, :-1]
    sess = _ours(_node_model("GRU", feeds, dict(direction="bidirectional", hidden_size=H), 0))
    want = r"GRU: input R has shape \[2, 18, 5\], expected \[2, 15, 5\]"
    with pytest.raises(RunError, match=want) as err:
        sess.run(None, feeds)
    assert isinstance(err.value.__cause__, InvalidArgument)


# -- the compiled loops: odd sizes, both paths, which path, tanh ----------------------


def _sized(op, direction, T, batch, n_in, H, lens, seed, layout=0, peep=False):
    rng = np.random.default_rng(seed)
    D = 2 if direction == "bidirectional" else 1
    g = GATES[op]

    def rand(*shape, scale=0.6):
        return (rng.standard_normal(shape) * scale).astype(np.float32)

    feeds = {
        "X": rand(*((batch, T, n_in) if layout else (T, batch, n_in)), scale=1.5),
        "W": rand(D, g * H, n_in),
        "R": rand(D, g * H, H),
        "B": rand(D, 2 * g * H),
    }
    if lens is not None:
        feeds["lens"] = np.array(lens, np.int32)
    shape = (batch, D, H) if layout else (D, batch, H)
    feeds["h0"] = rand(*shape)
    if op == "LSTM":
        feeds["c0"] = rand(*shape)
        if peep:
            feeds["P"] = rand(D, 3 * H)
    return feeds


def _constant_weights(model: onnx.ModelProto, feeds: dict) -> tuple[onnx.ModelProto, dict]:
    """The same node with W, R, B (and P) as initializers: the prepared-once path."""
    model = onnx.ModelProto.FromString(model.SerializeToString())
    g = model.graph
    fixed = [k for k in ("W", "R", "B", "P") if k in feeds]
    g.initializer.extend(onnx.numpy_helper.from_array(feeds[k], k) for k in fixed)
    keep = [i for i in g.input if i.name not in fixed]
    del g.input[:]
    g.input.extend(keep)
    return model, {k: v for k, v in feeds.items() if k not in fixed}


SIZES = [
    # op, direction, T, batch, input, H, lens, attrs
    ("LSTM", "bidirectional", 6, 1, 3, 1, None, {}),
    ("LSTM", "bidirectional", 7, 4, 5, 17, [7, 0, 3, 7], dict(clip=1.5)),
    ("LSTM", "reverse", 4, 3, 2, 3, [1, 4, 2], dict(input_forget=1)),
    ("LSTM", "forward", 9, 5, 33, 17, [9, 2, 9, 0, 5], {}),
    ("GRU", "bidirectional", 6, 1, 3, 1, None, dict(linear_before_reset=1)),
    ("GRU", "bidirectional", 7, 4, 5, 17, [7, 0, 3, 7], dict(clip=1.5)),
    ("GRU", "reverse", 5, 3, 4, 3, [2, 5, 0], dict(linear_before_reset=1, clip=0.9)),
    ("GRU", "forward", 9, 5, 33, 17, None, {}),
    ("RNN", "bidirectional", 7, 4, 5, 17, [7, 0, 3, 7], dict(clip=1.5)),
    ("RNN", "reverse", 6, 1, 3, 1, None, {}),
]


@pytest.mark.parametrize(("op", "direction", "T", "batch", "n_in", "H", "lens", "attrs"), SIZES)
@pytest.mark.parametrize("layout", [0, 1])
@pytest.mark.parametrize("constant", [False, True])
def test_odd_sizes_both_paths(op, direction, T, batch, n_in, H, lens, attrs, layout, constant,
                              monkeypatch):  # fmt: skip
    """Hidden sizes that are no multiple of the loops' blocks (1, 3, 17), batch 1 and more,
    ragged lengths with 0 and T, fed and constant weights: the compiled path against
    onnxruntime and against the NumPy path."""
    if not jit.ENABLED:
        pytest.skip("numba not installed: no compiled recurrence")
    peep = op == "LSTM" and H > 1
    feeds = _sized(op, direction, T, batch, n_in, H, lens, seed=H + T, layout=layout, peep=peep)
    attrs = dict(direction=direction, hidden_size=H, **attrs)
    model = _node_model(op, feeds, attrs, layout)
    if constant:
        model, feeds = _constant_weights(model, feeds)
    names = ["Y", "Y_h", "Y_c"]
    compiled = _ours(model).run(None, feeds)
    monkeypatch.setattr(jit, "ENABLED", False)
    numpy_path = _ours(model).run(None, feeds)
    _assert_close(compiled, numpy_path, names)
    f0 = dict(feeds)
    if layout:
        f0 = {k: v.transpose(1, 0, 2) if k in ("X", "h0", "c0") else v for k, v in feeds.items()}
    m0 = _node_model(op, {**f0, **{k: feeds.get(k) for k in ()}}, attrs, 0)
    if constant:
        full = dict(f0)
        full.update(
            {i.name: onnx.numpy_helper.to_array(i) for i in model.graph.initializer}
        )  # fmt: skip
        m0, f0 = _constant_weights(_node_model(op, full, attrs, 0), full)
    want = _ort_run(m0, f0)
    if layout:
        want = [want[0].transpose(2, 0, 1, 3)] + [w.transpose(1, 0, 2) for w in want[1:]]
    _assert_close(compiled, want, names)


@pytest.mark.parametrize("op", ["LSTM", "GRU", "RNN"])
def test_which_path_a_node_takes(op, monkeypatch):
    """Default activations in float32 and float16 run the compiled loops; other activations,
    float64 and a disabled jit run the NumPy steps (the same results within rounding)."""
    if not jit.ENABLED:
        pytest.skip("numba not installed: no compiled recurrence")
    calls = []
    real = recurrent_jit.run
    monkeypatch.setattr(recurrent_jit, "run", lambda *a, **k: calls.append(a[0]) or real(*a, **k))
    feeds, H = _case(op, "bidirectional", lens=[5, 2, 0], init=True)
    attrs = dict(direction="bidirectional", hidden_size=H)
    _ours(_node_model(op, feeds, attrs, 0)).run(None, feeds)
    assert calls == [op]
    half = {k: v.astype(np.float16) if v.dtype == np.float32 else v for k, v in feeds.items()}
    got = _ours(_node_model(op, half, attrs, 0, TensorProto.FLOAT16)).run(None, half)
    assert calls == [op, op] and got[0].dtype == np.float16
    wide = {k: v.astype(np.float64) if v.dtype == np.float32 else v for k, v in feeds.items()}
    _ours(_node_model(op, wide, attrs, 0, TensorProto.DOUBLE)).run(None, wide)
    acts = {"LSTM": ["Sigmoid", "Tanh", "Relu"] * 2, "GRU": ["Sigmoid", "Relu"] * 2}
    acts["RNN"] = ["Relu", "Relu"]
    _ours(_node_model(op, feeds, dict(attrs, activations=acts[op]), 0)).run(None, feeds)
    monkeypatch.setattr(jit, "ENABLED", False)
    _ours(_node_model(op, feeds, attrs, 0)).run(None, feeds)
    assert calls == [op, op]


def test_input_of_the_wrong_width_is_named():
    """The compiled loops do not check bounds: the driver must refuse a mismatched X (the
    NumPy path names W against X)."""
    feeds, H = _case("LSTM", "forward")
    model = _node_model("LSTM", feeds, dict(hidden_size=H), 0)
    for dim, name in zip(model.graph.input[0].type.tensor_type.shape.dim, "tbi"):
        dim.dim_param = name
    sess = _ours(model)
    feeds["X"] = np.ones((5, 3, 7), np.float32)
    want = r"LSTM: input (X has shape \[5, 3, 7\], expected \[5, 3, 4\]|W has shape \[1, 24, 4\])"
    with pytest.raises(RunError, match=want):
        sess.run(None, feeds)


def test_compiled_tanh_error_bound():
    """recurrent_loops.tanh32 against float64 tanh: at most 3.1e-7 relative over a dense
    sweep of float32 inputs (every 397th float in (0, 12], and both signs; the docs give
    the full sweep's 3.0e-7), odd, in [-1, 1], NaN kept; and the logistic built on it."""
    if not jit.ENABLED:
        pytest.skip("numba not installed: no compiled recurrence")
    loops = recurrent_jit.loops()
    lo, hi = np.array([1e-30, 12.0], np.float32).view(np.int32)
    x = np.arange(lo, hi, 397, dtype=np.int32).view(np.float32)
    x = np.concatenate([x, -x, np.array([0.0, 9.0, 30.0, np.inf], np.float32)])
    got = np.empty_like(x)
    loops.tanh_array(x, got)
    want = np.tanh(x.astype(np.float64))
    rel = np.abs(got - want) / np.maximum(np.abs(want), np.finfo(np.float32).tiny)
    assert rel.max() <= 3.1e-7, (rel.max(), x[np.argmax(rel)])
    n = (len(x) - 4) // 2
    assert np.all(np.abs(got) <= 1) and np.array_equal(got[:n], -got[n : 2 * n])
    nan = np.array([np.nan], np.float32)
    loops.tanh_array(nan, nan)
    assert np.isnan(nan[0])
    s = np.linspace(-40, 40, 20001).astype(np.float32)
    sig = np.empty_like(s)
    loops.sigmoid_array(s, sig)
    exact = 1 / (1 + np.exp(-s.astype(np.float64)))
    assert np.abs(sig - exact).max() <= 2e-7 and sig.min() >= 0 and sig.max() <= 1
