"""Running a plan: a tight loop over steps, with per-run slots so threads never share state."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from .codegen import ShapeCache, generate
from .errors import RunError
from .plan import Plan, Step
from .profiling import Profiler


def _step_error(step: Step, exc: BaseException) -> RunError:
    return RunError(
        f"{step.op_type} node {step.name!r} on provider {step.provider!r} failed: "
        f"{type(exc).__name__}: {exc}"
    )


class Executor:
    """Runs one compiled :class:`Plan`; safe to call from many threads at once.

    With a profiler, each step is timed (after synchronizing its provider's
    device, so a step's time is its own) and recorded as a trace event.
    """

    def __init__(
        self, plan: Plan, profiler: Profiler | None = None, sync: dict | None = None
    ) -> None:
        self.plan = plan
        self.profiler = profiler
        self._sync = sync or {}
        self._steps = tuple((s.fn, s.inputs, s.outputs, s.frees) for s in plan.steps)
        self._template = plan.template
        self._inputs = plan.input_slots
        self._outputs = plan.output_slots
        self._fast: Any = None
        self._lines: dict[int, int] = {}
        self.shape_cache = ShapeCache()

    def run(self, feeds: Sequence[Any]) -> list[Any]:
        if self.profiler is not None:
            return self._run_profiled(feeds)
        fast = self._fast
        if fast is None:
            # The first run goes through the checked loop, which catches a kernel that
            # returns a bare array instead of a tuple; later runs use generated code.
            out = self._run_checked(feeds)
            self._fast, self._lines = generate(self.plan, self.shape_cache)
            return out
        try:
            return fast(feeds)
        except Exception as exc:
            raise self._error(exc) from exc

    def _error(self, exc: BaseException) -> RunError:
        tb = exc.__traceback__
        index = None
        while tb is not None:
            if tb.tb_frame.f_code.co_filename == "<onnxep plan>":
                index = self._lines.get(tb.tb_lineno)
            tb = tb.tb_next
        if index is None:
            return RunError(f"the plan failed: {type(exc).__name__}: {exc}")
        return _step_error(self.plan.steps[index], exc)

    def _run_checked(self, feeds: Sequence[Any]) -> list[Any]:
        slots = self._template.copy()
        for s, v in zip(self._inputs, feeds):
            slots[s] = v
        index = 0
        try:
            for index, (fn, ins, outs, frees) in enumerate(self._steps):  # noqa: B007
                res = fn(*[slots[i] for i in ins])
                if res.__class__ is not tuple and res.__class__ is not list:
                    raise TypeError(f"kernel returned {type(res).__name__}, expected a tuple")
                for s, v in zip(outs, res):
                    slots[s] = v
                for s in frees:
                    slots[s] = None
        except RunError:
            raise
        except Exception as exc:
            step = self.plan.steps[index]
            raise _step_error(step, exc) from exc
        return [slots[s] for s in self._outputs]

    def _run_profiled(self, feeds: Sequence[Any]) -> list[Any]:
        prof = self.profiler
        assert prof is not None
        slots = self._template.copy()
        for s, v in zip(self._inputs, feeds):
            slots[s] = v
        for step in self.plan.steps:
            sync = self._sync.get(step.provider)
            t0 = prof.now_us()
            try:
                res = step.fn(*[slots[i] for i in step.inputs])
                if sync is not None:
                    sync()
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
            for s, v in zip(step.outputs, res):
                slots[s] = v
            for s in step.frees:
                slots[s] = None
        return [slots[s] for s in self._outputs]
