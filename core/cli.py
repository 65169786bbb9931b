"""The ``onnxep`` command line: providers, run, explain, conformance."""

from __future__ import annotations

import argparse
import sys
from collections import Counter
from pathlib import Path

import numpy as np

from .errors import OnnxepError


def bundled_model() -> Path:
    """The small model ``onnxep run`` uses when none is given."""
    here = Path(__file__).resolve().parent / "data" / "default.onnx"
    return here


def _providers(arg: str | None) -> list[str] | None:
    return [p.strip() for p in arg.split(",") if p.strip()] if arg else None


def cmd_providers(args: argparse.Namespace) -> int:
    from .registry_api import get_all_providers, plugin_failures

    rows = get_all_providers()
    print(f"{'provider':12s} {'device':8s} {'version':10s} {'status':12s} source")
    for r in rows:
        status = "available" if r.available else "unavailable"
        print(f"{r.name:12s} {r.device:8s} {r.version:10s} {status:12s} {r.source}")
        if r.aliases:
            print(f"{'':12s} aliases: {', '.join(r.aliases)}")
        if r.reason:
            print(f"{'':12s} why: {r.reason}")
    failures = plugin_failures()
    if failures:
        print("\nplugins that failed:")
        for f in failures:
            print(f"  {f}")
    return 0


def _dims(pairs: list[str]) -> dict[str, int]:
    out = {}
    for p in pairs or []:
        k, _, v = p.partition("=")
        out[k] = int(v)
    return out


def cmd_run(args: argparse.Namespace) -> int:
    from .random_inputs import random_inputs
    from .session import InferenceSession

    model = args.model or bundled_model()
    sess = InferenceSession(model, providers=_providers(args.providers))
    feeds = random_inputs(sess, _dims(args.dim), seed=args.seed)
    outs = sess.run(None, feeds)
    print(f"model: {model}")
    for name, value in feeds.items():
        print(f"input  {name}: {value.dtype} {list(value.shape)}")
    np.set_printoptions(precision=4, threshold=20, edgeitems=3)
    for arg, value in zip(sess.get_outputs(), outs):
        if isinstance(value, np.ndarray):
            print(f"output {arg.name}: {value.dtype} {list(value.shape)}\n{value}")
        else:
            print(f"output {arg.name}: {value!r}")
    print()
    print(sess.placement().format(max_nodes=args.max_nodes))
    return 0


def cmd_explain(args: argparse.Namespace) -> int:
    from .session import InferenceSession

    sess = InferenceSession(args.model, providers=_providers(args.providers))
    rep = sess.placement()
    if args.json:
        import json

        print(json.dumps(rep.to_dict(), indent=2))
        return 0
    print(rep.format(max_nodes=args.max_nodes))
    fallbacks = Counter((n.op_type, p, r) for n in rep.fallbacks for p, r in n.declined)
    if fallbacks:
        print("\nfallback reasons:")
        for (op, prov, reason), count in fallbacks.most_common():
            print(f"  {count:4d} x {op}: {prov} declined: {reason}")
    return 0


def cmd_conformance(args: argparse.Namespace) -> int:
    from .conformance import CATEGORIES, excluded_reason, run_suite

    cats = args.category.split(",") if args.category else list(CATEGORIES)
    results = run_suite(_providers(args.providers) or ["cpu"], cats, args.pattern)
    unexpected = 0
    for cat in cats:
        rs = [r for r in results if r.category == cat]
        bad = [r for r in rs if not r.ok]
        known = [r for r in bad if excluded_reason(r.name, cat)]
        unexpected += len(bad) - len(known)
        print(
            f"{cat:18s} {len(rs) - len(bad):5d} passed {len(bad):5d} failed of {len(rs)}"
            f" ({len(known)} of the failures are listed exclusions)"
        )
    for r in results:
        if not r.ok:
            why = excluded_reason(r.name, r.category)
            tag = f"excluded: {why}" if why else r.reason
            print(f"FAIL [{r.category}] {r.name}: {tag}")
    return 0 if unexpected == 0 else 1


def cmd_bench(args: argparse.Namespace) -> int:
    from .benchmark import bench

    vs = [v.strip() for v in args.vs.split(",") if v.strip()] if args.vs else []
    result = bench(
        args.model,
        providers=_providers(args.providers),
        vs=vs,
        runs=args.runs,
        warmup=args.warmup,
        decode=args.decode,
        context=args.context,
        dims=_dims(args.dim),
        profile=args.profile,
        json_path=args.json,
        plot=args.plot,
    )
    print(result.table())
    if args.json:
        print(f"samples written to {args.json}")
    return 0


def cmd_parity(args: argparse.Namespace) -> int:
    from .parity import parity_report

    report = parity_report(
        args.model,
        [_providers(args.providers)],
        reference=_providers(args.reference) or ["cpu"],
        dims=_dims(args.dim),
        seed=args.seed,
        rtol=args.rtol,
        atol=args.atol,
    )
    print(f"model: {args.model}")
    print(report.format())
    print("parity: ok" if report.ok else f"parity: {len(report.failures)} output(s) differ")
    return 0 if report.ok else 1


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="onnxep", description=__doc__)
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("providers", help="discovered providers, availability, load failures")
    p.set_defaults(fn=cmd_providers)
    p = sub.add_parser("run", help="run a model on random inputs (a bundled one by default)")
    p.add_argument("model", nargs="?")
    p.add_argument("--providers", help="comma-separated, priority order (default: plugins.toml)")
    p.add_argument("--dim", action="append", help="symbolic dim value, NAME=INT (repeatable)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--max-nodes", type=int, default=40)
    p.set_defaults(fn=cmd_run)
    p = sub.add_parser("explain", help="placement report: providers, copies, fallback reasons")
    p.add_argument("model")
    p.add_argument("--providers")
    p.add_argument("--json", action="store_true")
    p.add_argument("--max-nodes", type=int, default=None)
    p.set_defaults(fn=cmd_explain)
    p = sub.add_parser("bench", help="time onnxep against peers, interleaved, same inputs")
    p.add_argument("model")
    p.add_argument("--providers", default=None)
    p.add_argument("--vs", default="onnxruntime", help="peers: onnxruntime,reference,torch")
    p.add_argument("--runs", type=int, default=50)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--decode", type=int, default=None, metavar="STEPS")
    p.add_argument("--context", type=int, default=16, metavar="N")
    p.add_argument("--dim", action="append", help="symbolic dim value, NAME=INT (repeatable)")
    p.add_argument("--json", default=None, metavar="F")
    p.add_argument("--plot", default=None, metavar="F.png")
    p.add_argument("--profile", action="store_true", help="print the top ops by time")
    p.set_defaults(fn=cmd_bench)
    p = sub.add_parser("conformance", help="run the ONNX backend test cases")
    p.add_argument("--providers", default="cpu")
    p.add_argument(
        "--category", default=None, help="node,simple,pytorch-converted,pytorch-operator"
    )
    p.add_argument("--pattern", default=None, help="regex on case names")
    p.set_defaults(fn=cmd_conformance)
    p = sub.add_parser("parity", help="compare a model's outputs on providers with a reference")
    p.add_argument("model")
    p.add_argument("--providers", required=True, help="comma-separated providers under test")
    p.add_argument("--reference", default="cpu", help="comma-separated reference providers")
    p.add_argument("--dim", action="append", help="symbolic dim value, NAME=INT (repeatable)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--rtol", type=float, default=None, help="override the per-dtype rtol")
    p.add_argument("--atol", type=float, default=None, help="override the per-dtype atol")
    p.set_defaults(fn=cmd_parity)
    return ap


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.fn(args)
    except OnnxepError as exc:
        print(f"onnxep: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
