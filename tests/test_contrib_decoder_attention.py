"""onnxruntime parity for com.microsoft DecoderMaskedMultiHeadAttention: self attention on
shared past/present buffers (the only self-attention form onnxruntime's CPU kernel runs),
masks, attention bias, input bias, output_qk, custom scale, beam search through
cache_indirection, and cross attention."""

from __future__ import annotations

import numpy as np
import pytest
from contrib_cases import one_node, run_both

pytest.importorskip("onnxruntime")

B, N, HEAD, PAST, CAP = 2, 2, 4, 3, 6
HID = N * HEAD
OP = "DecoderMaskedMultiHeadAttention"


def _f(rng, *shape):
    return rng.standard_normal(shape).astype(np.float32)


def _compare(inputs, outputs, attrs):
    model = one_node(OP, inputs, outputs, {"num_heads": N, **attrs})
    feeds = {n: a for n, a in inputs if n}
    got, ref = run_both(model, feeds)
    assert len(got) == len(ref)
    for g, r in zip(got, ref):
        assert g.shape == r.shape
        np.testing.assert_allclose(g, r, atol=2e-6, rtol=1e-5)


SELF_CASES = ["plain", "mask", "attention_bias", "bias", "qk", "scale", "first_step"]


@pytest.mark.parametrize("case", SELF_CASES)
@pytest.mark.parametrize("beams", [1, 2])
def test_self_attention_on_shared_buffers(case, beams):
    if case == "attention_bias" and beams > 1:
        pytest.skip(
            "onnxruntime's CPU kernel reads attention_bias out of bounds under beam search "
            "(wrong numbers here, a segmentation fault in a standalone run)"
        )
    rng = np.random.default_rng(SELF_CASES.index(case) + 10 * beams)
    bb = B * beams
    past = 0 if case == "first_step" else PAST
    inputs = [("q", _f(rng, bb, 1, HID)), ("k", _f(rng, bb, 1, HID)), ("v", _f(rng, bb, 1, HID))]
    mask = (rng.random((bb, past + 1)) > 0.3).astype(np.int32)
    mask[:, -1] = 1
    inputs.append(("mask", mask) if case == "mask" else ("", None))
    inputs.append(("ab", _f(rng, bb, N, 1, past + 1)) if case == "attention_bias" else ("", None))
    inputs += [("pk", _f(rng, bb, N, CAP, HEAD)), ("pv", _f(rng, bb, N, CAP, HEAD))]
    inputs.append(("plen", np.array(past, np.int32)))
    if beams > 1:
        inputs.append(("beams", np.array(beams, np.int32)))
        inputs.append(("ci", rng.integers(0, beams, (B, beams, CAP)).astype(np.int32)))
    else:
        inputs += [("", None), ("", None)]
    inputs.append(("bias", _f(rng, 3 * HID)) if case == "bias" else ("", None))
    outputs = [("y", np.float32), ("pk_out", np.float32), ("pv_out", np.float32)]
    attrs = {"past_present_share_buffer": 1}
    if case == "qk":
        outputs.append(("qk", np.float32))
        attrs["output_qk"] = 1
    if case == "scale":
        attrs["scale"] = 0.3
    _compare(inputs, outputs, attrs)


@pytest.mark.parametrize("case", ["plain", "mask", "bias"])
def test_cross_attention(case):
    rng = np.random.default_rng(3)
    length = 5
    inputs = [("q", _f(rng, B, 1, HID)), ("ck", _f(rng, B, N, length, HEAD))]
    inputs.append(("cv", _f(rng, B, N, length, HEAD)))
    if case == "mask":
        inputs.append(("mask", np.array([[1, 1, 0, 1, 1], [1, 1, 1, 1, 0]], np.int32)))
    if case == "bias":
        inputs += [("", None)] * 7 + [("bias", _f(rng, 3 * HID))]
    _compare(inputs, [("y", np.float32)], {})


def _csr(layout):
    """(block_row_indices, block_col_indices) of bool block masks, columns padded with -1."""
    nnz = max(int(m.sum()) for m in layout)
    rows, cols = [], []
    for m in layout:
        r, c = [0], []
        for row in m:
            c += np.nonzero(row)[0].tolist()
            r.append(len(c))
        rows.append(r)
        cols.append(c + [-1] * (nnz - len(c)))
    return np.array(rows, np.int32), np.array(cols, np.int32)


def _ort_sparse(model, feeds):
    """onnxruntime's SparseAttention needs past and present bound to one buffer."""
    import onnxruntime as ort

    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    io = sess.io_binding()
    for name, arr in feeds.items():
        if name not in ("pk", "pv"):
            io.bind_cpu_input(name, arr)
    # the OrtValues wrap these arrays without copying them: keep them alive
    arrays = {n: feeds[n].copy() for n in ("pk", "pv")}
    caches = {n: ort.OrtValue.ortvalue_from_numpy(a) for n, a in arrays.items()}
    for n, ov in caches.items():
        io.bind_ortvalue_input(n, ov)
    io.bind_output("y")
    io.bind_ortvalue_output("pk_out", caches["pk"])
    io.bind_ortvalue_output("pv_out", caches["pv"])
    sess.run_with_iobinding(io)
    # the presents are the bound buffers, updated in place
    return [io.get_outputs()[0].numpy(), arrays["pk"], arrays["pv"]]


SPARSE = [  # (sequence length, keys per row, rotary, interleaved, packed qkv, layouts)
    (5, 5, 0, 0, 0, 1),
    (16, 16, 0, 0, 0, 2),
    (1, 37, 0, 0, 0, 2),
    (4, 40, 0, 0, 1, 2),
    (8, 8, 1, 0, 0, 2),
    (1, 30, 1, 1, 0, 1),
    (3, 50, 1, 0, 1, 2),
]


@pytest.mark.parametrize("s,total,rot,inter,packed,layouts", SPARSE)
def test_sparse_attention(s, total, rot, inter, packed, layouts):
    """Every batch row as long as total_sequence_length: with ragged rows onnxruntime's CPU
    kernel leaves the shorter rows' outputs unwritten (docs/contrib_ops.md)."""
    import onnxep

    rng = np.random.default_rng(s + total)
    b, nh, nkv, head, block, cap = 2, 4, 2, 16, 16, 64
    nb = cap // block
    layout = np.tril(np.ones((layouts, nb, nb), bool))
    layout[0, 3, 1] = False
    if layouts > 1:
        layout[1, 2, 0] = False
    rows, cols = _csr(layout)
    q, k, v = _f(rng, b, s, nh * head), _f(rng, b, s, nkv * head), _f(rng, b, s, nkv * head)
    inputs = (
        [("q", np.concatenate([q, k, v], -1))] + [("", None)] * 2
        if packed
        else [("q", q), ("k", k), ("v", v)]
    )
    inputs += [("pk", _f(rng, b, nkv, cap, head)), ("pv", _f(rng, b, nkv, cap, head))]
    inputs += [("rows", rows), ("cols", cols), ("total", np.array(total, np.int32))]
    inputs += [("lens", np.full(b, total, np.int32))]
    if rot:
        angles = np.arange(128)[:, None] / 10000 ** (np.arange(head // 2) / (head // 2))[None]
        inputs += [
            ("cos", np.cos(angles).astype(np.float32)),
            ("sin", np.sin(angles).astype(np.float32)),
        ]
    attrs = {"num_heads": nh, "kv_num_heads": nkv, "sparse_block_size": block}
    attrs |= {"do_rotary": rot, "rotary_interleaved": inter}
    outputs = [("y", np.float32), ("pk_out", np.float32), ("pv_out", np.float32)]
    model = one_node("SparseAttention", inputs, outputs, attrs)
    feeds = {n: a for n, a in inputs if n}
    ref = _ort_sparse(model, feeds)
    got = onnxep.InferenceSession(model, providers=["cpu"]).run(None, feeds)
    for g, r in zip(got, ref):
        np.testing.assert_allclose(g, r, atol=2e-6, rtol=1e-5)


@pytest.mark.parametrize("s,lens", [(1, [20, 37]), (3, [9, 40])])
def test_sparse_attention_ragged_rows_are_rows_alone(s, lens):
    """Rows of different lengths: each row is what onnxruntime gives that row run alone."""
    import onnxep

    rng = np.random.default_rng(7)
    b, nh, nkv, head, block, cap = len(lens), 2, 1, 16, 16, 64
    rows, cols = _csr(np.tril(np.ones((1, cap // block, cap // block), bool)))
    q, k, v = _f(rng, b, s, nh * head), _f(rng, b, s, nkv * head), _f(rng, b, s, nkv * head)
    pk, pv = _f(rng, b, nkv, cap, head), _f(rng, b, nkv, cap, head)
    attrs = {"num_heads": nh, "kv_num_heads": nkv, "sparse_block_size": block}
    outputs = [("y", np.float32), ("pk_out", np.float32), ("pv_out", np.float32)]

    def inputs(sl, total, row_lens):
        return [("q", q[sl]), ("k", k[sl]), ("v", v[sl]), ("pk", pk[sl]), ("pv", pv[sl])] + [
            ("rows", rows),
            ("cols", cols),
            ("total", np.array(total, np.int32)),
            ("lens", np.array(row_lens, np.int32)),
        ]

    batch = inputs(slice(None), max(lens), lens)
    model = one_node("SparseAttention", batch, outputs, attrs)
    got = onnxep.InferenceSession(model, providers=["cpu"]).run(None, dict(batch))
    for i, n in enumerate(lens):
        alone = inputs(slice(i, i + 1), n, [n])
        ref = _ort_sparse(one_node("SparseAttention", alone, outputs, attrs), dict(alone))
        for g, r in zip(got, ref):
            np.testing.assert_allclose(g[i : i + 1], r, atol=2e-6, rtol=1e-5)
