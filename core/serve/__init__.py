"""``onnxep.serve``: an onnxep model as a Ray Serve deployment (``pip install 'onnxep[serve]'``).

```python
import ray
from ray import serve
import onnxep.serve

onnxep.serve.start_ray()  # a local Ray on loopback (or start_ray("auto") to join a cluster)
serve.start(http_options={"host": "127.0.0.1", "port": 8000})
serve.run(onnxep.serve.app("model.onnx", providers=["cuda", "cpu"], num_replicas=2,
                           ray_actor_options={"num_gpus": 1}), route_prefix="/")
```

Routes: ``POST /infer`` (named tensors, JSON or .npz), ``POST /v1/completions`` and
``POST /v1/chat/completions`` (OpenAI's, streamed as server-sent events with
``"stream": true``) for a model folder with a genai_config.json, ``GET /v1/models``,
``GET /health`` and ``GET /report`` (a replica's providers, batching and counters).
This module imports Ray only when :func:`app` is called, so the codecs and the replica
(:mod:`onnxep.serve.tensors`, :mod:`onnxep.serve.replica`) work without it.
"""

from __future__ import annotations

from typing import Any

from .batching import BatchAxis, find_batch_axis
from .cluster import start_ray
from .limits import Limits, RequestError
from .replica import ModelReplica

__all__ = [
    "BatchAxis",
    "Limits",
    "ModelReplica",
    "RequestError",
    "app",
    "find_batch_axis",
    "start_ray",
]


def app(model: Any, **options: Any) -> Any:
    """A Ray Serve application serving ``model``; see :func:`onnxep.serve.deployments.app`."""
    from .cluster import import_ray

    import_ray()
    from .deployments import app as build

    return build(model, **options)
