"""Random feeds built from a model's declared inputs, resolving symbolic dims.

The runtime's half (``placement="measured"`` times on such feeds); the tools'
``random_inputs`` makes them for a session.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from .errors import InvalidArgument
from .model_io import NodeArg, tensor_dtype


def random_array(shape: tuple[int, ...], dtype: np.dtype, rng: np.random.Generator) -> np.ndarray:
    if dtype == np.bool_:
        return rng.integers(0, 2, size=shape).astype(np.bool_)
    if dtype.kind in "iu":
        # Integer inputs are mostly ids, indices and lengths: small and non-negative.
        hi = 100 if dtype.itemsize > 1 else 10
        return rng.integers(0, hi, size=shape).astype(dtype)
    if dtype == np.dtype(object):
        return np.array(
            [f"s{v}" for v in rng.integers(0, 100, size=shape).ravel()], dtype=object
        ).reshape(shape)
    return rng.standard_normal(size=shape).astype(np.float32).astype(dtype)


def random_feeds(
    inputs: Sequence[NodeArg],
    graph: Any,
    model_path: str | None,
    dims: Mapping[str, int] | None = None,
    seed: int = 0,
    default_dim: int = 1,
    *,
    shapes: Mapping[str, Sequence[int]] | None = None,
    int_ranges: Mapping[str, tuple[int, int]] | None = None,
    given: Mapping[str, Any] | None = None,
) -> dict[str, np.ndarray]:
    """One random array per declared input of ``inputs`` (``NodeArg``); ``graph`` is the
    onnx-ir graph whose Gather tables bound the integer inputs. Symbolic dims come from
    ``dims`` (else the model folder's genai_config.json, else ``default_dim``).

    ``shapes`` gives an input's whole shape (its fixed dims must agree), ``int_ranges`` an
    integer input's values as ``[low, high)``, ``given`` arrays to use as they are (real
    inputs; only the others are made). Integer inputs get small values (ids, lengths)
    inside the embedding tables they index; an input named like an attention mask gets
    ones, which every attention op accepts.
    """
    dims = {**folder_dims(model_path), **dict(dims or {})}
    shapes, int_ranges, given = dict(shapes or {}), dict(int_ranges or {}), dict(given or {})
    names = [a.name for a in inputs]
    for what, table in (("--shape", shapes), ("--int-range", int_ranges), ("inputs", given)):
        unknown = [n for n in table if n not in names]
        if unknown:
            raise InvalidArgument(
                f"{what} {', '.join(map(repr, unknown))}: the model has no such input; its "
                f"inputs are {names}"
            )
    rng = np.random.default_rng(seed)
    bounds = _index_bounds(graph)
    feeds: dict[str, np.ndarray] = {}
    for arg in inputs:
        if arg.name in given:
            feeds[arg.name] = given[arg.name]
            continue
        feeds[arg.name] = _one(
            arg,
            dims,
            default_dim,
            rng,
            bounds.get(arg.name),
            shapes.get(arg.name),
            int_ranges.get(arg.name),
        )
    return feeds


def folder_dims(model_path: str | None) -> dict[str, int]:
    """Symbolic dims the model's folder settles: a genai_config.json's head size, and an
    empty past (a prompt's first run), so the mask's total length agrees with the ids'."""
    if not model_path:
        return {}
    from .generation.spec import model_dims

    dims = model_dims(model_path)
    return {**dims, "past_sequence_length": 0} if dims else {}


def _index_bounds(graph: Any) -> dict[str, int]:
    """Inputs used as Gather indices into a constant table: the table's size on that axis.

    Token ids, token types and positions then stay inside their embedding tables.
    """
    out: dict[str, int] = {}
    for value in graph.inputs:
        for use in value.uses():
            node = use.node
            if node.op_type != "Gather" or use.idx != 1 or node.inputs[0] is None:
                continue
            table = node.inputs[0]
            if table.const_value is None or table.shape is None:
                continue
            attr = node.attributes.get("axis")
            axis = attr.value if attr is not None else 0
            size = table.shape[axis]
            if isinstance(size, int):
                out[value.name] = min(out.get(value.name, size), size)
    return out


def _shape_of(arg: NodeArg, dims: dict[str, int], default_dim: int, whole: Any) -> list[int]:
    if whole is not None:
        whole = [int(d) for d in whole]
        declared = arg.shape
        if declared is not None and (
            len(declared) != len(whole)
            or any(isinstance(d, int) and d >= 0 and d != w for d, w in zip(declared, whole))
        ):
            raise InvalidArgument(
                f"--shape {arg.name}={','.join(map(str, whole))} does not fit the declared "
                f"shape {declared}: give {len(declared)} dims, keeping the fixed ones"
            )
        return whole
    shape = []
    for d in arg.shape or []:
        if isinstance(d, int) and d >= 0:
            shape.append(d)
        elif isinstance(d, str) and d in dims:
            shape.append(int(dims[d]))
        else:
            shape.append(default_dim)
    return shape


def _one(
    arg: NodeArg,
    dims: dict[str, int],
    default_dim: int,
    rng: np.random.Generator,
    bound: int | None = None,
    whole: Sequence[int] | None = None,
    int_range: tuple[int, int] | None = None,
):
    if not arg.type.startswith("tensor("):
        raise InvalidArgument(
            f"input {arg.name!r} is {arg.type}; random_inputs makes tensors only, feed it yourself"
        )
    shape = _shape_of(arg, dims, default_dim, whole)
    dtype = tensor_dtype(arg.type)
    if int_range is not None:
        if dtype.kind not in "iu":
            raise InvalidArgument(
                f"--int-range {arg.name}: the input is {arg.type}, not an integer tensor"
            )
        lo, hi = int_range
        return rng.integers(lo, hi, size=shape).astype(dtype)
    if "mask" in arg.name.lower() and dtype.kind in "iub":
        return np.ones(shape, dtype=dtype)
    if bound is not None and dtype.kind in "iu":
        return rng.integers(0, max(bound, 1), size=shape).astype(dtype)
    return random_array(tuple(shape), dtype, rng)
