"""Running the ONNX backend test cases through a provider list and counting results.

``onnxep conformance`` prints what this returns; the test suite runs the
official ``BackendTest`` instead, with the same exclusion file.
"""

from __future__ import annotations

import re
import warnings
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

CATEGORIES = ("node", "simple", "pytorch-converted", "pytorch-operator")


def exclusions() -> dict[str, dict[str, str]]:
    """``{category: {regex: reason}}`` from the package's conformance_exclusions.toml."""
    import tomllib
    from pathlib import Path

    path = Path(__file__).resolve().parent.parent / "data" / "conformance_exclusions.toml"
    with open(path, "rb") as f:
        return tomllib.load(f)


def excluded_reason(name: str, category: str) -> str | None:
    for pattern, reason in exclusions().get(category, {}).items():
        if re.search(pattern, name):
            return reason
    return None


@dataclass
class CaseResult:
    name: str
    category: str
    ok: bool
    reason: str = ""
    ops: tuple[str, ...] = ()


def _normalize(x: Any) -> Any:
    from onnx import TensorProto, numpy_helper

    if isinstance(x, TensorProto):
        return numpy_helper.to_array(x)
    return x


def load_cases(category: str) -> list[Any]:
    from onnx.backend.test.loader import load_model_tests

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return load_model_tests(kind=category)


def case_model(case: Any) -> Any:
    import os

    import onnx

    if case.model is not None:
        return case.model
    path = os.path.join(case.model_dir, "model.onnx")
    return onnx.load(path)


def case_data(case: Any) -> list[tuple[list, list]]:
    import glob
    import os

    import onnx
    from onnx import numpy_helper

    if case.data_sets is not None:
        return [
            ([_normalize(i) for i in ins], [_normalize(o) for o in outs])
            for ins, outs in case.data_sets
        ]
    sets = []
    for d in sorted(glob.glob(os.path.join(case.model_dir, "test_data_set*"))):
        ins, outs = [], []
        for kind, dest in (("input", ins), ("output", outs)):
            for f in sorted(
                glob.glob(os.path.join(d, f"{kind}_*.pb")),
                key=lambda p: int(re.findall(r"_(\d+)\.pb$", p)[0]),
            ):
                t = onnx.TensorProto()
                with open(f, "rb") as fh:
                    t.ParseFromString(fh.read())
                dest.append(numpy_helper.to_array(t))
        sets.append((ins, outs))
    return sets


def run_case(case: Any, category: str, providers: Sequence[Any], repeat: int = 1) -> CaseResult:
    """Run one case; ``repeat`` > 1 also checks the later runs (generated code, shape cache)."""
    from onnx.backend.test.runner import Runner

    from .backend import OnnxepBackend

    try:
        model = case_model(case)
        ops = tuple(sorted({n.op_type for n in model.graph.node}))
    except Exception as exc:
        return CaseResult(case.name, category, False, f"load: {exc}")
    try:
        with warnings.catch_warnings(), np.errstate(all="ignore"):
            warnings.simplefilter("ignore")
            rep = OnnxepBackend.prepare(model, providers=list(providers))
            for ins, outs in case_data(case):
                for _ in range(repeat):
                    got = rep.run(ins)
                    Runner.assert_similar_outputs(outs, got, case.rtol, case.atol, case.model_dir)
    except Exception as exc:
        msg = f"{type(exc).__name__}: {exc}".strip().splitlines()
        return CaseResult(case.name, category, False, " | ".join(msg[:6])[:600], ops)
    return CaseResult(case.name, category, True, "", ops)


def select_cases(
    cases: Iterable[Any], pattern: str | None = None, ops: Iterable[str] | None = None
) -> list[Any]:
    """Cases whose name matches ``pattern`` and whose model uses one of ``ops``."""
    rx = re.compile(pattern) if pattern else None
    want = set(ops) if ops is not None else None
    chosen = []
    for case in cases:
        if rx is not None and not rx.search(case.name):
            continue
        if want is not None:
            try:
                names = {n.op_type for n in case_model(case).graph.node}
            except Exception:
                names = set()
            if not names & want:
                continue
        chosen.append(case)
    return chosen


def run_suite(
    providers: Sequence[Any] = ("cpu",),
    categories: Iterable[str] = ("node",),
    pattern: str | None = None,
    ops: Iterable[str] | None = None,
) -> list[CaseResult]:
    results = []
    for cat in categories:
        for case in select_cases(load_cases(cat), pattern, ops or None):
            results.append(run_case(case, cat, providers))
    return results
