"""LSTM / GRU / RNN cases shared by the GPU tests and the emulated ones.

ONNX's node-suite cases for the three ops (:func:`node_suite_cases`) and our own
(:data:`OWN`): every direction, ragged ``sequence_lens`` (an empty row included), layout
1, initial states, peepholes, ``clip``, ``input_forget``, ``linear_before_reset``, other
activations with their alpha/beta, hidden sizes that are not a multiple of a warp, and
float16. :func:`voice_activity_model` is a Conv1d + LSTM voice-activity model written as
torch exports one (``bench/factory/torch_models.py`` VoiceActivity).
"""

from __future__ import annotations

import importlib
import warnings
from dataclasses import dataclass, field

import numpy as np
import onnx
from onnx import TensorProto, helper

GATES = {"RNN": 1, "GRU": 3, "LSTM": 4}
INPUTS = ("X", "W", "R", "B", "sequence_lens", "initial_h", "initial_c", "P")


@dataclass(frozen=True)
class RnnCase:
    id: str
    op: str
    steps: int
    batch: int
    inputs: int
    hidden: int
    attrs: dict = field(default_factory=dict)
    #: which optional inputs to give: B, sequence_lens (a list), initial_h, initial_c, P
    bias: bool = True
    lens: tuple[int, ...] | None = None
    init_h: bool = False
    init_c: bool = False
    peep: bool = False
    dtype: type = np.float32
    seed: int = 0

    @property
    def dirs(self) -> int:
        return 2 if self.attrs.get("direction") == "bidirectional" else 1

    @property
    def layout(self) -> int:
        return int(self.attrs.get("layout", 0))


def case_inputs(case: RnnCase) -> dict[str, np.ndarray | None]:
    """The node's inputs by ONNX name (None where omitted)."""
    rng = np.random.default_rng(case.seed)
    g, h, d, dt = GATES[case.op] * case.hidden, case.hidden, case.dirs, case.dtype
    scale = 1.0 / np.sqrt(max(h, 1))

    def rand(*shape, s=1.0):
        return (rng.uniform(-s, s, shape)).astype(dt)

    x_shape = (
        (case.batch, case.steps, case.inputs)
        if case.layout
        else (case.steps, case.batch, case.inputs)
    )
    state = (case.batch, d, h) if case.layout else (d, case.batch, h)
    out: dict[str, np.ndarray | None] = {
        "X": rand(*x_shape),
        "W": rand(d, g, case.inputs, s=scale),
        "R": rand(d, g, h, s=scale),
        "B": rand(d, 2 * g, s=scale) if case.bias else None,
        "sequence_lens": None if case.lens is None else np.array(case.lens, np.int32),
        "initial_h": rand(*state) if case.init_h else None,
        "initial_c": rand(*state) if case.init_c and case.op == "LSTM" else None,
        "P": rand(d, 3 * h, s=scale) if case.peep and case.op == "LSTM" else None,
    }
    return out


def _elem(dt) -> int:
    return helper.np_dtype_to_tensor_dtype(np.dtype(dt))


def case_model(case: RnnCase, opset: int = 22) -> onnx.ModelProto:
    """A one-node model of ``case``, every given input a graph input."""
    given = case_inputs(case)
    names = [n if given[n] is not None else "" for n in INPUTS[: 8 if case.op == "LSTM" else 6]]
    while names and not names[-1]:
        names.pop()
    outs = ["Y", "Y_h"] + (["Y_c"] if case.op == "LSTM" else [])
    node = helper.make_node(case.op, names, outs, hidden_size=case.hidden, **case.attrs)
    ins = [
        helper.make_tensor_value_info(n, _elem(given[n].dtype), list(given[n].shape))
        for n in names
        if n
    ]
    el = _elem(case.dtype)
    t, b, d, h = case.steps, case.batch, case.dirs, case.hidden
    y, s = ([b, t, d, h], [b, d, h]) if case.layout else ([t, d, b, h], [d, b, h])
    shapes = [y, s, s]
    graph = helper.make_graph(
        [node],
        case.id,
        ins,
        [helper.make_tensor_value_info(o, el, sh) for o, sh in zip(outs, shapes)],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 10
    return model


def case_feeds(case: RnnCase) -> dict[str, np.ndarray]:
    return {k: v for k, v in case_inputs(case).items() if v is not None}


def _c(id, op, **kw) -> RnnCase:
    shape = dict(steps=5, batch=3, inputs=4, hidden=8)
    shape.update({k: kw.pop(k) for k in list(kw) if k in shape})
    return RnnCase(id, op, **shape, **kw)


BI = {"direction": "bidirectional"}
REV = {"direction": "reverse"}
L1 = {"layout": 1}

OWN: list[RnnCase] = [
    # plain, each direction
    *(
        _c(f"{op.lower()}-{name}", op, attrs=a)
        for op in GATES
        for name, a in (("forward", {}), ("reverse", REV), ("bidirectional", BI))
    ),
    # ragged lengths (an empty row, a full one), every direction, both layouts
    *(
        _c(
            f"{op.lower()}-ragged-{name}-l{lay}",
            op,
            batch=4,
            lens=(5, 2, 0, 3),
            attrs={**a, "layout": lay},
            init_h=True,
            init_c=True,
        )
        for op in GATES
        for name, a in (("forward", {}), ("reverse", REV), ("bidirectional", BI))
        for lay in (0, 1)
    ),
    # layout 1 with initial states
    *(
        _c(f"{op.lower()}-layout1-init", op, attrs={**BI, **L1}, init_h=True, init_c=True)
        for op in GATES
    ),
    # LSTM specifics
    _c("lstm-peepholes", "LSTM", attrs=BI, peep=True, init_h=True, init_c=True),
    _c("lstm-input-forget-clip", "LSTM", attrs={"input_forget": 1, "clip": 0.7}, peep=True),
    _c("lstm-no-bias", "LSTM", bias=False),
    _c(
        "lstm-activations",
        "LSTM",
        attrs={
            **BI,
            "activations": ["HardSigmoid", "Tanh", "ScaledTanh", "Sigmoid", "Softsign", "Elu"],
            "activation_alpha": [0.3, 0.9, 1.1],
            "activation_beta": [0.4, 1.2],
        },
    ),
    # GRU specifics
    _c("gru-linear-before-reset", "GRU", attrs={**BI, "linear_before_reset": 1}, init_h=True),
    _c("gru-lbr-ragged-clip", "GRU", attrs={"linear_before_reset": 1, "clip": 0.5}, lens=(1, 5, 3)),
    _c("gru-activations", "GRU", attrs={"activations": ["Sigmoid", "Relu"]}),
    # RNN specifics
    _c("rnn-relu", "RNN", attrs={"activations": ["Relu"]}),
    _c(
        "rnn-leaky-affine-bi",
        "RNN",
        attrs={
            **BI,
            "activations": ["LeakyRelu", "Affine"],
            "activation_alpha": [0.2, 0.5],
            "activation_beta": [0.1],
        },
    ),
    # alpha given: onnxruntime's default for ThresholdedRelu here is not ONNX's 1.0
    _c(
        "rnn-softplus-thresholded",
        "RNN",
        attrs={**BI, "activations": ["Softplus", "ThresholdedRelu"], "activation_alpha": [0.5]},
    ),
    # hidden sizes that leave threads of the last warp idle, a single step, batch 1
    _c("lstm-hidden-45", "LSTM", hidden=45, attrs=BI, lens=(5, 1, 4)),
    _c("gru-hidden-37", "GRU", hidden=37, steps=3, init_h=True),
    _c("rnn-one-step", "RNN", steps=1, batch=1, hidden=33, attrs=REV),
    # float16 (float32 projection, state and accumulation)
    *(
        _c(
            f"{op.lower()}-f16",
            op,
            dtype=np.float16,
            attrs=BI,
            lens=(5, 3, 1),
            init_h=True,
            init_c=True,
            peep=True,
        )
        for op in GATES
    ),
    _c("lstm-f16-layout1", "LSTM", dtype=np.float16, attrs=L1, init_h=True, init_c=True),
]

#: A sequence_lens value past X's steps, and a negative one: both are the caller's error.
BAD_LENS = [
    _c("lstm-lens-past-steps", "LSTM", lens=(5, 7, 2)),
    _c("gru-lens-negative", "GRU", lens=(3, 5, -1), attrs=BI),
]


def tolerance(dtype) -> dict:
    return (
        {"rtol": 2e-3, "atol": 2e-3}
        if np.dtype(dtype) == np.float16
        else {"rtol": 1e-5, "atol": 1e-5}
    )


def node_suite_cases() -> dict:
    """ONNX's node cases for LSTM, GRU and RNN (only their case modules are imported)."""
    from onnx.backend.test.case import node

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for mod in ("lstm", "gru", "rnn"):
            importlib.import_module(f"onnx.backend.test.case.node.{mod}")
    keys = ("test_lstm", "test_gru", "test_rnn", "test_simple_rnn")
    return {
        c.name: c
        for c in node._NodeTestCases  # noqa: SLF001 - onnx collects them there
        if c.name.startswith(keys) and not c.name.endswith("_expanded")
    }


def voice_activity_model(
    batch: int | str = "batch", samples: int = 1600, hidden: int = 64, seed: int = 0
) -> onnx.ModelProto:
    """Conv1d(1, 32, 9, stride 4) + ReLU, Conv1d(32, 32, 5, stride 2) + ReLU, an LSTM over the
    frames (batch_first, as torch exports it: a Transpose to [T, batch, C] first), the last
    frame's hidden state through Linear(hidden, 1) and a Sigmoid: one probability per clip."""
    rng = np.random.default_rng(seed)

    def init(name, *shape, s=0.2):
        return helper.make_tensor(
            name, TensorProto.FLOAT, shape, rng.uniform(-s, s, shape).astype(np.float32).ravel()
        )

    inits = [
        init("c1_w", 32, 1, 9),
        init("c1_b", 32),
        init("c2_w", 32, 32, 5),
        init("c2_b", 32),
        init("lstm_w", 1, 4 * hidden, 32),
        init("lstm_r", 1, 4 * hidden, hidden),
        init("lstm_b", 1, 8 * hidden),
        init("head_w", 1, hidden),
        init("head_b", 1),
        helper.make_tensor("axis0", TensorProto.INT64, [1], [0]),
    ]
    nodes = [
        helper.make_node("Conv", ["audio", "c1_w", "c1_b"], ["c1"], kernel_shape=[9], strides=[4]),
        helper.make_node("Relu", ["c1"], ["r1"]),
        helper.make_node("Conv", ["r1", "c2_w", "c2_b"], ["c2"], kernel_shape=[5], strides=[2]),
        helper.make_node("Relu", ["c2"], ["r2"]),
        helper.make_node("Transpose", ["r2"], ["frames"], perm=[2, 0, 1]),
        helper.make_node(
            "LSTM",
            ["frames", "lstm_w", "lstm_r", "lstm_b"],
            ["y", "y_h", "y_c"],
            hidden_size=hidden,
        ),
        helper.make_node("Squeeze", ["y_h", "axis0"], ["h"]),
        helper.make_node("Gemm", ["h", "head_w", "head_b"], ["logit"], transB=1),
        helper.make_node("Sigmoid", ["logit"], ["prob"]),
    ]
    graph = helper.make_graph(
        nodes,
        "voice_activity",
        [helper.make_tensor_value_info("audio", TensorProto.FLOAT, [batch, 1, samples])],
        [helper.make_tensor_value_info("prob", TensorProto.FLOAT, [batch, 1])],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 9
    return model
