"""Compiling placed nodes into a flat plan: numbered slots, copy steps, frees.

Slot 0 always holds ``None`` (an omitted optional input) and slot 1 is a
sink for omitted optional outputs. Constants live in the plan's template,
already on every device that reads them, so a run copies nothing it need not.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import onnx_ir as ir

from onnxep.providers.dtypes import np_dtype
from onnxep.providers.kernel import CAPTURE_ATTR, DIRECT_ATTR, KernelSpec
from onnxep.providers.provider import Provider

from ..errors import InvalidGraph
from .partition import PlacedNode

NONE_SLOT = 0
SINK_SLOT = 1
HOST = "cpu"


@dataclass
class Step:
    fn: Callable[..., Any]
    inputs: tuple[int, ...]
    outputs: tuple[int, ...]
    name: str
    op_type: str
    provider: str
    kind: str = "kernel"  # "kernel" or "copy"
    frees: tuple[int, ...] = ()
    #: its outputs depend only on the input shapes, so runs may reuse them (shape_cache)
    shape_only: bool = False
    #: positions of the inputs an output may be (a view of): see aliasing
    views_of: tuple[int, ...] = ()
    #: each output's element type as the model's types say (None where unknown)
    out_dtypes: tuple[np.dtype | None, ...] = ()
    #: the kernel behind the step, named for errors ("" for copies)
    kernel: str = ""
    #: whether the kernel may be recorded in a CUDA graph, and if not why (capture_plan)
    capture_safe: bool = True
    capture_note: str = ""
    #: a callable returning the one output itself, equal to ``fn`` for this node's static
    #: types (``onnxep.providers.kernel.direct``); generated code calls it instead
    direct: Callable[..., Any] | None = None
    #: with ``direct`` a NumPy ufunc: the input positions whose static shape and dtype are
    #: the output's, so the ufunc may write its result there (``out=``) when that input is
    #: a dead intermediate (the code generator decides; see codegen)
    same_as_output: tuple[int, ...] = ()
    #: with ``direct`` a NumPy ufunc: the output's shape where the model gives every dim as
    #: a number (the code generator broadcasts constant operands to it; see broadcast_consts)
    out_shape: tuple[int, ...] | None = None
    #: a copy's source device ("" for kernels): an upload from the host is no graph node
    #: unless the value is the same on every run (capture.plan)
    source: str = ""


@dataclass(frozen=True)
class CopyRecord:
    value: str
    src: str
    dst: str
    consumer: str


@dataclass
class Plan:
    steps: list[Step]
    template: list[Any]
    input_slots: tuple[int, ...]
    output_slots: tuple[int, ...]
    slot_names: list[str]
    copies: list[CopyRecord] = field(default_factory=list)
    #: where each graph output is produced, before any copy to the host
    device_output_slots: tuple[int, ...] = ()
    #: how many trailing steps only copy graph outputs to the host
    output_copies: int = 0

    @property
    def device_to_host_reads(self) -> int:
        return sum(1 for c in self.copies if c.dst == HOST and c.src != HOST)

    def on_device(self) -> Plan:
        """This plan without its trailing output copies: each output stays where it is made."""
        steps = self.steps[: len(self.steps) - self.output_copies]
        outs = self.device_output_slots or self.output_slots
        frees = _frees(steps, self.template, outs)
        steps = [replace(s, frees=frees.get(i, ())) for i, s in enumerate(steps)]
        return replace(self, steps=steps, output_slots=outs, output_copies=0)


def _frees(steps: Sequence[Step], template: Sequence[Any], keep: Sequence[int]) -> dict:
    """Step index -> the slots to drop after it: each slot's last use, unless kept."""
    kept = set(keep) | {NONE_SLOT, SINK_SLOT}
    last: dict[int, int] = {}
    for idx, step in enumerate(steps):
        for s in (*step.inputs, *step.outputs):
            last[s] = idx
    frees: dict[int, list[int]] = {}
    for s, idx in last.items():
        if s not in kept and template[s] is None:
            frees.setdefault(idx, []).append(s)
    return {idx: tuple(v) for idx, v in frees.items()}


def _direct(fn: Callable[..., Any], node: ir.Node) -> Callable[..., Any] | None:
    """The direct form a kernel offers for ``fn``, where ``node``'s static types meet its
    conditions: every input's dtype known and not upcast, one output of known rank >= 1."""
    offer = getattr(fn, DIRECT_ATTR, None)
    if offer is None or len(node.outputs) != 1:
        return None
    f, upcast = offer
    dtypes = [_tensor_dtype(v) for v in node.inputs]
    if not dtypes or any(d is None or d in upcast for d in dtypes):
        return None
    shape = node.outputs[0].shape
    if shape is None or len(shape) == 0:
        return None
    return f


def _same_as_output(direct: Callable[..., Any] | None, node: ir.Node) -> tuple[int, ...]:
    """The inputs of ``node`` a ufunc's result may overwrite: same dtype and the same dims
    (each a known size, or the same named dim) as the output, so no broadcasting grows it
    and no cast narrows it."""
    if not isinstance(direct, np.ufunc) or direct.signature is not None or len(node.outputs) != 1:
        return ()  # a generalized ufunc (matmul) is not elementwise
    out = node.outputs[0]
    want, dims = _tensor_dtype(out), _dims(out)
    if want is None or dims is None:
        return ()
    if any(_tensor_dtype(v) != want for v in node.inputs):
        return ()  # a mixed-type op (Pow's exponent) promotes; out= would cast
    return tuple(i for i, v in enumerate(node.inputs) if _dims(v) == dims)


def _ufunc_out_shape(direct: Callable[..., Any] | None, node: ir.Node) -> tuple[int, ...] | None:
    if not isinstance(direct, np.ufunc) or len(node.outputs) != 1:
        return None
    dims = _dims(node.outputs[0])
    if dims is None or not all(isinstance(d, int) for d in dims):
        return None
    return dims  # type: ignore[return-value]


def _dims(value: ir.Value | None) -> tuple[Any, ...] | None:
    shape = None if value is None else value.shape
    if shape is None:
        return None
    dims = []
    for d in shape.dims:
        if isinstance(d, int):
            dims.append(d)
        elif getattr(d, "value", None):  # a named dim; an anonymous one is unknown
            dims.append(("dim", d.value))
        else:
            return None
    return tuple(dims)


def _tensor_dtype(value: ir.Value | None) -> np.dtype | None:
    if value is None or not isinstance(value.type, ir.TensorType):
        return None
    try:
        return np_dtype(int(value.type.dtype))
    except ValueError:
        return None  # undefined or not carried by NumPy: nothing to check against


_GRAPH_ATTRS = (ir.AttributeType.GRAPH, ir.AttributeType.GRAPHS)


def _views_of(p: PlacedNode, spec: KernelSpec, n_inputs: int) -> tuple[int, ...]:
    """Inputs whose memory the node's outputs may share.

    Inputs read as host-side parameters (shapes, axes) are not handed back;
    a node that runs subgraphs may return any input, since control flow
    declares every input a host input only to receive host memory.
    """
    if any(a.type in _GRAPH_ATTRS for a in p.node.attributes.values()):
        return tuple(range(n_inputs))
    return tuple(i for i in range(n_inputs) if i not in spec.host_inputs)


def kernel_label(spec: KernelSpec) -> str:
    """``module.builder`` and the plugin that registered it: which code made an output."""
    fn = spec.builder
    name = f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', repr(fn))}"
    return f"{name} from plugin {spec.source!r}" if spec.source else name


def _copy_fn(src: Provider | None, dst: Provider | None) -> Callable[[Any], tuple]:
    if src is None and dst is not None:
        up = dst.from_host
        return lambda x: (up(x),)
    if dst is None and src is not None:
        down = src.to_host
        return lambda x: (down(x),)
    assert src is not None and dst is not None
    down, up = src.to_host, dst.from_host
    return lambda x: (up(down(x)),)


class PlanBuilder:
    """Turns one graph's placed nodes into a :class:`Plan`."""

    def __init__(self, providers: Sequence[Provider], const: Callable[[ir.Value], Any]) -> None:
        self.by_device: dict[str, Provider] = {}
        for p in providers:
            self.by_device.setdefault(p.device, p)
        self.const = const
        self.template: list[Any] = [None, None]
        self.names = ["<none>", "<sink>"]
        self.slot_of: dict[tuple[int, str], int] = {}
        self.location: dict[int, str] = {}
        self.steps: list[Step] = []
        self.copies: list[CopyRecord] = []
        self.shape_nodes: set[int] = set()
        self.shape_slots: set[int] = set()

    def _new_slot(self, name: str, value: Any = None) -> int:
        self.template.append(value)
        self.names.append(name)
        return len(self.template) - 1

    def _device_provider(self, device: str) -> Provider | None:
        return None if device == HOST else self.by_device[device]

    def bind_input(self, value: ir.Value, device: str = HOST) -> int:
        slot = self._new_slot(value.name or "")
        self.slot_of[(id(value), device)] = slot
        self.location[id(value)] = device
        return slot

    def slot_for(self, value: ir.Value, need: str, consumer: str) -> int:
        key = (id(value), need)
        slot = self.slot_of.get(key)
        if slot is not None:
            return slot
        if id(value) not in self.location:
            arr = self.const(value)
            if arr is None:
                if consumer == "<graph output>" or (
                    value.producer() is None and value.is_graph_output()
                ):
                    # as onnxruntime, which refuses such a model with the same advice
                    raise InvalidGraph(
                        f"graph output {value.name!r} is not produced in its graph: a "
                        "subgraph (an If branch, a Loop or Scan body) that returns a value "
                        "of an enclosing graph must pass it through a node; add an Identity "
                        "node in the subgraph"
                    )
                raise InvalidGraph(
                    f"value {value.name!r} is used by {consumer!r} before it is produced"
                )
            dev = self._device_provider(need)
            if dev is not None:
                arr = dev.from_host(arr)
            slot = self._new_slot(value.name or "", arr)
            self.slot_of[key] = slot
            return slot
        src = self.location[id(value)]
        src_slot = self.slot_of[(id(value), src)]
        if src == need:
            return src_slot
        slot = self._new_slot(f"{value.name}@{need}")
        fn = _copy_fn(self._device_provider(src), self._device_provider(need))
        self.steps.append(
            Step(
                fn,
                (src_slot,),
                (slot,),
                f"copy {value.name} {src}->{need}",
                "Copy",
                need,
                "copy",
                shape_only=src_slot in self.shape_slots,
                views_of=(0,),
                source=src,
            )
        )
        if src_slot in self.shape_slots:
            self.shape_slots.add(slot)
        self.copies.append(CopyRecord(value.name or "", src, need, consumer))
        self.slot_of[key] = slot
        return slot

    def add_node(self, p: PlacedNode) -> None:
        spec = p.claim.spec
        device = p.provider.device
        ins: list[int] = []
        for i, v in enumerate(p.node.inputs):
            if v is None:
                ins.append(NONE_SLOT)
                continue
            need = HOST if i in spec.host_inputs else device
            ins.append(self.slot_for(v, need, p.name))
        for v in p.implicit:
            ins.append(self.slot_for(v, HOST, p.name))
        outs: list[int] = []
        for j, o in enumerate(p.node.outputs):
            if o is None or not o.name:
                outs.append(SINK_SLOT)
                continue
            loc = HOST if j in spec.host_outputs else device
            slot = self._new_slot(o.name)
            self.slot_of[(id(o), loc)] = slot
            self.location[id(o)] = loc
            outs.append(slot)
        # A step without inputs is never cached: it is as cheap as a cache lookup, and
        # the output rules track what it returns (aliasing.keeps_output).
        shape_only = id(p.node) in self.shape_nodes and bool(ins)
        direct = _direct(p.claim.fn, p.node)
        # A built callable may narrow its spec's capture safety (kernel.not_capture_safe).
        unsafe = getattr(p.claim.fn, CAPTURE_ATTR, None)
        if shape_only:
            self.shape_slots.update(s for s in outs if s != SINK_SLOT)
        self.steps.append(
            Step(
                p.claim.fn,
                tuple(ins),
                tuple(outs),
                p.name,
                p.node.op_type,
                p.provider.name,
                shape_only=shape_only,
                views_of=_views_of(p, spec, len(ins)),
                out_dtypes=tuple(_tensor_dtype(o) for o in p.node.outputs),
                kernel=kernel_label(spec),
                capture_safe=spec.capture_safe and unsafe is None,
                capture_note=(
                    unsafe if unsafe is not None and spec.capture_safe else spec.capture_note
                ),
                direct=direct,
                same_as_output=_same_as_output(direct, p.node),
                out_shape=_ufunc_out_shape(direct, p.node),
            )
        )

    def finish(self, inputs: Sequence[int], outputs: Sequence[ir.Value]) -> Plan:
        """The plan, ending with the copies that bring graph outputs to the host."""
        produced = tuple(
            self.slot_of[(id(v), self.location[id(v)])] if id(v) in self.location else None
            for v in outputs
        )
        body = len(self.steps)
        out_slots = tuple(self.slot_for(v, HOST, "<graph output>") for v in outputs)
        # A constant output has no producer: it is returned from the host template.
        device_slots = tuple(d if d is not None else h for d, h in zip(produced, out_slots))
        frees = _frees(self.steps, self.template, out_slots)
        for idx, step in enumerate(self.steps):
            step.frees = frees.get(idx, ())
        return Plan(
            self.steps,
            self.template,
            tuple(inputs),
            out_slots,
            self.names,
            self.copies,
            device_output_slots=device_slots,
            output_copies=len(self.steps) - body,
        )
