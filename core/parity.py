"""Comparing a model's outputs on some providers with a reference provider, per dtype.

Tolerances follow what each float format can hold: an fp16 kernel that
accumulates in a different order than NumPy differs in the last bits, and the
check must allow that without hiding a real bug. Integers, bools and strings
must match exactly, and NaN must meet NaN.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import ml_dtypes
import numpy as np

from .parity_coverage import Coverage, coverage_of

#: dtype -> (atol, rtol); an element passes when |got - ref| <= atol + rtol * |ref|.
TOLERANCES: dict[np.dtype, tuple[float, float]] = {
    np.dtype(np.float64): (1e-8, 1e-7),
    np.dtype(np.float32): (1e-5, 1e-4),
    np.dtype(np.float16): (2.5e-3, 1e-3),
    np.dtype(ml_dtypes.bfloat16): (2e-2, 1e-2),
}


def tolerance(dtype: np.dtype, rtol: float | None = None, atol: float | None = None):
    """``(atol, rtol)`` for ``dtype``: exact (0, 0) unless it is a float; overrides win."""
    dt = np.dtype(dtype)
    if dt in TOLERANCES:
        a, r = TOLERANCES[dt]
    elif dt.kind in "fc":
        a, r = (2e-2, 1e-2) if dt.itemsize <= 2 else TOLERANCES[np.dtype(np.float32)]
    else:
        return (0.0, 0.0)
    return (a if atol is None else atol, r if rtol is None else rtol)


@dataclass(frozen=True)
class OutputParity:
    """One output of one provider list against the reference.

    ``max_abs`` and ``max_rel`` are over all elements; ``worst`` is the index
    of the element furthest beyond its tolerance (or of the largest error when
    all pass); ``got`` and ``want`` are the values there. ``problem`` says what
    is wrong, empty when the output matches.
    """

    output: str
    providers: str
    reference: str
    dtype: str
    shape: tuple[int, ...]
    max_abs: float = 0.0
    max_rel: float = 0.0
    mismatches: int = 0
    worst: tuple[int, ...] | None = None
    got: Any = None
    want: Any = None
    atol: float = 0.0
    rtol: float = 0.0
    problem: str = ""

    @property
    def ok(self) -> bool:
        return not self.problem

    def describe(self) -> str:
        if self.ok:
            return (
                f"output {self.output!r} ({self.dtype} {list(self.shape)}): max abs error "
                f"{self.max_abs:.3g}, max rel error {self.max_rel:.3g}"
            )
        return (
            f"output {self.output!r} differs between {self.providers} and reference "
            f"{self.reference}: {self.problem}"
        )


@dataclass
class ParityReport:
    """Every output of every provider list against the reference, and how much of the model
    each list's provider ran; ``ok`` when all match and every coverage meets ``min_coverage``
    (None: the provider ran at least one compute node)."""

    reference: str
    results: list[OutputParity] = field(default_factory=list)
    #: provider list label -> the coverage of its first provider
    coverage: dict[str, Coverage] = field(default_factory=dict)
    min_coverage: float | None = None

    @property
    def ok(self) -> bool:
        return all(r.ok for r in self.results) and not self.coverage_problems

    @property
    def coverage_problems(self) -> list[str]:
        return [p for c in self.coverage.values() if (p := c.below(self.min_coverage))]

    @property
    def partial(self) -> list[Coverage]:
        """Coverages under all the compute nodes: the outputs agree partly by construction."""
        return [c for c in self.coverage.values() if c.ran < c.total]

    @property
    def failures(self) -> list[OutputParity]:
        return [r for r in self.results if not r.ok]

    def max_abs(self, output: str) -> float:
        return max(r.max_abs for r in self.results if r.output == output)

    def max_rel(self, output: str) -> float:
        return max(r.max_rel for r in self.results if r.output == output)

    def format(self) -> str:
        lines = [
            f"{'providers':16s} {'output':24s} {'dtype':9s} {'shape':16s} "
            f"{'max abs':>10s} {'max rel':>10s}  status"
        ]
        for r in self.results:
            status = "ok" if r.ok else f"MISMATCH ({r.mismatches} elements)"
            if r.problem and not r.mismatches:
                status = "MISMATCH"
            cov = self.coverage.get(r.providers)
            ran = cov.per_output.get(r.output) if cov is not None else None
            where = f"  [{ran[0]}/{ran[1]} nodes on {cov.provider}]" if ran else ""
            lines.append(
                f"{r.providers:16s} {r.output:24s} {r.dtype:9s} {str(list(r.shape)):16s} "
                f"{r.max_abs:10.3g} {r.max_rel:10.3g}  {status}{where}"
            )
        for r in self.failures:
            lines.append(r.describe())
        for label, cov in self.coverage.items():
            lines.append(f"{label}: {cov.summary()}")
        lines += [f"COVERAGE TOO LOW: {p}" for p in self.coverage_problems]
        return "\n".join(lines)

    __str__ = format


def _label(providers: Sequence[Any]) -> str:
    return ",".join(p if isinstance(p, str) else p[0] for p in providers)


def compare_output(
    name: str,
    got: Any,
    want: Any,
    providers: str,
    reference: str,
    rtol: float | None = None,
    atol: float | None = None,
) -> list[OutputParity]:
    """Compare one output; a sequence gives one entry per element (``name[i]``), a map
    (a dict, as ZipMap gives per row) one entry for its keys and values."""
    if isinstance(want, Mapping) or isinstance(got, Mapping):
        return [_compare_maps(name, got, want, providers, reference, rtol, atol)]
    if isinstance(want, (list, tuple)) or isinstance(got, (list, tuple)):
        if not isinstance(got, (list, tuple)) or not isinstance(want, (list, tuple)):
            return [_bad(name, providers, reference, f"got {_kind(got)}, want {_kind(want)}")]
        if len(got) != len(want):
            return [_bad(name, providers, reference, f"sequence of {len(got)}, want {len(want)}")]
        if want and all(isinstance(w, Mapping) for w in want):
            return [_compare_maps(name, got, want, providers, reference, rtol, atol)]
        out: list[OutputParity] = []
        for i, (g, w) in enumerate(zip(got, want)):
            out += compare_output(f"{name}[{i}]", g, w, providers, reference, rtol, atol)
        return out
    if want is None or got is None:
        if want is None and got is None:
            return [OutputParity(name, providers, reference, "none", ())]
        return [_bad(name, providers, reference, f"got {_kind(got)}, want {_kind(want)}")]
    return [
        _compare_arrays(name, np.asarray(got), np.asarray(want), providers, reference, rtol, atol)
    ]


def _compare_maps(name, got, want, providers, reference, rtol, atol) -> OutputParity:
    """Maps (or a sequence of them, as one entry: a classifier's ZipMap rows) match when
    they have the same keys, of the same Python types, and their values match as one
    array (float values at float32's tolerance: such maps hold per-class scores)."""
    many = isinstance(want, (list, tuple))
    w_rows, g_rows = [], []
    for i, (g, w) in enumerate(zip(got if many else [got], want if many else [want])):
        at = f" in map {i}" if many else ""
        if not isinstance(g, Mapping) or not isinstance(w, Mapping):
            return _bad(name, providers, reference, f"got {_kind(g)}, want {_kind(w)}{at}", "map")
        gk, wk = list(g), list(w)
        if set(gk) != set(wk) or {type(k) for k in gk} != {type(k) for k in wk}:
            problem = f"keys {sorted(gk, key=repr)!r}, want {sorted(wk, key=repr)!r}{at}"
            return _bad(name, providers, reference, problem, "map")
        w_rows += [w[k] for k in wk]  # maps may differ in size: all values, flat
        g_rows += [g[k] for k in wk]
    w, g = np.asarray(w_rows), np.asarray(g_rows)
    if w.dtype.kind == "f":
        w, g = w.astype(np.float32), g.astype(np.float32)
    r = _compare_arrays(name, g, w, providers, reference, rtol, atol)
    return dataclasses.replace(r, dtype=f"map:{r.dtype}")


def _kind(x: Any) -> str:
    if x is None:
        return "None"
    if isinstance(x, Mapping):
        return f"a map of {len(x)}"
    if isinstance(x, (list, tuple)):
        return f"a sequence of {len(x)}"
    return f"an array {np.asarray(x).dtype} {list(np.shape(x))}"


def _bad(
    name: str,
    providers: str,
    reference: str,
    problem: str,
    dtype: str = "?",
    shape: tuple[int, ...] = (),
) -> OutputParity:
    """A mismatch that has no worst element: kinds, lengths, dtypes or shapes differ."""
    return OutputParity(name, providers, reference, dtype, shape, problem=problem)


def _compare_arrays(name, got, want, providers, reference, rtol, atol) -> OutputParity:
    dt = str(want.dtype)
    shape = tuple(want.shape)
    if got.dtype != want.dtype and not (got.dtype.kind in "UO" and want.dtype.kind in "UO"):
        return _bad(
            name,
            providers,
            reference,
            f"dtype {got.dtype}, want {want.dtype}",
            dtype=dt,
            shape=shape,
        )
    if got.shape != want.shape:
        return _bad(
            name,
            providers,
            reference,
            f"shape {list(got.shape)}, want {list(shape)}",
            dtype=dt,
            shape=shape,
        )
    if want.size == 0:
        return OutputParity(name, providers, reference, dt, shape)
    if want.dtype.kind not in "fc":
        return _exact(name, got, want, providers, reference, dt, shape)
    a, r = tolerance(want.dtype, rtol, atol)
    g = got.astype(np.float64) if want.dtype.kind == "f" else got.astype(np.complex128)
    w = want.astype(np.float64) if want.dtype.kind == "f" else want.astype(np.complex128)
    g_nan, w_nan = np.isnan(g), np.isnan(w)
    with np.errstate(all="ignore"):
        diff = np.abs(g - w)
        # Equal infinities subtract to NaN: they match. NaN must meet NaN.
        same_inf = np.isinf(w) & (g == w)
        diff = np.where(same_inf | (g_nan & w_nan), 0.0, diff)
        diff = np.where(g_nan ^ w_nan, np.inf, diff)
        allowed = a + r * np.abs(np.where(np.isfinite(w), w, 0.0))
        rel = np.where(diff == 0, 0.0, diff / np.abs(w))
        bad = diff > allowed
        excess = np.where(bad, diff / np.maximum(allowed, np.finfo(np.float64).tiny), 0.0)
    max_abs = float(np.max(diff))
    max_rel = float(np.nanmax(rel)) if np.any(~np.isnan(rel)) else 0.0
    n_bad = int(np.count_nonzero(bad))
    flat = int(np.argmax(excess)) if n_bad else int(np.argmax(diff))
    idx = tuple(int(i) for i in np.unravel_index(flat, shape)) if shape else ()
    gv, wv = got[idx].item(), want[idx].item()
    problem = ""
    if n_bad:
        problem = (
            f"{n_bad} of {want.size} elements out of tolerance ({dt}: atol {a:g}, rtol {r:g}); "
            f"worst at index {idx}: {gv!r} ({providers}) vs {wv!r} ({reference}), "
            f"abs error {float(diff[idx]):.3g}"
        )
    return OutputParity(
        name, providers, reference, dt, shape, max_abs, max_rel, n_bad, idx, gv, wv, a, r, problem
    )


def _exact(name, got, want, providers, reference, dt, shape) -> OutputParity:
    neq = got != want
    n_bad = int(np.count_nonzero(neq))
    if not n_bad:
        return OutputParity(name, providers, reference, dt, shape)
    flat = int(np.argmax(neq.reshape(-1)))
    idx = tuple(int(i) for i in np.unravel_index(flat, shape)) if shape else ()
    gv, wv = got[idx], want[idx]
    gv = gv.item() if hasattr(gv, "item") else gv
    wv = wv.item() if hasattr(wv, "item") else wv
    try:
        max_abs = float(np.max(np.abs(got.astype(np.float64) - want.astype(np.float64))))
    except (TypeError, ValueError):
        max_abs = float("nan")
    problem = (
        f"{n_bad} of {want.size} elements differ ({dt} must match exactly); first at index "
        f"{idx}: {gv!r} ({providers}) vs {wv!r} ({reference})"
    )
    return OutputParity(
        name, providers, reference, dt, shape, max_abs, 0.0, n_bad, idx, gv, wv, problem=problem
    )


def _provider_lists(providers: Any) -> list[list[Any]]:
    """``"torch"``, ``["torch", "cpu"]`` or ``[["torch"], ["cuda"]]`` as a list of lists."""
    if isinstance(providers, str) or (
        isinstance(providers, tuple) and len(providers) == 2 and isinstance(providers[1], dict)
    ):
        return [[providers]]
    items = list(providers)
    if items and all(isinstance(p, list) for p in items):
        return items
    return [items]


def parity_report(
    model: Any,
    providers: Any,
    reference: Sequence[Any] = ("cpu",),
    inputs: Mapping[str, Any] | None = None,
    dims: Mapping[str, int] | None = None,
    seed: int = 0,
    rtol: float | None = None,
    atol: float | None = None,
    shapes: Mapping[str, Sequence[int]] | None = None,
    int_ranges: Mapping[str, tuple[int, int]] | None = None,
    min_coverage: float | None = None,
) -> ParityReport:
    """Run ``model`` on each provider list and on ``reference``; compare every output.

    ``inputs`` are used as they are; inputs they leave out are random (``dims``,
    ``shapes``, ``int_ranges`` shape them, as in ``random_inputs``)."""
    from .options import SessionOptions
    from .random_inputs import random_inputs
    from .session import InferenceSession

    # A provider under test that is missing here is an error, never a quiet CPU-against-CPU run.
    quiet = SessionOptions(log_severity_level=3, strict_providers=True)
    ref_sess = InferenceSession(model, sess_options=quiet, providers=list(reference))
    feeds = random_inputs(
        ref_sess, dims, seed=seed, shapes=shapes, int_ranges=int_ranges, given=inputs
    )
    names = [o.name for o in ref_sess.get_outputs()]
    # NaN and inf are values to compare here, not accidents to warn about.
    with np.errstate(all="ignore"):
        want = ref_sess.run(None, feeds)
    ref_label = _label(reference)
    report = ParityReport(ref_label, min_coverage=_fraction(min_coverage))
    for plist in _provider_lists(providers):
        sess = InferenceSession(model, sess_options=quiet, providers=plist)
        with np.errstate(all="ignore"):
            got = sess.run(None, feeds)
        label = _label(plist)
        report.coverage[label] = coverage_of(sess)
        for name, g, w in zip(names, got, want):
            report.results += compare_output(name, g, w, label, ref_label, rtol, atol)
    return report


def _fraction(min_coverage: float | None) -> float | None:
    if min_coverage is None:
        return None
    if isinstance(min_coverage, bool) or not 0.0 <= float(min_coverage) <= 1.0:
        from .errors import InvalidArgument

        raise InvalidArgument(
            f"min_coverage must be a fraction from 0 to 1 (1: every compute node), got "
            f"{min_coverage!r}"
        )
    return float(min_coverage)


def warn_partial(report: ParityReport, stacklevel: int = 3) -> None:
    """One loud warning per provider that ran less than every compute node."""
    import warnings

    for cov in report.partial:
        warnings.warn(
            f"parity: {cov.summary()}\nthe outputs behind the nodes that fell back agree by "
            "construction; set min_coverage (strict: 1.0) to fail on it",
            UserWarning,
            stacklevel=stacklevel,
        )


def assert_parity(
    model: Any,
    providers: Any,
    reference: Sequence[Any] = ("cpu",),
    inputs: Mapping[str, Any] | None = None,
    dims: Mapping[str, int] | None = None,
    seed: int = 0,
    rtol: float | None = None,
    atol: float | None = None,
    min_coverage: float | None = None,
    strict: bool = False,
) -> ParityReport:
    """Fail with the worst element of every mismatching output, or when the provider under
    test ran too little of the model; else return the report (warning when it ran less
    than all of it).

    ``providers`` is one provider list (``["torch"]``) or several
    (``[["torch"], ["cuda"]]``); ``inputs`` default to ``random_inputs`` with
    ``dims`` and ``seed``; ``rtol``/``atol`` override the per-dtype tolerances
    of float outputs (integers, bools and strings always match exactly).
    ``min_coverage`` is the fraction of compute nodes the first provider of each list
    must run (default: at least one); ``strict`` asks for all of them.
    """
    report = parity_report(
        model,
        providers,
        reference,
        inputs,
        dims,
        seed,
        rtol,
        atol,
        min_coverage=1.0 if strict else min_coverage,
    )
    if not report.ok:
        problems = [r.describe() for r in report.failures] + report.coverage_problems
        raise AssertionError("\n".join(problems))
    warn_partial(report)
    return report
