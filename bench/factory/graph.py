"""A small graph writer with onnxruntime-genai's naming, and weights streamed to external data.

Names follow the builder (``/model/layers.0/attn/qkv_proj/MatMul``, output
``.../output_0``, constants ``/model/constants/INT64/[1]``), so a factory
model reads like a builder export node by node. Initializers go straight to
the ``.data`` file when the model is being saved, so a 1.5B-parameter model
never sits in memory twice.
"""

from __future__ import annotations

import ast
import json
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

OPSET = 22  # what the builder (onnxruntime-genai 0.18) declares
MS = "com.microsoft"
_ALIGN = 4096  # external data offsets page-aligned, so onnxruntime can mmap them


class GraphWriter:
    def __init__(self, data_path: Path | None = None) -> None:
        self.nodes: list[onnx.NodeProto] = []
        self.inits: list[TensorProto] = []
        self.inputs: list[onnx.ValueInfoProto] = []
        self.outputs: list[onnx.ValueInfoProto] = []
        self._constants: set[str] = set()
        self._data_path = data_path
        if data_path:
            data_path.parent.mkdir(parents=True, exist_ok=True)
        self._data: BinaryIO | None = open(data_path, "wb") if data_path else None  # noqa: SIM115

    # -- values -------------------------------------------------------------------
    def input(self, name: str, elem: int, shape: list[Any]) -> str:
        self.inputs.append(helper.make_tensor_value_info(name, elem, shape))
        return name

    def output(self, name: str, elem: int, shape: list[Any]) -> str:
        self.outputs.append(helper.make_tensor_value_info(name, elem, shape))
        return name

    def init(self, name: str, array: np.ndarray) -> str:
        """An initializer, written to the external data file when there is one."""
        array = np.ascontiguousarray(array)
        if self._data is None or array.nbytes < 1024:
            self.inits.append(numpy_helper.from_array(array, name))
            return name
        offset = self._data.tell()
        pad = -offset % _ALIGN
        if pad:
            self._data.write(b"\0" * pad)
            offset += pad
        self._data.write(array.tobytes())
        t = TensorProto(name=name, data_type=helper.np_dtype_to_tensor_dtype(array.dtype))
        t.dims.extend(array.shape)
        t.data_location = TensorProto.EXTERNAL
        assert self._data_path is not None
        for key, value in (
            ("location", self._data_path.name),
            ("offset", str(offset)),
            ("length", str(array.nbytes)),
        ):
            t.external_data.add(key=key, value=value)
        self.inits.append(t)
        return name

    def constant(self, dtype: str, value: Any) -> str:
        """The builder's shared constant ``/model/constants/{DTYPE}/{value}``, made once."""
        name = f"/model/constants/{dtype}/{value}"
        if name not in self._constants:
            self._constants.add(name)
            np_type = {
                "INT64": np.int64,
                "INT32": np.int32,
                "FLOAT": np.float32,
                "FLOAT16": np.float16,
            }[dtype]
            arr = np.array(ast.literal_eval(str(value)), np_type)
            self.nodes.append(
                helper.make_node(
                    "Constant",
                    [],
                    [name],
                    name=name.replace("constants", "constant_nodes"),
                    value=numpy_helper.from_array(arr, ""),
                )
            )
        return name

    # -- nodes ----------------------------------------------------------------------
    def node(
        self,
        op: str,
        inputs: list[str],
        name: str,
        outputs: list[str] | int = 1,
        domain: str = "",
        **attrs: Any,
    ) -> list[str]:
        """A node named ``name`` whose outputs default to ``{name}/output_{i}``."""
        if isinstance(outputs, int):
            outputs = [f"{name}/output_{i}" for i in range(outputs)]
        self.nodes.append(
            helper.make_node(op, inputs, outputs, name=name, domain=domain or None, **attrs)
        )
        return outputs

    def op(self, op: str, inputs: list[str], name: str, domain: str = "", **attrs: Any) -> str:
        return self.node(op, inputs, name, 1, domain, **attrs)[0]

    # -- the model ------------------------------------------------------------------
    def finish(self, graph_name: str, metadata: dict[str, Any]) -> onnx.ModelProto:
        if self._data is not None:
            self._data.close()
        graph = helper.make_graph(self.nodes, graph_name, self.inputs, self.outputs, self.inits)
        model = helper.make_model(
            graph,
            opset_imports=[helper.make_opsetid("", OPSET), helper.make_opsetid(MS, 1)],
            producer_name="onnxep-factory",
            ir_version=10,
        )
        for key, value in metadata.items():
            entry = model.metadata_props.add()
            entry.key = key
            entry.value = value if isinstance(value, str) else json.dumps(value)
        return model


def save(model: onnx.ModelProto, path: Path) -> None:
    """Write the proto; its initializers already point at the data file beside it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(model, str(path))
