"""Scan: run ``body`` over slices of the scan inputs, carrying state.

Opset 8 has a leading batch axis (scanned per batch entry, with optional
``sequence_lens``); opset 9 on drops it and adds per-input/output axes and
directions. Values are host-side (see ``_flow``).
"""

import numpy as np

from onnxep.providers.kernel import kernel

from .flow import CONTROL_NOTE, HOST_ALL, empty_output, norm_axis, stack


def _scan(body, states, xs, axes, reverse, steps, outer, n_out):
    """Iterate ``steps`` times; returns the final states and per-output element lists."""
    n_state = len(states)
    outs = [[] for _ in range(n_out)]
    for t in range(steps):
        elems = [
            x[(slice(None),) * ax + (steps - 1 - t if rev else t,)]
            for x, ax, rev in zip(xs, axes, reverse)
        ]
        res = body.run([*states, *elems], outer)
        states = res[:n_state]
        for k in range(n_out):
            outs[k].append(res[n_state + k])
    return list(states), outs


def _ints(node, name, count, default):
    vals = list(node.attr(name, [default] * count))
    if len(vals) != count:
        raise ValueError(f"Scan: {name} has {len(vals)} entries, expected {count}")
    return [int(v) for v in vals]


@kernel(
    "Scan",
    since=8,
    host_inputs=HOST_ALL,
    host_outputs=HOST_ALL,
    capture_safe=False,
    capture_note=CONTROL_NOTE,
)
def scan8(node, xp):
    body = node.subgraph("body")
    m = int(node.attr("num_scan_inputs"))
    n = node.num_inputs
    n_state = n - 1 - m
    n_out = len(body.output_names) - n_state
    reverse = [bool(d) for d in _ints(node, "directions", m, 0)]
    out_infos = [
        node.outputs[n_state + k] if n_state + k < node.num_outputs else None for k in range(n_out)
    ]

    def run(*args):
        lens, explicit, outer = args[0], args[1:n], args[n:]
        states, xs = explicit[:n_state], explicit[n_state:]
        batch, full = xs[0].shape[0], xs[0].shape[1]
        lengths = [full] * batch if lens is None else [int(v) for v in np.asarray(lens).ravel()]
        finals = [[] for _ in range(n_state)]
        per_batch = [[] for _ in range(n_out)]
        for b in range(batch):
            steps = lengths[b]
            # reverse scans start at the last valid step of this batch entry
            xb = [x[b, :steps] for x in xs]
            st, outs = _scan(
                body, [s[b] for s in states], xb, [0] * m, reverse, steps, outer, n_out
            )
            for k in range(n_state):
                finals[k].append(np.asarray(st[k]))
            for k in range(n_out):
                per_batch[k].append(outs[k])
        stacked = []
        for k in range(n_out):
            ref = next((np.asarray(o[0]) for o in per_batch[k] if o), None)
            if ref is None:  # no step ran for any batch entry
                stacked.append(empty_output(out_infos[k], {0: batch, 1: full}, "Scan"))
                continue
            # shorter sequences are padded with zeros up to the scanned length
            y = np.zeros((batch, full, *ref.shape), dtype=ref.dtype)
            for b, o in enumerate(per_batch[k]):
                if o:
                    y[b, : len(o)] = np.stack([np.asarray(v) for v in o])
            stacked.append(y)
        finals = [np.stack(f) if f else np.asarray(s) for f, s in zip(finals, states)]
        return (*finals, *stacked)

    return run


@kernel(
    "Scan",
    since=(9, 11, 16),
    host_inputs=HOST_ALL,
    host_outputs=HOST_ALL,
    capture_safe=False,
    capture_note=CONTROL_NOTE,
)
def scan9(node, xp):
    body = node.subgraph("body")
    m = int(node.attr("num_scan_inputs"))
    n = node.num_inputs
    n_state = n - m
    n_out = len(body.output_names) - n_state
    in_axes = _ints(node, "scan_input_axes", m, 0)
    in_rev = [bool(d) for d in _ints(node, "scan_input_directions", m, 0)]
    out_axes = _ints(node, "scan_output_axes", n_out, 0)
    out_rev = [bool(d) for d in _ints(node, "scan_output_directions", n_out, 0)]
    out_infos = [
        node.outputs[n_state + k] if n_state + k < node.num_outputs else None for k in range(n_out)
    ]

    def run(*args):
        explicit, outer = args[:n], args[n:]
        states, xs = explicit[:n_state], explicit[n_state:]
        axes = [norm_axis(a, x.ndim, "Scan") for a, x in zip(in_axes, xs)]
        lengths = {x.shape[a] for x, a in zip(xs, axes)}
        if len(lengths) > 1:
            raise ValueError(f"Scan: scan inputs have different lengths {sorted(lengths)}")
        steps = lengths.pop() if lengths else 0
        finals, outs = _scan(body, list(states), xs, axes, in_rev, steps, outer, n_out)
        stacked = []
        for k in range(n_out):
            vals = outs[k][::-1] if out_rev[k] else outs[k]
            stacked.append(stack(vals, out_axes[k], out_infos[k], "Scan"))
        return (*finals, *stacked)

    return run
