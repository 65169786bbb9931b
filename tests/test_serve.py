"""onnxep.serve on a live Ray Serve: one Ray instance for the module, started on this machine
and on loopback only; every request has a timeout and every loop a fixed count.

Two replicas answer concurrent clients as a local session does; batching on
and off give the same results; bad requests get 4xx and the replicas keep
serving; streamed completions give the tokens of ``onnxep generate``; and a
replica killed under load (``ray.kill``) loses no request, each answered
correctly or with a clear 503, and the deployment is back to two replicas.
Run with ``python -m pytest -m serve tests/test_serve.py``.
"""

from __future__ import annotations

import json
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
from serve_http import call, free_port, infer_json, infer_npz, post_json, stream
from test_cli import onnxep as onnxep_cli
from text_models import make_text_folder

import onnxep

pytestmark = pytest.mark.serve

RESNET = Path(__file__).parent / "data" / "resnet_cnn.onnx"
LIMITS = dict(max_body_bytes=2_000_000, max_rows=4, max_tokens=64, max_prompt_tokens=200)


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    # a context of 128 tokens, so a prompt can pass it within the prompt limit (200)
    return make_text_folder(
        tmp_path_factory.mktemp("serve") / "qwen2", model={"context_length": 128}
    )


@pytest.fixture(scope="module")
def url(folder):
    """The server: three applications on one Ray started here for the module."""
    import onnxep.serve

    started = onnxep.serve.start_ray(num_cpus=4)
    from ray import serve

    port = free_port()
    serve.start(http_options={"host": "127.0.0.1", "port": port})
    limits = onnxep.serve.Limits(**LIMITS)
    apps = {
        "batched": onnxep.serve.app(
            RESNET,
            providers=["cpu"],
            num_replicas=2,
            max_batch_size=8,
            batch_wait_timeout_s=0.02,
            limits=limits,
        ),
        "single": onnxep.serve.app(RESNET, providers=["cpu"], batching=False, limits=limits),
        "text": onnxep.serve.app(folder, providers=["cpu"], limits=limits),
    }
    for name, application in apps.items():
        serve.run(application, name=name, route_prefix=f"/{name}")
    yield f"http://127.0.0.1:{port}"
    serve.shutdown()
    if started:
        import ray

        ray.shutdown()


@pytest.fixture(scope="module")
def local():
    # Ray gives each replica OMP_NUM_THREADS = its CPUs (1): BLAS on one thread here too, so
    # a request run alone there is this run, bit for bit
    so = onnxep.SessionOptions()
    so.intra_op_num_threads = 1
    return onnxep.InferenceSession(str(RESNET), so, providers=["cpu"])


def _images(seed: int, n: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {"image": rng.standard_normal((n, 3, 64, 64)).astype(np.float32)}


def _pids(url: str, app: str, tries: int = 48) -> set[int]:
    """The model replicas' process ids seen through /report (each call goes to one).

    The calls go 8 at a time: Ray Serve's router sends a request to the replica with the
    shorter queue, so calls made one after another on an idle deployment may all find the
    same replica (the ties then decide); concurrent ones spread."""

    def one(_: int) -> int:
        status, report = post_json_get(f"{url}/{app}/report")
        assert status == 200, report
        return report["pid"]

    with ThreadPoolExecutor(8) as pool:
        return set(pool.map(one, range(tries)))


def post_json_get(u: str):
    status, body, _ = call(u)
    return status, json.loads(body)


def test_ray_runs_on_loopback_only(url):
    import ray

    assert {n["NodeManagerAddress"] for n in ray.nodes()} == {"127.0.0.1"}
    assert ray.get_runtime_context().gcs_address.startswith("127.0.0.1:")


def test_two_replicas_answer_concurrent_clients_as_a_local_session(url, local):
    seeds = [(i, 1 + i % 3, i % 2 == 0) for i in range(96)]

    def client(job):
        seed, n, as_json = job
        feeds = _images(seed, n)
        send = infer_json if as_json else infer_npz
        status, out = send(f"{url}/batched/infer", feeds)
        return feeds, status, out

    with ThreadPoolExecutor(32) as pool:
        answers = list(pool.map(client, seeds))
    for feeds, status, out in answers:
        assert status == 200, out
        (want,) = local.run(None, feeds)
        np.testing.assert_allclose(out["logits"], want, rtol=1e-5, atol=1e-6)
    assert len(_pids(url, "batched")) == 2
    status, report = post_json_get(f"{url}/batched/report")
    assert report["batching"]["enabled"] and report["batching"]["axis"] == 0
    assert report["providers"] == ["cpu"]


def test_batching_on_and_off_give_the_same_results(url, local):
    jobs = [(100 + i, 1 + i % 2) for i in range(24)]

    def both(job):
        feeds = _images(*job)
        return (
            feeds,
            infer_json(f"{url}/batched/infer", feeds),
            infer_json(f"{url}/single/infer", feeds),
        )

    with ThreadPoolExecutor(12) as pool:
        answers = list(pool.map(both, jobs))
    for feeds, (s1, on), (s2, off) in answers:
        assert s1 == s2 == 200
        (want,) = local.run(None, feeds)
        assert off["logits"].tobytes() == want.tobytes()  # alone: the local run itself
        np.testing.assert_allclose(on["logits"], off["logits"], rtol=1e-5, atol=1e-6)
    status, report = post_json_get(f"{url}/single/report")
    assert report["batching"]["enabled"] is False
    # concurrent clients on the batched app made runs of several requests; the reports are
    # asked for 8 at a time, as in _pids, so both replicas answer (calls one after another on
    # an idle deployment can all reach the one whose runs were single)
    with ThreadPoolExecutor(8) as pool:
        reports = list(pool.map(lambda _: post_json_get(f"{url}/batched/report")[1], range(48)))
    assert max(r["batching"]["largest_run"] for r in reports) > 1


def _npz_with_object() -> bytes:
    import io

    buf = io.BytesIO()
    np.savez(buf, image=np.array([{"x": 1}], dtype=object))
    return buf.getvalue()


def test_bad_requests_get_4xx_and_the_replicas_keep_serving(url, local):
    before = _pids(url, "batched")
    good = _images(7, 1)
    x = good["image"]
    local_error = {}
    for name, feeds in {
        "unknown": {"image": x, "other": x},
        "dtype": {"image": x.astype(np.float64)},
        "shape": {"image": x[:, :, :32]},
    }.items():
        with pytest.raises(onnxep.errors.InvalidArgument) as info:
            local.run(None, feeds)
        local_error[name] = (feeds, str(info.value))
    for name, (feeds, sentence) in local_error.items():
        for send in (infer_json, infer_npz):
            status, doc = send(f"{url}/batched/infer", feeds)
            assert status == 400, (name, doc)
            assert doc["error"]["message"] == sentence
    json_headers = {"Content-Type": "application/json"}
    for body, headers, status, words in [
        (b"{oops", json_headers, 400, "not valid JSON"),
        (b"PK\x03\x04broken", {"Content-Type": "application/x-npz"}, 400, "not an .npz file"),
        (_npz_with_object(), {}, 400, "has dtype object"),
        (b"x" * 2_000_001, json_headers, 413, "the request body is 2,000,001, over this server's"),
    ]:
        got, answer, _ = call(f"{url}/batched/infer", body, headers)
        assert got == status, answer
        assert words in json.loads(answer)["error"]["message"]
    status, doc = infer_json(f"{url}/batched/infer", _images(8, 5))
    assert status == 422 and "(max_rows; the operator raises it" in doc["error"]["message"]
    assert call(f"{url}/batched/nothing", b"{}")[0] == 404
    assert call(f"{url}/batched/infer")[0] == 405
    # and still serving, on the same replica processes
    status, out = infer_json(f"{url}/batched/infer", good)
    assert status == 200
    np.testing.assert_allclose(out["logits"], local.run(None, good)[0], rtol=1e-5, atol=1e-6)
    assert _pids(url, "batched") == before


def _streamed_text(events, chat=False):
    key = "delta" if chat else None
    parts = []
    for e in events:
        for c in e["choices"]:
            parts.append(c[key].get("content", "") if key else c["text"])
    return "".join(parts)


def test_streaming_completions_give_the_tokens_of_onnxep_generate(url, folder):
    gen = onnxep.Generator(folder, providers=["cpu"])
    prompt = "Once upon a time"
    cli = onnxep_cli("generate", str(folder), "--prompt", prompt, "--max-new-tokens", "20")
    assert cli.returncode == 0, cli.stderr
    want = gen.generate(prompt, max_new_tokens=20)
    assert cli.stdout == want.text + "\n"
    doc = {"prompt": prompt, "max_tokens": 20, "stream": True}
    status, events = stream(
        f"{url}/text/v1/completions", {**doc, "stream_options": {"include_usage": True}}
    )
    assert status == 200, events
    assert _streamed_text(events) + "\n" == cli.stdout
    assert events[-1]["usage"]["completion_tokens"] == len(want.token_ids)
    assert len(events) > 3  # the pieces came as separate events
    status, whole = post_json(f"{url}/text/v1/completions", {"prompt": prompt, "max_tokens": 20})
    assert status == 200 and whole["choices"][0]["text"] + "\n" == cli.stdout

    question = "What is your name?"
    sampled = ["--temperature", "0.9", "--top-k", "30", "--seed", "4"]
    cli = onnxep_cli(
        "generate", str(folder), "--prompt", question, "--chat", "--max-new-tokens", "16", *sampled
    )
    assert cli.returncode == 0, cli.stderr
    chat = {
        "messages": [{"role": "user", "content": question}],
        "max_tokens": 16,
        "temperature": 0.9,
        "top_k": 30,
        "seed": 4,
        "stream": True,
    }
    status, events = stream(f"{url}/text/v1/chat/completions", chat)
    assert status == 200, events
    assert events[0]["object"] == "chat.completion.chunk"
    assert _streamed_text(events, chat=True) + "\n" == cli.stdout
    status, models = post_json_get(f"{url}/text/v1/models")
    assert models["data"][0]["id"] == "qwen2"


def test_completion_errors_are_4xx_with_the_generators_sentence(url):
    long = {"prompt": "Once upon a time " * 30, "max_tokens": 2, "stream": True}
    status, doc = stream(f"{url}/text/v1/completions", long)
    assert status == 422
    assert doc["error"]["message"].startswith(
        "the prompt's length in tokens is 240, over this server's limit of 200 (max_prompt_tokens"
    )
    status, doc = stream(f"{url}/text/v1/completions", {**long, "prompt": "Once upon a time " * 20})
    assert status == 400
    assert doc["error"]["message"] == (
        "the prompt is 160 tokens, and the model's context length (128) leaves no room for a "
        "new one; shorten the prompt"
    )
    status, doc = post_json(
        f"{url}/text/v1/completions",
        {**long, "stream": False, "max_tokens": 30, "prompt": "Once upon a time " * 14},
    )
    assert status == 400
    assert doc["error"]["message"] == (
        "a 112-token prompt and max_new_tokens 30 pass the model's context length (128); give "
        "max_new_tokens <= 16"
    )
    for body, code in [
        ({"prompt": "x", "max_tokens": 65}, 422),
        ({"prompt": "x", "n": 3}, 400),
        ({"prompt": "x", "model": "other"}, 404),
        ({"messages": "x"}, 400),
    ]:
        status, doc = post_json(f"{url}/text/v1/completions", body)
        assert status == code, (body, doc)
        assert doc["error"]["type"] == "invalid_request_error"
    status, doc = post_json(f"{url}/batched/v1/completions", {"prompt": "x"})
    assert status == 404 and "has no genai_config.json" in doc["error"]["message"]
    status, ok = post_json(f"{url}/text/v1/completions", {"prompt": "Hi", "max_tokens": 3})
    assert status == 200 and ok["usage"]["completion_tokens"] <= 3


def test_a_replica_killed_under_load_loses_no_request(url, local):
    import ray
    from ray import serve

    before = _pids(url, "batched")
    retried = post_json_get(f"{url}/batched/report")[1]["ingress"]["retried"]
    # .npz bodies of 4 images: the model replicas, not JSON parsing, are the busy part, so
    # the kill finds requests in flight; 32 clients keep both replicas' queues a batch deep
    # or more however fast the model runs (16 were not always enough once the CPU
    # convolutions got faster: the victim could be between batches with nothing queued)
    clients = 32
    jobs = [(1000 + i, 4) for i in range(320)]
    # the kill comes once a few answers are back, not after a fixed time: with a fast model
    # a fixed second could see every request answered before the kill (nothing to retry)
    answered, started = [], threading.Event()

    def client(job):
        feeds = _images(*job)
        t0 = time.monotonic()
        status, out = infer_npz(f"{url}/batched/infer", feeds)
        answered.append(1)
        if len(answered) >= 8:
            started.set()
        return feeds, status, out, time.monotonic() - t0

    replicas = [
        a
        for a in ray.util.list_named_actors(all_namespaces=True)
        if a["name"].startswith("SERVE_REPLICA::batched#model#")
    ]
    assert len(replicas) == 2
    with ThreadPoolExecutor(clients) as pool:
        futures = [pool.submit(client, j) for j in jobs]
        assert started.wait(60), "no answers within 60 s"
        # Kill the replica that holds requests now: a warm router can send a run of requests
        # to one replica while the other sits between batches with nothing in flight, and a
        # kill there would test nothing (its queue length is what the controller reads too).
        handles = [ray.get_actor(r["name"], namespace=r["namespace"]) for r in replicas]
        victim, deadline = None, time.monotonic() + 30
        while victim is None and time.monotonic() < deadline:
            loads = ray.get([h.get_num_ongoing_requests.remote() for h in handles])
            if max(loads) >= 2:
                killed = replicas[loads.index(max(loads))]["name"]
                victim = handles[loads.index(max(loads))]
        assert victim is not None, "no replica held two requests within 30 s"
        ray.kill(victim, no_restart=True)
        answers = [f.result(timeout=120) for f in futures]
    served = 0
    for feeds, status, out, took in answers:
        assert took < 60  # none hung
        if status == 200:
            served += 1
            np.testing.assert_allclose(
                out["logits"], local.run(None, feeds)[0], rtol=1e-5, atol=1e-6
            )
        else:
            assert status == 503, out
            assert out["error"]["message"].startswith("no model replica could serve this request")
    assert served >= len(jobs) - clients, served  # at most the ones in flight are lost
    after = post_json_get(f"{url}/batched/report")[1]["ingress"]["retried"]
    # The requests the kill caught were sent again by the ingress (its count rises), or Ray
    # Serve's router put them on the other replica itself (seen with warm replicas: every
    # request answered, none through the ingress's retry): either way none was lost.
    assert after > retried or served == len(jobs), (served, retried, after)
    # back to two: a new replica in the dead one's place (serve.status() alone can still
    # count the dead one as running until its health check fails)
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        state = serve.status().applications["batched"].deployments["model"]
        names = {a["name"] for a in ray.util.list_named_actors(all_namespaces=True)}
        names = {n for n in names if n.startswith("SERVE_REPLICA::batched#model#")}
        if state.replica_states.get("RUNNING") == 2 and len(names) == 2 and killed not in names:
            break
        time.sleep(1)
    assert len(names) == 2 and killed not in names, (state, names)
    status, out = infer_npz(f"{url}/batched/infer", _images(5, 2))
    assert status == 200
    # The ingress's router hears of the new replica through Ray Serve's long poll, some time
    # after the controller counts it running: calls made at once can all reach the old one.
    pids, deadline = _pids(url, "batched"), time.monotonic() + 60
    while len(pids) < 2 and time.monotonic() < deadline:
        time.sleep(1)
        pids = _pids(url, "batched")
    assert len(pids) == 2 and pids != before  # a new process took the dead one's place
