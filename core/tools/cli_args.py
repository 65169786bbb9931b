"""Argument types and checks for the ``onnxep`` command line.

Each ``type=`` function turns one command-line string into a value or raises
``argparse.ArgumentTypeError`` with a message that says what to write
instead; checks that need the model (dims naming its inputs, the size of the
random inputs they make) are the functions at the bottom.
"""

from __future__ import annotations

import argparse
import math
import os
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import InvalidArgument

#: Largest value one ``--dim`` may take: anything past int32 is a typo, not a test size.
MAX_DIM = 2**31 - 1
#: Most elements the ``--dim`` values may give the random inputs, all inputs together
#: (4 GiB of float32): a larger request is refused before anything is allocated.
MAX_FEED_ELEMENTS = 2**30


class UsageError(Exception):
    """A command line argparse refused; ``main`` prints it and the usage, and exits 2."""

    def __init__(self, message: str, usage: str) -> None:
        super().__init__(message)
        self.usage = usage


class Parser(argparse.ArgumentParser):
    """An ArgumentParser whose errors reach ``main`` instead of exiting the process.

    Subparsers inherit the class, so ``onnxep run --dim x`` fails through here too.
    """

    def error(self, message: str):  # type: ignore[override]
        raise UsageError(message, self.format_usage())

    def parse_args(self, args=None, namespace=None):  # type: ignore[override]
        """As argparse's, but an unknown flag is reported with its subcommand's usage
        (``onnxep run --bogus`` shows run's options, not the list of commands)."""
        ns, extras = self.parse_known_args(args, namespace)
        if extras:
            (self._chosen(ns) or self).error(f"unrecognized arguments: {' '.join(extras)}")
        return ns

    def _chosen(self, ns: argparse.Namespace) -> argparse.ArgumentParser | None:
        for action in self._actions:
            # the subcommand table: an action whose choices are the subcommands' parsers
            table = action.choices if isinstance(action.choices, dict) else {}
            chosen = table.get(getattr(ns, action.dest, None))
            if isinstance(chosen, argparse.ArgumentParser):
                return chosen
        return None


def _int(text: str, what: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer; {what}") from None


def positive_int(text: str) -> int:
    """An integer from 1 to MAX_DIM (--runs, --decode, --context)."""
    n = _int(text, "give a whole number of 1 or more")
    if not 1 <= n <= MAX_DIM:
        raise argparse.ArgumentTypeError(f"{n} is out of range; give a number from 1 to {MAX_DIM}")
    return n


def non_negative_int(text: str) -> int:
    """An integer from 0 up (--seed, --warmup, --max-nodes)."""
    n = _int(text, "give a whole number of 0 or more")
    if n < 0:
        raise argparse.ArgumentTypeError(f"{n} is negative; give a number of 0 or more")
    return n


def milliseconds(text: str) -> float:
    """A finite number of milliseconds above 0 (--placement-budget-ms)."""
    try:
        x = float(text)
    except ValueError:
        x = -1.0
    if not 0.0 < x < float("inf"):
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of milliseconds above 0")
    return x


def tolerance(text: str) -> float:
    """A finite float of 0 or more (--rtol, --atol)."""
    try:
        x = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number; write e.g. 1e-4") from None
    if not math.isfinite(x) or x < 0:
        raise argparse.ArgumentTypeError(f"{text} is not a finite number of 0 or more")
    return x


def dim(text: str) -> tuple[str, int]:
    """``NAME=INT``: a symbolic dim of the model's inputs and the size to give it."""
    name, sep, value = text.partition("=")
    name, value = name.strip(), value.strip()
    if not sep or not name or not value:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not NAME=INT; write the symbolic dim's name and its size, "
            "e.g. --dim batch=2"
        )
    try:
        n = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r}: {value!r} is not an integer; write e.g. --dim {name}=2"
        ) from None
    if not 0 <= n <= MAX_DIM:
        raise argparse.ArgumentTypeError(f"{text!r}: a dim must be from 0 to {MAX_DIM}, got {n}")
    return name, n


def shape(text: str) -> tuple[str, tuple[int, ...]]:
    """``NAME=D0,D1,...``: an input's whole shape (for dims without names, too)."""
    name, sep, value = text.partition("=")
    name = name.strip()
    try:
        dims = tuple(int(d) for d in value.split(",") if d.strip() != "")
    except ValueError:
        dims = ()
    if not sep or not name or not dims or any(not 0 <= d <= MAX_DIM for d in dims):
        raise argparse.ArgumentTypeError(
            f"{text!r} is not NAME=D0,D1,...; write the input's name and its whole shape, "
            "e.g. --shape input_ids=1,512"
        )
    return name, dims


def int_range(text: str) -> tuple[str, tuple[int, int]]:
    """``NAME=LOW,HIGH``: random integers for an input in [LOW, HIGH)."""
    name, sep, value = text.partition("=")
    name = name.strip()
    parts = [p.strip() for p in value.split(",")]
    try:
        lo, hi = (int(p) for p in parts) if len(parts) == 2 else (0, 0)
    except ValueError:
        lo, hi = 0, 0
    if not sep or not name or not lo < hi:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not NAME=LOW,HIGH with LOW < HIGH; e.g. --int-range sr=8000,16001 "
            "gives integers from 8000 to 16000"
        )
    return name, (lo, hi)


def add_feed_options(p: argparse.ArgumentParser, dim_help: str, real_inputs: bool = True) -> None:
    """--dim, --shape, --inputs and --int-range: what a command feeds the model (without
    --inputs where ``real_inputs`` is false: the feeds are random)."""
    p.add_argument("--dim", action="append", type=dim, help=dim_help)
    p.add_argument(
        "--shape",
        action="append",
        type=shape,
        metavar="NAME=D0,D1",
        help="an input's whole shape, dims with or without names (repeatable)",
    )
    if real_inputs:
        p.add_argument(
            "--inputs",
            action="append",
            metavar="FILE",
            help="real inputs: .npz, .npy or .pb (NAME=FILE for one input), or a folder of "
            "input_N.pb (ONNX's test data); the rest stay random (repeatable)",
        )
    p.add_argument(
        "--int-range",
        action="append",
        type=int_range,
        metavar="NAME=LO,HI",
        help="random integers for an input in [LO, HI) (repeatable)",
    )


def feed_options(args: argparse.Namespace, model: str) -> dict[str, Any]:
    """The keyword arguments ``random_inputs`` (and parity, bench) take from those options."""
    from .feed_files import read_feed_files

    given: dict[str, Any] = {}
    if getattr(args, "inputs", None):
        given = read_feed_files(args.inputs, [a.name for a in declared_inputs(model)])
    return {
        "dims": dims_dict(getattr(args, "dim", None)),
        "shapes": dict(getattr(args, "shape", None) or []),
        "int_ranges": dict(getattr(args, "int_range", None) or []),
        "given": given,
    }


def fraction(text: str) -> float:
    """A number from 0 to 1 (--min-coverage)."""
    try:
        f = float(text)
    except ValueError:
        f = -1.0
    if not 0.0 <= f <= 1.0:
        raise argparse.ArgumentTypeError(f"{text!r} is not a fraction from 0 to 1, e.g. 0.9")
    return f


def names(text: str) -> list[str]:
    """A comma-separated list with at least one name (--providers, --reference)."""
    out = [p.strip() for p in text.split(",") if p.strip()]
    if not out:
        raise argparse.ArgumentTypeError(
            f"{text!r} names nothing; give comma-separated names, e.g. cuda,cpu"
        )
    return out


def peers(text: str) -> list[str]:
    """``--vs``: comma-separated peers, each one bench knows; empty for onnxep alone."""
    from .benchmark.sides import SIDES

    out = [p.strip() for p in text.split(",") if p.strip()]
    unknown = [p for p in out if p not in SIDES]
    if unknown:
        raise argparse.ArgumentTypeError(
            f"unknown peer {', '.join(map(repr, unknown))}; choose from {', '.join(SIDES)}"
        )
    return out


def categories(text: str) -> list[str]:
    """``--category``: comma-separated ONNX backend test categories."""
    from .conformance import CATEGORIES

    out = [c.strip() for c in text.split(",") if c.strip()]
    unknown = [c for c in out if c not in CATEGORIES]
    if unknown or not out:
        what = ", ".join(map(repr, unknown)) if unknown else repr(text)
        raise argparse.ArgumentTypeError(
            f"unknown category {what}; choose from {', '.join(CATEGORIES)}"
        )
    return out


def regex(text: str) -> str:
    """``--pattern``: a Python regular expression, compiled here so a typo fails early."""
    try:
        re.compile(text)
    except re.error as exc:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a valid regular expression: {exc}"
        ) from None
    return text


def folder_model(path: Path) -> Path | None:
    """The model a genai-format folder names (genai_config.json's decoder filename)."""
    cfg = path / "genai_config.json"
    if not cfg.is_file():
        return None
    import json

    try:
        decoder = json.loads(cfg.read_text()).get("model", {}).get("decoder", {})
    except (ValueError, OSError, AttributeError):
        return None
    name = decoder.get("filename", "model.onnx") if isinstance(decoder, dict) else None
    return path / name if isinstance(name, str) else None


def model_file(text: str) -> str:
    """A model path that exists, is a regular file and can be read; a folder with a
    genai_config.json stands for the model it names."""
    path = Path(text)
    if not path.exists():
        raise argparse.ArgumentTypeError(f"model file {text!r} does not exist")
    if path.is_dir():
        named = folder_model(path)
        if named is None:
            raise argparse.ArgumentTypeError(
                f"{text!r} is a folder; pass the .onnx file inside it (or a model folder with "
                "a genai_config.json)"
            )
        if not named.is_file():
            raise argparse.ArgumentTypeError(
                f"{text!r}: its genai_config.json names {named.name!r}, which is not there"
            )
        return model_file(str(named))
    if not path.is_file():
        # A device or a pipe: reading it may never end.
        raise argparse.ArgumentTypeError(f"{text!r} is not a regular file; pass an .onnx file")
    try:
        with open(path, "rb"):
            pass
    except OSError as exc:
        raise argparse.ArgumentTypeError(
            f"model file {text!r} cannot be read: {exc.strerror}"
        ) from None
    return text


def output_file(text: str) -> str:
    """A file to write (--json, --plot): its folder must exist and it must not be a folder."""
    path = Path(text)
    if path.is_dir():
        raise argparse.ArgumentTypeError(f"{text!r} is a folder; give a file name to write")
    parent = path.parent if str(path.parent) else Path(".")
    if not parent.is_dir():
        raise argparse.ArgumentTypeError(
            f"cannot write {text!r}: folder {str(parent)!r} does not exist"
        )
    if not os.access(parent, os.W_OK):
        raise argparse.ArgumentTypeError(
            f"cannot write {text!r}: folder {str(parent)!r} is not writable"
        )
    return text


def plot_file(text: str) -> str:
    """``--plot``: a writable path whose suffix matplotlib can save, matplotlib installed."""
    text = output_file(text)
    try:
        from matplotlib.backend_bases import FigureCanvasBase
    except ImportError:
        raise argparse.ArgumentTypeError(
            "--plot needs matplotlib: pip install 'onnxep[plot]'"
        ) from None
    kinds = FigureCanvasBase.get_supported_filetypes()
    suffix = Path(text).suffix.lstrip(".").lower()
    if suffix not in kinds:
        raise argparse.ArgumentTypeError(
            f"{text!r}: matplotlib cannot save {suffix or 'a file without a suffix'}; "
            f"use one of .{', .'.join(sorted(kinds))}"
        )
    return text


# --- checks that need the model ---------------------------------------------


@dataclass(frozen=True)
class DeclaredInput:
    """A graph input as far as dims go: its name and shape (None where unknown)."""

    name: str
    shape: Sequence[int | str | None] | None


def dims_dict(pairs: Iterable[tuple[str, int]] | None) -> dict[str, int]:
    """The ``--dim`` pairs as a dict; the same name given twice is an error."""
    out: dict[str, int] = {}
    for name, value in pairs or []:
        if name in out and out[name] != value:
            raise InvalidArgument(
                f"--dim {name} is given twice ({out[name]} and {value}); keep one"
            )
        out[name] = value
    return out


def declared_inputs(model: str | os.PathLike) -> list[DeclaredInput]:
    """The model file's graph inputs (initializers left out), read without external data."""
    from ..loading.read import read_model

    graph = read_model(model).proto.graph
    inits = {t.name for t in graph.initializer}
    out = []
    for value in graph.input:
        if value.name in inits:
            continue
        shape: list[int | str | None] | None = None
        if value.type.HasField("tensor_type") and value.type.tensor_type.HasField("shape"):
            shape = [
                d.dim_value if d.HasField("dim_value") else (d.dim_param or None)
                for d in value.type.tensor_type.shape.dim
            ]
        out.append(DeclaredInput(value.name, shape))
    return out


def check_dims(inputs: Sequence[Any], dims: dict[str, int]) -> None:
    """Every ``--dim`` names a symbolic dim of an input; the random inputs stay under the cap.

    ``inputs`` are anything with ``name`` and ``shape`` (``get_inputs()`` or
    ``declared_inputs``). Symbolic dims not given count as 1, as in ``random_inputs``.
    """
    if not dims:
        return
    symbolic = sorted({d for a in inputs for d in (a.shape or []) if isinstance(d, str)})
    unknown = [n for n in dims if n not in symbolic]
    if unknown:
        have = (
            f"its inputs' symbolic dims are {', '.join(symbolic)}"
            if symbolic
            else "its inputs have no symbolic dims"
        )
        raise InvalidArgument(
            f"--dim {', '.join(unknown)}: no input of the model has a dim of that name; {have}"
        )
    total, biggest = 0, ("", 0, [])
    for a in inputs:
        shape = [
            d if isinstance(d, int) and d >= 0 else dims.get(d, 1) if isinstance(d, str) else 1
            for d in (a.shape or [])
        ]
        n = math.prod(shape) if a.shape is not None else 0
        total += n
        if n > biggest[1]:
            biggest = (a.name, n, shape)
    if total > MAX_FEED_ELEMENTS:
        name, n, shape = biggest
        raise InvalidArgument(
            f"the --dim values give random inputs of {total:,} elements in all (input {name!r} "
            f"alone is {shape}, {n:,} elements); the limit is {MAX_FEED_ELEMENTS:,} "
            "(4 GiB of float32): give smaller dims"
        )
