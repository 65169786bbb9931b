"""``onnxep serve MODEL``: the model as an HTTP server on Ray Serve, until Ctrl-C.

Ray is started on this machine (on loopback, with no usage statistics sent)
unless --address joins a cluster; the server listens on 127.0.0.1 unless
--host says otherwise. Routes: POST /infer (named tensors as JSON or .npz),
and for a model folder with a genai_config.json POST /v1/completions and
/v1/chat/completions (OpenAI's, streamed with "stream": true); GET /v1/models,
/health and /report (a replica's providers, batching and counters). Every
request is held to the --max-* limits: over one, it gets 413 or 422 naming it.
"""

from __future__ import annotations

import argparse
import math
import re
import signal
import sys
import time
from pathlib import Path
from typing import Any

from onnxep.errors import InvalidArgument

from .limits import Limits

DEFAULTS = Limits()


def _number(text: str, kind: type, what: str) -> Any:
    try:
        x = kind(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not {what}") from None
    if not (math.isfinite(x) and x > 0):
        raise argparse.ArgumentTypeError(f"{text!r} is not {what}")
    return x


def positive_int(text: str) -> int:
    return _number(text, int, "a whole number of 1 or more")


def positive_float(text: str) -> float:
    return _number(text, float, "a number above 0")


def non_negative_float(text: str) -> float:
    if text.strip() in ("0", "0.0"):
        return 0.0
    return _number(text, float, "a number of 0 or more")


def port(text: str) -> int:
    n = _number(text, int, "a port number from 1 to 65535")
    if n > 65535:
        raise argparse.ArgumentTypeError(f"{text!r} is not a port number from 1 to 65535")
    return n


def model_path(text: str) -> str:
    path = Path(text)
    if not path.exists():
        raise argparse.ArgumentTypeError(f"model {text!r} does not exist")
    return text


def batch_axis(text: str) -> int | str | None:
    if text == "auto":
        return "auto"
    if text == "none":
        return None
    try:
        n = int(text)
    except ValueError:
        n = -1
    if n < 0:
        raise argparse.ArgumentTypeError(f"{text!r} is not auto, none or an axis of 0 or more")
    return n


def providers(text: str) -> list[str]:
    out = [p.strip() for p in text.split(",") if p.strip()]
    if not out:
        raise argparse.ArgumentTypeError(f"{text!r} names nothing; give e.g. cuda,cpu")
    return out


def add_parser(sub: argparse._SubParsersAction, providers_help: str) -> None:
    p = sub.add_parser(
        "serve",
        help="serve a model over HTTP on Ray Serve (replicas, batching, OpenAI routes)",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("model", type=model_path, metavar="MODEL", help=".onnx file or model folder")
    p.add_argument("--providers", type=providers, default=None, help=providers_help)
    p.add_argument("--replicas", type=positive_int, default=1, metavar="N")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    p.add_argument("--port", type=port, default=8000, metavar="P")
    p.add_argument(
        "--address", default=None, help="join this Ray cluster (e.g. auto) instead of a local Ray"
    )
    p.add_argument("--name", default=None, help="the model's name in /v1/models (default: MODEL's)")
    p.add_argument(
        "--max-batch",
        type=positive_int,
        default=8,
        metavar="B",
        help="requests one run may gather (default 8)",
    )
    p.add_argument(
        "--batch-wait-ms",
        type=non_negative_float,
        default=5.0,
        metavar="MS",
        help="longest wait for a batch to fill (default 5)",
    )
    p.add_argument("--no-batching", action="store_true", help="run each request alone")
    p.add_argument(
        "--batch-axis",
        type=batch_axis,
        default="auto",
        help="auto (dim 0 when every input and output shares it), none, or an axis",
    )
    p.add_argument(
        "--gpus-per-replica",
        type=non_negative_float,
        default=None,
        metavar="G",
        help="default: 1 when --providers names cuda and the cluster has a GPU, else 0",
    )
    p.add_argument("--cpus-per-replica", type=non_negative_float, default=1.0, metavar="C")
    for field, kind in (
        ("max_body_bytes", positive_int),
        ("max_rows", positive_int),
        ("max_tokens", positive_int),
        ("max_prompt_tokens", positive_int),
        ("request_timeout_s", positive_float),
    ):
        p.add_argument(
            Limits.option(field),
            type=kind,
            default=getattr(DEFAULTS, field),
            metavar="N",
            help=f"(default {getattr(DEFAULTS, field):g})",
        )
    p.set_defaults(fn=cmd_serve)


def _gpus(args: argparse.Namespace) -> float:
    from .cluster import gpus_in_cluster

    if args.gpus_per_replica is not None:
        return args.gpus_per_replica
    names = [n.lower() for n in args.providers or []]
    if not any("cuda" in n for n in names):
        return 0.0
    if gpus_in_cluster() >= 1:
        return 1.0
    print(
        "onnxep: the Ray cluster has no GPU, so the replicas take none; each session falls "
        "back from cuda as InferenceSession does",
        file=sys.stderr,
    )
    return 0.0


def _stop(*_: Any) -> None:
    raise KeyboardInterrupt


def cmd_serve(args: argparse.Namespace) -> int:
    from .cluster import import_ray, start_ray

    limits = Limits(
        max_body_bytes=args.max_body_bytes,
        max_rows=args.max_rows,
        max_tokens=args.max_tokens,
        max_prompt_tokens=args.max_prompt_tokens,
        request_timeout_s=args.request_timeout_s,
    )
    started = start_ray(args.address)  # imports Ray, after setting a local one to loopback
    # Ctrl-C and a service manager's SIGTERM both stop it cleanly, even where the shell that
    # started it in the background left SIGINT ignored
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, _stop)
    from ray import serve

    from .deployments import app

    name = args.name or "onnxep"
    try:
        actor = {"num_cpus": args.cpus_per_replica, "num_gpus": _gpus(args)}
        application = app(
            args.model,
            providers=args.providers,
            num_replicas=args.replicas,
            ray_actor_options=actor,
            batching=not args.no_batching,
            max_batch_size=args.max_batch,
            batch_wait_timeout_s=args.batch_wait_ms / 1000.0,
            batch_axis=args.batch_axis,
            limits=limits,
            name=args.name,
        )
        serve.start(http_options={"host": args.host, "port": args.port})
        try:
            serve.run(application, name=name, route_prefix="/", blocking=False)
        except Exception as exc:  # noqa: BLE001 - Serve's failure; the replica's is in status
            why = _failure(serve, name, exc)
            raise InvalidArgument(f"the deployment of {args.model} failed: {why}") from None
        batching = (
            "each request alone"
            if args.no_batching
            else f"batches of up to {args.max_batch} requests, {args.batch_wait_ms:g} ms wait"
        )
        print(
            f"onnxep: serving {args.model} at http://{args.host}:{args.port} "
            f"({args.replicas} replica(s), {batching}); Ctrl-C stops",
            flush=True,
        )
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        print("onnxep: stopping", file=sys.stderr, flush=True)
    finally:
        ray = import_ray()
        if ray.is_initialized():
            if started:
                serve.shutdown()
            else:
                serve.delete(name)
            ray.shutdown()
    return 0


def _failure(serve: Any, name: str, exc: BaseException) -> str:
    """The sentence a replica's failure to start ends with: Serve's exception says only that
    the deployment failed; its status holds the replica's traceback."""
    try:
        deployments = serve.status().applications[name].deployments.values()
        text = next(d.message for d in deployments if "FAILED" in str(d.status) and d.message)
    except Exception:  # noqa: BLE001 - no status: Serve's own words
        text = str(exc)
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    line = lines[-1] if lines else type(exc).__name__
    # "onnxep.errors.InvalidModel: 'x' is not an ONNX model: ..." -> the sentence itself
    return re.sub(r"^(?:\w+\.)*[A-Z]\w*: ", "", line)[-400:]
