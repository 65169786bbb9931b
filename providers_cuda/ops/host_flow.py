"""Control flow on the CUDA provider: the generic host orchestration, re-registered.

As in onnxruntime's CUDA provider, the control-flow node belongs to the
device provider while its values cross the subgraph boundary in host memory
(every input and output is declared host-side); the body is placed with the
session's providers, so its nodes run on the GPU like any other. The generic
builder is reused as it is, built with NumPy since everything it touches is
on the host, and keeps its registrations (versions, host slots, capture note),
so the two providers cannot drift apart.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import numpy as np

from onnxep.providers.kernel import SPECS_ATTR, Builder
from onnxep.providers.node import NodeInfo


def on_host(generic: Builder, module: str) -> Builder:
    """``generic``'s builder and kernel registrations, owned by the op module ``module``.

    The kernel library collects only builders defined in the module it reads,
    hence the module name; the builder ignores the provider's array module.
    """

    @functools.wraps(generic)
    def build(node: NodeInfo, xp: Any):
        return generic(node, np)

    build.__module__ = module
    specs = [dataclasses.replace(s, builder=build) for s in getattr(generic, SPECS_ATTR)]
    setattr(build, SPECS_ATTR, specs)
    return build
