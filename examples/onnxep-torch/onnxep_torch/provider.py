"""The torch provider: claims the nodes it can run on torch tensors, declines the rest."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import array_api_compat.torch as torch_xp
import torch

from onnxep.providers import Claim, Decline, NodeInfo, Provider, dtype_name

from .convert import to_numpy, to_torch
from .verified import NATIVE, VERIFIED

#: ONNX element types torch holds with NumPy's meaning. torch's uint16/32/64,
#: float8 and complex support is partial, bfloat16 has no NumPy twin that
#: torch.from_numpy reads, and strings do not exist in torch: all declined.
TORCH_TYPES = frozenset(
    {"float", "double", "float16", "int8", "int16", "int32", "int64", "uint8", "bool"}
)


def _truthy(value: Any) -> bool:
    return str(value).lower() in ("1", "true", "yes", "on")


class TorchProvider(Provider):
    """Nodes on torch tensors; ``options``: ``device`` (any torch device), ``unverified``."""

    def __init__(self, options: Mapping[str, Any] | None = None) -> None:
        opts = dict(options or {})
        self.torch_device = torch.device(str(opts.get("device", "cpu")))
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
        if key not in NATIVE and key not in VERIFIED and not self.unverified:
            return Decline(
                f"{node.op_type}: the generic kernel is not verified on torch "
                "(onnxep_torch/verified.py lists the ops that pass the node suite)"
            )
        return super().claim(node)

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
