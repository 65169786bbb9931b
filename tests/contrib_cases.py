"""One-node com.microsoft models run by onnxep's CPU provider and onnxruntime's, compared."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import ort_int8_reference
from onnx import helper, numpy_helper

import onnxep

MS = "com.microsoft"


def elem(dt):
    return helper.np_dtype_to_tensor_dtype(np.dtype(dt))


def one_node(op, inputs, outputs, attrs=None, consts=(), domain=MS, opset=21):
    """A one-node model. ``inputs``: (name, array) pairs, "" for an omitted input; names in
    ``consts`` become initializers. ``outputs``: (name, dtype) pairs."""
    node = helper.make_node(op, [n for n, _ in inputs], [o for o, _ in outputs], domain=domain)
    node.attribute.extend(helper.make_attribute(k, v) for k, v in (attrs or {}).items())
    g_in = [
        helper.make_tensor_value_info(n, elem(a.dtype), a.shape)
        for n, a in inputs
        if n and n not in consts
    ]
    g_out = [helper.make_tensor_value_info(o, elem(dt), None) for o, dt in outputs]
    inits = [numpy_helper.from_array(np.asarray(a), n) for n, a in inputs if n and n in consts]
    graph = helper.make_graph([node], "g", g_in, g_out, inits)
    opsets = [helper.make_opsetid("", opset), helper.make_opsetid(MS, 1)]
    return helper.make_model(graph, opset_imports=opsets, ir_version=10)


def feeds_of(inputs, consts):
    return {n: a for n, a in inputs if n and n not in consts}


def run_both(model, feeds, ort_threads=0):
    """(onnxep's outputs, onnxruntime's); ``ort_threads`` sets onnxruntime's intra-op threads
    (0: its default), for kernels whose result depends on how it splits the work."""
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    so.intra_op_num_threads = ort_threads
    ref_model, ref_feeds = ort_int8_reference.reference(model, feeds)
    ref = ort.InferenceSession(
        ref_model.SerializeToString(), so, providers=["CPUExecutionProvider"]
    )
    got = onnxep.InferenceSession(model, providers=["cpu"])
    return got.run(None, feeds), ref.run(None, ref_feeds)


def check(op, inputs, outputs, attrs=None, consts=(), atol=0.0, rtol=0.0, **model_kw):
    """Integer and bool outputs must be equal; float ones close to ``atol``/``rtol``."""
    model = one_node(op, inputs, outputs, attrs, consts, **model_kw)
    got, ref = run_both(model, feeds_of(inputs, consts))
    for g, r in zip(got, ref):
        g, r = np.asarray(g), np.asarray(r)
        assert g.dtype == r.dtype and g.shape == r.shape, (g.dtype, g.shape, r.dtype, r.shape)
        if g.dtype.kind in "OUS":
            assert g.tolist() == r.tolist(), f"{op}: {g.tolist()} != {r.tolist()}"
        elif g.dtype.kind in "iub":
            bad = np.flatnonzero(g != r)
            assert not bad.size, f"{op}: {bad.size} of {g.size} differ, first at {bad[0]}"
        else:
            np.testing.assert_allclose(g, r, atol=atol, rtol=rtol)
    return got
