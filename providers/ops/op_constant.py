import numpy as np

from onnxep.errors import NotSupported
from onnxep.providers.kernel import kernel


def _strings(v):
    # onnx-ir hands string tensors over as bytes; string values here are str objects
    arr = np.asarray(v)
    if arr.dtype.kind in "SUO":
        flat = [s.decode("utf-8") if isinstance(s, bytes) else str(s) for s in arr.reshape(-1)]
        return np.array(flat, dtype=object).reshape(arr.shape)
    return arr


def _densify(sparse):
    values = np.asarray(sparse.values.numpy())
    indices = np.asarray(sparse.indices.numpy()).astype(np.int64)
    dims = tuple(int(d) for d in sparse.dims)
    out = np.zeros(dims, dtype=values.dtype)
    flat = out.reshape(-1)
    if indices.ndim == 2:
        indices = np.ravel_multi_index(tuple(indices.T), dims)
    flat[indices.reshape(-1)] = values.reshape(-1)
    return out


def constant_value(node) -> np.ndarray:
    a = node.attrs
    if "value" in a:
        return _strings(a["value"])
    if "value_float" in a:
        return np.array(a["value_float"], dtype=np.float32)
    if "value_floats" in a:
        return np.array(list(a["value_floats"]), dtype=np.float32)
    if "value_int" in a:
        return np.array(a["value_int"], dtype=np.int64)
    if "value_ints" in a:
        return np.array(list(a["value_ints"]), dtype=np.int64)
    if "value_string" in a:
        return _strings(np.array(a["value_string"], dtype=object))
    if "value_strings" in a:
        return _strings(np.array(list(a["value_strings"]), dtype=object))
    if "sparse_value" in a:
        try:
            return _densify(a["sparse_value"])
        except Exception as exc:
            raise NotSupported(
                f"Constant: sparse_value could not be densified ({type(exc).__name__}: {exc})"
            ) from exc
    raise NotSupported("Constant: no value attribute (value, value_float, ...)")


@kernel("Constant", since=1)
def constant(node, xp):
    host = constant_value(node)
    # strings stay NumPy object arrays; numbers move to the provider once
    value = host if host.dtype == object else xp.asarray(host)

    def run():
        return (value,)

    return run
