"""Write parity_table.py: for each op the CUDA provider claims, a case per dtype (no GPU needed).

    python tests/cuda/make_parity_table.py

For each claimed op it takes node-suite cases using that op (single-node
cases first), one per input dtype the CUDA provider accepts (float32,
float16, then up to two more), plus a float16 retyping of a single-node
float32 case when the suite has no float16 case. Every chosen case is run
once on the CPU provider with its perturbed inputs, so the table holds only
cases that are valid models with valid inputs.
"""

from __future__ import annotations

import re
import sys
import warnings
from collections import defaultdict
from pathlib import Path

import numpy as np
import onnx

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import cuda_sim  # noqa: E402
import parity_cases as pc  # noqa: E402

import onnxep  # noqa: E402
from onnxep.providers.dtypes import dtype_name, np_dtype  # noqa: E402
from onnxep.providers_cuda.declines import claimed_ops, dtype_refusal  # noqa: E402

#: Cases whose node the CUDA provider declines by attribute (not by op or dtype).
DECLINED_CASES = {
    r"^test_dft_inverse": "inverse float32 DFT is declined (op_dft.py)",
    r"training_dropout": "training-mode Dropout is declined (op_dropout.py)",
    r"bernoulli|random": "random outputs: the two providers draw different numbers",
    r"^test_attention.*qk_matmul|^test_attention_local_window_gqa_rank4_mask": (
        "Attention's qk_matmul_output is declined (providers_cuda/ops/op_attention.py)"
    ),
}
PREFERRED = ("float", "float16", "int64", "int32", "bool", "uint8", "double", "int8")
MAX_DTYPES = 4


def _first_input_dtype(model: onnx.ModelProto, op: str, domain: str) -> str | None:
    try:
        inferred = onnx.shape_inference.infer_shapes(model)
    except Exception:
        inferred = model
    types = {}
    g = inferred.graph
    for vi in [*g.input, *g.value_info, *g.output]:
        types[vi.name] = vi.type.tensor_type.elem_type
    for init in g.initializer:
        types[init.name] = init.data_type
    for node in g.node:
        if node.op_type == op and (node.domain or "") in (domain, "ai.onnx" if not domain else ""):
            if node.input and node.input[0] in types and types[node.input[0]]:
                return dtype_name(np_dtype(types[node.input[0]]))
    return None


def _model_refused(model: onnx.ModelProto) -> bool:
    g = model.graph
    for vi in [*g.input, *g.output]:
        if vi.type.HasField("tensor_type"):
            try:
                if dtype_refusal(np_dtype(vi.type.tensor_type.elem_type)):
                    return True
            except ValueError:
                return True
        else:
            return True  # sequences, optionals, maps
    return False


def _valid_on_cpu(case: str, dtype: str, op: tuple[str, str] | None = None) -> bool:
    """The case runs on the CPU provider, and (given ``op``) the CUDA provider's
    placement, simulated, runs at least one of the op's nodes as a compute node."""
    try:
        with warnings.catch_warnings(), np.errstate(all="ignore"):
            warnings.simplefilter("ignore")
            model, feeds = pc.build(case, dtype)
            sess = onnxep.InferenceSession(model, providers=["cpu"])
            sess.run(None, feeds)
            if op is not None:
                sim = onnxep.InferenceSession(model, providers=[cuda_sim.NAME, "cpu"])
                mine = [n for n in sim.placement() if (n.domain or "", n.op_type) == op]
                if not any(n.provider == cuda_sim.NAME and n.role == "compute" for n in mine):
                    return False
                if any(n.provider != cuda_sim.NAME and n.role == "compute" for n in mine):
                    return False
        return True
    except Exception:
        return False


def main() -> None:
    cuda_sim.register()
    uses: dict[tuple[str, str], list[str]] = defaultdict(list)
    single: set[str] = set()
    models = {}
    for name in sorted(pc.node_cases()):
        if any(re.search(p, name) for p in DECLINED_CASES):
            continue
        try:
            m = pc.node_case(name, "float32")[0]
        except Exception:
            continue
        models[name] = m
        if len(m.graph.node) == 1:
            single.add(name)
        for n in m.graph.node:
            uses[("" if n.domain in ("", "ai.onnx") else n.domain, n.op_type)].append(name)
    custom = pc.custom().CASES
    table: dict[str, list[tuple[str, str]]] = {}
    for dom, op in sorted(claimed_ops()):
        key = pc.op_key(dom, op)
        entries: list[tuple[str, str]] = []
        if key in custom:
            entries = [(f"custom:{key}", dt) for dt in ("float32", "float16")]
            entries = [e for e in entries if _valid_on_cpu(*e)]
        else:
            cands = sorted(
                set(uses[(dom, op)]), key=lambda n: (n not in single, "expanded" in n, n)
            )
            by_dtype: dict[str, str] = {}
            for name in cands:
                m = models[name]
                if _model_refused(m):
                    continue
                dt = _first_input_dtype(m, op, dom)
                if dt is None or dt in by_dtype:
                    continue
                if _valid_on_cpu(name, "float32", (dom, op)):
                    by_dtype[dt] = name
            order = sorted(
                by_dtype, key=lambda d: (PREFERRED.index(d) if d in PREFERRED else 99, d)
            )
            for dt in order[:MAX_DTYPES]:
                entries.append((by_dtype[dt], "float16" if dt == "float16" else "float32"))
            if "float16" not in by_dtype and "float" in by_dtype and by_dtype["float"] in single:
                if _valid_on_cpu(by_dtype["float"], "float16", (dom, op)):
                    entries.append((by_dtype["float"], "float16"))
        table[key] = entries
        print(f"{key:45s} {entries}", flush=True)
    lines = [
        '"""Generated by make_parity_table.py: op -> [(case, dtype)] for the CUDA parity test."""',
        "",
        "TABLE = {",
    ]
    for key, entries in table.items():
        lines.append(f"    {key!r}: {entries!r},")
    lines.append("}")
    (HERE / "parity_table.py").write_text("\n".join(lines) + "\n")
    empty = [k for k, v in table.items() if not v]
    print(f"{len(table)} ops, {sum(len(v) for v in table.values())} cases; empty: {empty}")


if __name__ == "__main__":
    main()
