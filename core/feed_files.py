"""Real inputs from files for the command line (``--inputs``): NumPy's .npz and .npy, and
ONNX's TensorProto .pb files, alone or as a test-data folder (``input_0.pb``, ...).

A spec is ``PATH`` or ``NAME=PATH``. An .npz names its arrays; a .pb names its tensor
when its ``name`` field is set (else its place, ``input_N.pb``, or the spec's NAME); a
lone .npy needs NAME unless the model has one input. Inputs given no file stay random.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from .errors import InvalidArgument


def _pb(path: Path) -> tuple[str, np.ndarray]:
    import onnx
    from onnx import numpy_helper

    t = onnx.TensorProto()
    try:
        t.ParseFromString(path.read_bytes())
        return t.name, numpy_helper.to_array(t)
    except Exception as exc:
        raise InvalidArgument(
            f"--inputs {str(path)!r} is not a TensorProto file (ONNX's test-data format): {exc}"
        ) from None


def _npy(path: Path) -> np.ndarray:
    try:
        return np.load(path, allow_pickle=False)  # nothing a file holds is unpickled
    except (ValueError, OSError) as exc:
        raise InvalidArgument(
            f"--inputs {str(path)!r} is not a readable .npy file: {exc}"
        ) from None


def read_feed_files(specs: Sequence[str], input_names: Sequence[str]) -> dict[str, np.ndarray]:
    """The arrays ``specs`` give, by input name; an unknown name is an error listing the
    model's inputs."""
    names = list(input_names)
    feeds: dict[str, np.ndarray] = {}

    def put(name: str | None, value: np.ndarray, where: str, index: int | None = None) -> None:
        if not name and index is not None and index < len(names):
            name = names[index]
        if not name and len(names) == 1:
            name = names[0]
        if not name:
            raise InvalidArgument(
                f"--inputs {where}: which input is this? write NAME={where} (the model's "
                f"inputs are {names})"
            )
        if name not in names:
            raise InvalidArgument(
                f"--inputs {where}: the model has no input {name!r}; its inputs are {names}"
            )
        feeds[name] = value

    for spec in specs:
        name, sep, rest = spec.partition("=")
        name, text = (name.strip(), rest.strip()) if sep and not Path(spec).exists() else ("", spec)
        path = Path(text)
        if not path.exists():
            raise InvalidArgument(f"--inputs {text!r} does not exist")
        if path.is_dir():
            pbs = sorted(path.glob("input_*.pb"), key=lambda p: int(re.sub(r"\D", "", p.stem) or 0))
            if not pbs:
                raise InvalidArgument(
                    f"--inputs {text!r} is a folder without input_N.pb files (ONNX's test-data "
                    "format: test_data_set_0/input_0.pb, ...)"
                )
            for pb in pbs:
                tname, arr = _pb(pb)
                put(
                    tname if tname in names else None, arr, str(pb), int(re.sub(r"\D", "", pb.stem))
                )
            continue
        suffix = path.suffix.lower()
        if suffix == ".npz":
            try:
                with np.load(path, allow_pickle=False) as z:
                    for key in z.files:
                        put(key, z[key], f"{text}[{key}]")
            except (ValueError, OSError) as exc:
                raise InvalidArgument(
                    f"--inputs {text!r} is not a readable .npz file: {exc}"
                ) from None
        elif suffix == ".npy":
            put(name or None, _npy(path), text)
        elif suffix == ".pb":
            tname, arr = _pb(path)
            put(name or (tname if tname in names else None), arr, text)
        else:
            raise InvalidArgument(
                f"--inputs {text!r}: give an .npz, .npy or .pb file, or a folder of input_N.pb"
            )
    return feeds
