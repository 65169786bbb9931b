"""The decode stages' summary: per side tok/s, ms per step, capture counters, floor fraction.

``python -m onnxep.tools.benchmark.decode_report OUT --pattern 'decode_*_ctx*.json'``
prints one block per ``bench --decode --json`` file (named ``<prefix><tag>_ctx<N>.json``).
The bandwidth floor of a decode step is the time to read every weight once:
the model's initializer bytes over the device's bandwidth (default 4.26 TB/s,
the H200's measured device copy bandwidth, bench/results/2026-12-01-h200-llm-kernels.md);
each side's fraction of it is that floor over its median ms per step.
"""

from __future__ import annotations

import argparse
import glob
import json
import math
import os
from collections.abc import Mapping
from typing import Any

#: bytes per second a decode step's weight reads are measured against (H200 copy bandwidth)
H200_BANDWIDTH = 4.26e12

_SUBBYTE_BITS = {"INT4": 4, "UINT4": 4, "FLOAT4E2M1": 4, "INT2": 2, "UINT2": 2}


def weight_bytes(model_path: str) -> int:
    """Bytes of the model's initializers, as stored (packed 4-bit weights count as stored);
    external data is counted from the declared shapes, never read."""
    import onnx
    from onnx import helper

    proto = onnx.load(model_path, load_external_data=False)
    total = 0
    for t in proto.graph.initializer:
        n = math.prod(t.dims)
        name = onnx.TensorProto.DataType.Name(t.data_type)
        if name in _SUBBYTE_BITS:
            total += -(-n * _SUBBYTE_BITS[name] // 8)
        elif t.data_type == onnx.TensorProto.STRING:
            total += sum(len(s) for s in t.string_data)
        else:
            total += n * helper.tensor_dtype_to_np_dtype(t.data_type).itemsize
    return total


def floor_ms(nbytes: int, bandwidth: float = H200_BANDWIDTH) -> float:
    """Milliseconds to read ``nbytes`` once at ``bandwidth`` bytes per second."""
    if bandwidth <= 0:
        raise ValueError(f"bandwidth must be positive bytes per second, got {bandwidth}")
    return nbytes / bandwidth * 1000.0


def floor_line(result: Mapping[str, Any], bandwidth: float = H200_BANDWIDTH) -> str:
    """The floor and each side's fraction of it (floor ms over the side's median ms)."""
    nbytes = result.get("weight_bytes")
    if nbytes is None and os.path.isfile(str(result.get("model", ""))):
        nbytes = weight_bytes(result["model"])
    if not nbytes:
        return "  bandwidth floor: n/a (no weight bytes recorded and the model is not here)"
    floor = floor_ms(nbytes, bandwidth)
    parts = ", ".join(
        f"{name} {floor / s['median_ms']:.1%}" for name, s in result["summary"].items()
    )
    return (
        f"  bandwidth floor: {nbytes / 1e9:.3f} GB of weights / {bandwidth / 1e12:.2f} TB/s = "
        f"{floor:.3f} ms/step; fraction of it: {parts}"
    )


def _us(v: Any) -> str:
    return "n/a" if v is None else f"{v:.1f}"


def block(tag: str, r: Mapping[str, Any], bandwidth: float = H200_BANDWIDTH) -> list[str]:
    """One bench JSON's lines."""
    sides = "; ".join(
        f"{k} {1000 / s['median_ms']:.1f} tok/s {s['median_ms']:.3f} ms/step"
        for k, s in r["summary"].items()
    )
    by_name = {s["name"]: s for s in r["sides"]}
    ours = by_name.get("onnxep", {})
    ref = r["tokens"].get("onnxep", [])
    agree = ", ".join(
        f"{k} {sum(a == b for a, b in zip(ref, t))}/{len(ref)}"
        for k, t in r["tokens"].items()
        if k != "onnxep"
    )
    lines = [
        f"{tag}: {sides}",
        f"  onnxep: state {ours.get('state_path')} ({ours.get('state_note')}), d2h reads/step "
        f"{ours.get('device_to_host_reads_per_step')}, copied/step "
        f"{ours.get('copied_outputs_per_step')}, host {_us(ours.get('host_us_per_op'))} us/op "
        f"of {ours.get('compute_nodes')} nodes, profiled {_us(ours.get('profiled_us_per_op'))}"
        f" us/op, placement {ours.get('nodes_per_provider')}; tokens equal: {agree}",
    ]
    for side in r["sides"]:
        if side.get("decode"):  # how a peer keeps its cache (onnxruntime's IO binding)
            lines.append(f"  {side['name']}: {side['decode']}")
        c = side.get("capture_timed")
        if not c:
            continue
        extra = ""
        if side["name"].startswith("onnxep"):
            extra = (
                f", copied/step {side.get('copied_outputs_per_step')}, full-capacity mask "
                f"{side.get('full_mask')}"
            )
        elif side.get("capacity") is not None:
            extra = f", static cache of {side['capacity']} rows"
        lines.append(
            f"  {side['name']} capture {c['policy']}: timed decode captures {c['captures']},"
            f" replays {c['replays']}, fallbacks {c['fallbacks']}{extra}"
            + (f"; failures: {'; '.join(c['failures'])[:300]}" if c["failures"] else "")
        )
    alone = r.get("sustained_ms_per_step") or {}
    if alone:
        lines.append(
            "  back to back (each side alone, one sync at the end): "
            + "; ".join(f"{k} {1000 / v:.1f} tok/s {v:.3f} ms/step" for k, v in alone.items())
        )
    lines.append(floor_line(r, bandwidth))
    for name, why in r.get("skipped", {}).items():
        lines.append(f"  {name} skipped: {why}")
    return lines


def _key(path: str, prefix: str) -> tuple[str, int]:
    base = os.path.basename(path)
    tag, _, ctx = base[len(prefix) : -len(".json")].rpartition("_ctx")
    return tag, int(ctx) if ctx.isdigit() else -1


def report(out_dir: str, pattern: str, bandwidth: float = H200_BANDWIDTH) -> str:
    """Every matching JSON's block, ordered by tag and context."""
    prefix = pattern.split("*", 1)[0]
    paths = sorted(glob.glob(os.path.join(out_dir, pattern)), key=lambda p: _key(p, prefix))
    lines: list[str] = []
    for path in paths:
        tag, ctx = _key(path, prefix)
        with open(path) as f:
            lines += block(f"{tag} context {ctx}", json.load(f), bandwidth)
    return "\n".join(lines) if lines else f"no {pattern} in {out_dir}"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("out", help="folder holding the bench JSON files")
    p.add_argument("--pattern", default="decode_*_ctx*.json")
    p.add_argument("--bandwidth-tbs", type=float, default=H200_BANDWIDTH / 1e12)
    args = p.parse_args(argv)
    print(report(args.out, args.pattern, args.bandwidth_tbs * 1e12))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
