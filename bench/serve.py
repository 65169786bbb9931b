"""onnxep.serve under load: requests/s and p50/p99 latency against the session in-process.

    python bench/serve.py                                  # CPU: resnet_cnn, 1/8/32 clients
    python bench/serve.py --providers cuda,cpu --gpus 1 --completions qwen2.5-0.5b --dtype fp16

Starts a local Ray (loopback only) and deploys the model twice, one replica
each: batching on (``--max-batch`` requests, ``--batch-wait-ms``) and off.
At each client count, in turn and in the same run, three sides answer the
same requests: the session called in-process from that many threads (the
peer), the server with batching on, and with it off. Each client thread
sends its requests one after the other (its own .npz bodies, made before
the clock starts) on one kept-alive HTTP connection; latency is each
request's wall time as its client saw it, requests/s all requests over the
side's wall time. The replica's BLAS runs on one thread (Ray gives an actor
``OMP_NUM_THREADS`` = its CPUs), so the in-process session is given one too.

``--completions SIZE`` adds concurrent completions: a factory decoder of that
size (bench/factory: ``qwen2.5-0.5b`` is the 0.5B builder shape) served in a
folder with a genai_config.json, token-id prompts of ``--prompt`` tokens,
``--tokens`` new tokens each; tokens/s is all new tokens over the wall time,
against the same Generator called in-process from as many threads.
Results go to ``--json`` (default bench/results/serve-<device>.json).
"""

from __future__ import annotations

import argparse
import http.client
import io
import json
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # bench/ is imported from the root


def _percentile(xs: list[float], q: float) -> float:
    return float(np.percentile(np.asarray(xs), q)) if xs else float("nan")


def _summary(side: str, clients: int, latencies: list[float], wall: float, errors: int):
    return {
        "side": side,
        "clients": clients,
        "requests": len(latencies),
        "errors": errors,
        "rps": len(latencies) / wall,
        "p50_ms": _percentile(latencies, 50) * 1000,
        "p99_ms": _percentile(latencies, 99) * 1000,
    }


def _threads(clients: int, work) -> float:
    """Run ``work(i)`` on ``clients`` threads at once; the wall time of all."""
    start = threading.Barrier(clients + 1)
    threads = [threading.Thread(target=lambda i=i: (start.wait(), work(i))) for i in range(clients)]
    for t in threads:
        t.start()
    start.wait()
    t0 = time.perf_counter()
    for t in threads:
        t.join(timeout=600)
    return time.perf_counter() - t0


def _npz(feeds: dict[str, np.ndarray]) -> bytes:
    buf = io.BytesIO()
    np.savez(buf, **feeds)
    return buf.getvalue()


def http_side(port: int, path: str, bodies: list[list[bytes]], headers: dict[str, str]):
    """Each client sends its bodies in turn on one connection: (latencies, wall, errors)."""
    latencies: list[float] = []
    errors = [0]
    lock = threading.Lock()

    def work(i: int) -> None:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
        mine = []
        for body in bodies[i]:
            t0 = time.perf_counter()
            conn.request("POST", path, body, headers)
            r = conn.getresponse()
            r.read()
            mine.append(time.perf_counter() - t0)
            if r.status != 200:
                with lock:
                    errors[0] += 1
        conn.close()
        with lock:
            latencies.extend(mine)

    wall = _threads(len(bodies), work)
    return latencies, wall, errors[0]


def local_side(run, jobs: list[list]) -> tuple[list[float], float, int]:
    latencies: list[float] = []
    lock = threading.Lock()

    def work(i: int) -> None:
        mine = []
        for job in jobs[i]:
            t0 = time.perf_counter()
            run(job)
            mine.append(time.perf_counter() - t0)
        with lock:
            latencies.extend(mine)

    return latencies, _threads(len(jobs), work), 0


NPZ_HEADERS = {"Content-Type": "application/x-npz"}


def _runner(sess):
    return lambda feeds: sess.run(None, feeds)


def bench_infer(args, port: int, results: list[dict]) -> None:
    import onnxep

    so = onnxep.SessionOptions()
    so.intra_op_num_threads = 1
    sess = onnxep.InferenceSession(args.model, so, providers=args.providers)
    rng = np.random.default_rng(0)
    shapes = {}
    for a in sess.get_inputs():
        shapes[a.name] = [args.rows if not isinstance(d, int) else d for d in a.shape]
    for clients in args.clients:
        per = max(args.requests // clients, 2)
        feeds = [
            [
                {n: rng.standard_normal(s).astype(np.float32) for n, s in shapes.items()}
                for _ in range(per)
            ]
            for _ in range(clients)
        ]
        bodies = [[_npz(f) for f in mine] for mine in feeds]
        sess.run(None, feeds[0][0])  # warm
        for side, measure in (
            ("in-process session (peer)", lambda f=feeds: local_side(_runner(sess), f)),
            ("serve, batching on", lambda b=bodies: http_side(port, "/on/infer", b, NPZ_HEADERS)),
            ("serve, batching off", lambda b=bodies: http_side(port, "/off/infer", b, NPZ_HEADERS)),
        ):
            lat, wall, errors = measure()
            results.append(_summary(side, clients, lat, wall, errors))
            print(_row(results[-1]), flush=True)


def bench_completions(args, port: int, gen, results: list[dict]) -> None:
    from bench.factory import SIZES

    vocab = SIZES[args.completions].vocab
    rng = np.random.default_rng(1)
    for clients in args.completion_clients:
        prompts = [[rng.integers(0, vocab, args.prompt).tolist()] for _ in range(clients)]
        made = [0]
        lock = threading.Lock()

        def local(i: int, prompts=prompts, made=made, lock=lock) -> None:
            r = gen.generate(prompts[i][0], max_new_tokens=args.tokens)
            with lock:
                made[0] += len(r.token_ids)

        def served(i: int, prompts=prompts, made=made, lock=lock) -> None:
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
            doc = {"prompt": prompts[i][0], "max_tokens": args.tokens}
            conn.request(
                "POST",
                "/text/v1/completions",
                json.dumps(doc),
                {"Content-Type": "application/json"},
            )
            r = conn.getresponse()
            body = json.loads(r.read())
            with lock:
                made[0] += body["usage"]["completion_tokens"] if r.status == 200 else 0

        gen.generate(prompts[0][0], max_new_tokens=2)  # warm
        for side, work in (
            ("in-process Generator (peer)", local),
            ("serve /v1/completions", served),
        ):
            made[0] = 0
            wall = _threads(clients, work)
            results.append(
                {
                    "side": side,
                    "clients": clients,
                    "tokens": made[0],
                    "tokens_per_s": made[0] / wall,
                }
            )
            print(f"{side:32s} {clients:3d} clients  {made[0] / wall:9.1f} tokens/s", flush=True)


def _row(r: dict) -> str:
    return (
        f"{r['side']:28s} {r['clients']:3d} clients  {r['rps']:8.1f} req/s  p50 {r['p50_ms']:7.2f} "
        f"ms  p99 {r['p99_ms']:7.2f} ms  ({r['requests']} requests, {r['errors']} errors)"
    )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default=str(ROOT / "tests" / "data" / "resnet_cnn.onnx"))
    p.add_argument("--providers", default="cpu")
    p.add_argument("--gpus", type=float, default=0, help="GPUs per replica")
    p.add_argument("--rows", type=int, default=1, help="rows per request (the batch dim)")
    p.add_argument("--clients", default="1,8,32")
    p.add_argument("--requests", type=int, default=192, help="requests per side and count")
    p.add_argument("--max-batch", type=int, default=8)
    p.add_argument("--batch-wait-ms", type=float, default=5.0)
    p.add_argument("--completions", default=None, metavar="SIZE", help="a bench/factory size")
    p.add_argument("--dtype", default="fp32", choices=("fp32", "fp16", "int4"))
    p.add_argument("--completion-clients", default="1,8")
    p.add_argument("--prompt", type=int, default=32)
    p.add_argument("--tokens", type=int, default=32)
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)
    args.providers = args.providers.split(",")
    args.clients = [int(c) for c in args.clients.split(",")]
    args.completion_clients = [int(c) for c in args.completion_clients.split(",")]

    import onnxep
    import onnxep.serve

    onnxep.serve.start_ray()
    from ray import serve

    from tests.serve_http import free_port

    port = free_port()
    serve.start(http_options={"host": "127.0.0.1", "port": port})
    import ray

    # The two deployments (batching on and off) are up at once; where the node has fewer
    # GPUs than both ask for, each takes half of what was asked (Ray shares a GPU between
    # fractional requests), else the second would wait for a GPU that never frees.
    have = ray.cluster_resources().get("GPU", 0.0)
    gpus = args.gpus if have >= 2 * args.gpus else args.gpus / 2
    if gpus != args.gpus:
        print(f"{have:g} GPU(s) here: each of the two deployments takes {gpus:g} GPU")
    actor = {"num_cpus": 1, "num_gpus": gpus}
    common = dict(providers=args.providers, ray_actor_options=actor)
    serve.run(
        onnxep.serve.app(
            args.model,
            max_batch_size=args.max_batch,
            batch_wait_timeout_s=args.batch_wait_ms / 1000,
            name="on",
            **common,
        ),
        name="on",
        route_prefix="/on",
    )
    serve.run(
        onnxep.serve.app(args.model, batching=False, **common), name="off", route_prefix="/off"
    )
    results: list[dict] = []
    meta = {
        "model": args.model,
        "providers": args.providers,
        "rows": args.rows,
        "gpus_per_replica": gpus,
        "max_batch": args.max_batch,
        "batch_wait_ms": args.batch_wait_ms,
    }
    try:
        bench_infer(args, port, results)
        if args.completions:
            from bench.text_generation import build

            tmp = tempfile.mkdtemp()
            folder = build(args.completions, args.dtype, Path(tmp))
            serve.delete("on")
            serve.delete("off")
            text_actor = {"num_cpus": 1, "num_gpus": args.gpus}
            serve.run(
                onnxep.serve.app(
                    folder, name="text", providers=args.providers, ray_actor_options=text_actor
                ),
                name="text",
                route_prefix="/text",
            )
            so = onnxep.SessionOptions()
            so.intra_op_num_threads = 1 if args.gpus == 0 else 0
            gen = onnxep.Generator(folder, providers=args.providers, sess_options=so)
            bench_completions(args, port, gen, results)
            meta.update(
                completions=args.completions,
                dtype=args.dtype,
                prompt=args.prompt,
                tokens=args.tokens,
            )
    finally:
        serve.shutdown()
        ray.shutdown()
    device = "gpu" if args.gpus else "cpu"
    out = Path(args.json or ROOT / "bench" / "results" / f"serve-{device}.json")
    out.write_text(json.dumps({"meta": meta, "results": results}, indent=1))
    print(f"written to {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
