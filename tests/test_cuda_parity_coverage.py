"""Every op the CUDA provider claims has a GPU parity case (checked without CuPy or a GPU).

The claimed set is derived statically (op modules of the generic library and
of providers_cuda, minus the decline table); the GPU test
tests/cuda/test_parity.py iterates the same table.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import onnx
import pytest

from onnxep.providers_cuda.declines import DECLINED_OPS, claimed_ops

CUDA_TESTS = Path(__file__).resolve().parent / "cuda"


def _load(name):
    spec = importlib.util.spec_from_file_location(f"coverage_{name}", CUDA_TESTS / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def cases():
    sys.path.insert(0, str(CUDA_TESTS))
    try:
        return _load("parity_cases")
    finally:
        sys.path.remove(str(CUDA_TESTS))


def test_every_claimed_op_has_a_parity_case(cases):
    table = cases.table()
    missing = [
        cases.op_key(d, o)
        for d, o in sorted(claimed_ops())
        if not table.get(cases.op_key(d, o)) and cases.op_key(d, o) not in cases.FOLDED
    ]
    assert not missing, f"claimed ops without a parity case (run make_parity_table.py): {missing}"


def test_the_table_names_only_claimed_ops(cases):
    claimed = {cases.op_key(d, o) for d, o in claimed_ops()}
    stale = sorted(set(cases.table()) - claimed)
    assert not stale, f"parity entries for ops the CUDA provider does not claim: {stale}"


@pytest.mark.slow  # onnx 1.23 builds the node suite in memory: about a minute
def test_every_case_exists_and_uses_its_op(cases):
    suite = cases.node_cases()
    custom = cases.custom().CASES
    for key, entries in cases.table().items():
        domain, op = key.split("::")
        for case, dtype in entries:
            assert dtype in ("float32", "float16"), (key, case, dtype)
            if case.startswith("custom:"):
                assert case.removeprefix("custom:") == key and key in custom, (key, case)
                continue
            assert case in suite, f"{key}: node case {case!r} is not in onnx {onnx.__version__}"
            model, _ = cases.node_case(case, "float32")
            used = {(n.domain or "", n.op_type) for n in model.graph.node}
            assert (domain, op) in used, f"{key}: {case} does not use the op"


def test_declined_ops_have_kernels():
    from onnxep.providers import KernelLibrary

    known = KernelLibrary.from_package("onnxep.providers.ops").op_types()
    stale = [op for op in DECLINED_OPS if op not in known]
    assert not stale, f"decline entries for ops with no kernel: {stale}"
    assert not claimed_ops() & set(DECLINED_OPS)
