"""Compiling a plan into one straight-line Python function.

Each slot becomes a local variable and each step one call, so a run pays no
list indexing, no loop and no per-step dispatch: only the kernels' own calls.
Locals are per call, so the function is safe to run from many threads.

Steps whose outputs depend only on the input shapes (``Step.shape_only``)
run once per input-shape key; later runs with the same shapes take their
values from a small cache instead.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import Any

from .plan import NONE_SLOT, SINK_SLOT, Plan

CACHE_KEYS = 8


class ShapeCache:
    """Values of shape-only steps per input-shape key; the oldest key goes first."""

    def __init__(self, size: int = CACHE_KEYS) -> None:
        self.size = size
        self.entries: dict[Any, list[Any]] = {}
        self.hits = 0
        self.misses = 0
        self._lock = threading.Lock()

    def get(self, key: Any) -> list[Any] | None:
        hit = self.entries.get(key)
        if hit is None:
            self.misses += 1
        else:
            self.hits += 1
        return hit

    def put(self, key: Any, values: list[Any]) -> None:
        with self._lock:
            if key not in self.entries and len(self.entries) >= self.size:
                self.entries.pop(next(iter(self.entries)))
            self.entries[key] = values


def _key(feeds: Sequence[Any]) -> Any:
    try:
        return tuple(x.shape for x in feeds)
    except AttributeError:
        return None  # a sequence or optional input: no shape key, no reuse


def _name(slot: int, template: Sequence[Any]) -> str:
    if slot == NONE_SLOT:
        return "None"
    return f"c{slot}" if template[slot] is not None else f"s{slot}"


def generate(
    plan: Plan, cache: ShapeCache | None = None
) -> tuple[Callable[[Sequence[Any]], list[Any]], dict[int, int]]:
    """The run function, and a map from its source line numbers to step indices."""
    tpl = plan.template
    env: dict[str, Any] = {"_key": _key, "_cache": cache}
    for slot, value in enumerate(tpl):
        if value is not None:
            env[f"c{slot}"] = value
    use_cache = cache is not None and any(s.shape_only for s in plan.steps)
    lines = ["def run(feeds):"]
    for k, slot in enumerate(plan.input_slots):
        lines.append(f"    s{slot} = feeds[{k}]")
    if use_cache:
        lines += [
            "    key = _key(feeds)",
            "    hit = None if key is None else _cache.get(key)",
            "    new = [] if hit is None else None",
        ]
    line_to_step: dict[int, int] = {}
    cached = 0
    for i, step in enumerate(plan.steps):
        env[f"f{i}"] = step.fn
        args = ", ".join(_name(s, tpl) for s in step.inputs)
        outs = [(j, s) for j, s in enumerate(step.outputs) if s != SINK_SLOT]
        first = len(lines) + 1  # source lines are 1-based
        pad = "    "
        if use_cache and step.shape_only:
            lines.append("    if hit is None:")
            pad = "        "
        if len(outs) == 1 and outs[0][0] == 0:
            lines.append(f"{pad}s{outs[0][1]} = f{i}({args})[0]")
        else:
            lines.append(f"{pad}r = f{i}({args})")
            lines.extend(f"{pad}s{s} = r[{j}]" for j, s in outs)
        if use_cache and step.shape_only:
            lines.append("        new.extend((" + "".join(f"s{s}, " for _, s in outs) + "))")
            lines.append("    else:")
            for _, s in outs:
                lines.append(f"        s{s} = hit[{cached}]")
                cached += 1
        if step.frees:
            names = [f"s{s}" for s in step.frees if tpl[s] is None]
            if names:
                lines.append("    del " + ", ".join(names))
        for ln in range(first, len(lines) + 1):
            line_to_step[ln] = i
    if use_cache:
        lines.append("    if new is not None and key is not None:")
        lines.append("        _cache.put(key, new)")
    # A constant handed to the caller is copied: the caller may write into it.
    outs = [f"c{s}.copy()" if tpl[s] is not None else _name(s, tpl) for s in plan.output_slots]
    lines.append("    return [" + ", ".join(outs) + "]")
    source = "\n".join(lines) + "\n"
    code = compile(source, "<onnxep plan>", "exec")
    exec(code, env)
    return env["run"], line_to_step
