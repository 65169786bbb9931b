"""The torch peer: the same architecture and weights as a factory model, in PyTorch.

Factory models (``bench/factory``) record their architecture in the model's
metadata (``onnxep.factory`` and ``onnxep.config``); the weights come from the
model's own initializers, so both sides compute the same function.
"""

from __future__ import annotations

import json
from typing import Any


def factory_config(model_path: str) -> dict[str, Any] | None:
    import onnx

    proto = onnx.load(model_path, load_external_data=False)
    meta = {p.key: p.value for p in proto.metadata_props}
    if "onnxep.factory" not in meta:
        return None
    return {"kind": meta["onnxep.factory"], **json.loads(meta.get("onnxep.config", "{}"))}


def load_torch_peer(model_path: str, device: str = "cpu") -> Any:
    cfg = factory_config(model_path)
    if cfg is None:
        raise ValueError(
            f"{model_path} was not made by onnxep's model factory, so there is no torch "
            "version of it to compare against"
        )
    raise ValueError(f"no torch peer for factory model kind {cfg['kind']!r} yet")
