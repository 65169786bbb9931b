"""x * rsqrt(mean(x^2, -1) + eps) * w  ->  SimplifiedLayerNormalization(x, w).

The pattern PyTorch exports for RMSNorm written by hand (LLaMA, Qwen, Mistral):
Pow(x, 2) -> ReduceMean(last axis, keepdims) -> Add(eps) -> Sqrt -> Reciprocal
(or Div(1, .)) -> Mul(x, .) -> Mul(., w). Seven nodes become one.
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir

from ..rewrite import FusionPass, const_array, only_consumer, single_use

_FLOATS = {ir.DataType.FLOAT, ir.DataType.FLOAT16, ir.DataType.DOUBLE, ir.DataType.BFLOAT16}


def _other(node: ir.Node, v: ir.Value) -> ir.Value | None:
    a, b = node.inputs[0], node.inputs[1]
    return b if a is v else a if b is v else None


def _scalar(arr, value: float | None = None) -> float | None:
    if arr is None or np.asarray(arr).size != 1:
        return None
    x = float(np.asarray(arr).reshape(()))
    return x if value is None or x == value else None


class FuseRMSNorm(FusionPass):
    name = "fuse_rms_norm"

    def call(self, model: ir.Model) -> ir.passes.PassResult:
        if not self.can_emit("", "SimplifiedLayerNormalization"):
            return ir.passes.PassResult(model, False)
        graph = model.graph
        outs = {id(v) for v in graph.outputs}
        changed = False
        for node in list(graph):
            if node.op_type != "Pow" or node.domain not in ("", "ai.onnx") or node.graph is None:
                continue
            match = self._match(node, outs)
            if match is None:
                continue
            x, w, eps, nodes, last = match
            if not all(self.owns(n) for n in nodes):
                continue
            fused = ir.node(
                "SimplifiedLayerNormalization",
                [x, w],
                attributes={"axis": -1, "epsilon": eps, "stash_type": 1},
                name=f"{last.name or 'rms'}_fused",
            )
            graph.insert_before(nodes[0], fused)
            out, old = fused.outputs[0], last.outputs[0]
            out.type, out.shape = old.type, old.shape
            name = old.name
            old.replace_all_uses_with(out, replace_graph_outputs=True)
            old.name, out.name = f"{name}_unfused", name
            for n in reversed(nodes):
                graph.remove(n, safe=True)
            self.count += 1
            changed = True
        return ir.passes.PassResult(model, changed)

    def _match(self, pow_: ir.Node, outs: set[int]):
        x = pow_.inputs[0]
        if x is None or x.dtype not in _FLOATS or _scalar(const_array(pow_.inputs[1]), 2.0) is None:
            return None
        p = pow_.outputs[0]
        mean = only_consumer(p) if single_use(p, outs) else None
        if mean is None or mean.op_type != "ReduceMean" or not self._last_axis(mean, x):
            return None
        m = mean.outputs[0]
        add = only_consumer(m) if single_use(m, outs) else None
        if add is None or add.op_type != "Add":
            return None
        eps = _scalar(const_array(_other(add, m)))
        if eps is None:
            return None
        a = add.outputs[0]
        nxt = only_consumer(a) if single_use(a, outs) else None
        if nxt is None or nxt.op_type != "Sqrt":
            return None
        sq = nxt.outputs[0]
        inv = only_consumer(sq) if single_use(sq, outs) else None
        if inv is None:
            return None
        if inv.op_type == "Div":
            if inv.inputs[1] is not sq or _scalar(const_array(inv.inputs[0]), 1.0) is None:
                return None
        elif inv.op_type != "Reciprocal":
            return None
        q = inv.outputs[0]
        mul = only_consumer(q) if single_use(q, outs) else None
        if mul is None or mul.op_type != "Mul" or _other(mul, q) is not x:
            return None
        y = mul.outputs[0]
        scale = only_consumer(y) if single_use(y, outs) else None
        if scale is None or scale.op_type != "Mul":
            return None
        w = _other(scale, y)
        warr = const_array(w)
        if warr is None or warr.ndim != 1 or w.dtype != x.dtype:
            return None
        if x.shape is not None and isinstance(x.shape[-1], int) and x.shape[-1] != warr.shape[0]:
            return None
        return x, w, eps, [pow_, mean, add, nxt, inv, mul, scale], scale

    @staticmethod
    def _last_axis(mean: ir.Node, x: ir.Value) -> bool:
        keep = mean.attributes.get("keepdims")
        if keep is not None and keep.value == 0:
            return False
        axes_attr = mean.attributes.get("axes")
        if axes_attr is not None:
            axes = list(axes_attr.value)
        elif len(mean.inputs) > 1 and mean.inputs[1] is not None:
            arr = const_array(mean.inputs[1])
            if arr is None:
                return False
            axes = [int(a) for a in np.asarray(arr).reshape(-1)]
        else:
            return False
        if len(axes) != 1:
            return False
        rank = len(x.shape) if x.shape is not None else None
        return axes[0] == -1 or (rank is not None and axes[0] == rank - 1)
