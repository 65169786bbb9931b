"""The ONNX backend node suite for one provider list: declines skip, the rest must match.

A case runs only when every compute node of its model lands on one of the
providers under test; otherwise it is skipped with the providers' own decline
reasons ("provider 'torch' declined Relu: ..."), so a provider that claims
little still gets a clean, honest report. A case that runs is compared with
the outputs the suite recorded, with the case's own tolerances, exactly as
onnx's ``BackendTest`` does. Cases listed in conformance_exclusions.toml (the
ones ``onnxep conformance`` counts as known failures) are skipped with their
reason, and a failure carries the traceback of what raised.
"""

from __future__ import annotations

import functools
import re
import traceback
import unittest
import warnings
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .conformance import _case_data, _case_model, exclusions, load_cases, select_cases

PASSED, FAILED, SKIPPED = "passed", "failed", "skipped"


@dataclass(frozen=True)
class CaseOutcome:
    """One case's result: ``status`` is ``passed``, ``failed`` or ``skipped``, with the reason.

    A failed case keeps the formatted ``traceback`` of what raised, and the
    exception itself as ``error``.
    """

    name: str
    status: str
    reason: str = ""
    ops: tuple[str, ...] = ()
    traceback: str = field(default="", repr=False)
    error: BaseException | None = field(default=None, repr=False, compare=False)


@functools.cache
def _cases(category: str) -> tuple[Any, ...]:
    return tuple(load_cases(category))


def _provider_name(entry: Any) -> str:
    return entry if isinstance(entry, str) else entry[0]


@dataclass
class BackendSuite:
    """The node cases selected for ``providers``; see :func:`backend_suite`."""

    providers: list[Any]
    cases: list[Any] = field(default_factory=list)
    exclude: Mapping[str, str] = field(default_factory=dict)

    @property
    def names(self) -> list[str]:
        return [c.name for c in self.cases]

    def _under_test(self, session: Any) -> set[str]:
        # Providers are named by the user's spelling (aliases, tuples); the
        # session's own names are what placement() reports.
        listed = {_provider_name(e).lower() for e in self.providers}
        own = session.get_providers()
        under = {p for p in own if p.lower() in listed}
        if not under:  # an alias: the first len(providers) of the session's list
            under = set(own[: len(self.providers)])
        return under

    def decline_reason(self, session: Any) -> str | None:
        """Why the providers under test did not take every node, or ``None`` if they did."""
        under = self._under_test(session)
        reasons: list[str] = []
        for n in session.placement():
            if n.role != "compute" or n.provider in under:
                continue
            why = [
                f"provider {p!r} declined {n.op_type}: {r.removeprefix(n.op_type + ': ')}"
                for p, r in n.declined
                if p in under
            ]
            reasons.append(why[0] if why else f"{n.op_type} ran on {n.provider!r}")
        if not reasons:
            return None
        unique = list(dict.fromkeys(reasons))
        more = f" (and {len(unique) - 3} more)" if len(unique) > 3 else ""
        return "; ".join(unique[:3]) + more

    def run(self, name: str) -> CaseOutcome:
        """Run one case by name (``test_abs``)."""
        case = self._by_name[name]
        return run_node_case(case, self.providers, self.decline_reason, self.exclude)

    def run_all(self) -> list[CaseOutcome]:
        return [self.run(c.name) for c in self.cases]

    def check(self, name: str, skip: Callable[[str], Any] | None = None) -> None:
        """Run one case: skip on a decline, ``AssertionError`` (caused by the failure) otherwise.

        The body of a parametrized pytest test. ``skip`` defaults to
        ``pytest.skip`` under pytest, else raises ``unittest.SkipTest``.
        """
        out = self.run(name)
        if out.status == SKIPPED:
            (skip or _default_skip())(out.reason)
            return
        if out.status == FAILED:
            # Chained, so pytest and unittest print the traceback of what raised.
            raise AssertionError(f"{name} on {self.providers}: {out.reason}") from out.error

    @functools.cached_property
    def _by_name(self) -> dict[str, Any]:
        return {c.name: c for c in self.cases}

    @property
    def test_cases(self) -> dict[str, type[unittest.TestCase]]:
        """One ``unittest.TestCase`` class, keyed by its name, with a ``test_*`` method per case.

        ``globals().update(backend_suite(["torch"]).test_cases)`` in a test
        file lets pytest or unittest collect it.
        """
        label = "_".join(re.sub(r"\W", "_", _provider_name(p)) for p in self.providers)
        cls_name = f"OnnxepNodeSuite_{label}"
        methods: dict[str, Callable[..., None]] = {}
        for case in self.cases:
            methods[case.name] = _method(self, case.name)
        return {cls_name: type(cls_name, (unittest.TestCase,), methods)}


def _default_skip() -> Callable[[str], Any]:
    import sys

    if "pytest" in sys.modules:
        return sys.modules["pytest"].skip

    def skip(reason: str) -> None:
        raise unittest.SkipTest(reason)

    return skip


def _method(suite: BackendSuite, name: str) -> Callable[[unittest.TestCase], None]:
    def test(self: unittest.TestCase) -> None:
        suite.check(name, skip=self.skipTest)

    test.__name__ = name
    return test


def run_node_case(
    case: Any,
    providers: Sequence[Any],
    decline_reason: Callable[[Any], str | None],
    exclude: Mapping[str, str] = {},  # noqa: B006 - read only
) -> CaseOutcome:
    from onnx.backend.test.runner import Runner

    from .errors import NotImplementedOp
    from .options import SessionOptions
    from .session import InferenceSession

    for pattern, why in exclude.items():
        if re.search(pattern, case.name):
            return CaseOutcome(case.name, SKIPPED, f"excluded: {why}")
    try:
        model = _case_model(case)
    except Exception as exc:
        return CaseOutcome(case.name, FAILED, f"load: {exc}")
    ops = tuple(sorted({n.op_type for n in model.graph.node}))
    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore")
        try:
            sess = InferenceSession(
                model,
                SessionOptions(log_severity_level=3, strict_providers=True),
                providers=list(providers),
            )
        except NotImplementedOp as exc:
            return CaseOutcome(case.name, SKIPPED, f"no provider can run it: {exc}", ops)
        except Exception as exc:
            why = f"session: {type(exc).__name__}: {exc}"
            return _failed(case.name, why, ops, exc)
        why = decline_reason(sess)
        if why is not None:
            return CaseOutcome(case.name, SKIPPED, why, ops)
        names = [i.name for i in model.graph.input]
        try:
            for ins, outs in _case_data(case):
                got = sess.run(None, dict(zip(names, ins)))
                Runner.assert_similar_outputs(outs, got, case.rtol, case.atol, case.model_dir)
        except Exception as exc:
            msg = " | ".join(f"{type(exc).__name__}: {exc}".strip().splitlines()[:8])
            return _failed(case.name, msg[:800], ops, exc)
    return CaseOutcome(case.name, PASSED, "", ops)


def _failed(name: str, reason: str, ops: tuple[str, ...], exc: BaseException) -> CaseOutcome:
    tb = "".join(traceback.format_exception(exc))
    return CaseOutcome(name, FAILED, reason, ops, tb, exc)


def backend_suite(
    providers: Sequence[Any],
    *,
    pattern: str | None = None,
    ops: Iterable[str] | None = None,
    sample: int | None = None,
    exclude: Mapping[str, str] | None = None,
    category: str = "node",
    default_exclusions: bool = True,
) -> BackendSuite:
    """The ONNX backend ``node`` cases for ``providers`` (names or ``(name, options)``).

    ``pattern`` keeps cases whose name matches the regex, ``ops`` those whose
    model uses one of the op types, ``sample`` every k-th of the rest so that
    about ``sample`` cases remain (a quick, stable cross-section), and
    ``exclude`` maps name regexes to reasons for cases to skip, on top of
    onnxep's own conformance exclusions for ``category`` (the cases the CPU
    reference cannot pass; ``default_exclusions=False`` runs them too). The
    CPU provider is appended by the session as usual, but a case only runs
    when the providers under test take every compute node.
    """
    chosen = select_cases(_cases(category), pattern, ops)
    if sample is not None and 0 < sample < len(chosen):
        step = len(chosen) / sample
        chosen = [chosen[int(i * step)] for i in range(sample)]
    skip = dict(exclusions().get(category, {})) if default_exclusions else {}
    skip.update(exclude or {})
    return BackendSuite(list(providers), chosen, skip)
