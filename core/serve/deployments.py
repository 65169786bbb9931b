"""The Ray Serve deployments: the model (one :class:`ModelReplica` per replica, with
``@serve.batch``) and the HTTP ingress in front of it, and :func:`app`, which binds them.

Sessions run in worker threads (``asyncio.to_thread``), so a replica's event
loop keeps taking requests, filling the next batch, while one runs; a session
is safe to run from several threads at once.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from ray import serve

from .batching import AUTO, Request
from .completions import CompletionJob
from .ingress import Ingress
from .limits import Limits, RequestError
from .replica import ModelReplica

_END = object()


@serve.deployment(name="model")
class ModelDeployment:
    """One replica of the model: its session, its batching queue, its report."""

    def __init__(self, model: str, replica: Mapping[str, Any], batching: Mapping[str, Any]):
        self.replica = ModelReplica(model, **replica)
        self.batching = dict(batching)
        if self.batching["enabled"]:
            self._batched.set_max_batch_size(self.batching["max_batch_size"])
            self._batched.set_batch_wait_timeout_s(self.batching["batch_wait_timeout_s"])

    async def infer(self, req: Request) -> dict[str, Any] | RequestError:
        err = self.replica.check(req)
        if err is not None:
            return err
        if self.batching["enabled"]:
            return await self._batched(req)
        return await asyncio.to_thread(self.replica.infer, req)

    @serve.batch(max_batch_size=8, batch_wait_timeout_s=0.005)
    async def _batched(self, reqs: list[Request]) -> list[dict[str, Any] | RequestError]:
        return await asyncio.to_thread(self.replica.infer_batch, reqs)

    async def complete(self, job: CompletionJob) -> dict[str, Any] | RequestError:
        return await asyncio.to_thread(self.replica.complete, job)

    async def stream(self, job: CompletionJob):
        pieces = self.replica.stream(job)
        while True:
            chunk = await asyncio.to_thread(next, pieces, _END)
            if chunk is _END:
                return
            yield chunk

    def report(self) -> dict[str, Any]:
        out = self.replica.report()
        out["batching"].update(self.batching)
        ctx = serve.get_replica_context()
        out["replica"] = ctx.replica_id.unique_id
        return out


@serve.deployment(name="ingress")
class IngressDeployment(Ingress):
    """The HTTP routes (:class:`onnxep.serve.ingress.Ingress`) as a deployment."""


def app(
    model: str | os.PathLike,
    *,
    providers: Sequence[Any] | None = None,
    provider_options: Sequence[dict[str, Any]] | None = None,
    sess_options: Any = None,
    num_replicas: int | str = 1,
    ray_actor_options: Mapping[str, Any] | None = None,
    batching: bool = True,
    max_batch_size: int = 8,
    batch_wait_timeout_s: float = 0.005,
    batch_axis: int | str | None = AUTO,
    limits: Limits | None = None,
    name: str | None = None,
    max_ongoing_requests: int | None = None,
    ingress_replicas: int = 1,
    deployment_options: Mapping[str, Any] | None = None,
) -> serve.Application:
    """A Ray Serve application serving ``model`` (an .onnx file or a model folder).

    Each of ``num_replicas`` replicas holds one :class:`onnxep.InferenceSession` made with
    ``providers``, ``provider_options`` and ``sess_options``, and runs where
    ``ray_actor_options`` says (``{"num_gpus": 1}``: one GPU each, on whichever node has
    one; default ``{"num_cpus": 1}``). ``batching`` gathers up to ``max_batch_size``
    requests, waiting at most ``batch_wait_timeout_s`` for them, into one run (see
    :mod:`onnxep.serve.batching` for ``batch_axis``). ``deployment_options`` go to the model
    deployment's ``.options()`` as they are (``autoscaling_config``, say). Run it with
    ``ray.serve.run(app(...))``; the model path must exist on every node.
    """
    path = Path(model).resolve()
    limits = limits or Limits()
    name = name or (path.name if path.is_dir() else path.stem)
    if batching and (not isinstance(max_batch_size, int) or max_batch_size < 1):
        raise ValueError(
            f"max_batch_size must be a whole number of 1 or more, got {max_batch_size}"
        )
    replica = {
        "providers": list(providers) if providers is not None else None,
        "provider_options": list(provider_options) if provider_options is not None else None,
        "sess_options": sess_options,
        "batch_axis": batch_axis,
        "limits": limits,
        "name": name,
    }
    options: dict[str, Any] = {
        "num_replicas": num_replicas,
        "ray_actor_options": dict(ray_actor_options or {"num_cpus": 1}),
        # a batch can only fill from requests the replica has been handed
        "max_ongoing_requests": max_ongoing_requests or max(2 * max_batch_size, 16),
    }
    options.update(deployment_options or {})
    if "autoscaling_config" in (deployment_options or {}) and num_replicas == 1:
        options.pop("num_replicas")
    flags = {
        "enabled": bool(batching),
        "max_batch_size": max_batch_size,
        "batch_wait_timeout_s": batch_wait_timeout_s,
    }
    model_app = ModelDeployment.options(**options).bind(str(path), replica, flags)
    return IngressDeployment.options(
        num_replicas=ingress_replicas,
        ray_actor_options={"num_cpus": 0},  # it waits on the model; it computes nothing
        max_ongoing_requests=1024,
    ).bind(model_app, limits, name)
