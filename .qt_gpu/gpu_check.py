"""Run this group's generic kernels on CuPy against the ONNX node-test data."""
import glob, importlib, os, sys, types, traceback
import numpy as np
import onnx
from onnx import helper, numpy_helper

root = os.getcwd()
for name, path in (("onnxep", "core"), ("onnxep.providers", "providers"), ("onnxep.providers.ops", "providers/ops")):
    m = types.ModuleType(name); m.__path__ = [os.path.join(root, path)]; sys.modules[name] = m
import cupy as cp

MODS = {"QuantizeLinear": "op_quantize_linear", "DequantizeLinear": "op_dequantize_linear",
        "DynamicQuantizeLinear": "op_dynamic_quantize_linear", "MatMulInteger": "op_mat_mul_integer",
        "ConvInteger": "op_conv_integer", "QLinearMatMul": "op_q_linear_mat_mul", "QLinearConv": "op_q_linear_conv",
        "Adagrad": "op_adagrad", "Adam": "op_adam", "Momentum": "op_momentum"}
from onnxep.providers.node import NodeInfo, ValueInfo
from onnxep.providers.kernel import SPECS_ATTR

def attr(a):
    v = helper.get_attribute_value(a)
    if isinstance(v, bytes): return v.decode()
    if isinstance(v, onnx.TensorProto): return numpy_helper.to_array(v)
    if isinstance(v, list) and v and isinstance(v[0], bytes): return [x.decode() for x in v]
    return v

base = os.path.join(os.path.dirname(onnx.__file__), "backend/test/data/node")
ok = bad = skip = 0
for d in sorted(glob.glob(base + "/test_*")):
    if "expanded" in d: continue
    model = onnx.load(os.path.join(d, "model.onnx"))
    if len(model.graph.node) != 1 or model.graph.node[0].op_type not in MODS: continue
    n = model.graph.node[0]
    ins = [numpy_helper.to_array(onnx.load_tensor(f)) for f in sorted(glob.glob(d + "/test_data_set_0/input_*.pb"), key=lambda p: int(p.split("_")[-1][:-3]))]
    outs = [numpy_helper.to_array(onnx.load_tensor(f)) for f in sorted(glob.glob(d + "/test_data_set_0/output_*.pb"), key=lambda p: int(p.split("_")[-1][:-3]))]
    if any(a.dtype.kind == "V" or "bfloat" in a.dtype.name or "float8" in a.dtype.name for a in ins + outs):
        skip += 1; continue
    opset = max(o.version for o in model.opset_import if o.domain == (n.domain if n.domain != "ai.onnx" else ""))
    it = iter(ins)
    vis = tuple(ValueInfo(nm, dtype=a.dtype, shape=a.shape) for nm, a in zip(n.input, ins))
    info = NodeInfo(n.op_type, domain=n.domain, opset=opset, attrs={a.name: attr(a) for a in n.attribute},
                    inputs=vis, outputs=tuple(ValueInfo(o) for o in n.output))
    mod = importlib.import_module("onnxep.providers.ops." + MODS[n.op_type])
    fn = [v for v in vars(mod).values() if hasattr(v, SPECS_ATTR)][0]
    try:
        got = fn(info, cp)(*[cp.asarray(a) for a in ins])
        for g, e in zip(got, outs):
            assert isinstance(g, cp.ndarray), type(g)
            g = cp.asnumpy(g)
            assert g.dtype == e.dtype and g.shape == e.shape, (g.dtype, e.dtype, g.shape, e.shape)
            np.testing.assert_allclose(g.astype(np.float64), e.astype(np.float64), rtol=1e-3, atol=1e-6)
        ok += 1
    except Exception as exc:
        bad += 1; print("FAIL", os.path.basename(d), type(exc).__name__, str(exc)[:300])

# random kernels: shapes / dtypes / seed on CuPy
for opmod, fname, a, args in [
    ("op_random_normal", "random_normal", {"shape": [2, 3], "seed": 1.0}, []),
    ("op_random_uniform", "random_uniform", {"shape": [4], "dtype": 10}, []),
    ("op_random_normal_like", "random_normal_like", {}, [cp.zeros((2, 2), cp.float32)]),
    ("op_random_uniform_like", "random_uniform_like", {"dtype": 11}, [cp.zeros((3,), cp.float32)]),
    ("op_bernoulli", "bernoulli", {"seed": 0.0}, [cp.asarray([0.0, 1.0, 0.5], cp.float32)]),
    ("op_multinomial", "multinomial", {"sample_size": 5, "dtype": 7}, [cp.zeros((2, 4), cp.float32)]),
]:
    mod = importlib.import_module("onnxep.providers.ops." + opmod)
    try:
        r = getattr(mod, fname)(NodeInfo("X", attrs=a), cp)(*args)[0]
        print(fname, type(r).__name__, r.dtype, r.shape)
    except Exception:
        bad += 1; traceback.print_exc()
print(f"gpu: {ok} ok, {bad} failed, {skip} skipped (ml_dtypes inputs)")
