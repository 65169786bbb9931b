"""Resize and Upsample on the GPU (providers_cuda/ops/op_resize.py): the node suite on CUDA
alone, our own shapes, and a Conv -> Resize -> Conv model captured as one CUDA graph.

The same kernels run on the CPU through the emulator in tests/test_cuda_resize_emulated.py,
with launch counts and table uploads checked there.
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
import resize_cases as cases
from onnx import TensorProto, helper

import onnxep
from onnxep.testing import compare_output
from onnxep.tools.conformance import case_data, case_model

NODE_CASES = cases.onnx_node_cases()


def _cuda_alone():
    return onnxep.SessionOptions(disable_fallback=True)


@pytest.mark.parametrize("name", sorted(NODE_CASES))
def test_node_suite_on_cuda_alone(name):
    case = NODE_CASES[name]
    model = case_model(case)
    ins, outs = case_data(case)[0]
    sess = onnxep.InferenceSession(model, _cuda_alone(), ["cuda"])
    got = sess.run(None, dict(zip([i.name for i in model.graph.input], ins)))
    bad = []
    for arg, g, w in zip(sess.get_outputs(), got, outs, strict=True):
        bad += [r.describe() for r in compare_output(arg.name, g, w, "cuda", "onnx") if not r.ok]
    assert not bad, "\n".join(bad)


@pytest.mark.parametrize("case", cases.OWN, ids=lambda c: c[0])
def test_own_cases_match_cpu(case):
    _, shape, dtype, attrs, inputs = case
    model = cases.resize_model(shape, dtype, attrs, **inputs)
    x = cases.data(shape, dtype)
    (got,) = onnxep.InferenceSession(model, _cuda_alone(), ["cuda"]).run(None, {"x": x})
    (want,) = onnxep.InferenceSession(model, providers=["cpu"]).run(None, {"x": x})
    assert got.dtype == want.dtype and got.shape == want.shape
    tol = {np.float16: 2e-3, np.uint8: 1, np.int8: 1}.get(dtype, 1e-5)  # 8 bits: a .5 tie
    np.testing.assert_allclose(got.astype(np.float64), want.astype(np.float64), rtol=tol,
                               atol=tol)  # fmt: skip


def _conv_resize_conv(dtype, resize_attrs, roi=None, scales=None, sizes=None):
    """x [1, 4, 12, 10] -> Conv 3x3 (8) -> Resize -> Conv 3x3 (4): a detector's neck."""
    rng = np.random.default_rng(0)
    elem = helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
    w1 = (rng.standard_normal((8, 4, 3, 3)) * 0.2).astype(dtype)
    w2 = (rng.standard_normal((4, 8, 3, 3)) * 0.2).astype(dtype)
    inits = [onnx.numpy_helper.from_array(w1, "w1"), onnx.numpy_helper.from_array(w2, "w2")]
    ins = ["c1", "", "", ""]
    if roi is not None:
        inits.append(onnx.numpy_helper.from_array(np.array(roi, np.float32), "roi"))
        ins[1] = "roi"
    if scales is not None:
        inits.append(onnx.numpy_helper.from_array(np.array(scales, np.float32), "scales"))
        ins[2] = "scales"
    if sizes is not None:
        inits.append(onnx.numpy_helper.from_array(np.array(sizes, np.int64), "sizes"))
        ins[3] = "sizes"
    while ins[-1] == "":
        ins.pop()
    nodes = [
        helper.make_node("Conv", ["x", "w1"], ["c1"], name="conv1", pads=[1, 1, 1, 1]),
        helper.make_node("Resize", ins, ["r"], name="resize", **resize_attrs),
        helper.make_node("Conv", ["r", "w2"], ["y"], name="conv2", pads=[1, 1, 1, 1]),
    ]
    g = helper.make_graph(
        nodes,
        "neck",
        [helper.make_tensor_value_info("x", elem, [1, 4, 12, 10])],
        [helper.make_tensor_value_info("y", elem, None)],
        inits,
    )
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 19)])


NECKS = [
    ("nearest-x2-f32", np.float32, {"mode": "nearest"}, {"scales": [1, 1, 2, 2]}),
    ("nearest-x2-f16", np.float16, {"mode": "nearest"}, {"scales": [1, 1, 2, 2]}),
    ("linear-sizes-f32", np.float32, {"mode": "linear"}, {"sizes": [1, 8, 17, 23]}),
    ("cubic-crop-f16", np.float16,
     {"mode": "cubic", "coordinate_transformation_mode": "tf_crop_and_resize",
      "extrapolation_value": 0.5},
     {"roi": [0, 0, 0.1, -0.1, 1, 1, 0.8, 1.2], "sizes": [1, 8, 9, 15]}),
]  # fmt: skip


@pytest.mark.parametrize("neck", NECKS, ids=lambda n: n[0])
def test_conv_resize_conv_is_one_graph(neck):
    _, dtype, attrs, inputs = neck
    model = _conv_resize_conv(dtype, attrs, **inputs)
    sess = onnxep.InferenceSession(
        model.SerializeToString(), providers=[("cuda", {"capture": "whole"}), "cpu"]
    )
    plan = sess.capture_plan()
    assert plan.mode == "whole" and not plan.seams, plan.format()
    cpu = onnxep.InferenceSession(model, providers=["cpu"])
    rng = np.random.default_rng(1)
    tol = 2e-2 if dtype == np.float16 else 2e-3
    for _ in range(6):
        x = rng.standard_normal((1, 4, 12, 10)).astype(dtype)
        (got,) = sess.run(None, {"x": x})
        (want,) = cpu.run(None, {"x": x})
        np.testing.assert_allclose(got.astype(np.float32), want.astype(np.float32), rtol=tol,
                                   atol=tol)  # fmt: skip
    s = sess.capture_stats()
    assert (s["captures"], s["segments"], s["fallbacks"]) == (1, 1, 0), s
    assert s["replays"] >= 3, s


def test_an_integer_linear_resize_is_a_seam_naming_why():
    x = helper.make_tensor_value_info("x", TensorProto.INT32, [1, 1, 4, 4])
    y = helper.make_tensor_value_info("y", TensorProto.INT32, None)
    sc = onnx.numpy_helper.from_array(np.array([1, 1, 2, 2], np.float32), "s")
    nodes = [
        helper.make_node("Neg", ["x"], ["n"], name="neg"),
        helper.make_node("Resize", ["n", "", "s"], ["r"], name="resize", mode="linear"),
        helper.make_node("Neg", ["r"], ["y"], name="neg2"),
    ]
    g = helper.make_graph(nodes, "g", [x], [y], [sc])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 19)])
    sess = onnxep.InferenceSession(
        model.SerializeToString(), providers=[("cuda", {"capture": "auto"}), "cpu"]
    )
    plan = sess.capture_plan()
    assert [r.name for r in plan.seams] == ["resize"], plan.format()
    assert (
        "linear interpolates float16, float32, float64, uint8 and int8, not int32"
        in plan.seams[0].reason
    )
    xv = np.arange(16, dtype=np.int32).reshape(1, 1, 4, 4)
    (got,) = sess.run(None, {"x": xv})
    (want,) = onnxep.InferenceSession(model, providers=["cpu"]).run(None, {"x": xv})
    np.testing.assert_array_equal(got, want)
