"""Loop: iterate ``body`` up to ``M`` times while ``cond`` holds.

The body takes (iteration_num, cond, carried...) and returns (cond, carried...,
scan elements...); the node returns the final carried values and each scan
element stacked on a new leading axis. Values are host-side (see ``_flow``).
"""

import numpy as np

from onnxep.providers.kernel import kernel

from .flow import CONTROL_NOTE, HOST_ALL, host_int, stack, truth


@kernel(
    "Loop",
    since=(1, 11, 13, 16),
    host_inputs=HOST_ALL,
    host_outputs=HOST_ALL,
    capture_safe=False,
    capture_note=CONTROL_NOTE,
)
def loop(node, xp):
    body = node.subgraph("body")
    n = node.num_inputs
    n_carried = n - 2
    n_scan = len(body.output_names) - 1 - n_carried
    scan_infos = [
        node.outputs[n_carried + k] if n_carried + k < node.num_outputs else None
        for k in range(n_scan)
    ]

    def run(*args):
        trip, cond = args[0], args[1]
        carried = list(args[2:n])
        outer = args[n:]
        max_trip = None if trip is None else host_int(trip)
        go = True if cond is None else truth(cond)
        scans = [[] for _ in range(n_scan)]
        i = 0
        while go and (max_trip is None or i < max_trip):
            outs = body.run([np.array(i, dtype=np.int64), np.array(go), *carried], outer)
            go = truth(outs[0])
            carried = outs[1 : 1 + n_carried]
            for k in range(n_scan):
                scans[k].append(outs[1 + n_carried + k])
            i += 1
        stacked = [stack(s, 0, info, "Loop") for s, info in zip(scans, scan_infos)]
        return (*carried, *stacked)

    return run
