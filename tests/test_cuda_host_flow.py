"""The CUDA provider's If/Loop/Scan are the generic host orchestration, registered alike."""

import importlib

import numpy as np
import pytest

from onnxep.providers.kernel import KernelLibrary


def _specs(package: str, module: str) -> list[dict]:
    lib = KernelLibrary.from_module(importlib.import_module(f"{package}.{module}"))
    return [{**s.__dict__, "builder": None} for s in lib]


@pytest.mark.parametrize("module", ["op_if", "op_loop", "op_scan"])
def test_cuda_control_flow_registers_as_the_generic_kernel(module):
    cuda = _specs("onnxep.providers_cuda.ops", module)
    assert cuda, f"providers_cuda.ops.{module} registers no kernel"
    assert cuda == _specs("onnxep.providers.ops", module)


def test_cuda_control_flow_builds_the_generic_kernel_with_numpy():
    from onnxep.providers_cuda.ops import op_if

    seen = []

    class Node:
        num_inputs = 1

        def subgraph(self, name):
            seen.append(name)
            return type("G", (), {"run": lambda self, a, b: [np.array(name)]})()

    run = op_if.if_(Node(), xp=None)  # a device array module must never reach the builder
    assert run(np.array(False)) == (np.array("else_branch"),)
    assert seen == ["then_branch", "else_branch"]
