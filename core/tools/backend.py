"""``onnxep.tools.backend``: an ``onnx.backend.base.Backend`` running through InferenceSession.

It lets the official ``onnx.backend.test.BackendTest`` run against any
provider list: ``prepare(model, device, providers=[...])``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import onnx
from onnx.backend.base import Backend, BackendRep

from ..options import SessionOptions
from ..plugins.registration import get_available_providers
from ..session import InferenceSession


class OnnxepBackendRep(BackendRep):
    def __init__(self, session: InferenceSession, input_names: Sequence[str]) -> None:
        self.session = session
        self.input_names = list(input_names)

    def run(self, inputs: Any, **kwargs: Any) -> tuple[Any, ...]:
        if isinstance(inputs, dict):
            feeds = dict(inputs)
        else:
            if isinstance(inputs, np.ndarray):
                inputs = [inputs]
            feeds = dict(zip(self.input_names, inputs))
        return tuple(self.session.run(None, feeds))


class OnnxepBackend(Backend):
    """Backend over InferenceSession; ``providers`` defaults to ``["cpu"]``."""

    default_providers: Sequence[str] = ("cpu",)

    @classmethod
    def is_compatible(cls, model: onnx.ModelProto, device: str = "CPU", **kwargs: Any) -> bool:
        return True

    @classmethod
    def supports_device(cls, device: str) -> bool:
        dev = device.upper()
        if dev == "CPU":
            return True
        if dev == "CUDA":
            return "cuda" in get_available_providers()
        return False

    @classmethod
    def prepare(
        cls,
        model: onnx.ModelProto | bytes | str,
        device: str = "CPU",
        providers: Sequence[Any] | None = None,
        sess_options: SessionOptions | None = None,
        **kwargs: Any,
    ) -> OnnxepBackendRep:
        if providers is None:
            providers = ["cuda", "cpu"] if device.upper() == "CUDA" else list(cls.default_providers)
        sess = InferenceSession(model, sess_options=sess_options, providers=providers)
        proto = model if isinstance(model, onnx.ModelProto) else None
        if proto is not None:
            names = [i.name for i in proto.graph.input]
        else:
            names = sess.compiled.input_names
        return OnnxepBackendRep(sess, names)

    @classmethod
    def run_model(
        cls, model: onnx.ModelProto, inputs: Any, device: str = "CPU", **kwargs: Any
    ) -> tuple[Any, ...]:
        return cls.prepare(model, device, **kwargs).run(inputs)


prepare = OnnxepBackend.prepare
run_model = OnnxepBackend.run_model
supports_device = OnnxepBackend.supports_device
