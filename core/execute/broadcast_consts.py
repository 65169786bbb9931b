"""Constant operands of elementwise steps, broadcast to the output's shape once per plan.

NumPy runs a ufunc whose operands all have the output's shape (or none at all) through
its plain loop; one operand of another shape that broadcasts (a bias [C] added to
[N, C], a scale [1, C, 1] or [1, 1, 1]) sends every call through its general iterator.
On small arrays that costs more than the arithmetic: [2, 4] + [4] took 0.82 us against
0.22 with the bias already [2, 4], [16, 64] + [64] 1.01 against 0.32, [64, 64] + [64]
1.73 against 0.71 (NumPy 2.4, Zen 3). A constant's broadcast copy is made once, when the
plan is compiled; the generated step uses it while the step's other inputs have the
output's static shape, and the step as the model wrote it otherwise. Only operations
that round each element once (IEEE add, subtract, multiply, divide, comparisons,
logical and bitwise ops) qualify: NumPy may pick another inner loop for other strides,
and only for these are all its loops the same bits.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..compile.plan import NONE_SLOT, Plan, Step

#: ufuncs whose every inner loop gives the same bits (one correctly rounded operation)
EXACT_UFUNCS = frozenset(
    {
        np.add,
        np.subtract,
        np.multiply,
        np.divide,
        np.equal,
        np.not_equal,
        np.less,
        np.less_equal,
        np.greater,
        np.greater_equal,
        np.logical_and,
        np.logical_or,
        np.logical_xor,
        np.bitwise_and,
        np.bitwise_or,
        np.bitwise_xor,
    }
)
#: outputs up to this many elements: over it the copy is memory a run reads for little
MAX_ELEMENTS = 65536
#: the broadcast copies of one plan, together
MAX_BYTES = 16 << 20


@dataclass(frozen=True)
class Broadcast:
    """A step's constant operands as its generated code passes them, and when."""

    #: the output's static shape, which each of the step's other inputs must have
    shape: tuple[int, ...]
    #: input position -> the array passed there instead of the constant
    args: dict[int, np.ndarray]


def broadcast_constants(plan: Plan) -> dict[int, Broadcast]:
    """Step index -> the broadcast operands of that elementwise step, for the code generator."""
    made: dict[tuple[int, tuple[int, ...]], np.ndarray] = {}
    budget = MAX_BYTES
    out: dict[int, Broadcast] = {}
    for i, step in enumerate(plan.steps):
        shape = step.out_shape
        if not _eligible(step, plan.template) or shape is None:
            continue
        args: dict[int, np.ndarray] = {}
        for pos, slot in enumerate(step.inputs):
            c = plan.template[slot]
            if c is None or c.shape == shape or c.ndim == 0:
                continue  # another step's value, or an operand NumPy's plain loop takes
            if np.broadcast_shapes(c.shape, shape) != shape:
                args = {}
                break  # the constant sets the output's shape: the model's call stays
            got = made.get((slot, shape))
            if got is None:
                if c.size == 1:
                    got = c.reshape(())  # a view: the other inputs have the output's shape
                else:
                    need = math.prod(shape) * c.itemsize
                    if need > budget:
                        continue
                    budget -= need
                    got = np.ascontiguousarray(np.broadcast_to(c, shape))
                    got.flags.writeable = False
                made[(slot, shape)] = got
            args[pos] = got
        if args:
            out[i] = Broadcast(shape, args)
    return out


def _eligible(step: Step, template: Sequence[Any]) -> bool:
    d = step.direct
    if not isinstance(d, np.ufunc) or d not in EXACT_UFUNCS or step.shape_only:
        return False
    if len(step.inputs) != d.nin:
        return False
    if step.out_shape is None or math.prod(step.out_shape) > MAX_ELEMENTS:
        return False
    consts = [template[s] for s in step.inputs if template[s] is not None]
    fed = [s for s in step.inputs if template[s] is None and s != NONE_SLOT]
    # a step of constants alone is folded before it gets here; other constants (a device
    # array, a NumPy scalar) are passed as they are
    return bool(fed) and all(type(c) is np.ndarray for c in consts)
