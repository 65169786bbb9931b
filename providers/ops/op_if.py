"""If: run ``then_branch`` or ``else_branch`` on a host-side condition.

Every value crosses in host memory, as subgraphs take and return (see ``_flow``).
"""

from onnxep.providers.kernel import kernel

from .flow import CONTROL_NOTE, HOST_ALL, truth


@kernel(
    "If",
    since=(1, 11, 13, 16),
    host_inputs=HOST_ALL,
    host_outputs=HOST_ALL,
    capture_safe=False,
    capture_note=CONTROL_NOTE,
)
def if_(node, xp):
    then_g = node.subgraph("then_branch")
    else_g = node.subgraph("else_branch")
    n = node.num_inputs

    def run(*args):
        branch = then_g if truth(args[0]) else else_g
        return tuple(branch.run([], args[n:]))

    return run
