"""Compiling a plan into one straight-line Python function.

Each slot becomes a local variable and each step one call, so a run pays no
list indexing, no loop and no per-step dispatch: only the kernels' own calls.
Locals are per call, so the function is safe to run from many threads.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from .plan import NONE_SLOT, SINK_SLOT, Plan


def _name(slot: int, template: Sequence[Any]) -> str:
    if slot == NONE_SLOT:
        return "None"
    return f"c{slot}" if template[slot] is not None else f"s{slot}"


def generate(plan: Plan) -> tuple[Callable[[Sequence[Any]], list[Any]], dict[int, int]]:
    """The run function, and a map from its source line numbers to step indices."""
    tpl = plan.template
    env: dict[str, Any] = {}
    for slot, value in enumerate(tpl):
        if value is not None:
            env[f"c{slot}"] = value
    lines = ["def run(feeds):"]
    for k, slot in enumerate(plan.input_slots):
        lines.append(f"    s{slot} = feeds[{k}]")
    line_to_step: dict[int, int] = {}
    for i, step in enumerate(plan.steps):
        env[f"f{i}"] = step.fn
        args = ", ".join(_name(s, tpl) for s in step.inputs)
        outs = [(j, s) for j, s in enumerate(step.outputs) if s != SINK_SLOT]
        first = len(lines) + 1  # source lines are 1-based
        if len(outs) == 1 and outs[0][0] == 0:
            lines.append(f"    s{outs[0][1]} = f{i}({args})[0]")
        else:
            lines.append(f"    r = f{i}({args})")
            lines.extend(f"    s{s} = r[{j}]" for j, s in outs)
        if step.frees:
            lines.append("    del " + ", ".join(f"s{s}" for s in step.frees if tpl[s] is None))
        for ln in range(first, len(lines) + 1):
            line_to_step[ln] = i
    lines.append("    return [" + ", ".join(_name(s, tpl) for s in plan.output_slots) + "]")
    source = "\n".join(lines) + "\n"
    code = compile(source, "<onnxep plan>", "exec")
    exec(code, env)
    return env["run"], line_to_step
