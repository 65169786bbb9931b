"""GatherBlockQuantized against onnxruntime on random tables, indices and attributes."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper

import onnxep

ort = pytest.importorskip("onnxruntime")


def _model(bits, block, gaxis, qaxis, with_zp, data_type=TensorProto.UINT8):
    inputs = ["d", "i", "s"] + (["z"] if with_zp else [])
    node = helper.make_node(
        "GatherBlockQuantized",
        inputs,
        ["y"],
        domain="com.microsoft",
        bits=bits,
        block_size=block,
        gather_axis=gaxis,
        quantize_axis=qaxis,
    )
    vi = [
        helper.make_tensor_value_info("d", data_type, None),
        helper.make_tensor_value_info("i", TensorProto.INT64, None),
        helper.make_tensor_value_info("s", TensorProto.FLOAT, None),
    ]
    if with_zp:
        vi.append(helper.make_tensor_value_info("z", data_type, None))
    graph = helper.make_graph(
        [node], "g", vi, [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)]
    )
    return helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 21), helper.make_opsetid("com.microsoft", 1)]
    )


@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("block", [16, 32])
@pytest.mark.parametrize("with_zp", [False, True])
@pytest.mark.parametrize("seed", [0, 1])
def test_matches_onnxruntime(bits, block, with_zp, seed):
    rng = np.random.default_rng(seed)
    rows, cols = int(rng.integers(3, 9)), block * int(rng.integers(1, 4))
    per = 8 // bits
    data = rng.integers(0, 256, (rows, cols // per)).astype(np.uint8)
    nblocks = cols // block
    scales = rng.uniform(0.01, 0.2, (rows, nblocks)).astype(np.float32)
    feeds = {"d": data, "i": rng.integers(0, rows, (2, 3)).astype(np.int64), "s": scales}
    if with_zp:
        zcols = -(-nblocks // per) if bits < 8 else nblocks
        feeds["z"] = rng.integers(0, 256, (rows, zcols)).astype(np.uint8)
    model = _model(bits, block, 0, 1, with_zp)
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(
        None, feeds
    )[0]
    (got,) = onnxep.InferenceSession(model, providers=["cpu"]).run(None, feeds)
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)
