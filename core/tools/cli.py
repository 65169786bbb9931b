"""The ``onnxep`` command line: providers, run, explain, conformance, bench, parity, generate,
serve."""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import InvalidArgument, OnnxepError, RunError
from ..serve import cli as serve_cli
from . import cli_args, cli_generate


def bundled_model() -> Path:
    """The small model ``onnxep run`` uses when none is given."""
    here = Path(__file__).resolve().parent.parent / "data" / "default.onnx"
    return here


def cmd_providers(args: argparse.Namespace) -> int:
    from ..plugins.registration import check_providers, plugin_failures

    rows = check_providers()  # starts each available provider once, to be sure it does
    print(f"{'provider':12s} {'device':8s} {'version':10s} {'status':12s} {'default':8s} source")
    for r in rows:
        status = "broken" if r.broken else "available" if r.available else "unavailable"
        default = "yes" if r.default else "opt-in"
        print(f"{r.name:12s} {r.device:8s} {r.version:10s} {status:12s} {default:8s} {r.source}")
        if r.aliases:
            print(f"{'':12s} aliases: {', '.join(r.aliases)}")
        if r.description:
            print(f"{'':12s} about: {r.description}")
        if r.reason:
            print(f"{'':12s} why: {r.reason}")
    used = [r.name for r in rows if r.default and r.available]
    print(
        f"\na session with no providers= list runs on: {', '.join(used) or 'none'} "
        "(plugins.toml's order); an opt-in provider runs when named, providers=['NAME', "
        "'cpu'], or when a plugins.toml of yours (ONNXEP_PLUGINS) adds it to the order"
    )
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
    from ..session import InferenceSession
    from .random_inputs import random_inputs

    model = args.model or bundled_model()
    sess = InferenceSession(model, providers=args.providers)
    made = cli_args.feed_options(args, model)
    cli_args.check_dims(sess.get_inputs(), made["dims"])
    feeds = random_inputs(sess, made.pop("dims"), seed=args.seed, **made)
    outs = sess.run(None, feeds)
    if args.json:
        print(json.dumps(run_json(model, sess, feeds, outs)))
        return 0
    print(f"model: {model}")
    for name, value in feeds.items():
        print(f"input  {name}: {value.dtype} {list(value.shape)}")
    np.set_printoptions(precision=4, threshold=20, edgeitems=3)
    for arg, value in zip(sess.get_outputs(), outs):
        if isinstance(value, np.ndarray):
            print(f"output {arg.name}: {value.dtype} {list(value.shape)}\n{value}")
        elif isinstance(value, list) and len(value) > 3:
            # A sequence (of maps, for a classifier's ZipMap): its length and first entries.
            head = ", ".join(repr(v) for v in value[:3])
            print(f"output {arg.name}: {arg.type}, {len(value)} entries\n[{head}, ...]")
        else:
            print(f"output {arg.name}: {arg.type}\n{value!r}")
    print()
    print(sess.placement().format(max_nodes=args.max_nodes))
    return 0


def _jsonable(value: Any) -> Any:
    """An output as JSON: a tensor's dtype, shape and values; maps and sequences as they are."""
    if isinstance(value, np.ndarray):
        data = value.astype(str) if value.dtype.kind in "OSUV" else value
        if data.dtype.kind == "f":
            data = np.where(np.isfinite(data), data, np.nan).astype(np.float64)
            flat = [None if np.isnan(x) else float(x) for x in data.reshape(-1)]
            values: Any = np.array(flat, dtype=object).reshape(data.shape).tolist()
        else:
            values = data.tolist()
        return {"dtype": str(value.dtype), "shape": list(value.shape), "values": values}
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, np.generic):
        return value.item()
    return value


def run_json(model: Any, sess: Any, feeds: dict, outs: list) -> dict:
    """``onnxep run --json``: the inputs' dtypes and shapes, every output, the placement."""
    return {
        "model": str(model),
        "providers": sess.get_providers(),
        "inputs": {k: {"dtype": str(v.dtype), "shape": list(v.shape)} for k, v in feeds.items()},
        "outputs": {a.name: _jsonable(v) for a, v in zip(sess.get_outputs(), outs)},
        "placement": sess.placement().counts(),
    }


def cmd_explain(args: argparse.Namespace) -> int:
    from ..options import SessionOptions
    from ..session import InferenceSession

    opts = SessionOptions(
        placement=args.placement,
        placement_budget_ms=args.placement_budget_ms,
        placement_shapes={k: list(v) for k, v in (args.shape or [])},
        placement_int_ranges=dict(args.int_range or []),
    )
    for name, value in args.dim or []:
        opts.add_free_dimension_override_by_name(name, value)
    sess = InferenceSession(args.model, opts, providers=args.providers)
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
    from onnxep.plugins.host import get_host

    from ..plugins.config import load_config
    from ..plugins.selection import select_providers
    from .conformance import CATEGORIES, excluded_reason, run_suite

    # Checked once here, so a wrong name is one error rather than a failure per case.
    select_providers(get_host(load_config()), args.providers, None, strict=True)
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


def cmd_coverage(args: argparse.Namespace) -> int:
    from .coverage import coverage, format_coverage

    print(format_coverage(coverage(args.providers, args.domains.split(","))))
    return 0


def cmd_bench(args: argparse.Namespace) -> int:
    from .benchmark import bench

    made = cli_args.feed_options(args, args.model)
    if made["dims"]:
        cli_args.check_dims(cli_args.declared_inputs(args.model), made["dims"])
    result = bench(
        args.model,
        providers=args.providers,
        vs=args.vs,
        runs=args.runs,
        warmup=args.warmup,
        decode=args.decode,
        context=args.context,
        feeds=made["given"] or None,
        dims=made["dims"],
        shapes=made["shapes"],
        int_ranges=made["int_ranges"],
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

    made = cli_args.feed_options(args, args.model)
    if made["dims"]:
        cli_args.check_dims(cli_args.declared_inputs(args.model), made["dims"])
    report = parity_report(
        args.model,
        [args.providers],
        reference=args.reference,
        inputs=made["given"] or None,
        dims=made["dims"],
        shapes=made["shapes"],
        int_ranges=made["int_ranges"],
        seed=args.seed,
        rtol=args.rtol,
        atol=args.atol,
        min_coverage=1.0 if args.strict else args.min_coverage,
    )
    print(f"model: {args.model}")
    print(report.format())
    for cov in report.partial:
        print(
            f"onnxep: warning: {cov.provider} ran {cov.ran} of {cov.total} compute nodes; "
            "outputs behind the others agree by construction (--strict fails on it)",
            file=sys.stderr,
        )
    if report.ok:
        print("parity: ok")
    else:
        why = [f"{len(report.failures)} output(s) differ"] if report.failures else []
        print(f"parity: {'; '.join(why + report.coverage_problems)}")
    return 0 if report.ok else 1


def _version() -> str:
    from .. import __version__

    return __version__


def build_parser() -> argparse.ArgumentParser:
    dim_help = (
        f"symbolic dim value, NAME=INT (repeatable); 0 to {cli_args.MAX_DIM}, and the random "
        f"inputs may hold {cli_args.MAX_FEED_ELEMENTS:,} elements in all"
    )
    providers_help = "comma-separated, priority order (default: plugins.toml)"
    ap = cli_args.Parser(prog="onnxep", description=__doc__)
    ap.add_argument("--version", action="version", version=f"onnxep {_version()}")
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("providers", help="discovered providers, availability, load failures")
    p.set_defaults(fn=cmd_providers)
    p = sub.add_parser("run", help="run a model on random inputs (a bundled one by default)")
    p.add_argument("model", nargs="?", type=cli_args.model_file)
    p.add_argument("--providers", type=cli_args.names, help=providers_help)
    cli_args.add_feed_options(p, dim_help)
    p.add_argument("--seed", type=cli_args.non_negative_int, default=0)
    p.add_argument("--max-nodes", type=cli_args.non_negative_int, default=40)
    p.add_argument("--json", action="store_true", help="outputs and placement as one JSON object")
    p.set_defaults(fn=cmd_run)
    p = sub.add_parser("explain", help="placement report: providers, copies, fallback reasons")
    p.add_argument("model", type=cli_args.model_file)
    p.add_argument("--providers", type=cli_args.names, help=providers_help)
    p.add_argument("--json", action="store_true")
    p.add_argument("--max-nodes", type=cli_args.non_negative_int, default=None)
    p.add_argument(
        "--placement",
        choices=["priority", "measured"],
        default=None,
        help="measured: time the candidate placements and keep the fastest (default: "
        "plugins.toml's [placement] mode, priority)",
    )
    p.add_argument(
        "--placement-budget-ms",
        type=cli_args.milliseconds,
        default=None,
        metavar="MS",
        help="the time the measured placement's timed runs may take",
    )
    # the measured placement's timing feeds, as other commands make their random ones
    cli_args.add_feed_options(p, dim_help, real_inputs=False)
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
    cli_args.add_feed_options(p, dim_help)
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
    p = sub.add_parser("coverage", help="per domain, each op's kernels by provider, or why not")
    p.add_argument("--providers", type=cli_args.names, default="cpu")
    p.add_argument("--domains", default="ai.onnx.ml,com.microsoft")
    p.set_defaults(fn=cmd_coverage)
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
    cli_args.add_feed_options(p, dim_help)
    p.add_argument("--seed", type=cli_args.non_negative_int, default=0)
    p.add_argument(
        "--rtol", type=cli_args.tolerance, default=None, help="override the per-dtype rtol"
    )
    p.add_argument(
        "--atol", type=cli_args.tolerance, default=None, help="override the per-dtype atol"
    )
    p.add_argument(
        "--min-coverage",
        type=cli_args.fraction,
        default=None,
        metavar="F",
        help="fail unless the provider under test ran this fraction of the compute nodes "
        "(default: at least one node)",
    )
    p.add_argument("--strict", action="store_true", help="fail unless it ran every compute node")
    p.set_defaults(fn=cmd_parity)
    cli_generate.add_parser(sub, providers_help)
    serve_cli.add_parser(sub, providers_help)
    return ap


def main(argv: list[str] | None = None) -> int:
    """Run the command line; user errors print ``onnxep: error: ...`` and return 2."""
    try:
        args = build_parser().parse_args(argv)
        return args.fn(args)
    except BrokenPipeError:
        # the reader went away (onnxep explain ... | head): no traceback, as coreutils do
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 141
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
