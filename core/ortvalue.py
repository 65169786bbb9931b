"""OrtValue: onnxruntime's handle on an array in host or device memory.

What IO binding returns (``get_outputs()``) and what ``run_with_ort_values`` takes
and returns. ``ortvalue_from_numpy(array, "cuda", 0)`` puts a copy on a device
through that device's provider (the session's own ones are not needed), so a
script written for onnxruntime's OrtValue runs unchanged.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any

import numpy as np

from .errors import InvalidArgument

_DEVICE_TYPES = ("cpu", "cuda", "gpu")
_device_providers: dict[int, Any] = {}
_device_lock = threading.Lock()


def element_dtype(element_type: Any, what: str) -> np.dtype:
    """A NumPy dtype from onnxruntime's ``element_type``: a NumPy type or dtype, or an ONNX
    element type as its ``TensorProto.DataType`` int (as onnxruntime's helpers pass)."""
    if isinstance(element_type, (int, np.integer)) and not isinstance(element_type, bool):
        from onnx import TensorProto, helper

        if int(element_type) not in TensorProto.DataType.values() or not element_type:
            raise InvalidArgument(
                f"{what}: element_type {int(element_type)} is not an ONNX element type "
                "(onnx.TensorProto.DataType); pass one, or a NumPy dtype such as np.float32"
            )
        return np.dtype(helper.tensor_dtype_to_np_dtype(int(element_type)))
    try:
        return np.dtype(element_type)
    except TypeError:
        raise InvalidArgument(
            f"{what}: element_type {element_type!r} is neither a NumPy dtype nor an ONNX "
            "element type int; pass np.float32 or onnx.TensorProto.FLOAT, say"
        ) from None


def device_kind(name: str) -> str:
    """``cpu`` or ``cuda`` from onnxruntime's device_type (``gpu`` is ``cuda``)."""
    d = str(name).lower()
    if d not in _DEVICE_TYPES:
        raise InvalidArgument(
            f"unknown device_type {name!r}; use one of {', '.join(_DEVICE_TYPES)}"
        )
    return "cuda" if d == "gpu" else d


def device_provider(device_id: int) -> Any:
    """The CUDA provider that holds OrtValues made on ``device_id`` (one per device)."""
    with _device_lock:
        provider = _device_providers.get(device_id)
        if provider is None:
            from onnxep.providers.discovery import get_host

            from .config import load_config
            from .providers_select import select_providers

            host = get_host(load_config())
            select_providers(host, ["cuda"], None, strict=True)  # one sentence if missing
            provider = host.create("cuda", {"device_id": int(device_id)})
            _device_providers[device_id] = provider
        return provider


@dataclass
class OrtValue:
    """An output as onnxruntime's OrtValue shows it: ``numpy()``, ``shape()``, ``data_type()``.

    ``value`` is the array itself (a CuPy array for an output left on the
    device, the caller's own object for a bound buffer).
    """

    value: Any
    array: Any = None  # the NumPy or CuPy array behind ``value``
    to_host: Any = None
    #: ``array`` is memory the caller owns (a bound buffer): a host result is a copy of it,
    #: since the caller may free it or the next run write into it
    borrowed: bool = False

    def __post_init__(self) -> None:
        if self.array is None:
            self.array = self.value

    def numpy(self) -> np.ndarray:
        a = self.array
        if isinstance(a, np.ndarray):
            return a.copy() if self.borrowed else a
        if self.to_host is not None:
            return self.to_host(a)
        if hasattr(a, "get"):  # CuPy
            return a.get()
        return np.asarray(a)

    def shape(self) -> list[int]:
        return list(self.array.shape)

    def data_type(self) -> str:
        from onnxep.providers.dtypes import dtype_name

        return f"tensor({dtype_name(np.dtype(self.array.dtype))})"

    def element_type(self) -> Any:
        return np.dtype(self.array.dtype).type

    def device_name(self) -> str:
        return "cpu" if isinstance(self.array, np.ndarray) else "cuda"

    def data_ptr(self) -> int:
        a = self.array
        if isinstance(a, np.ndarray):
            return a.ctypes.data
        return int(a.data.ptr)

    # -- onnxruntime's constructors and in-place update --------------------------------
    @staticmethod
    def ortvalue_from_numpy(
        numpy_obj: Any, device_type: str = "cpu", device_id: int = 0
    ) -> OrtValue:
        """A copy of ``numpy_obj`` on ``device_type`` (onnxruntime keeps a host array in
        place; so does this, on the CPU)."""
        arr = np.asarray(numpy_obj)
        if device_kind(device_type) == "cpu":
            return OrtValue(arr)
        provider = device_provider(device_id)
        dev = provider.from_host(np.ascontiguousarray(arr))
        return OrtValue(dev, dev, provider.to_host)

    @staticmethod
    def ortvalue_from_shape_and_type(
        shape: Any, element_type: Any = np.float32, device_type: str = "cpu", device_id: int = 0
    ) -> OrtValue:
        dtype = element_dtype(element_type, "ortvalue_from_shape_and_type")
        shape = tuple(int(d) for d in shape)
        if device_kind(device_type) == "cpu":
            return OrtValue(np.zeros(shape, dtype))
        provider = device_provider(device_id)
        dev = provider.from_host(np.zeros(shape, dtype))
        return OrtValue(dev, dev, provider.to_host)

    def update_inplace(self, np_arr: Any) -> None:
        """Copy ``np_arr`` (same shape and dtype) into this value's memory."""
        src = np.asarray(np_arr)
        a = self.array
        if tuple(src.shape) != tuple(a.shape) or src.dtype != np.dtype(a.dtype):
            raise InvalidArgument(
                f"update_inplace: the array is {src.dtype} {list(src.shape)} but this OrtValue "
                f"is {np.dtype(a.dtype)} {list(a.shape)}"
            )
        if isinstance(a, np.ndarray):
            np.copyto(a, src)
        else:
            a.set(np.ascontiguousarray(src))

    def is_tensor(self) -> bool:
        return True

    def has_value(self) -> bool:
        return True
