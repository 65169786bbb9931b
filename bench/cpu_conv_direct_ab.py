"""Corpus models with the direct Conv kernel off and on, against onnxruntime, in one process.

    python bench/cpu_conv_direct_ab.py MODEL [MODEL ...] [--threads 1] [--rounds 60] [--seconds 25]

MODEL is a corpus name or a path to an .onnx file (random float32 feeds, free dims 1:
``tests/data/resnet_cnn.onnx``, the small ResNet of ``bench/run_all.py``).

Three sessions per model, run one after the other in each round on the same feeds: onnxep
with ``providers_cpu/ops/conv_direct.py`` off (``MODE = "0"``: the routes before it),
onnxep with it on (``auto``), onnxruntime. The table gives each side's median and the
median over rounds of onnxep / onnxruntime in that round, so both onnxep figures are
same-run ratios against the same onnxruntime (on a shared machine onnxruntime's own time
moves 2x between separate runs). ``MODE`` is switched before each onnxep run: a session's
unplanned routes read it per run, its planned direct convs were planned with it on.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT))


def _random_feeds(model) -> dict:
    import numpy as np

    rng = np.random.default_rng(0)
    init = {i.name for i in model.graph.initializer}
    out = {}
    for v in model.graph.input:
        if v.name not in init:
            dims = [d.dim_value or 1 for d in v.type.tensor_type.shape.dim]
            out[v.name] = rng.standard_normal(dims).astype(np.float32)
    return out


def main(argv: list[str] | None = None) -> None:
    import onnx
    import onnxruntime as ort
    from real_models import CORPUS, feeds, fetch

    import onnxep
    from onnxep.providers_cpu.ops import conv_direct

    ap = argparse.ArgumentParser()
    ap.add_argument("models", nargs="+")
    ap.add_argument("--threads", type=int, default=0, help="both sides (0: defaults)")
    ap.add_argument("--rounds", type=int, default=60)
    ap.add_argument("--seconds", type=float, default=25.0, help="per model, after 10 rounds")
    a = ap.parse_args(argv)
    print(f"threads {a.threads or 'default'}; {conv_direct.status()}")
    print(
        f"{'model':20s} {'off ms':>8s} {'on ms':>8s} {'ort ms':>8s} {'off/ort':>8s} "
        f"{'on/ort':>7s} rounds"
    )
    for name in a.models:
        if name.endswith(".onnx"):  # a model file: random float32 feeds, free dims 1
            path = name
            inputs = _random_feeds(onnx.load(path, load_external_data=False))
        else:
            model = next(m for m in CORPUS if m.name == name)
            path = str(fetch(model))
            inputs = feeds(model, onnx.load(path, load_external_data=False))
        sides = {}
        for mode in ("0", "auto"):
            conv_direct.MODE = mode
            so = onnxep.SessionOptions(intra_op_num_threads=a.threads)
            sides[mode] = onnxep.InferenceSession(path, so, providers=["cpu"])
            sides[mode].run(None, inputs)
        oso = ort.SessionOptions()
        oso.intra_op_num_threads = a.threads
        oso.log_severity_level = 4
        sides["ort"] = ort.InferenceSession(path, oso, providers=["CPUExecutionProvider"])
        sides["ort"].run(None, inputs)
        t: dict[str, list[float]] = {k: [] for k in sides}
        end = time.perf_counter() + a.seconds
        for i in range(a.rounds):
            for key, sess in sides.items():
                if key != "ort":
                    conv_direct.MODE = key
                t0 = time.perf_counter()
                sess.run(None, inputs)
                t[key].append(time.perf_counter() - t0)
            if i >= 9 and time.perf_counter() > end:
                break
        conv_direct.MODE = "auto"
        ms = {k: statistics.median(v) * 1e3 for k, v in t.items()}
        ratio = {k: statistics.median(x / y for x, y in zip(t[k], t["ort"])) for k in ("0", "auto")}
        print(
            f"{name:20s} {ms['0']:8.2f} {ms['auto']:8.2f} {ms['ort']:8.2f} {ratio['0']:8.2f} "
            f"{ratio['auto']:7.2f} {len(t['ort'])}",
            flush=True,
        )


if __name__ == "__main__":
    main()
