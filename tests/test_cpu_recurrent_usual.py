"""GRU's and LSTM's usual call (constant weights, no sequence_lens: ``recurrent_node``)
against the ONNX reference implementation and, bit for bit, against the general compiled
driver (the same node given sequence_lens of the full length): directions x layouts x
linear_before_reset / input_forget x initial states x bias, few rows (the compiled
projection) and many (BLAS), hidden sizes that are no multiple of the loops' blocks, clip."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnx.reference import ReferenceEvaluator

import onnxep
from onnxep.providers_cpu import jit

pytestmark = pytest.mark.skipif(not jit.ENABLED, reason="numba not available: no compiled GRU")


def _model(direction, layout, lbr, H, n_in, weights, h0, lens, clip=None, op="GRU"):
    D = 2 if direction == "bidirectional" else 1
    inits = [numpy_helper.from_array(v, k) for k, v in weights.items()]
    names = ["X", "W", "R", "B" if "B" in weights else "", "lens" if lens else ""]
    names += ["h0" if h0 else ""] + (["c0" if h0 else ""] if op == "LSTM" else [])
    while names[-1] == "":
        names.pop()
    attrs = dict(direction=direction, hidden_size=H, layout=layout)
    attrs["linear_before_reset" if op == "GRU" else "input_forget"] = lbr
    if clip is not None:
        attrs["clip"] = clip
    outs = ["Y", "Y_h", "Y_c"] if op == "LSTM" else ["Y", "Y_h"]
    node = helper.make_node(op, names, outs, **attrs)
    seq, batch = ("T", "N")
    x_shape = [batch, seq, n_in] if layout else [seq, batch, n_in]
    inputs = [helper.make_tensor_value_info("X", TensorProto.FLOAT, x_shape)]
    if lens:
        inputs.append(helper.make_tensor_value_info("lens", TensorProto.INT32, [batch]))
    if h0:
        h_shape = [batch, D, H] if layout else [D, batch, H]
        for name in ("h0", "c0") if op == "LSTM" else ("h0",):
            inputs.append(helper.make_tensor_value_info(name, TensorProto.FLOAT, h_shape))
    graph = helper.make_graph(
        [node],
        "g",
        inputs,
        [helper.make_tensor_value_info(o, TensorProto.FLOAT, None) for o in outs],
        inits,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 22)], ir_version=10)


CASES = [
    # T, batch, input, H: 2 rows (compiled projection), 1 step of 1 row (akiki VAD's call),
    # 8 rows (the limit), 14 and 45 rows (BLAS), H 1 and 17 (no multiple of 4 or 8)
    (2, 1, 5, 8),
    (1, 1, 7, 16),
    (4, 2, 3, 17),
    (7, 2, 9, 12),
    (9, 5, 6, 1),
]


@pytest.mark.parametrize(("T", "batch", "n_in", "H"), CASES)
@pytest.mark.parametrize("direction", ["forward", "reverse", "bidirectional"])
@pytest.mark.parametrize("layout", [0, 1])
@pytest.mark.parametrize("lbr", [0, 1])
@pytest.mark.parametrize("h0", [False, True])
@pytest.mark.parametrize("op", ["GRU", "LSTM"])
def test_usual_call(T, batch, n_in, H, direction, layout, lbr, h0, op):
    """``lbr``: GRU's linear_before_reset, LSTM's input_forget."""
    rng = np.random.default_rng(T * 100 + H + lbr)
    D = 2 if direction == "bidirectional" else 1
    g = 4 if op == "LSTM" else 3
    weights = {
        "W": (rng.standard_normal((D, g * H, n_in)) * 0.5).astype(np.float32),
        "R": (rng.standard_normal((D, g * H, H)) * 0.5).astype(np.float32),
    }
    if (T + batch + lbr) % 2:  # with and without B
        weights["B"] = (rng.standard_normal((D, 2 * g * H)) * 0.5).astype(np.float32)
    feeds = {"X": rng.standard_normal((batch, T, n_in) if layout else (T, batch, n_in))}
    feeds["X"] = feeds["X"].astype(np.float32)
    if h0:
        shape = (batch, D, H) if layout else (D, batch, H)
        feeds["h0"] = (rng.standard_normal(shape) * 0.5).astype(np.float32)
        if op == "LSTM":
            feeds["c0"] = (rng.standard_normal(shape) * 0.5).astype(np.float32)
    clip = 1.2 if H == 17 else None
    model = _model(direction, layout, lbr, H, n_in, weights, h0, False, clip, op)
    usual = onnxep.InferenceSession(model.SerializeToString(), providers=["cpu"])
    got = usual.run(None, feeds)
    assert got[0].shape == ((batch, T, D, H) if layout else (T, D, batch, H))
    for state in got[1:]:
        assert state.shape == ((batch, D, H) if layout else (D, batch, H))

    # The general driver: the same node with every row's length given.
    general_model = _model(direction, layout, lbr, H, n_in, weights, h0, True, clip, op)
    general = onnxep.InferenceSession(general_model.SerializeToString(), providers=["cpu"])
    want = general.run(None, {**feeds, "lens": np.full(batch, T, np.int32)})
    for g, w in zip(got, want):
        assert g.tobytes() == w.tobytes()

    # onnx.reference leaves clip and input_forget out (tests/test_cpu_recurrent: onnxruntime)
    if clip is None and not (op == "LSTM" and lbr):
        ref = ReferenceEvaluator(model).run(None, feeds)
        for a, r in zip(got, ref):
            np.testing.assert_allclose(a, r, rtol=1e-5, atol=2e-6)
    # A second run starts from the given state again (the states are copies, not the feed).
    again = usual.run(None, feeds)
    for g, a in zip(got, again):
        assert g.tobytes() == a.tobytes()


def test_other_calls_take_the_general_path():
    """Float16 X, a wrong initial state and an empty batch are the general driver's."""
    rng = np.random.default_rng(0)
    H, n_in = 4, 3
    weights = {
        "W": rng.standard_normal((1, 3 * H, n_in)).astype(np.float32),
        "R": rng.standard_normal((1, 3 * H, H)).astype(np.float32),
    }
    model = _model("forward", 0, 0, H, n_in, weights, True, False)
    sess = onnxep.InferenceSession(model.SerializeToString(), providers=["cpu"])
    empty = sess.run(
        None, {"X": np.zeros((3, 0, n_in), np.float32), "h0": np.zeros((1, 0, H), np.float32)}
    )
    assert empty[0].shape == (3, 1, 0, H) and empty[1].shape == (1, 0, H)
    with pytest.raises(Exception, match="initial_h"):
        sess.run(
            None, {"X": np.zeros((3, 2, n_in), np.float32), "h0": np.zeros((1, 3, H), np.float32)}
        )


def test_thread_policy_counts_one_directions_projection():
    """A bidirectional recurrence's BLAS products are one per direction: the session's
    thread count sizes the largest of them, not their sum (the romanizer encoder's GRU,
    [T*32, 256] x [256, 384] a direction, stays on one thread)."""
    H, n_in = 128, 256
    rng = np.random.default_rng(0)
    weights = {
        "W": rng.standard_normal((2, 3 * H, n_in)).astype(np.float32),
        "R": rng.standard_normal((2, 3 * H, H)).astype(np.float32),
    }
    model = _model("bidirectional", 0, 0, H, n_in, weights, False, False)
    sess = onnxep.InferenceSession(model.SerializeToString(), providers=["cpu"])
    note = sess.placement().provider_notes["cpu"][0]
    # free T counts 1 (the leading axis), free batch 32: 32 * 256 * 384 per direction
    assert f"{32 * n_in * 3 * H / 1e6:.2f}M multiply-adds" in note
    assert sess.providers[0].blas_thread_count == 1
