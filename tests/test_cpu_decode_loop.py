"""The host decode loop's cheaper paths (docs/cpu_kernels.md, "Tiny decoders, the loop"):
the step inputs made from buffers, GroupQueryAttention over fixed-capacity past buffers
(in place when given up), the one-row MatMul, integer ReduceSum on the ufunc's own call
and Split with fixed sizes; each against onnxruntime or the construction it replaces, on
odd sizes and edge cases."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import helper, numpy_helper

import onnxep
from onnxep.generation.step_inputs import CHUNK, StepInputs
from onnxep.providers.inplace import array_address, donating

ort = pytest.importorskip("onnxruntime")

MS = "com.microsoft"


def _model(op, inputs, outputs, attrs=None, domain="", consts=None, opset=18):
    """A one-node model; its outputs have the first input's element type."""
    consts = consts or {}
    names = ["" if a is None else n for n, a in inputs.items()]
    node = helper.make_node(op, names, outputs, name="n", domain=domain, **(attrs or {}))
    g_in = [
        helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(a.dtype), [None] * a.ndim)
        for n, a in inputs.items()
        if a is not None and n not in consts
    ]
    elem = helper.np_dtype_to_tensor_dtype(next(iter(inputs.values())).dtype)
    g_out = [helper.make_tensor_value_info(o, elem, None) for o in outputs if o]
    inits = [numpy_helper.from_array(a, n) for n, a in consts.items()]
    graph = helper.make_graph([node], "g", g_in, g_out, inits)
    opsets = [helper.make_opsetid("", opset), helper.make_opsetid(MS, 1)]
    return helper.make_model(graph, opset_imports=opsets, ir_version=10).SerializeToString()


def _ort(model, feeds):
    return ort.InferenceSession(model, providers=["CPUExecutionProvider"]).run(None, feeds)


# ------------------------------------------------------------------ the step inputs


def _mask(past, width, pad, dtype):
    return (np.arange(width)[None] < (past + 1 - pad)[:, None]).astype(dtype)


@pytest.mark.parametrize("pad", [[0], [0, 0, 0], [0, 3, 1]])
@pytest.mark.parametrize("full", [False, True])
@pytest.mark.parametrize("rank", [2, 3])
def test_step_inputs_are_the_masks_and_positions_made_fresh(pad, full, rank):
    pad = np.array(pad, np.int64)
    prompt, steps, capacity = 6, 2 * CHUNK + 5, 2 * CHUNK + 20
    inputs = StepInputs(pad, capacity if full else prompt + steps, np.int32, rank)
    for past in range(prompt, prompt + steps - 1):
        width = capacity if full else past + 1
        for _ in range(2):  # asked twice a step (step_feeds, then the step): the same
            mask = inputs.mask(past, width)
            np.testing.assert_array_equal(mask, _mask(past, width, pad, np.int32))
            assert mask.dtype == np.int32 and mask.flags.c_contiguous
        pos = inputs.positions(past)
        want = (past - pad)[:, None]
        np.testing.assert_array_equal(pos, want if rank == 2 else np.stack([want] * 3))
    # a step skipped or repeated makes the mask afresh
    np.testing.assert_array_equal(
        inputs.mask(prompt, prompt + 1), _mask(prompt, prompt + 1, pad, np.int32)
    )


def test_step_inputs_refuse_a_mask_outside_the_buffer():
    inputs = StepInputs(np.zeros(1, np.int64), 8, np.int64, 2)
    with pytest.raises(ValueError, match="outside the buffer"):
        inputs.mask(8, 9)


# ------------------------------------------------------------------ GroupQueryAttention


def _gqa(nh, nkv, d, filled, new, capacity, packed, rotary, seed=0):
    rng = np.random.default_rng(seed)
    b = 2 if new == 1 else 1  # onnxruntime takes several new rows over a past one row only
    f32 = np.float32
    if packed:
        ins = {"query": rng.standard_normal((b, new, (nh + 2 * nkv) * d)).astype(f32)}
        ins.update(key=None, value=None)
    else:
        ins = {
            "query": rng.standard_normal((b, new, nh * d)).astype(f32),
            "key": rng.standard_normal((b, new, nkv * d)).astype(f32),
            "value": rng.standard_normal((b, new, nkv * d)).astype(f32),
        }
    ins["past_key"] = rng.standard_normal((b, nkv, capacity, d)).astype(f32)
    ins["past_value"] = rng.standard_normal((b, nkv, capacity, d)).astype(f32)
    ins["seqlens_k"] = np.full((b,), filled + new - 1, np.int32)
    ins["total_sequence_length"] = np.array(capacity, np.int32)
    attrs = {"num_heads": nh, "kv_num_heads": nkv}
    consts = {}
    if rotary:
        half = 8 if rotary == "partial" else d // 2  # onnxruntime: a multiple of 8
        ins["cos_cache"] = np.cos(rng.standard_normal((64, half))).astype(f32)
        ins["sin_cache"] = np.sin(rng.standard_normal((64, half))).astype(f32)
        consts = {"cos_cache": ins["cos_cache"], "sin_cache": ins["sin_cache"]}
        attrs.update(do_rotary=1, rotary_interleaved=int(rotary == "interleaved"))
    model = _model("GroupQueryAttention", ins, ["y", "pk", "pv"], attrs, MS, consts)
    feeds = {n: a for n, a in ins.items() if a is not None and n not in consts}
    return model, feeds


@pytest.mark.parametrize("nh,nkv,d", [(4, 2, 16), (6, 1, 32)])
@pytest.mark.parametrize(
    "filled,new,spare", [(0, 1, 0), (1, 1, 3), (17, 1, 5), (0, 3, 2), (5, 3, 1)]
)
@pytest.mark.parametrize("packed", [False, True])
@pytest.mark.parametrize("rotary", [None, "halves", "interleaved", "partial"])
def test_gqa_into_capacity_buffers_matches_onnxruntime(
    compiled, nh, nkv, d, filled, new, spare, packed, rotary
):
    """Rows [0, filled) cached in buffers of ``filled + new + spare`` rows: the new rows
    land at ``filled`` and the rows after keep the buffers' values."""
    t = filled + new
    model, feeds = _gqa(nh, nkv, d, filled, new, t + spare, packed, rotary, seed=t + spare)
    before = {n: feeds[n].copy() for n in ("past_key", "past_value")}
    y, pk, pv = onnxep.InferenceSession(model, providers=["cpu"]).run(None, feeds)
    wy, wk, wv = _ort(model, feeds)
    np.testing.assert_allclose(y, wy, rtol=1e-5, atol=1e-5)
    for got, want, past in ((pk, wk, "past_key"), (pv, wv, "past_value")):
        assert got.shape == feeds[past].shape
        np.testing.assert_allclose(got[:, :, :t], want[:, :, :t], rtol=1e-5, atol=1e-5)
        np.testing.assert_array_equal(got[:, :, t:], before[past][:, :, t:])
        np.testing.assert_array_equal(feeds[past], before[past])  # a plain run copies


@pytest.mark.parametrize("new", [1, 3])
def test_gqa_writes_into_buffers_given_up_for_the_run(compiled, new):
    model, feeds = _gqa(4, 2, 8, 6, new, 12, False, "halves")
    sess = onnxep.InferenceSession(model, providers=["cpu"])
    want = sess.run(None, feeds)
    pk, pv = feeds["past_key"], feeds["past_value"]
    with donating({"n": (array_address(pk), array_address(pv))}):
        y, got_k, got_v = _kernel(sess, feeds)[:3]
    assert got_k is pk and got_v is pv
    for got, w in zip((y, got_k, got_v), want):
        np.testing.assert_array_equal(got, w)
    # one buffer given up is not both: the kernel writes copies, the pasts stay as they were
    model, feeds = _gqa(4, 2, 8, 6, new, 12, False, "halves")
    before = feeds["past_key"].copy()
    with donating({"n": array_address(feeds["past_key"])}):
        got_k = _kernel(sess, feeds)[1]
    assert got_k is not feeds["past_key"]
    np.testing.assert_array_equal(feeds["past_key"], before)


def _kernel(sess, feeds):
    """The session's one node called on ``feeds`` themselves (a run may copy them)."""
    plan = sess.compiled.executor.plan
    (step,) = plan.steps
    slots = list(plan.template)
    for s, name in zip(plan.input_slots, sess.compiled.input_names):
        slots[s] = feeds[name]
    return step.fn(*[slots[i] for i in step.inputs])


def test_shared_host_buffers_are_written_in_place_by_generate(tmp_path):
    from bench.factory import build_genai_decoder
    from onnxep.generation.greedy import SHARED, GreedyDecoder

    path = tmp_path / "m" / "model.onnx"
    build_genai_decoder("tiny", seed=0, dtype="fp32", out_path=path)
    sess = onnxep.InferenceSession(str(path), providers=["cpu"])
    prompt = np.arange(1, 12) % 500
    grown = onnxep.generate(sess, prompt, 10, progress=False)
    dec = GreedyDecoder(sess, prompt, 10, share_on_host=True)
    assert dec.state_path == SHARED
    while not dec.done:
        dec.step()
    res = dec.finish()
    assert res.tokens == grown.tokens
    assert res.copied_outputs == [0] * 10  # every cache written where it is bound


# ------------------------------------------------------------------ MatMul, one row


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("lead", [(1,), (1, 1), (1, 1, 1)])
@pytest.mark.parametrize("k,n", [(1, 1), (7, 5), (128, 256), (257, 33)])
def test_one_row_matmul_is_the_gemv(dtype, lead, k, n):
    rng = np.random.default_rng(k + n)
    w = rng.standard_normal((k, n)).astype(dtype)
    wide = rng.standard_normal((*lead[:-1], 1, 2 * k)).astype(dtype)
    model = _model("MatMul", {"a": wide[..., :k], "w": w}, ["y"], consts={"w": w})
    sess = onnxep.InferenceSession(model, providers=["cpu"])
    for a in (wide[..., :k].copy(), wide[..., ::2]):  # contiguous and strided rows
        (y,) = sess.run(None, {"a": a})
        # the 2-D product the general path runs (a strided row takes BLAS's strided GEMV,
        # whose sums may differ from a contiguous copy's in the last place)
        gemv = np.matmul(a.reshape(1, k), w)
        assert y.shape == (*lead[:-1], 1, n) and y.dtype == dtype
        assert y.tobytes() == gemv.tobytes()
        np.testing.assert_allclose(
            y, _ort(model, {"a": np.ascontiguousarray(a)})[0], rtol=1e-5, atol=1e-5
        )


def test_rows_of_nothing_are_not_one_row():
    w = np.ones((0, 4), np.float32)
    model = _model("MatMul", {"a": np.ones((3, 0), np.float32), "w": w}, ["y"], consts={"w": w})
    (y,) = onnxep.InferenceSession(model, providers=["cpu"]).run(
        None, {"a": np.ones((3, 0), np.float32)}
    )
    assert y.shape == (3, 4) and not y.any()


# ------------------------------------------------------------------ ReduceSum, Split


@pytest.mark.parametrize("dtype", [np.int64, np.int32, np.uint8])
@pytest.mark.parametrize("axes", [[1], [-1, 0], []])
@pytest.mark.parametrize("keep", [0, 1])
def test_integer_reduce_sum_keeps_its_type(dtype, axes, keep):
    x = (np.arange(3 * 17).reshape(3, 17) % 7).astype(dtype)
    if dtype == np.uint8:
        x[:] = 200  # a sum that wraps in uint8, as onnxruntime's does
    ax = np.array(axes, np.int64)
    model = _model(
        "ReduceSum", {"x": x, "axes": ax}, ["y"], {"keepdims": keep}, consts={"axes": ax}
    )
    sess = onnxep.InferenceSession(model, providers=["cpu"])
    for rows in (x, x[:1], x[:, :5]):
        (y,) = sess.run(None, {"x": rows})
        want = rows.sum(axis=tuple(axes) or None, keepdims=bool(keep), dtype=dtype)
        assert y.dtype == dtype and y.shape == want.shape
        np.testing.assert_array_equal(y, want)
    if dtype != np.uint8:
        np.testing.assert_array_equal(sess.run(None, {"x": x})[0], _ort(model, {"x": x})[0])


@pytest.mark.parametrize(
    "attrs,sizes",
    [({"axis": 1}, [2, 5, 1]), ({"axis": -1, "num_outputs": 3}, None), ({"axis": 0}, None)],
)
def test_split_with_fixed_sizes(attrs, sizes):
    rng = np.random.default_rng(0)
    x = rng.standard_normal((6, 8, 7)).astype(np.float32)
    ins = {"x": x}
    consts = {}
    if sizes:
        ins["split"] = consts["split"] = np.array(sizes, np.int64)
        x = rng.standard_normal((6, 8, 7)).astype(np.float32)[:, : sum(sizes)]
        ins["x"] = x
    n = len(sizes) if sizes else 3
    outs = [f"y{i}" for i in range(n)]
    model = _model("Split", ins, outs, attrs, consts=consts)
    sess = onnxep.InferenceSession(model, providers=["cpu"])
    for rows in (x, x[:, :, :3], x[:0]):  # a second shape, and an empty one
        rows = np.ascontiguousarray(rows)
        got = sess.run(None, {"x": rows})
        for g, w in zip(got, _ort(model, {"x": rows})):
            np.testing.assert_array_equal(g, w)


def test_split_sizes_that_do_not_add_up_are_named():
    x = np.zeros((2, 5), np.float32)
    split = np.array([2, 2], np.int64)
    model = _model(
        "Split", {"x": x, "split": split}, ["a", "b"], {"axis": 1}, consts={"split": split}
    )
    with pytest.raises(onnxep.errors.RunError, match="do not add up"):
        onnxep.InferenceSession(model, providers=["cpu"]).run(None, {"x": x})
