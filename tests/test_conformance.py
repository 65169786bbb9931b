"""The official ONNX backend test suite, run against onnxep.tools.backend with providers=["cpu"].

Cases listed in onnxep's conformance_exclusions.toml are excluded (each has its
reason there); every other node, simple, pytorch-converted and
pytorch-operator case must pass.
"""

from __future__ import annotations

import warnings

import numpy as np
import onnx.backend.test

from onnxep.tools.backend import OnnxepBackend
from onnxep.tools.conformance import exclusions

warnings.filterwarnings("ignore", category=RuntimeWarning)
np.seterr(all="ignore")

_backend_test = onnx.backend.test.BackendTest(OnnxepBackend, __name__)
for _category, _patterns in exclusions().items():
    for _pattern in _patterns:
        # Exclusion keys match case names without the device suffix BackendTest adds.
        _anchored = _pattern[:-1] if _pattern.endswith("$") else f"{_pattern}.*"
        _backend_test.exclude(f"{_anchored}_(cpu|cuda)$")

_cases = _backend_test.test_cases
# The "real" category downloads models from the network; CI has none to give.
for _name in (
    "OnnxBackendNodeModelTest",
    "OnnxBackendSimpleModelTest",
    "OnnxBackendPyTorchConvertedModelTest",
    "OnnxBackendPyTorchOperatorModelTest",
):
    globals()[_name] = _cases[_name]
