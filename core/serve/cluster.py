"""Starting Ray for a deployment: a local instance on loopback only, or joining a cluster.

A local Ray started by onnxep listens on 127.0.0.1 and sends no usage
statistics: by default Ray takes the machine's outward address as the node's
(every internal connection then leaves through it) and reports usage to its
makers, and a server made to run on one machine should do neither. Both are
environment settings that Ray reads when it is imported, so they are set
before the first ``import ray``; a process that imported Ray before cannot be
moved to loopback, and is told so.
"""

from __future__ import annotations

import os
import sys
from typing import Any

from onnxep.errors import InvalidArgument

#: environment for a Ray started on this machine alone
LOCAL_ENV = {
    # Ray's own switch: a node on the loopback address, as on a laptop
    "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0",
    "RAY_USAGE_STATS_ENABLED": "0",
}


def import_ray() -> Any:
    try:
        import ray
        from ray import serve  # noqa: F401 - the serve extra, not Ray alone
    except ImportError as exc:
        raise InvalidArgument(
            f"onnxep serve needs Ray Serve ({exc.name or exc} is missing): pip install "
            "'onnxep[serve]'"
        ) from None
    return ray


def start_ray(
    address: str | None = None,
    *,
    num_cpus: int | None = None,
    num_gpus: int | None = None,
) -> bool:
    """Connect to Ray: join the cluster at ``address`` ("auto" finds one started on this
    machine by ``ray start``), or start a local instance on loopback. Returns whether this
    call started Ray (and so should stop it). Already connected: nothing is done."""
    if address is None:
        loaded = sys.modules.get("ray._private.ray_constants")
        if loaded is not None and getattr(loaded, "ENABLE_RAY_CLUSTER", False):
            raise InvalidArgument(
                "Ray was imported before onnxep could set it to loopback; import "
                "onnxep.serve before ray, or set RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0 "
                "in the environment"
            )
        os.environ.update(LOCAL_ENV)
    ray = import_ray()
    if ray.is_initialized():
        return False
    if address is None:
        ray.init(
            address="local",
            num_cpus=num_cpus,
            num_gpus=num_gpus,
            include_dashboard=False,
            log_to_driver=False,
        )
        nodes = {n["NodeManagerAddress"] for n in ray.nodes()}
        if nodes != {"127.0.0.1"}:
            ray.shutdown()
            raise InvalidArgument(
                f"the local Ray started on {', '.join(sorted(nodes))}, not loopback"
            )
        return True
    ray.init(address=address, log_to_driver=False)
    return False


def gpus_in_cluster() -> float:
    ray = import_ray()
    return float(ray.cluster_resources().get("GPU", 0))
