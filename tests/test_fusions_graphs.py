"""Small graphs of each fusion's pattern, built with onnx.helper (no tests here).

Shared by test_fusions_ops.py (on the ``fusions`` test provider) and
tests/cuda/test_cuda_fusions.py (on the GPU), so both check the same cases, and by the same
comparison (:func:`assert_like_unfused`). The tests/ conftest is not imported: the GPU tests
import this module outside it.
"""

from __future__ import annotations

import math

import numpy as np
from onnx import TensorProto, helper, numpy_helper

from onnxep.testing import TOLERANCES

F32, F16 = np.float32, np.float16
ELEM = {F32: TensorProto.FLOAT, F16: TensorProto.FLOAT16}
node = helper.make_node


def assert_like_unfused(got, want, exact, what=""):
    """A fused session's output against the unfused session's: the same dtype and shape, and
    the same bytes where the pass claims them (``exact``), else within the dtype's tolerance."""
    assert got.dtype == want.dtype and got.shape == want.shape, what
    if exact:
        np.testing.assert_array_equal(got, want, err_msg=what)
    else:
        atol, rtol = TOLERANCES[np.dtype(got.dtype)]
        np.testing.assert_allclose(got, want, rtol=rtol, atol=atol, err_msg=what)


def make_model(nodes, inputs, outputs, inits=(), opset=17):
    graph = helper.make_graph(nodes, "g", inputs, outputs, list(inits))
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def tensor(name, shape, elem=TensorProto.FLOAT):
    return helper.make_tensor_value_info(name, elem, shape)


def const(name, value, dtype=np.float32):
    return numpy_helper.from_array(np.asarray(value, dtype), name)


def feeds(model, seed=0):
    rng = np.random.default_rng(seed)
    out = {}
    for v in model.graph.input:
        t = v.type.tensor_type
        shape = [d.dim_value for d in t.shape.dim]
        dt = F16 if t.elem_type == TensorProto.FLOAT16 else F32
        out[v.name] = rng.standard_normal(shape).astype(dt)
    return out


def rms_model(dt=F32, div=False, axes_attr=False, escape=None, cast=False, d=16):
    e = ELEM[dt]
    cdt = F32 if cast else dt
    inits = [
        const("two", 2.0, cdt),
        const("eps", 1e-6, cdt),
        const("one", 1.0, cdt),
        const("w", np.linspace(0.5, 1.5, d), dt),
    ]
    nodes = []
    x = "x"
    if cast:
        nodes.append(node("Cast", ["x"], ["x32"], to=TensorProto.FLOAT))
        x = "x32"
    if axes_attr:
        mean = node("ReduceMean", ["p"], ["m"], axes=[-1], keepdims=1)
    else:
        inits.append(numpy_helper.from_array(np.array([-1], np.int64), "axes"))
        # as torch writes it, both attributes out (onnxscript's rule matches only then)
        mean = node("ReduceMean", ["p", "axes"], ["m"], keepdims=1, noop_with_empty_axes=0)
    nodes += [
        node("Pow", [x, "two"], ["p"]),
        mean,
        node("Add", ["m", "eps"], ["a"]),
        node("Sqrt", ["a"], ["s"]),
        node("Div", ["one", "s"], ["r"]) if div else node("Reciprocal", ["s"], ["r"]),
        node("Mul", [x, "r"], ["n"]),
    ]
    if cast:
        nodes.append(node("Cast", ["n"], ["n16"], to=e))
        nodes.append(node("Mul", ["w", "n16"], ["y"], name="scale"))
    else:
        nodes.append(node("Mul", ["n", "w"], ["y"], name="scale"))
    outputs = [tensor("y", [2, 3, d], e)]
    if escape == "output":
        outputs.append(tensor("m", [2, 3, 1], ELEM[cdt]))
    elif escape == "consumer":
        nodes.append(node("Neg", ["s"], ["ns"]))
        outputs.append(tensor("ns", [2, 3, 1], ELEM[cdt]))
    opset = 17 if axes_attr else 18
    return make_model(nodes, [tensor("x", [2, 3, d], e)], outputs, inits, opset=opset)


def skip_model(dt=F32, opset23=False, bias=False, escape=False, d=16):
    e = ELEM[dt]
    inits = [const("w", np.linspace(0.5, 1.5, d), dt), const("bias", np.linspace(-1, 1, d), dt)]
    nodes = [node("Add", ["h", "res"], ["t"], name="residual")]
    s = "t"
    if bias:
        nodes.append(node("Add", ["t", "bias"], ["tb"], name="bias_add"))
        s = "tb"
    if opset23:
        nodes.append(node("RMSNormalization", [s, "w"], ["y"], axis=-1, epsilon=1e-6))
    else:
        rms = rms_model(dt, d=d)
        inits += [i for i in rms.graph.initializer if i.name != "w"]
        for n in rms.graph.node:
            n.input[:] = [s if i == "x" else i for i in n.input]
            nodes.append(n)
    nodes.append(node("Add", [s, "c"], ["z"], name="next_residual"))
    inputs = [tensor(n, [2, 3, d], e) for n in ("h", "res", "c")]
    outputs = [tensor("y", [2, 3, d], e), tensor("z", [2, 3, d], e)]
    if escape:
        outputs.append(tensor("t", [2, 3, d], e))
    return make_model(nodes, inputs, outputs, inits, opset=23 if opset23 else 18)


def rsqrt_model(dt=F32, div=False, escape=False, one_shape=()):
    e = ELEM[dt]
    nodes = [node("Sqrt", ["x"], ["s"])]
    if div:
        nodes.append(node("Div", ["one", "s"], ["y"], name="inv"))
    else:
        nodes.append(node("Reciprocal", ["s"], ["y"], name="inv"))
    shape_y = [4, 8] if len(one_shape) <= 2 else [1] * (len(one_shape) - 2) + [4, 8]
    outputs = [tensor("y", shape_y, e)]
    if escape:
        nodes.append(node("Neg", ["s"], ["ns"]))
        outputs.append(tensor("ns", [4, 8], e))
    inits = [const("one", np.ones(one_shape), dt)]
    return make_model(nodes, [tensor("x", [4, 8], e)], outputs, inits)


def positive(model):
    return {k: np.abs(v) + 1e-3 for k, v in feeds(model).items()}


def silu_model(dt=F32, swapped=False):
    e = ELEM[dt]
    mul = ["s", "x"] if swapped else ["x", "s"]
    nodes = [node("Sigmoid", ["x"], ["s"]), node("Mul", mul, ["y"])]
    return make_model(nodes, [tensor("x", [4, 8], e)], [tensor("y", [4, 8], e)])


def swiglu_model(dt=F32, escape=False):
    e = ELEM[dt]
    nodes = [
        node("Sigmoid", ["g"], ["s"]),
        node("Mul", ["g", "s"], ["act"]),
        node("Mul", ["act", "u"], ["y"], name="gated"),
    ]
    outputs = [tensor("y", [4, 8], e)]
    if escape:
        outputs.append(tensor("act", [4, 8], e))
    return make_model(nodes, [tensor("g", [4, 8], e), tensor("u", [4, 8], e)], outputs)


def gelu_model(dt=F32, form="erf", bias=None, opset=18, escape=False, bias_shape=(8,)):
    """GELU as torch exports it at opset 18 (primitives) or 20 (ONNX Gelu), after x (+ bias)."""
    e = ELEM[dt]
    inits = [const("b", np.linspace(-1, 1, math.prod(bias_shape)).reshape(bias_shape), dt)]
    nodes = []
    x = "x"
    if bias:
        nodes.append(node("Add", ["x", "b"], ["xb"], name="bias_add"))
        x = "xb"
    if opset >= 20:
        approx = "tanh" if form == "tanh" else "none"
        nodes.append(node("Gelu", [x], ["y"], approximate=approx))
    elif form == "erf":
        inits += [const(n, v, dt) for n, v in (("sqrt2", 1.4142135), ("one", 1.0), ("half", 0.5))]
        nodes += [
            node("Div", [x, "sqrt2"], ["d"]),
            node("Erf", ["d"], ["erf"]),
            node("Add", ["erf", "one"], ["e1"]),
            node("Mul", ["half", "e1"], ["h"]),
            node("Mul", [x, "h"], ["y"], name="gelu_out"),
        ]
    else:
        consts = (("three", 3.0), ("k", 0.044715), ("c", 0.7978846), ("one", 1.0), ("half", 0.5))
        inits += [const(n, v, dt) for n, v in consts]
        nodes += [
            node("Pow", [x, "three"], ["p3"]),
            node("Mul", ["k", "p3"], ["kp"]),
            node("Add", [x, "kp"], ["inner"]),
            node("Mul", ["c", "inner"], ["ci"]),
            node("Tanh", ["ci"], ["erf"]),
            node("Add", ["erf", "one"], ["e1"]),
            node("Mul", ["half", "e1"], ["h"]),
            node("Mul", [x, "h"], ["y"], name="gelu_out"),
        ]
    outputs = [tensor("y", [4, 8], e)]
    if escape:
        name = "xb" if bias else "erf"
        nodes.append(node("Neg", [name], ["n"]))
        outputs.append(tensor("n", [4, 8], e))
    return make_model(nodes, [tensor("x", [4, 8], e)], outputs, inits, opset=opset)


def matmul_bias_model(dt=F32, residual=False, escape=False, swapped=False):
    e = ELEM[dt]
    rng = np.random.default_rng(1)
    inits = [
        const("w", rng.standard_normal((8, 16)) / 3, dt),
        const("b", np.linspace(-1, 1, 16), dt),
    ]
    addend = "r" if residual else "b"
    pair = [addend, "mm"] if swapped else ["mm", addend]
    nodes = [node("MatMul", ["x", "w"], ["mm"]), node("Add", pair, ["y"], name="bias_add")]
    inputs = [tensor("x", [2, 3, 8], e)] + ([tensor("r", [2, 3, 16], e)] if residual else [])
    outputs = [tensor("y", [2, 3, 16], e)] + ([tensor("mm", [2, 3, 16], e)] if escape else [])
    return make_model(nodes, inputs, outputs, inits)


def shared_model(widths=(16, 8, 8), dt=F32, swiglu=False, dynamic=None, opset=17, bias=False):
    e = ELEM[dt]
    rng = np.random.default_rng(2)
    inits, nodes, outputs = [], [], []
    inputs = [tensor("x", [2, 3, 8], e)]
    for k, n in enumerate(widths):
        inits.append(const(f"w{k}", rng.standard_normal((8, n)) / 3, dt))
        w = f"w{k}"
        if dynamic == k:
            inputs.append(tensor("wd", [8, n], e))
            w = "wd"
        nodes.append(node("MatMul", ["x", w], [f"m{k}"], name=f"proj{k}"))
        out = f"m{k}"
        if bias:
            inits.append(const(f"b{k}", np.linspace(-1, 1, n), dt))
            nodes.append(node("Add", [f"m{k}", f"b{k}"], [f"y{k}"]))
            out = f"y{k}"
        if not swiglu:
            outputs.append(tensor(out, [2, 3, n], e))
    if swiglu:
        nodes += [
            node("Sigmoid", ["m0"], ["s"]),
            node("Mul", ["m0", "s"], ["act"]),
            node("Mul", ["act", "m1"], ["y"]),
        ]
        outputs.append(tensor("y", [2, 3, widths[0]], e))
    return make_model(nodes, inputs, outputs, inits, opset=opset)
