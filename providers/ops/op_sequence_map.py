"""SequenceMap: apply ``body`` to each position of the input sequence(s).

Sequence inputs are taken element by element, tensor inputs whole; each body
output becomes a sequence. Values are host-side (see ``_flow``).
"""

from onnxep.providers.kernel import kernel

from .flow import CONTROL_NOTE, HOST_ALL


@kernel(
    "SequenceMap",
    since=17,
    host_inputs=HOST_ALL,
    host_outputs=HOST_ALL,
    capture_safe=False,
    capture_note=CONTROL_NOTE,
)
def sequence_map(node, xp):
    body = node.subgraph("body")
    n = node.num_inputs
    n_out = len(body.output_names)

    def run(*args):
        explicit, outer = args[:n], args[n:]
        count = len(explicit[0])
        for j, v in enumerate(explicit[1:], 1):
            if isinstance(v, list) and len(v) != count:
                raise ValueError(
                    f"SequenceMap: input {j} has {len(v)} elements, input 0 has {count}"
                )
        results = [[] for _ in range(n_out)]
        for i in range(count):
            ins = [v[i] if isinstance(v, list) else v for v in explicit]
            for k, o in enumerate(body.run(ins, outer)):
                results[k].append(o)
        return tuple(results)

    return run
