"""Running a plan: a tight loop over steps, with per-run slots so threads never share state."""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager, ExitStack
from typing import Any

import numpy as np

from onnxep.providers.bounds import OutOfBounds
from onnxep.providers.dtypes import dtype_name

from ..compile.plan import SINK_SLOT, Plan, Step
from ..errors import BoundsError, RunError, with_cause
from .aliasing import apply_rules, keeps_output, output_rules, root_ids
from .codegen import ShapeCache, straight_line
from .profiling import Profiler

#: A provider's name and its ``run_context`` method.
RunContext = tuple[str, Callable[[], "AbstractContextManager[Any] | None"]]


def _step_error(step: Step, exc: BaseException) -> RunError:
    if isinstance(exc, OutOfBounds):  # the sentence says it all; the node goes in front
        return BoundsError(f"{step.op_type} node {step.name!r}: {exc}")
    return RunError(
        f"{step.op_type} node {step.name!r} on provider {step.provider!r} failed: "
        f"{with_cause(exc, limit=4000)}"
    )


def _check_result(step: Step, res: Any, names: Sequence[str]) -> None:
    """Raise if a kernel's result is not a tuple, or has other element types than the model's."""
    if res.__class__ is not tuple and res.__class__ is not list:
        raise TypeError(f"kernel returned {type(res).__name__}, expected a tuple")
    wrong = _wrong_dtype(step, res, names)
    if wrong is not None:
        raise wrong


def _wrong_dtype(step: Step, res: Sequence[Any], names: Sequence[str]) -> RunError | None:
    """An error if a kernel's output has another element type than the model says."""
    for j, (want, x) in enumerate(zip(step.out_dtypes, res)):
        got = getattr(x, "dtype", None)
        if want is None or step.outputs[j] == SINK_SLOT or not isinstance(got, np.dtype):
            continue  # unknown type, omitted output, sequence, or a non-NumPy dtype
        if got == want or (want.kind == "O" and got.kind in "OUS"):
            continue
        return RunError(
            f"{step.op_type} node {step.name!r} on provider {step.provider!r} returned "
            f"{got} for output {j} ({names[step.outputs[j]]!r}), but the model's type there "
            f"is {dtype_name(want)} ({want}): the kernel ({step.kernel or 'a copy'}) or the "
            "model's declared type is wrong"
        )
    return None


def _context_error(name: str, exc: BaseException) -> RunError:
    return RunError(
        f"provider {name!r} could not set up its run context: {type(exc).__name__}: {exc}"
    )


class _Variant:
    """One plan's run state: checked on its first run, then generated straight-line code."""

    __slots__ = ("plan", "steps", "fast", "lines", "shape_cache", "rules", "const_roots")

    def __init__(self, plan: Plan, protect_feeds: bool) -> None:
        self.plan = plan
        self.steps = tuple((s.fn, s.inputs, s.outputs, s.frees) for s in plan.steps)
        self.fast: Any = None
        self.lines: dict[int, int] = {}
        self.shape_cache = ShapeCache()
        self.rules = output_rules(plan, protect_feeds)
        self.const_roots = root_ids([c for c in plan.template if c is not None])

    def compile_code(self) -> None:
        self.fast, self.lines = straight_line(
            self.plan, self.shape_cache, self.rules, self.const_roots
        )

    def outputs(self, slots: Sequence[Any], feeds: Sequence[Any], kept: set[int]) -> list[Any]:
        outs = [slots[s] for s in self.plan.output_slots]
        return apply_rules(self.rules, outs, feeds, self.const_roots, frozenset(kept))


class Executor:
    """Runs one compiled :class:`Plan`; safe to call from many threads at once.

    With a profiler, each step is timed (after synchronizing its provider's
    device, so a step's time is its own) and recorded as a trace event.
    ``contexts`` are entered around every run, in order: the providers that
    need a device, stream or pool made current for the calling thread.
    Outputs never share memory with the feeds (unless ``protect_feeds`` is off,
    for a subgraph whose parent guards them), the plan's constants or values
    kept across runs (see aliasing).
    """

    def __init__(
        self,
        plan: Plan,
        profiler: Profiler | None = None,
        sync: dict | None = None,
        contexts: Sequence[RunContext] = (),
        protect_feeds: bool = True,
    ) -> None:
        self.plan = plan
        self.profiler = profiler
        self._sync = sync or {}
        self.contexts = tuple(contexts)
        self._protect_feeds = protect_feeds
        self._host = _Variant(plan, protect_feeds)
        self._device: _Variant | None = None  # built on the first run_on_device
        self._device_shared: _Variant | None = None  # run_on_device(protect_feeds=False)
        self.shape_cache = self._host.shape_cache
        #: the output rules of host runs (aliasing: which outputs are copied, and why)
        self.rules = self._host.rules

    def run(self, feeds: Sequence[Any]) -> list[Any]:
        """Run the plan; every output is in host memory."""
        if self.contexts:
            return self._run_in_contexts(self._host, feeds)
        return self._run(self._host, feeds)

    def run_on_device(self, feeds: Sequence[Any], protect_feeds: bool = True) -> list[Any]:
        """Run the plan, leaving each output in the memory of the provider that made it.

        ``protect_feeds=False`` hands back an output that shares a feed's memory as it is:
        IO binding asks for it when one buffer is bound as both an input and an output
        (a KV cache whose present is its past), and guards the other outputs itself.
        """
        if protect_feeds or not self._protect_feeds:
            variant = self._device
            if variant is None:
                variant = self._device = _Variant(self.plan.on_device(), self._protect_feeds)
        else:
            variant = self._device_shared
            if variant is None:
                variant = self._device_shared = _Variant(self.plan.on_device(), False)
        if self.contexts:
            return self._run_in_contexts(variant, feeds)
        return self._run(variant, feeds)

    def _run_in_contexts(self, v: _Variant, feeds: Sequence[Any]) -> list[Any]:
        # One context (the CPU provider's BLAS threads) is the common case, and a run of a
        # small model is a few microseconds: an ExitStack per run cost 1 us of that.
        if len(self.contexts) != 1:
            with self.enter_contexts():
                return self._run(v, feeds)
        name, make = self.contexts[0]
        try:
            cm = make()
            if cm is not None:
                cm.__enter__()
        except Exception as exc:
            raise _context_error(name, exc) from exc
        if cm is None:
            return self._run(v, feeds)
        try:
            out = self._run(v, feeds)
        except BaseException:
            if not cm.__exit__(*sys.exc_info()):
                raise
            return None  # type: ignore[return-value]  # suppressed, as ``with`` would
        cm.__exit__(None, None, None)
        return out

    def _run(self, v: _Variant, feeds: Sequence[Any]) -> list[Any]:
        if self.profiler is not None:
            return self._run_profiled(v, feeds)
        fast = v.fast
        if fast is None:
            # The first run goes through the checked loop, which catches a kernel that
            # returns a bare array instead of a tuple; later runs use generated code.
            out = self._run_checked(v, feeds)
            v.compile_code()
            return out
        try:
            return fast(feeds)
        except BoundsError:
            raise  # names the node whose value was out of range (a device's record says so)
        except Exception as exc:
            raise self._error(v, exc) from exc

    def enter_contexts(self) -> ExitStack:
        stack = ExitStack()
        for name, make in self.contexts:
            try:
                cm = make()
                if cm is not None:
                    stack.enter_context(cm)
            except Exception as exc:
                stack.close()
                raise _context_error(name, exc) from exc
        return stack

    def _error(self, v: _Variant, exc: BaseException) -> RunError:
        tb = exc.__traceback__
        index = None
        while tb is not None:
            if tb.tb_frame.f_code.co_filename == "<onnxep plan>":
                index = v.lines.get(tb.tb_lineno)
            tb = tb.tb_next
        if index is None:
            return RunError(f"the plan failed: {with_cause(exc, limit=4000)}")
        return _step_error(v.plan.steps[index], exc)

    def _run_checked(self, v: _Variant, feeds: Sequence[Any]) -> list[Any]:
        """A run that checks each kernel's result: a tuple, of the element types the model says."""
        slots = v.plan.template.copy()
        for s, x in zip(v.plan.input_slots, feeds):
            slots[s] = x
        names = v.plan.slot_names
        kept: set[int] = set()
        index = 0
        try:
            for index, (fn, ins, outs, frees) in enumerate(v.steps):  # noqa: B007
                res = fn(*[slots[i] for i in ins])
                step = v.plan.steps[index]
                _check_result(step, res, names)
                if keeps_output(step):
                    kept.update(root_ids(res))
                for s, x in zip(outs, res):
                    slots[s] = x
                for s in frees:
                    slots[s] = None
        except RunError:
            raise
        except Exception as exc:
            raise _step_error(v.plan.steps[index], exc) from exc
        return v.outputs(slots, feeds, kept)

    def _run_profiled(self, v: _Variant, feeds: Sequence[Any]) -> list[Any]:
        prof = self.profiler
        assert prof is not None
        slots = v.plan.template.copy()
        for s, x in zip(v.plan.input_slots, feeds):
            slots[s] = x
        kept: set[int] = set()
        for step in v.plan.steps:
            sync = self._sync.get(step.provider)
            t0 = prof.now_us()
            try:
                res = step.fn(*[slots[i] for i in step.inputs])
                if sync is not None:
                    sync()
                _check_result(step, res, v.plan.slot_names)
            except RunError:
                raise
            except Exception as exc:
                raise _step_error(step, exc) from exc
            prof.record(
                step.name,
                "Node",
                t0,
                prof.now_us() - t0,
                op_type=step.op_type,
                provider=step.provider,
                kind=step.kind,
            )
            if keeps_output(step):
                kept.update(root_ids(res))
            for s, x in zip(step.outputs, res):
                slots[s] = x
            for s in step.frees:
                slots[s] = None
        return v.outputs(slots, feeds, kept)
