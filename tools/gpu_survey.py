"""Survey: which generic kernels already run correctly on CuPy (a GPU machine).

    python tools/gpu_survey.py OUT_DIR

Registers a throwaway CuPy provider that claims every generic kernel (and
declines dtypes CuPy lacks), runs every ONNX backend node case with
providers=[that, "cpu"], and writes per-op results to OUT_DIR/gpu_survey.json
and a summary to stdout. It is a map for the CUDA provider's work, not the
provider itself.
"""

from __future__ import annotations

import collections
import json
import sys
import time
import warnings
from pathlib import Path

import cupy
import numpy as np

import onnxep
from onnxep.providers import Decline, KernelLibrary, Provider, ProviderInfo, hookimpl
from onnxep.tools.conformance import case_data, case_model, load_cases

_OK_KINDS = "biufc"


class CuPySurvey(Provider):
    def __init__(self, options):
        super().__init__("cupy_survey", options, device="cuda", xp=cupy)

    def claim(self, node):
        for v in (*node.inputs, *node.outputs):
            if v is not None and v.dtype is not None:
                if v.dtype.kind not in _OK_KINDS or v.dtype.name.startswith(
                    ("float8", "float4", "int4", "uint4", "int2", "uint2")
                ):
                    return Decline(f"dtype {v.dtype} is not a CuPy dtype")
            if v is not None and v.kind not in ("tensor", "unknown"):
                return Decline(f"{v.kind} values stay on the host")
        if node.subgraphs:
            return Decline("control flow stays on the host")
        return super().claim(node)

    def to_host(self, v):
        return cupy.asnumpy(v) if isinstance(v, cupy.ndarray) else v

    def from_host(self, v):
        if isinstance(v, np.ndarray) and v.dtype.kind in _OK_KINDS:
            return cupy.asarray(v)
        return v

    def synchronize(self):
        cupy.cuda.Device().synchronize()


class Plugin:
    @hookimpl
    def onnxep_provider_info(self):
        return ProviderInfo(name="cupy_survey", device="cuda")

    @hookimpl
    def onnxep_create_provider(self, options):
        return CuPySurvey(options)

    @hookimpl
    def onnxep_kernels(self, provider):
        if provider.name == "cupy_survey":
            return KernelLibrary.from_package("onnxep.providers.ops")


def main(out: Path) -> None:
    from onnx.backend.test.runner import Runner

    onnxep.register_provider(Plugin())
    per_op: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    failures: dict[str, list[str]] = collections.defaultdict(list)
    t0 = time.time()
    for case in load_cases("node"):
        model = case_model(case)
        ops = sorted({n.op_type for n in model.graph.node})
        try:
            with warnings.catch_warnings(), np.errstate(all="ignore"):
                warnings.simplefilter("ignore")
                sess = onnxep.InferenceSession(model, providers=["cupy_survey", "cpu"])
                on_gpu = {n.op_type for n in sess.placement() if n.provider == "cupy_survey"}
                for ins, outs in case_data(case):
                    feeds = dict(zip([i.name for i in model.graph.input], ins))
                    got = sess.run(None, feeds)
                    Runner.assert_similar_outputs(outs, got, case.rtol, case.atol)
            status = "pass"
            reason = ""
        except Exception as exc:
            status, reason = "fail", f"{type(exc).__name__}: {str(exc)[:300]}"
            on_gpu = locals().get("on_gpu", set())
        for op in ops:
            if op in on_gpu:
                per_op[op][status] += 1
                if status == "fail":
                    failures[op].append(f"{case.name}: {reason}")
            else:
                per_op[op]["host"] += 1
    doc = {
        "cupy": cupy.__version__,
        "gpu": cupy.cuda.runtime.getDeviceProperties(0)["name"].decode(),
        "seconds": time.time() - t0,
        "per_op": {k: dict(v) for k, v in sorted(per_op.items())},
        "failures": {k: v[:5] for k, v in sorted(failures.items())},
    }
    out.mkdir(parents=True, exist_ok=True)
    (out / "gpu_survey.json").write_text(json.dumps(doc, indent=1))
    clean = [op for op, c in per_op.items() if c.get("pass") and not c.get("fail")]
    broken = [op for op, c in per_op.items() if c.get("fail")]
    print(f"ops passing every GPU case: {len(clean)}; ops with GPU failures: {len(broken)}")
    for op in sorted(broken):
        print(f"  {op}: {dict(per_op[op])} e.g. {failures[op][0][:200]}")


if __name__ == "__main__":
    main(Path(sys.argv[1]))
