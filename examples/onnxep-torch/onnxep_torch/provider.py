"""The torch provider: claims the nodes it can run on torch tensors, declines the rest."""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from typing import Any

import array_api_compat.torch as torch_xp
import torch

from onnxep.providers import Claim, Decline, KernelLibrary, NodeInfo, Provider, dtype_name

from .convert import to_numpy, to_torch
from .verified import VERIFIED

#: ONNX element types torch holds with NumPy's meaning. torch's uint16/32/64,
#: float8 and complex support is partial, bfloat16 has no NumPy twin that
#: torch.from_numpy reads, and strings do not exist in torch: all declined.
TORCH_TYPES = frozenset(
    {"float", "double", "float16", "int8", "int16", "int32", "int64", "uint8", "bool"}
)


@functools.cache
def native_kernels() -> KernelLibrary:
    """The torch-native kernels of ``onnxep_torch.ops``; their ops are always claimed."""
    from . import ops

    return KernelLibrary.from_package(ops)


def _truthy(value: Any) -> bool:
    return str(value).lower() in ("1", "true", "yes", "on")


class TorchProvider(Provider):
    """Nodes on torch tensors; ``options``: ``device`` (any torch device), ``unverified``."""

    def __init__(self, options: Mapping[str, Any] | None = None) -> None:
        opts = dict(options or {})
        self.torch_device = torch.device(str(opts.get("device", "cpu")))
        if self.torch_device.type == "cuda" and not torch.cuda.is_available():
            # Said at session creation, in one sentence, not at the first run.
            raise RuntimeError(
                f"torch device {str(self.torch_device)!r} is not available: this torch "
                f"({torch.__version__}) sees no CUDA device"
            )
        # The device string is what the core compares to decide where copies
        # go; it must differ from "cpu" (NumPy host memory) even when torch
        # runs on the CPU, since a torch tensor is not a NumPy array.
        super().__init__("torch", opts, device=f"torch:{self.torch_device}", xp=torch_xp)
        self.unverified = _truthy(opts.get("unverified", False))

    def claim(self, node: NodeInfo) -> Claim | Decline:
        reason = self._type_reason(node)
        if reason:
            return Decline(reason)
        key = (node.domain, node.op_type)
        known = self.registry.lookup(node.domain, node.op_type, node.opset) is not None
        if known and not self.unverified and key not in VERIFIED | native_kernels().op_types():
            return Decline(
                f"{node.op_type}: the generic kernel is not verified on torch "
                "(onnxep_torch/verified.py lists the ops that pass the node suite)"
            )
        res = super().claim(node)
        if isinstance(res, Claim) and self.torch_device.type != "cpu":
            # Kernels that create tensors (ConstantOfShape, Range) make them on
            # torch's default device; this moves such outputs where they belong.
            res = Claim(_on_device(res.fn, self.torch_device), res.spec)
        return res

    @staticmethod
    def _type_reason(node: NodeInfo) -> str | None:
        for kind, values in (("input", node.inputs), ("output", node.outputs)):
            for i, v in enumerate(values):
                if v is None:
                    continue
                if v.kind not in ("tensor", "sequence", "optional", "unknown"):
                    return f"{node.op_type}: {kind} {i} is a {v.kind}, which torch does not hold"
                if v.dtype is None:
                    continue
                try:
                    name = dtype_name(v.dtype)
                except ValueError:
                    name = str(v.dtype)
                if name not in TORCH_TYPES:
                    return f"{node.op_type}: {name} {kind} {i} is not supported on torch"
        return None

    def from_host(self, value: Any) -> Any:
        return to_torch(value, self.torch_device)

    def to_host(self, value: Any) -> Any:
        return to_numpy(value)

    def synchronize(self) -> None:
        if self.torch_device.type == "cuda":
            torch.cuda.synchronize(self.torch_device)


def _on_device(fn: Callable[..., tuple], device: torch.device) -> Callable[..., tuple]:
    def run(*args: Any) -> tuple:
        return tuple(o.to(device) if isinstance(o, torch.Tensor) else o for o in fn(*args))

    return run
