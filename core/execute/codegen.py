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

import numpy as np

from ..compile.plan import NONE_SLOT, SINK_SLOT, Plan
from .aliasing import CONST, FEED, KEPT, OutputRule, fresh, guard, keeps_output, root_id, root_ids
from .broadcast_consts import broadcast_constants

CACHE_KEYS = 8
_NO_ROOTS: frozenset[int] = frozenset()


class ShapeCache:
    """Values of shape-only steps per input-shape key; the oldest key goes first.

    Each entry also records its values' memory roots, so a run can tell
    whether an output would share memory with a value later runs reuse.
    """

    def __init__(self, size: int = CACHE_KEYS) -> None:
        self.size = size
        self.entries: dict[Any, list[Any]] = {}
        self.roots: dict[Any, frozenset[int]] = {}
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
        roots = root_ids(values)
        with self._lock:
            if key not in self.entries and len(self.entries) >= self.size:
                old = next(iter(self.entries))
                self.entries.pop(old)
                self.roots.pop(old, None)
            self.entries[key] = values
            self.roots[key] = roots

    def kept(self, key: Any) -> frozenset[int]:
        """Memory roots of the values kept for ``key`` (none when nothing is)."""
        return self.roots.get(key, _NO_ROOTS)


def _key(feeds: Sequence[Any]) -> Any:
    try:
        return tuple(x.shape for x in feeds)
    except AttributeError:
        return None  # a sequence or optional input: no shape key, no reuse


def _name(slot: int, template: Sequence[Any]) -> str:
    if slot == NONE_SLOT:
        return "None"
    return f"c{slot}" if template[slot] is not None else f"s{slot}"


def _returns(
    rules: Sequence[OutputRule],
    tpl: Sequence[Any],
    use_cache: bool,
    kept: Sequence[str],
    n_feeds: int = 0,
) -> list[str]:
    """The lines that hand the outputs over, each as its rule says (see aliasing).

    ``kept`` names the locals holding the memory roots of what kernels without
    inputs returned this run.
    """
    checks = 0
    for r in rules:
        if r.checked:
            checks |= r.check
    lines = []
    if checks & FEED and 0 < n_feeds <= 8:
        # a set display of each feed's root: root_ids' generator cost 0.2 us more a run
        # (a None feed adds id(None), which no output's root is)
        roots = ", ".join(f"_root_id(feeds[{k}])" for k in range(n_feeds))
        lines.append(f"    _fr = {{{roots}}}")
    elif checks & FEED:
        lines.append("    _fr = _root_ids(feeds)")
    kept_sets = []
    if checks & KEPT and use_cache:
        lines.append("    _kc = _no_roots if key is None else _cache.kept(key)")
        kept_sets.append("_kc")
    if checks & KEPT and kept:
        lines.append("    _kk = (" + "".join(f"{k}, " for k in kept) + ")")
        kept_sets.append("_kk")
    outs = []
    for r in rules:
        name = _name(r.slot, tpl)
        if r.copy:
            outs.append(f"_fresh({name})")
            continue
        sets = []
        if r.check & FEED:
            sets.append("_fr")
        if r.check & CONST:
            sets.append("_cr")
        if r.check & KEPT:
            sets += kept_sets
        outs.append(f"_guard({name}, {', '.join(sets)})" if sets else name)
    lines.append("    return [" + ", ".join(outs) + "]")
    return lines


def reusable_inputs(plan: Plan) -> dict[int, int]:
    """Step index -> the input slot its ufunc may write its result into (``out=``).

    The slot must hold a dead intermediate: made fresh this run by another ufunc step
    (not a feed, a constant, a cached shape value or a kernel's view), read by this
    step alone and freed after it, with the output's static shape and dtype
    (``Step.same_as_output``). NumPy then skips the allocation, and a chain of
    elementwise ops runs in one buffer, as a fused expression would.
    """
    fresh: set[int] = set()
    readers: dict[int, set[int]] = {}
    for i, step in enumerate(plan.steps):
        for s in step.inputs:
            readers.setdefault(s, set()).add(i)
    feeds = set(plan.input_slots)
    out: dict[int, int] = {}
    for i, step in enumerate(plan.steps):
        ufunc = step.same_as_output and not step.shape_only
        if ufunc:
            for pos in step.same_as_output:
                s = step.inputs[pos]
                if s in fresh and s in step.frees and s not in feeds and readers[s] == {i}:
                    out[i] = s
                    break
        if isinstance(step.direct, np.ufunc) and not step.shape_only:
            fresh.add(step.outputs[0])  # a ufunc's result is a new array (or a dead one)
    return out


def straight_line(
    plan: Plan,
    cache: ShapeCache | None = None,
    rules: Sequence[OutputRule] | None = None,
    const_roots: frozenset[int] = frozenset(),
) -> tuple[Callable[[Sequence[Any]], list[Any]], dict[int, int]]:
    """The run function, and a map from its source line numbers to step indices.

    ``rules`` say how each output is handed over (aliasing.output_rules); without
    them outputs are returned as they are.
    """
    tpl = plan.template
    if rules is None:
        rules = [OutputRule(s) for s in plan.output_slots]
    env: dict[str, Any] = {
        "_key": _key,
        "_cache": cache,
        "_fresh": fresh,
        "_guard": guard,
        "_root_ids": root_ids,
        "_root_id": root_id,
        "_no_roots": _NO_ROOTS,
        "_cr": const_roots,
    }
    track_kept = any(r.checked and r.check & KEPT for r in rules)
    kept: list[str] = []
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
    reuse = reusable_inputs(plan)
    broadcast = broadcast_constants(plan)
    for i, step in enumerate(plan.steps):
        env[f"f{i}"] = step.fn
        args = ", ".join(_name(s, tpl) for s in step.inputs)
        outs = [(j, s) for j, s in enumerate(step.outputs) if s != SINK_SLOT]
        first = len(lines) + 1  # source lines are 1-based
        pad = "    "
        if use_cache and step.shape_only:
            lines.append("    if hit is None:")
            pad = "        "
        wide = broadcast.get(i)
        if wide is not None:
            # While the step's other inputs have the output's static shape, its constants
            # go in broadcast to it (broadcast_consts); otherwise, the call as below.
            env[f"o{i}"] = wide.shape
            fed = dict.fromkeys(f"s{s}" for s in step.inputs if tpl[s] is None and s != NONE_SLOT)
            wide_args = []
            for pos, s in enumerate(step.inputs):
                if pos in wide.args:
                    env[f"b{i}_{pos}"] = wide.args[pos]
                    wide_args.append(f"b{i}_{pos}")
                else:
                    wide_args.append(_name(s, tpl))
            out_arg = f", s{reuse[i]}" if i in reuse else ""
            lines += [
                f"{pad}if " + " and ".join(f"{n}.shape == o{i}" for n in fed) + ":",
                f"{pad}    s{outs[0][1]} = d{i}({', '.join(wide_args)}{out_arg})",
                f"{pad}else:",
            ]
            pad += "    "
        if i in reuse:
            # A ufunc whose result outgrows the buffer (inputs broadcast past the static
            # shapes) refuses before writing anything: then it allocates as usual.
            env[f"d{i}"] = step.direct
            # out as the last positional argument where the ufunc takes it there: the
            # keyword costs 0.08 us a call to parse, a third of a small elementwise node
            d = step.direct
            plain = getattr(d, "nin", -1) == len(step.inputs) and getattr(d, "nout", 0) == 1
            out_arg = f"s{reuse[i]}" if plain else f"out=s{reuse[i]}"
            lines += [
                f"{pad}try:",
                f"{pad}    s{outs[0][1]} = d{i}({args}, {out_arg})",
                f"{pad}except ValueError:",
                f"{pad}    s{outs[0][1]} = d{i}({args})",
            ]
        elif len(outs) == 1 and outs[0][0] == 0 and step.direct is not None:
            env[f"d{i}"] = step.direct
            lines.append(f"{pad}s{outs[0][1]} = d{i}({args})")
        elif len(outs) == 1 and outs[0][0] == 0:
            lines.append(f"{pad}s{outs[0][1]} = f{i}({args})[0]")
        else:
            lines.append(f"{pad}r = f{i}({args})")
            lines.extend(f"{pad}s{s} = r[{j}]" for j, s in outs)
        if track_kept and keeps_output(step):
            for _, s in outs:
                lines.append(f"    k{s} = _root_id(s{s})")
                kept.append(f"k{s}")
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
    lines += _returns(rules, tpl, use_cache, kept, len(plan.input_slots))
    source = "\n".join(lines) + "\n"
    code = compile(source, "<onnxep plan>", "exec")
    exec(code, env)
    return env["run"], line_to_step
