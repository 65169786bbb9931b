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
from onnxep.testing import compare_output

ort = pytest.importorskip("onnxruntime")
torch = pytest.importorskip("torch")


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
def test_directions_layouts_sequence_lens(op, direction, layout, lens):
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
def test_clip_peepholes_and_gate_options(op, direction, layout, lens, peep, attrs):
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
