"""IOBinding: onnxruntime's bind-then-run API, with inputs and outputs left on the device.

Inputs are bound as arrays: NumPy, CuPy, or any device array exposing
``__cuda_array_interface__`` or DLPack (a torch CUDA tensor), which the
session's device provider reads in place, without a copy. onnxruntime's
raw form ``bind_input(name, "cuda", 0, np.float32, shape, ptr)`` is taken
too. Outputs are bound by name to a device (``"cpu"`` or ``"cuda"``), where
the run leaves them, or to a pre-allocated buffer (an array, or
onnxruntime's ``buffer_ptr`` form) that every run writes in place. Bound
inputs and buffers stay bound across ``run_with_iobinding`` calls.

One buffer may be bound as both an input and an output, as onnxruntime's
past/present KV cache sharing does: a kernel that writes the output into
that input's memory (GroupQueryAttention with a fixed-capacity past) hands
the buffer back and nothing is copied; ``copied_outputs`` names the outputs
the last run had to copy into their buffers. With CUDA-graph capture on, such
a shared device buffer is read and written by the graph in place (the graph
is keyed by its address), so a replayed step copies no cache either.
"""

from __future__ import annotations

import ctypes
import functools
import operator
from dataclasses import dataclass
from typing import Any

import numpy as np

from onnxep.providers.inplace import array_address

from .errors import InvalidArgument
from .execute.aliasing import guard, root_ids
from .model_io import host_array, is_device_array, tensor_dtype
from .ortvalue import OrtValue, device_kind, element_dtype

#: the name IO binding's results had before OrtValue took the role
BoundValue = OrtValue

#: an input's address not looked up yet: no output buffer was bound when it was (see
#: ``IOBinding._note_input``)
_UNSEEN = -1


def _same_memory(a: Any, b: Any) -> bool:
    """``a`` and ``b`` are the same elements of the same memory: no copy from one to the other."""
    if a is b:
        return True
    if type(a) is not type(b) or a.shape != b.shape or a.dtype != b.dtype:
        return False
    at = array_address(a)
    return a.strides == b.strides and at is not None and at == array_address(b)


def _addresses(given: int | tuple[int, ...]) -> tuple[int, ...]:
    return given if isinstance(given, tuple) else (given,)


@functools.lru_cache(maxsize=64)
def _declared_dtype(type_str: str) -> np.dtype:
    """``tensor_dtype`` once per type string: parsing it cost 3 us a bound input."""
    return tensor_dtype(type_str)


@dataclass(frozen=True)
class _Arg:
    """A graph input as a bind checks it: its NodeArg, declared dtype (None: any) and rank
    (None: any), worked out once per session."""

    arg: Any
    dtype: np.dtype | None
    rank: int | None

    @staticmethod
    def of(arg: Any) -> _Arg:
        want = None
        if arg.type.startswith("tensor("):
            want = _declared_dtype(arg.type)
            if want == np.dtype(object):
                want = None
        rank = None if arg.shape is None or not arg.type.startswith("tensor(") else len(arg.shape)
        return _Arg(arg, want, rank)


@dataclass
class _OutputBinding:
    device: str = "cpu"
    buffer: Any = None  # the caller's object
    array: Any = None  # the NumPy or CuPy view of it the run writes into


class IOBinding:
    def __init__(self, session: Any) -> None:
        self._session = session
        self._inputs: dict[str, Any] = {}
        self._outputs: dict[str, _OutputBinding] = {}
        self._results: list[OrtValue] = []
        #: outputs the last run copied into their bound buffers (a shared one needs none)
        self.copied_outputs: list[str] = []
        # where each bound output buffer starts, and the inputs bound to one of those buffers
        self._buffer_at: dict[int, str] = {}
        self._shared_inputs: set[str] = set()
        self._input_at: dict[str, int | None] = {}  # where each bound input starts
        self._device_inputs: set[str] = set()  # inputs bound to device arrays
        #: the last run's donations and, per output, the value it delivered in place (both
        #: dropped when an output is bound anew)
        self._donation: tuple[tuple[str, ...], list, dict[str, Any]] | None = None
        self._in_place: dict[str, tuple[Any, OrtValue]] = {}
        self._args: dict[str, _Arg] | None = None  # the session's inputs by name

    # -- the device provider --------------------------------------------------------------
    def _device_provider(self, why: str) -> Any:
        for p in self._session.providers:
            if p.device != "cpu" and p.implements("adopt"):
                return p
        raise InvalidArgument(
            f"{why}, but this session has no device provider "
            f"(its providers are {self._session.get_providers()}); create it with "
            "providers=['cuda', 'cpu']"
        )

    def _from_pointer(self, device: str, element_type: Any, shape: Any, ptr: int, what: str) -> Any:
        dtype = element_dtype(element_type, what)
        shape = tuple(int(d) for d in shape)
        nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
        if device == "cpu":
            raw = (ctypes.c_ubyte * nbytes).from_address(int(ptr))
            return np.ctypeslib.as_array(raw).view(dtype).reshape(shape)
        return self._device_provider(f"{what} is a device pointer").wrap_pointer(
            int(ptr), shape, dtype
        )

    # -- inputs ---------------------------------------------------------------------------
    def bind_input(
        self,
        name: str,
        device_type: Any = "cpu",
        device_id: int = 0,
        element_type: Any = None,
        shape: Any = None,
        buffer_ptr: int | None = None,
    ) -> None:
        """Bind input ``name`` to an array, or (onnxruntime's form) to raw memory.

        ``bind_input(name, array)`` takes NumPy, CuPy, torch tensors and any
        object with ``__cuda_array_interface__``/DLPack, read in place;
        ``bind_input(name, "cuda", 0, np.float32, shape, ptr)`` wraps memory
        the caller owns.
        """
        if not isinstance(device_type, str):
            self.bind_input_array(name, device_type)
            return
        if buffer_ptr is None or element_type is None or shape is None:
            raise InvalidArgument(
                f"bind_input({name!r}, {device_type!r}, ...) needs element_type, shape and "
                "buffer_ptr; to bind an array, call bind_input(name, array)"
            )
        device = device_kind(device_type)
        self.bind_input_array(
            name, self._from_pointer(device, element_type, shape, buffer_ptr, f"input {name!r}")
        )

    def bind_cpu_input(self, name: str, arr: np.ndarray) -> None:
        self.bind_input_array(name, arr)

    def bind_input_array(self, name: str, arr: Any) -> None:
        """Bind any array (NumPy or a device array) as input ``name``."""
        arg = self._check_input(name)
        on_device = False
        if type(arr) is np.ndarray:
            pass  # the decode loops' case, which pays for every probe below each step
        elif is_device_array(arr):
            arr = self._device_provider(f"input {name!r} is a device array").adopt(arr)
            on_device = True
        elif not isinstance(arr, np.ndarray):
            arr = host_array(arr)
        self._check_feed(arg, arr)
        self._inputs[name] = arr
        if on_device:
            self._device_inputs.add(name)
        elif self._device_inputs:
            self._device_inputs.discard(name)
        self._note_input(name, arr)

    def bound_input(self, name: str) -> Any:
        """The array a run feeds as input ``name``: a bound device array is the provider's
        view of the caller's memory, not a copy of it."""
        if name not in self._inputs:
            raise InvalidArgument(f"input {name!r} is not bound")
        return self._inputs[name]

    def bind_ortvalue_input(self, name: str, value: Any) -> None:
        self.bind_input_array(name, value.array if isinstance(value, OrtValue) else value)

    # -- outputs --------------------------------------------------------------------------
    def bind_output(
        self,
        name: str,
        device_type: Any = "cpu",
        device_id: int = 0,
        element_type: Any = None,
        shape: Any = None,
        buffer_ptr: int | None = None,
    ) -> None:
        """Leave output ``name`` on ``device_type``, or write it into a buffer.

        ``bind_output(name)`` / ``bind_output(name, "cuda")`` choose where
        the output is left; ``bind_output(name, array)`` or onnxruntime's
        ``bind_output(name, "cuda", 0, np.float32, shape, ptr)`` bind a
        pre-allocated buffer that every run writes in place.
        """
        self._check_output(name)
        if not isinstance(device_type, str):
            self._bind_buffer(name, device_type)
            return
        device = device_kind(device_type)
        if buffer_ptr is not None:
            if element_type is None or shape is None:
                raise InvalidArgument(
                    f"bind_output({name!r}, ..., buffer_ptr=...) needs element_type and shape"
                )
            arr = self._from_pointer(device, element_type, shape, buffer_ptr, f"output {name!r}")
            self._set_output(name, _OutputBinding(device, arr, arr))
            return
        if device != "cpu":
            self._device_provider(f"output {name!r} is bound to {device_type!r}")
        self._set_output(name, _OutputBinding(device))

    def bind_ortvalue_output(self, name: str, value: Any) -> None:
        self._check_output(name)
        self._bind_buffer(name, value.array if isinstance(value, OrtValue) else value)

    def _bind_buffer(self, name: str, buf: Any) -> None:
        if is_device_array(buf):
            arr = self._device_provider(f"the buffer for output {name!r} is a device array")
            view = arr.adopt(buf)
            device = "cuda"
        else:
            view = host_array(buf)
            device = "cpu"
            if not view.flags.writeable:
                # DLPack imports of read-only memory (an onnxruntime OrtValue, say) are read-only.
                raise InvalidArgument(
                    f"the buffer bound to output {name!r} is read-only, so no run can write into "
                    f"it; bind a writable array, or bind_output({name!r}, 'cpu') to let each "
                    "run allocate"
                )
        if not view.flags.c_contiguous:
            raise InvalidArgument(f"the buffer bound to output {name!r} must be C-contiguous")
        self._set_output(name, _OutputBinding(device, buf, view))

    # -- buffers bound as both an input and an output -----------------------------------
    def _note_input(self, name: str, arr: Any) -> None:
        if not self._buffer_at:
            # No output buffer bound, so no input shares one: the address (1 us a bind, five
            # binds a decode step) is looked up when an output buffer is bound.
            self._input_at[name] = _UNSEEN
            self._shared_inputs.discard(name)
            return
        addr = self._input_at[name] = array_address(arr)
        self._mark_shared(name, addr)

    def _mark_shared(self, name: str, addr: int | None) -> None:
        if addr is not None and addr in self._buffer_at:
            self._shared_inputs.add(name)
        else:
            self._shared_inputs.discard(name)

    def _set_output(self, name: str, binding: _OutputBinding) -> None:
        # Incremental: a decoder binds a present buffer per layer, and re-deriving every
        # address for each one cost milliseconds a generate call.
        old = self._outputs.get(name)
        self._outputs[name] = binding
        self._donation = None
        self._in_place = {}
        old_at = array_address(old.array) if old is not None and old.array is not None else None
        new_at = array_address(binding.array) if binding.array is not None else None
        if old_at is not None and old_at != new_at and self._buffer_at.get(old_at) == name:
            del self._buffer_at[old_at]
            for n, b in self._outputs.items():  # another output bound to that buffer keeps it
                if b.array is not None and array_address(b.array) == old_at:
                    self._buffer_at[old_at] = n
        if new_at is not None:
            self._buffer_at[new_at] = name
        for n, at in self._input_at.items():
            if at == _UNSEEN:
                at = self._input_at[n] = array_address(self._inputs[n])
            if at is not None and (at == old_at or at == new_at):
                self._mark_shared(n, at)

    def clear_binding_inputs(self) -> None:
        self._inputs.clear()
        self._input_at.clear()
        self._device_inputs.clear()
        self._shared_inputs.clear()

    def clear_binding_outputs(self) -> None:
        self._outputs.clear()
        self._donation = None
        self._in_place = {}
        self._buffer_at.clear()
        self._shared_inputs.clear()
        self._results = []

    def get_outputs(self) -> list[OrtValue]:
        return list(self._results)

    def copy_outputs_to_cpu(self) -> list[np.ndarray]:
        """Every output in host memory: one copy for each output left on the device or in a
        bound buffer (the caller's memory, which it may free or the next run overwrite)."""
        return [r.numpy() for r in self._results]

    def synchronize_inputs(self) -> None:
        for p in self._session.providers:
            p.synchronize()

    def synchronize_outputs(self) -> None:
        self.synchronize_inputs()

    # -- checks ---------------------------------------------------------------------------
    def _check_input(self, name: str) -> _Arg:
        known = self._args
        if known is None:
            # a session's inputs never change: looked up by name, with the dtype and rank a
            # bind checks, from the first bind on (a decode loop binds several inputs a step)
            args = self._session.get_overridable_initializers() + self._session.get_inputs()
            known = self._args = {a.name: _Arg.of(a) for a in args}
        arg = known.get(name)
        if arg is not None:
            return arg
        names = [a.name for a in self._session.get_inputs()]
        names += [a.name for a in self._session.get_overridable_initializers()]
        raise InvalidArgument(f"unknown input {name!r}; the model's inputs are {names}")

    def _check_output(self, name: str) -> None:
        names = [o.name for o in self._session.get_outputs()]
        if name not in names:
            raise InvalidArgument(f"unknown output {name!r}; the model's outputs are {names}")

    @staticmethod
    def _check_feed(checked: _Arg, arr: Any) -> None:
        want, arg = checked.dtype, checked.arg
        if want is not None and arr.dtype != want and np.dtype(arr.dtype) != want:
            raise InvalidArgument(
                f"input {arg.name!r} is bound to a {np.dtype(arr.dtype)} array but the model "
                f"declares {arg.type}; bind an array of dtype {want}"
            )
        if checked.rank is not None and checked.rank != arr.ndim:
            raise InvalidArgument(
                f"input {arg.name!r} is bound to an array of rank {arr.ndim} (shape "
                f"{list(arr.shape)}) but the model declares shape {arg.shape}"
            )

    # -- running --------------------------------------------------------------------------
    def run(self, run_options: Any = None) -> None:
        """Run with these bindings (what ``InferenceSession.run_with_iobinding`` calls)."""
        sess = self._session
        names = list(self._outputs) or [o.name for o in sess.get_outputs()]
        feeds = self._inputs
        device = self._device_inputs
        host_read = [n for n in self._host_read_inputs() if n in device] if device else None
        if host_read:
            # A host kernel (shape math, control flow) reads these inputs: it gets a copy.
            provider = self._device_provider("a bound input is on the device")
            feeds = {**feeds, **{n: provider.to_host(feeds[n]) for n in host_read}}
        if self._shared_inputs:
            outs = self._run_sharing(feeds, names, run_options)
        else:
            outs = sess.compiled.run(feeds, names, on_device=True, run_options=run_options)
        self.copied_outputs = []
        self._results = [self._deliver(n, v) for n, v in zip(names, outs)]

    def _run_sharing(
        self, feeds: dict[str, Any], names: list[str], run_options: Any = None
    ) -> list[Any]:
        """A run that may hand a bound input back as an output (see the module's note).

        The executor leaves outputs that share a feed's memory as they are; an
        output not written into a bound buffer is copied here when it does, as
        a plain run would copy it.
        """
        compiled = self._session.compiled
        inputs = compiled.feeds(feeds)
        pick = compiled.pick(names)
        # Shared device buffers are read in place by a captured graph too: no cache copy.
        order = compiled.input_names
        shared = [i for i, n in enumerate(order) if n in self._shared_inputs]
        outs = compiled.run_on_device(
            inputs,
            run_options=run_options,
            protect=False,
            in_place=shared,
            donated=self._donated(feeds),
        )
        roots = root_ids(inputs)
        result = []
        for n, i in zip(names, pick):
            bound = self._outputs.get(n)
            result.append(outs[i] if bound and bound.array is not None else guard(outs[i], roots))
        return result

    def _donated(self, feeds: dict[str, Any]) -> dict[str, int | tuple[int, ...]]:
        """Shared buffers a node may overwrite this run: the input's buffer is bound to the
        very output the session pairs it with (``InferenceSession.inplace_pairs``). Kept until
        a binding changes: a decode rebinds its small feeds every step, never its states."""
        names = tuple(sorted(self._shared_inputs))
        arrays = [feeds[n] for n in names]
        last = self._donation
        if last is not None and last[0] == names and all(map(operator.is_, last[1], arrays)):
            return last[2]
        pairs = self._session.compiled.inplace
        out: dict[str, int | tuple[int, ...]] = {}
        for name in self._shared_inputs & pairs.keys():
            node, output = pairs[name]
            addr = array_address(feeds[name])
            bound = self._outputs.get(output)
            if addr is not None and bound is not None and _same_memory(bound.array, feeds[name]):
                given = out.get(node)  # a node may have several pairs (GQA's key and value)
                out[node] = addr if given is None else (*_addresses(given), addr)
        self._donation = (names, arrays, out)
        return out

    def _host_read_inputs(self) -> set[str]:
        """Graph inputs that some host-side step of the plan reads directly."""
        return self._session.compiled.host_read_inputs()

    def _deliver(self, name: str, value: Any) -> OrtValue:
        last = self._in_place.get(name)
        if last is not None and last[0] is value:
            return last[1]  # the very array found in its bound buffer last run
        bound = self._outputs.get(name) or _OutputBinding()
        on_host = value.__class__ is np.ndarray or not is_device_array(value)
        provider = None
        if not on_host or bound.device != "cpu":
            provider = self._device_provider(f"output {name!r} is on the device")
        if bound.array is not None:
            delivered = OrtValue(
                bound.buffer, bound.array, provider and provider.to_host, borrowed=True
            )
            if _same_memory(bound.array, value):
                self._in_place[name] = (value, delivered)
            else:
                self._write(name, bound, value, provider)
                self.copied_outputs.append(name)
            return delivered
        if bound.device == "cpu":
            return OrtValue(value if on_host else provider.to_host(value))
        dev = provider.from_host(value) if on_host else value
        return OrtValue(dev, dev, provider.to_host)

    @staticmethod
    def _write(name: str, bound: _OutputBinding, value: Any, provider: Any) -> None:
        dst = bound.array
        if tuple(dst.shape) != tuple(value.shape) or np.dtype(dst.dtype) != np.dtype(value.dtype):
            raise InvalidArgument(
                f"the buffer bound to output {name!r} is {np.dtype(dst.dtype)} "
                f"{list(dst.shape)} but the run produced {np.dtype(value.dtype)} "
                f"{list(value.shape)}; bind a matching buffer, or bind_output({name!r}, "
                "'cuda') to let each run allocate"
            )
        if isinstance(dst, np.ndarray):
            np.copyto(dst, value if isinstance(value, np.ndarray) else provider.to_host(value))
        else:
            provider.copy_into(dst, value)
