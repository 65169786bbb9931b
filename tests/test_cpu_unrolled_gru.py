"""An unrolled GRU step's gate nodes as one onnxep::GRUCell (``fuse_gru_cell``), against
onnxruntime and the unfused graph, with the compiled loop and without it; the kernel
against float64; and the near-misses the pass must leave alone.

The models are what a tracing exporter writes for a GRU cell called in a Python loop
(the romanizer decoder's): ``Gemm(x_t, W_ih, b_ih, transB=1)`` and ``Gemm(h, W_hh, b_hh,
transB=1)``, three Slices of each, ``r = Sigmoid(i_r + h_r)``, ``z = Sigmoid(i_z + h_z)``,
``n = Tanh(i_n + r * h_n)``, ``h = (1 - z) * n + z * h``, built with onnx.helper so that
gate orders, operand orders and Slice forms can vary.
"""

from __future__ import annotations

import numpy as np
import pytest
from onnx import helper, numpy_helper

import onnxep
from onnxep.providers_cpu.ops import op_gru_cell

ort = pytest.importorskip("onnxruntime")

BIG = np.iinfo(np.int64).max


def _gru_model(
    T=3,
    K=6,
    H=4,
    *,
    order_i=(0, 1, 2),
    order_h=(0, 1, 2),
    swap=False,
    slice_form="plain",
    one=1.0,
    r_from_gi_only=False,
    escape=None,
    width_off=False,
    step2=False,
    dtype=np.float32,
    seed=0,
):
    """T unrolled GRU steps over x [T, batch, K] from h0 [batch, H]; outputs each step's h
    stacked and the last h. ``order_i`` / ``order_h``: the blocks of (r, z, n) in each
    product; ``swap``: the other operand order of every Add and Mul; ``slice_form``:
    "plain" (starts/ends/axes 1), "negative" (negative starts, huge ends, axes -1, steps
    1), "noaxes" (starts/ends only: axis 0, not the cell); ``one``: the constant of ``1 -
    z``; ``r_from_gi_only``: r sums two blocks of gi; ``escape``: a step-0 intermediate
    ("r" or "z") also a graph output; ``width_off``: gh's n block one column wide;
    ``step2``: gi's r Slice with step 2."""
    rng = np.random.default_rng(seed)
    elem = helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
    inits, nodes, outs, extra = [], [], [], []

    def const(name, arr):
        inits.append(numpy_helper.from_array(np.asarray(arr), name))
        return name

    const("w_ih", (rng.standard_normal((3 * H, K)) * 0.4).astype(dtype))
    const("w_hh", (rng.standard_normal((3 * H, H)) * 0.4).astype(dtype))
    const("b_ih", (rng.standard_normal(3 * H) * 0.2).astype(dtype))
    const("b_hh", (rng.standard_normal(3 * H) * 0.2).astype(dtype))
    const("one", np.array(one, dtype))
    const("ax0", np.array([0], np.int64))

    def pair(a, b):
        return [b, a] if swap else [a, b]

    def sl(src, s, blk, ref, width):
        start, end = blk * width, blk * width + width
        if ref == "h" and blk == order_h[2] and width_off:
            end = start + 1  # one column, which the Mul broadcasts
        step = 2 if (ref == "i" and blk == order_i[0] and step2) else 1
        if step == 2:
            start, end = 0, 2 * width  # every other column of the first two blocks
        if slice_form == "negative":
            st = start - 3 * H
            en = BIG if end == 3 * H else end - 3 * H
            args = [const(s + "st", [st]), const(s + "en", [en]), const(s + "ax", [-1])]
            args.append(const(s + "sp", [step]))
        elif slice_form == "noaxes":
            args = [const(s + "st", [start]), const(s + "en", [end])]
        else:
            args = [const(s + "st", [start]), const(s + "en", [end]), const(s + "ax", [1])]
            if step != 1:
                args.append(const(s + "sp", [step]))
        nodes.append(helper.make_node("Slice", [src, *args], [s + "out"]))
        return s + "out"

    h = "h0"
    for t in range(T):
        p = f"t{t}_"
        const(p + "t", np.array(t, np.int64))
        nodes.append(helper.make_node("Gather", ["x", p + "t"], [p + "xt"], axis=0))
        nodes.append(helper.make_node("Gemm", [p + "xt", "w_ih", "b_ih"], [p + "gi"], transB=1))
        nodes.append(helper.make_node("Gemm", [h, "w_hh", "b_hh"], [p + "gh"], transB=1))
        i_r, i_z, i_n = (sl(p + "gi", f"{p}i{k}_", order_i[k], "i", H) for k in range(3))
        h_r, h_z, h_n = (sl(p + "gh", f"{p}h{k}_", order_h[k], "h", H) for k in range(3))
        if r_from_gi_only:
            h_r = sl(p + "gi", f"{p}i3_", order_i[1], "i", H)
        nodes.append(helper.make_node("Add", pair(i_r, h_r), [p + "ra"]))
        nodes.append(helper.make_node("Sigmoid", [p + "ra"], [p + "r"]))
        nodes.append(helper.make_node("Add", pair(i_z, h_z), [p + "za"]))
        nodes.append(helper.make_node("Sigmoid", [p + "za"], [p + "z"]))
        nodes.append(helper.make_node("Mul", pair(p + "r", h_n), [p + "rn"]))
        nodes.append(helper.make_node("Add", pair(i_n, p + "rn"), [p + "na"]))
        nodes.append(helper.make_node("Tanh", [p + "na"], [p + "n"]))
        nodes.append(helper.make_node("Sub", ["one", p + "z"], [p + "omz"]))
        nodes.append(helper.make_node("Mul", pair(p + "omz", p + "n"), [p + "a"]))
        nodes.append(helper.make_node("Mul", pair(p + "z", h), [p + "b"]))
        nodes.append(helper.make_node("Add", pair(p + "a", p + "b"), [p + "h"]))
        nodes.append(helper.make_node("Unsqueeze", [p + "h", "ax0"], [p + "hu"]))
        outs.append(p + "hu")
        if escape and t == 0:
            extra.append(p + escape)
        h = p + "h"
    nodes.append(helper.make_node("Concat", outs, ["hs"], axis=0))
    graph = helper.make_graph(
        nodes,
        "unrolled_gru",
        [
            helper.make_tensor_value_info("x", elem, [T, "batch", K]),
            helper.make_tensor_value_info("h0", elem, ["batch", H]),
        ],
        [helper.make_tensor_value_info(v, elem, None) for v in ["hs", h, *extra]],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model.SerializeToString()


def _feed(T, batch, K, H, dtype=np.float32, seed=1):
    rng = np.random.default_rng(seed)
    return {
        "x": rng.standard_normal((T, batch, K)).astype(dtype),
        "h0": rng.standard_normal((batch, H)).astype(dtype),
    }


def _sessions(model):
    fused = onnxep.InferenceSession(model, providers=["cpu"])
    plain = onnxep.InferenceSession(
        model, onnxep.SessionOptions(disabled_rewrites=["fuse_gru_cell"]), providers=["cpu"]
    )
    return fused, plain


def _close(got, want, tol=2e-6):
    for g, w in zip(got, want):
        assert g.shape == w.shape and g.dtype == w.dtype
        np.testing.assert_allclose(g, w, rtol=tol, atol=tol)


def _check(model, T, batch, K, H, fires):
    fused, plain = _sessions(model)
    assert fused.placement().rewrites.get("fuse_gru_cell", 0) == fires
    feed = _feed(T, batch, K, H)
    want = ort.InferenceSession(model, providers=["CPUExecutionProvider"]).run(None, feed)
    _close(fused.run(None, feed), want)
    _close(plain.run(None, feed), want)
    return fused


@pytest.mark.parametrize(("T", "K", "H", "batch"), [(1, 4, 1, 1), (3, 9, 5, 2), (4, 33, 17, 3)])
def test_unrolled_gru_fuses_and_matches(compiled, T, K, H, batch):
    fused = _check(_gru_model(T, K, H), T, batch, K, H, fires=T)
    ops = [n.op_type for n in fused.placement()]
    assert ops.count("GRUCell") == T
    assert not {"Slice", "Sigmoid", "Tanh", "Sub"} & set(ops)


@pytest.mark.parametrize(
    ("order_i", "order_h"), [((0, 1, 2), (0, 1, 2)), ((2, 0, 1), (2, 0, 1)), ((1, 2, 0), (0, 2, 1))]
)
@pytest.mark.parametrize("swap", [False, True])
@pytest.mark.parametrize("slice_form", ["plain", "negative"])
def test_gate_roles_and_offsets_come_from_the_structure(
    compiled, order_i, order_h, swap, slice_form
):
    model = _gru_model(3, 6, 4, order_i=order_i, order_h=order_h, swap=swap, slice_form=slice_form)
    _check(model, 3, 3, 6, 4, fires=3)


def test_empty_batch(compiled):
    model = _gru_model(2, 6, 4)
    fused, plain = _sessions(model)
    assert fused.placement().rewrites["fuse_gru_cell"] == 2
    feed = _feed(2, 0, 6, 4)
    got, ref = fused.run(None, feed), plain.run(None, feed)
    assert [g.shape for g in got] == [r.shape for r in ref] == [(2, 0, 4), (0, 4)]


@pytest.mark.parametrize(
    "miss",
    [
        {"one": 0.5},  # 0.5 - z is not the update gate's complement
        {"slice_form": "noaxes"},  # Slices along the batch axis
        {"r_from_gi_only": True},  # r sums two blocks of one product
        {"width_off": True},  # a block of another width (broadcast)
        {"step2": True},  # a strided block
        {"escape": "r"},  # the reset gate read outside the cell
        {"escape": "z"},  # the update gate read outside the cell
    ],
)
def test_near_misses_stay_unfused(miss):
    T, K, H, batch = 2, 6, 4, 3
    model = _gru_model(T, K, H, **miss)
    fused, _ = _sessions(model)
    counts = fused.placement().rewrites.get("fuse_gru_cell", 0)
    if "escape" in miss:
        assert counts == T - 1  # the other steps still fuse
    elif "slice_form" in miss:
        assert counts == 0
        return  # the model is not a GRU (batch slices): nothing to compare but no fusion
    else:
        assert counts == 0
    feed = _feed(T, batch, K, H)
    want = ort.InferenceSession(model, providers=["CPUExecutionProvider"]).run(None, feed)
    _close(fused.run(None, feed), want)


def test_float64_cells_stay_unfused():
    model = _gru_model(2, 6, 4, dtype=np.float64)
    fused, plain = _sessions(model)
    assert fused.placement().rewrites.get("fuse_gru_cell", 0) == 0
    feed = _feed(2, 2, 6, 4, np.float64)
    _close(fused.run(None, feed), plain.run(None, feed), 1e-12)


class _Node:
    def __init__(self, offsets, H):
        self.values = {"offsets": list(offsets), "hidden_size": H}

    def attr(self, name, default=None):
        return self.values.get(name, default)


def _float64_cell(gi, gh, h0, offsets, H):
    gi, gh, h0 = (np.asarray(v, np.float64) for v in (gi, gh, h0))
    ir, iz, i_n, hr, hz, h_n = offsets

    def blk(x, at):
        return x[:, at : at + H]

    sig = lambda v: 1 / (1 + np.exp(-v))  # noqa: E731
    r = sig(blk(gi, ir) + blk(gh, hr))
    z = sig(blk(gi, iz) + blk(gh, hz))
    n = np.tanh(blk(gi, i_n) + r * blk(gh, h_n))
    return (1 - z) * n + z * h0


@pytest.mark.parametrize("rows", [0, 1, 2, 5])
@pytest.mark.parametrize("H", [1, 3, 8, 33])
@pytest.mark.parametrize("offsets", [(0, 1, 2, 0, 1, 2), (2, 0, 1, 1, 2, 0)])
def test_cell_kernel_against_float64(compiled, rows, H, offsets):
    rng = np.random.default_rng(H + rows)
    gi = (rng.standard_normal((rows, 3 * H)) * 3).astype(np.float32)
    gh = (rng.standard_normal((rows, 3 * H)) * 3).astype(np.float32)
    h0 = rng.standard_normal((rows, H)).astype(np.float32)
    offs = [o * H for o in offsets]
    (h,) = op_gru_cell.gru_cell(_Node(offs, H), np)(gi, gh, h0)
    assert h.dtype == np.float32 and h.shape == (rows, H)
    np.testing.assert_allclose(h, _float64_cell(gi, gh, h0, offs, H), rtol=2e-6, atol=2e-6)


def test_cell_kernel_wider_products_strides_broadcast_and_nan(compiled):
    rng = np.random.default_rng(0)
    H = 5
    gi = rng.standard_normal((3, 4 * H)).astype(np.float32)  # a block nobody reads
    gh = rng.standard_normal((3, 2 * 3 * H)).astype(np.float32)[:, ::2]  # strided
    offs = [H, 3 * H, 0, 2 * H, 0, H]
    run = op_gru_cell.gru_cell(_Node(offs, H), np)
    h0 = rng.standard_normal((3, H)).astype(np.float32)
    (h,) = run(gi, gh, h0)
    np.testing.assert_allclose(h, _float64_cell(gi, gh, h0, offs, H), rtol=2e-6, atol=2e-6)
    h1 = np.full((1, H), 0.5, np.float32)  # broadcast over the rows: the NumPy path
    (h,) = run(gi, gh, h1)
    want = _float64_cell(gi, gh, np.broadcast_to(h1, (3, H)), offs, H)
    np.testing.assert_allclose(h, want, rtol=2e-6, atol=2e-6)
    gi[1, 0] = np.nan  # n's block: row 1, column 0 only
    (h,) = run(gi, gh, h0)
    assert np.isnan(h[1, 0]) and not np.isnan(np.delete(h.reshape(-1), H)).any()
