"""Unrolled RNN cells on the CPU: the per-step input Gemms joined into one
(``fuse_step_gemms``) and an LSTM step's gate nodes as one onnxep::LSTMCell
(``fuse_lstm_cell``), against onnxruntime and against the unfused graph, with the
compiled loop and without it; and the graphs they must leave alone.

The models are what torch.onnx writes for ``nn.LSTMCell`` called in a Python loop (the
OCR CRNN's exporter): ``Gather(x, t)`` then ``Gemm(x_t, W_ih, b_ih, transB=1)`` per
step, ``Gemm(h, W_hh, b_hh, transB=1)``, their Add, a Split in four, Sigmoid/Tanh, and
the state update, built here with onnx.helper so that operand orders and gate orders
can vary.
"""

from __future__ import annotations

import numpy as np
import pytest
from onnx import helper, numpy_helper

import onnxep
from onnxep.providers_cpu.ops import op_lstm_cell

ort = pytest.importorskip("onnxruntime")

FUSIONS = ["fuse_step_gemms", "fuse_lstm_cell"]


def _cell_model(
    T=5,
    K=9,
    H=3,
    *,
    directions=1,
    gate_order=(0, 1, 2, 3),
    swap=False,
    bias=True,
    steps=None,
    negative=False,
    escape=False,
    dtype=np.float32,
    seed=0,
):
    """An unrolled LSTMCell over x [T, batch, K] (a reverse pass too when ``directions``
    is 2): outputs every step's h stacked, and each direction's last c. ``gate_order``:
    the Split block of (input, forget, cell, output); ``swap``: the other operand order of
    every Mul and Add; ``steps``: which steps to read (all by default); ``escape``: a
    Split output is a graph output too."""
    rng = np.random.default_rng(seed)
    elem = helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
    inits, nodes, outs, value_outs = [], [], [], []

    def const(name, arr):
        inits.append(numpy_helper.from_array(np.asarray(arr), name))
        return name

    const("four", np.array([H, H, H, H], np.int64))
    const("axis0", np.array([0], np.int64))
    nodes.append(helper.make_node("Shape", ["x"], ["xs"], start=1, end=2))
    nodes.append(helper.make_node("Concat", ["xs", "h_cols"], ["state_shape"], axis=0))
    const("h_cols", np.array([H], np.int64))
    nodes.append(
        helper.make_node(
            "ConstantOfShape",
            ["state_shape"],
            ["zero"],
            value=numpy_helper.from_array(np.zeros(1, dtype)),
        )
    )
    order = list(range(T)) if steps is None else list(steps)
    for d in range(directions):
        p = f"d{d}_"
        const(p + "w_ih", (rng.standard_normal((4 * H, K)) * 0.4).astype(dtype))
        const(p + "w_hh", (rng.standard_normal((4 * H, H)) * 0.4).astype(dtype))
        const(p + "b_ih", (rng.standard_normal(4 * H) * 0.2).astype(dtype))
        const(p + "b_hh", (rng.standard_normal(4 * H) * 0.2).astype(dtype))
        h, c = "zero", "zero"
        seq = order if d == 0 else order[::-1]
        for n, t in enumerate(seq):
            s = f"{p}{n}_"
            idx = t - T if negative else t
            const(s + "t", np.array(idx, np.int64))
            nodes.append(helper.make_node("Gather", ["x", s + "t"], [s + "xt"], axis=0))
            b_ih = [p + "b_ih"] if bias else []
            nodes.append(
                helper.make_node("Gemm", [s + "xt", p + "w_ih", *b_ih], [s + "gx"], transB=1)
            )
            nodes.append(
                helper.make_node("Gemm", [h, p + "w_hh", p + "b_hh"], [s + "gh"], transB=1)
            )
            pair = [s + "gx", s + "gh"]
            nodes.append(helper.make_node("Add", pair[::-1] if swap else pair, [s + "g"]))
            blocks = [s + f"blk{k}" for k in range(4)]
            nodes.append(helper.make_node("Split", [s + "g", "four"], blocks, axis=1))
            gi, gf, gg, go = (blocks[k] for k in gate_order)
            nodes.append(helper.make_node("Sigmoid", [gi], [s + "i"]))
            nodes.append(helper.make_node("Sigmoid", [gf], [s + "f"]))
            nodes.append(helper.make_node("Tanh", [gg], [s + "gt"]))
            nodes.append(helper.make_node("Sigmoid", [go], [s + "o"]))

            def mul(a, b, out):
                nodes.append(helper.make_node("Mul", [b, a] if swap else [a, b], [out]))

            mul(s + "f", c, s + "fc")
            mul(s + "i", s + "gt", s + "ig")
            pair = [s + "fc", s + "ig"]
            nodes.append(helper.make_node("Add", pair[::-1] if swap else pair, [s + "c"]))
            nodes.append(helper.make_node("Tanh", [s + "c"], [s + "tc"]))
            mul(s + "o", s + "tc", s + "h")
            nodes.append(helper.make_node("Unsqueeze", [s + "h", "axis0"], [s + "hu"]))
            outs.append(s + "hu")
            h, c = s + "h", s + "c"
        value_outs.append(c)
        if escape and d == 0:
            value_outs.append(f"{p}0_blk0")
    nodes.append(helper.make_node("Concat", outs, ["hs"], axis=0))
    graph = helper.make_graph(
        nodes,
        "unrolled_lstm",
        [helper.make_tensor_value_info("x", elem, [T, "batch", K])],
        [helper.make_tensor_value_info(v, elem, None) for v in ["hs", *value_outs]],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model.SerializeToString()


def _feed(T, batch, K, dtype=np.float32, seed=1):
    return {"x": np.random.default_rng(seed).standard_normal((T, batch, K)).astype(dtype)}


def _sessions(model, **opts):
    fused = onnxep.InferenceSession(model, onnxep.SessionOptions(**opts), providers=["cpu"])
    plain = onnxep.InferenceSession(
        model, onnxep.SessionOptions(disabled_rewrites=FUSIONS, **opts), providers=["cpu"]
    )
    return fused, plain


def _close(got, want, dtype=np.float32):
    rtol, atol = (1e-5, 1e-5) if dtype == np.float32 else (1e-10, 1e-10)
    for g, w in zip(got, want):
        assert g.shape == w.shape and g.dtype == w.dtype
        np.testing.assert_allclose(g, w, rtol=rtol, atol=atol)


@pytest.mark.parametrize(
    ("T", "K", "H", "batch"),
    [(1, 4, 1, 1), (2, 9, 3, 2), (5, 9, 3, 3), (7, 33, 17, 2), (20, 64, 100, 2)],
)
@pytest.mark.parametrize("directions", [1, 2])
def test_unrolled_lstm_fuses_and_matches(compiled, T, K, H, batch, directions):
    model = _cell_model(T, K, H, directions=directions)
    fused, plain = _sessions(model)
    counts = fused.placement().rewrites
    # one joined Gemm per direction (a single step has nothing to join), one cell a step
    assert counts["fuse_step_gemms"] == (directions if T > 1 else 0)
    assert counts["fuse_lstm_cell"] == T * directions
    ops = [n.op_type for n in fused.placement()]
    assert "Split" not in ops and "Sigmoid" not in ops
    feed = _feed(T, batch, K)
    want = ort.InferenceSession(model, providers=["CPUExecutionProvider"]).run(None, feed)
    _close(fused.run(None, feed), want)
    _close(plain.run(None, feed), want)


@pytest.mark.parametrize("gate_order", [(0, 1, 2, 3), (3, 2, 1, 0), (1, 3, 0, 2), (2, 0, 3, 1)])
@pytest.mark.parametrize("swap", [False, True])
def test_gate_roles_come_from_the_structure(compiled, gate_order, swap):
    model = _cell_model(4, 6, 5, gate_order=gate_order, swap=swap, negative=swap)
    fused, _ = _sessions(model)
    assert fused.placement().rewrites["fuse_lstm_cell"] == 4
    assert fused.placement().rewrites["fuse_step_gemms"] == 1
    feed = _feed(4, 3, 6)
    want = ort.InferenceSession(model, providers=["CPUExecutionProvider"]).run(None, feed)
    _close(fused.run(None, feed), want)


def test_gemms_without_bias_and_empty_batch(compiled):
    model = _cell_model(3, 8, 4, bias=False, directions=2)
    fused, plain = _sessions(model)
    assert fused.placement().rewrites["fuse_step_gemms"] == 2
    feed = _feed(3, 2, 8)
    want = ort.InferenceSession(model, providers=["CPUExecutionProvider"]).run(None, feed)
    _close(fused.run(None, feed), want)
    empty = _feed(3, 0, 8)
    got, ref = fused.run(None, empty), plain.run(None, empty)
    assert [g.shape for g in got] == [r.shape for r in ref] == [(6, 0, 4), (0, 4), (0, 4)]


def test_few_steps_of_a_long_sequence_are_not_joined():
    # steps 0 and 1 of 10: a joined product would compute eight steps nobody reads
    model = _cell_model(10, 8, 4, steps=[0, 1])
    fused, _ = _sessions(model)
    counts = fused.placement().rewrites
    assert counts["fuse_step_gemms"] == 0
    assert counts["fuse_lstm_cell"] == 2
    feed = _feed(10, 2, 8)
    want = ort.InferenceSession(model, providers=["CPUExecutionProvider"]).run(None, feed)
    _close(fused.run(None, feed), want)


def test_a_gate_read_outside_the_cell_keeps_that_cell():
    model = _cell_model(3, 8, 4, escape=True)
    fused, _ = _sessions(model)
    assert fused.placement().rewrites["fuse_lstm_cell"] == 2  # not the escaping step
    feed = _feed(3, 2, 8)
    want = ort.InferenceSession(model, providers=["CPUExecutionProvider"]).run(None, feed)
    _close(fused.run(None, feed), want)


def test_float64_cells_stay_unfused_and_steps_join(compiled):
    model = _cell_model(4, 8, 4, dtype=np.float64)
    fused, plain = _sessions(model)
    counts = fused.placement().rewrites
    assert counts["fuse_lstm_cell"] == 0
    assert counts["fuse_step_gemms"] == 1
    feed = _feed(4, 2, 8, np.float64)
    _close(fused.run(None, feed), plain.run(None, feed), np.float64)


def _numpy_cell(a, c0, b, order):
    g = (a if b is None else a + b).astype(np.float64)
    i, f, gg, o = (np.split(g, 4, axis=-1)[k] for k in order)
    sig = lambda v: 1 / (1 + np.exp(-v))  # noqa: E731
    c = sig(f) * c0 + sig(i) * np.tanh(gg)
    return sig(o) * np.tanh(c), c


@pytest.mark.parametrize("rows", [0, 1, 2, 5])
@pytest.mark.parametrize("H", [1, 3, 8, 33])
@pytest.mark.parametrize("with_b", [False, True])
def test_cell_kernel_against_float64(compiled, rows, H, with_b):
    rng = np.random.default_rng(H + rows)
    a = (rng.standard_normal((rows, 4 * H)) * 3).astype(np.float32)
    b = (rng.standard_normal((rows, 4 * H)) * 3).astype(np.float32) if with_b else None
    c0 = rng.standard_normal((rows, H)).astype(np.float32)
    order = (2, 0, 3, 1)
    run = op_lstm_cell.lstm_cell(_Node(order), np)
    h, c = run(a, c0, b) if with_b else run(a, c0)
    wh, wc = _numpy_cell(a, c0, b, order)
    assert h.dtype == c.dtype == np.float32 and h.shape == c.shape == (rows, H)
    np.testing.assert_allclose(c, wc, rtol=2e-6, atol=2e-6)
    np.testing.assert_allclose(h, wh, rtol=2e-6, atol=2e-6)


def test_cell_kernel_broadcasts_and_keeps_nan(compiled):
    order = (0, 1, 2, 3)
    run = op_lstm_cell.lstm_cell(_Node(order), np)
    a = np.random.default_rng(0).standard_normal((3, 8)).astype(np.float32)
    a[1, 0] = np.nan
    c0 = np.full((1, 2), 0.5, np.float32)  # broadcast over the rows: the NumPy path
    h, c = run(a, c0)
    wh, wc = _numpy_cell(a, np.broadcast_to(c0, (3, 2)), None, order)
    np.testing.assert_allclose(c, wc, rtol=2e-6, atol=2e-6)
    np.testing.assert_allclose(h, wh, rtol=2e-6, atol=2e-6)
    assert np.isnan(h[1, 0]) and np.isnan(c[1, 0])
    h, c = run(a, np.full((3, 2), 0.5, np.float32))  # the compiled path when on
    assert np.isnan(h[1, 0]) and np.isnan(c[1, 0]) and not np.isnan(h[0]).any()


class _Node:
    def __init__(self, order):
        self.order = order

    def attr(self, name, default=None):
        return list(self.order) if name == "gates" else default
