"""Running a plan: a tight loop over steps, with per-run slots so threads never share state."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from .errors import RunError
from .plan import Plan


class Executor:
    """Runs one compiled :class:`Plan`; safe to call from many threads at once."""

    def __init__(self, plan: Plan) -> None:
        self.plan = plan
        self._steps = tuple((s.fn, s.inputs, s.outputs, s.frees) for s in plan.steps)
        self._template = plan.template
        self._inputs = plan.input_slots
        self._outputs = plan.output_slots

    def run(self, feeds: Sequence[Any]) -> list[Any]:
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
            raise RunError(
                f"{step.op_type} node {step.name!r} on provider {step.provider!r} failed: "
                f"{type(exc).__name__}: {exc}"
            ) from exc
        return [slots[s] for s in self._outputs]
