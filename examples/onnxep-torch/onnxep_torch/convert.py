"""Moving values between NumPy (onnxep's host memory) and torch tensors.

Only dtypes both libraries carry the same way cross; the provider declines
nodes touching any other (see ``provider.TORCH_TYPES``).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch


def to_torch(value: Any, device: torch.device) -> Any:
    """A host value (array, scalar, sequence of arrays, ``None``) as torch tensors on ``device``."""
    if value is None or isinstance(value, torch.Tensor):
        return value if value is None else value.to(device)
    if isinstance(value, (list, tuple)):
        return [to_torch(v, device) for v in value]
    arr = np.asarray(value)
    # torch.from_numpy shares memory and warns on read-only arrays (constants
    # are read-only); a copy keeps the plan's constants safe from torch ops.
    if not arr.flags.writeable or not arr.flags.c_contiguous:
        arr = np.ascontiguousarray(arr).copy()
    return torch.from_numpy(arr).to(device)


def to_numpy(value: Any) -> Any:
    """A torch value (tensor, sequence of tensors, ``None``) back in host memory."""
    if isinstance(value, torch.Tensor):
        return value.detach().cpu().numpy()
    if isinstance(value, (list, tuple)):
        return [to_numpy(v) for v in value]
    return value
