"""onnxep's parity kit: what a provider author needs to test a provider.

- :func:`assert_parity` runs a model on providers and on a reference and
  compares every output with per-dtype tolerances;
- :func:`random_inputs` makes feeds from a model's declared inputs;
- :func:`backend_suite` runs the ONNX backend node suite for a provider,
  skipping (with the decline reason) the cases it does not take whole.

The pytest plugin (``onnxep.tools.pytest_plugin``, loaded automatically) adds
``--onnxep-providers`` and the ``onnxep_provider`` fixture.
"""

from .tools.node_suite import BackendSuite, CaseOutcome, backend_suite
from .tools.parity import (
    TOLERANCES,
    OutputParity,
    ParityReport,
    assert_parity,
    compare_output,
    parity_report,
    tolerance,
)
from .tools.random_inputs import random_inputs

__all__ = [
    "TOLERANCES",
    "BackendSuite",
    "CaseOutcome",
    "OutputParity",
    "ParityReport",
    "assert_parity",
    "backend_suite",
    "compare_output",
    "parity_report",
    "random_inputs",
    "tolerance",
]
