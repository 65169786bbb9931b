"""The ``onnxep`` command line: providers, run, explain, conformance."""

from __future__ import annotations

import argparse
import sys
from collections import Counter
from pathlib import Path

import numpy as np

from . import cli_args
from .errors import InvalidArgument, OnnxepError, RunError


def bundled_model() -> Path:
    """The small model ``onnxep run`` uses when none is given."""
    here = Path(__file__).resolve().parent / "data" / "default.onnx"
    return here


def cmd_providers(args: argparse.Namespace) -> int:
    from .registry_api import check_providers, plugin_failures

    rows = check_providers()  # starts each available provider once, to be sure it does
    print(f"{'provider':12s} {'device':8s} {'version':10s} {'status':12s} source")
    for r in rows:
        status = "broken" if r.broken else "available" if r.available else "unavailable"
        print(f"{r.name:12s} {r.device:8s} {r.version:10s} {status:12s} {r.source}")
        if r.aliases:
            print(f"{'':12s} aliases: {', '.join(r.aliases)}")
        if r.reason:
            print(f"{'':12s} why: {r.reason}")
    records = plugin_failures()
    for title, group in (
        ("plugins that failed", [f for f in records if f.failed]),
        ("kernel registrations set aside", [f for f in records if not f.failed]),
    ):
        if group:
            print(f"\n{title}:")
            for f in group:
                print(f"  {f}")
    return 0


def cmd_run(args: argparse.Namespace) -> int:
    from .random_inputs import random_inputs
    from .session import InferenceSession

    model = args.model or bundled_model()
    sess = InferenceSession(model, providers=args.providers)
    dims = cli_args.dims_dict(args.dim)
    cli_args.check_dims(sess.get_inputs(), dims)
    feeds = random_inputs(sess, dims, seed=args.seed)
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

    sess = InferenceSession(args.model, providers=args.providers)
    rep = sess.placement()
    capture = sess.capture_plan()
    if args.json:
        import json

        out = rep.to_dict()
        if capture is not None:
            out["capture"] = capture.to_dict()
        print(json.dumps(out, indent=2))
        return 0
    print(rep.format(max_nodes=args.max_nodes))
    if capture is not None:
        print()
        print(capture.format())
    fallbacks = Counter((n.op_type, p, r) for n in rep.fallbacks for p, r in n.declined)
    if fallbacks:
        print("\nfallback reasons:")
        for (op, prov, reason), count in fallbacks.most_common():
            print(f"  {count:4d} x {op}: {prov} declined: {reason}")
    return 0


def cmd_conformance(args: argparse.Namespace) -> int:
    from onnxep.providers.discovery import get_host

    from .config import load_config
    from .conformance import CATEGORIES, excluded_reason, run_suite
    from .providers_select import select_providers

    # Checked once here, so a wrong name is one error rather than a failure per case.
    select_providers(get_host(load_config()), args.providers, None)
    cats = args.category or list(CATEGORIES)
    results = run_suite(args.providers, cats, args.pattern)
    if not results:
        raise InvalidArgument(
            f"no case in {', '.join(cats)} matches --pattern {args.pattern!r}; "
            "the names look like test_relu or test_averagepool_2d_default"
        )
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

    dims = cli_args.dims_dict(args.dim)
    if dims:
        cli_args.check_dims(cli_args.declared_inputs(args.model), dims)
    result = bench(
        args.model,
        providers=args.providers,
        vs=args.vs,
        runs=args.runs,
        warmup=args.warmup,
        decode=args.decode,
        context=args.context,
        dims=dims,
        profile=args.profile,
        json_path=args.json,
        plot=args.plot,
    )
    print(result.table())
    if "onnxep" in result.skipped:
        raise RunError(f"onnxep could not run the model: {result.skipped['onnxep']}")
    if args.json:
        print(f"samples written to {args.json}")
    return 0


def cmd_parity(args: argparse.Namespace) -> int:
    from .parity import parity_report

    dims = cli_args.dims_dict(args.dim)
    if dims:
        cli_args.check_dims(cli_args.declared_inputs(args.model), dims)
    report = parity_report(
        args.model,
        [args.providers],
        reference=args.reference,
        dims=dims,
        seed=args.seed,
        rtol=args.rtol,
        atol=args.atol,
    )
    print(f"model: {args.model}")
    print(report.format())
    print("parity: ok" if report.ok else f"parity: {len(report.failures)} output(s) differ")
    return 0 if report.ok else 1


def build_parser() -> argparse.ArgumentParser:
    dim_help = (
        f"symbolic dim value, NAME=INT (repeatable); 0 to {cli_args.MAX_DIM}, and the random "
        f"inputs may hold {cli_args.MAX_FEED_ELEMENTS:,} elements in all"
    )
    providers_help = "comma-separated, priority order (default: plugins.toml)"
    ap = cli_args.Parser(prog="onnxep", description=__doc__)
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("providers", help="discovered providers, availability, load failures")
    p.set_defaults(fn=cmd_providers)
    p = sub.add_parser("run", help="run a model on random inputs (a bundled one by default)")
    p.add_argument("model", nargs="?", type=cli_args.model_file)
    p.add_argument("--providers", type=cli_args.names, help=providers_help)
    p.add_argument("--dim", action="append", type=cli_args.dim, help=dim_help)
    p.add_argument("--seed", type=cli_args.non_negative_int, default=0)
    p.add_argument("--max-nodes", type=cli_args.non_negative_int, default=40)
    p.set_defaults(fn=cmd_run)
    p = sub.add_parser("explain", help="placement report: providers, copies, fallback reasons")
    p.add_argument("model", type=cli_args.model_file)
    p.add_argument("--providers", type=cli_args.names, help=providers_help)
    p.add_argument("--json", action="store_true")
    p.add_argument("--max-nodes", type=cli_args.non_negative_int, default=None)
    p.set_defaults(fn=cmd_explain)
    p = sub.add_parser("bench", help="time onnxep against peers, interleaved, same inputs")
    p.add_argument("model", type=cli_args.model_file)
    p.add_argument("--providers", type=cli_args.names, default=None, help=providers_help)
    p.add_argument(
        "--vs",
        type=cli_args.peers,
        default="onnxruntime",
        help="peers: onnxruntime,reference,torch,onnxep-graph,torch-graph,onnxruntime-graph "
        "(the last three: CUDA; onnxruntime-graph: onnxruntime-gpu's CUDA graph, decode only)",
    )
    p.add_argument("--runs", type=cli_args.positive_int, default=50)
    p.add_argument("--warmup", type=cli_args.non_negative_int, default=5)
    p.add_argument("--decode", type=cli_args.positive_int, default=None, metavar="STEPS")
    p.add_argument("--context", type=cli_args.positive_int, default=16, metavar="N")
    p.add_argument("--dim", action="append", type=cli_args.dim, help=dim_help)
    p.add_argument("--json", type=cli_args.output_file, default=None, metavar="F")
    p.add_argument("--plot", type=cli_args.plot_file, default=None, metavar="F.png")
    p.add_argument("--profile", action="store_true", help="print the top ops by time")
    p.set_defaults(fn=cmd_bench)
    p = sub.add_parser("conformance", help="run the ONNX backend test cases")
    p.add_argument("--providers", type=cli_args.names, default="cpu")
    p.add_argument(
        "--category",
        type=cli_args.categories,
        default=None,
        help="node,simple,pytorch-converted,pytorch-operator",
    )
    p.add_argument("--pattern", type=cli_args.regex, default=None, help="regex on case names")
    p.set_defaults(fn=cmd_conformance)
    p = sub.add_parser("parity", help="compare a model's outputs on providers with a reference")
    p.add_argument("model", type=cli_args.model_file)
    p.add_argument(
        "--providers",
        type=cli_args.names,
        required=True,
        help="comma-separated providers under test",
    )
    p.add_argument(
        "--reference",
        type=cli_args.names,
        default="cpu",
        help="comma-separated reference providers",
    )
    p.add_argument("--dim", action="append", type=cli_args.dim, help=dim_help)
    p.add_argument("--seed", type=cli_args.non_negative_int, default=0)
    p.add_argument(
        "--rtol", type=cli_args.tolerance, default=None, help="override the per-dtype rtol"
    )
    p.add_argument(
        "--atol", type=cli_args.tolerance, default=None, help="override the per-dtype atol"
    )
    p.set_defaults(fn=cmd_parity)
    return ap


def main(argv: list[str] | None = None) -> int:
    """Run the command line; user errors print ``onnxep: error: ...`` and return 2."""
    try:
        args = build_parser().parse_args(argv)
        return args.fn(args)
    except cli_args.UsageError as exc:
        print(f"onnxep: error: {exc}\n{exc.usage}", end="", file=sys.stderr)
        return 2
    except OnnxepError as exc:
        print(f"onnxep: error: {exc}", file=sys.stderr)
        return 2
    except MemoryError as exc:
        print(
            f"onnxep: error: out of memory ({exc}); give smaller --dim values or a smaller model",
            file=sys.stderr,
        )
        return 2


if __name__ == "__main__":
    sys.exit(main())
