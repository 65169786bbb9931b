"""The things a benchmark compares: onnxep and its peers, behind one small interface."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from ...errors import NotSupported

if TYPE_CHECKING:
    from ...generation.spec import DecodeSpec
    from .loops import DecodeLoop


class Side:
    """One runtime under test. ``run`` returns host outputs in the model's output order."""

    name = "side"
    #: the KV buffers' rows in a decode, where a side keeps fixed-capacity caches (set by the
    #: bench: one capacity for the warm-up and the timed decode, so a graph captured while
    #: warming up is replayed while timed)
    decode_capacity: int | None = None
    #: the loop of the timed decode (set by the bench; the back-to-back run after it makes
    #: another loop, whose counters are not the timed decode's)
    timed_loop: Any = None

    def run(self, feeds: Mapping[str, Any]) -> list[Any]:
        raise NotImplementedError

    def sync(self) -> None:
        """Wait for queued device work, so a clock read after it is honest."""

    def describe(self) -> dict[str, Any]:
        return {"name": self.name}

    def decode_loop(
        self,
        spec: DecodeSpec,
        prompt: np.ndarray,
        tokens: int,
        dims: Mapping[str, int],
        output_names: list[str],
    ) -> DecodeLoop:
        """A greedy decode of ``tokens`` new tokens; by default through host feeds."""
        from .loops import HostLoop

        return HostLoop(self, spec, prompt, tokens, dims, output_names)


def with_capture(providers: Sequence[str] | None, mode: str) -> list[Any] | None:
    """``providers`` with the CUDA-graph ``capture`` option set on each CUDA entry."""
    if not providers:
        return None
    return [(p, {"capture": mode}) if "cuda" in p.lower() else p for p in providers]


#: the second onnxep side of a CUDA bench: the same session options with capture on
GRAPH_SIDE = "onnxep-graph"


class OnnxepSide(Side):
    def __init__(
        self,
        model: str,
        providers: Sequence[Any] | None,
        profile: bool = False,
        name: str = "onnxep",
    ) -> None:
        import onnxep

        # a benchmark of a provider that is missing here is an error, not a CPU figure
        opts = onnxep.SessionOptions(enable_profiling=profile, strict_providers=True)
        self.session = onnxep.InferenceSession(model, opts, providers=providers)
        self.name = name
        self.output_names = [o.name for o in self.session.get_outputs()]
        self._last_feeds: Any = None
        #: what a decode run learned (state path, per-step counters), shown with the placement
        self.decode_info: dict[str, Any] = {}

    def run(self, feeds):
        self._last_feeds = feeds
        return self.session.run(None, feeds)

    def decode_loop(self, spec, prompt, tokens, dims, output_names, pipeline=False):
        """onnxep's own loop (``onnxep.generate``'s): on a device the state never leaves it;
        ``pipeline`` queues each next step before a token is read (back-to-back runs)."""
        from .loops import OnnxepLoop

        return OnnxepLoop(self.session, prompt, tokens, dims, self.decode_capacity, pipeline)

    def measured_reads(self) -> int | None:
        """Device-to-host reads of one more run with the last feeds, from the providers'
        own transfer counters (None when no provider counts its copies)."""
        counters = [
            p.transfer_counts for p in self.session.providers if p.implements("transfer_counts")
        ]
        if not counters or self._last_feeds is None:
            return None
        before = sum(c()["device_to_host"] for c in counters)
        self.session.run(None, self._last_feeds)
        return sum(c()["device_to_host"] for c in counters) - before

    def sync(self) -> None:
        for p in self.session.providers:
            p.synchronize()

    def describe(self):
        rep = self.session.placement()
        return {
            "name": self.name,
            "providers": self.session.get_providers(),
            "nodes_per_provider": rep.counts(),
            "copies": len(rep.copies),
            "device_to_host_copies": rep.device_to_host_copies,
            "device_to_host_reads_per_run": self.measured_reads(),
            "fallbacks": len(rep.fallbacks),
            "rewrites": rep.rewrites,
            # every figure states its captures, replays and fallbacks
            "capture": self.session.capture_stats(),
            **self.decode_info,
        }


#: onnxruntime with the CUDA provider's graph (``enable_cuda_graph``): decode steps only
ORT_GRAPH_SIDE = "onnxruntime-graph"


class OrtSide(Side):
    """onnxruntime on the same model: its CUDA provider when the bench runs onnxep on CUDA
    and this onnxruntime has one (onnxruntime-gpu), else its CPU one (the side is then named
    ``onnxruntime``, not ``onnxruntime-cuda``). A decode binds fixed-capacity KV buffers as
    past and present (:class:`~.ort_loop.OrtBoundLoop`) where GroupQueryAttention can share
    them; ``graph`` replays the decode step from onnxruntime's CUDA graph (a side to skip,
    with the reason, where onnxruntime has no CUDA provider)."""

    def __init__(self, model: str, want_cuda: bool, graph: bool = False) -> None:
        import onnxruntime as ort

        avail = ort.get_available_providers()
        cuda = "CUDAExecutionProvider" in avail
        if graph and not cuda:
            raise NotSupported(
                f"onnxruntime {ort.__version__} here has no CUDAExecutionProvider (it has "
                f"{', '.join(avail)}): install onnxruntime-gpu to compare with its CUDA graph"
            )
        provs: list[Any] = ["CPUExecutionProvider"]
        if (want_cuda or graph) and cuda:
            options = {"enable_cuda_graph": "1"} if graph else {}
            provs.insert(0, ("CUDAExecutionProvider", options))
        so = ort.SessionOptions()
        # Spinning intra-op threads keep cores busy after a run returns, which on a
        # small machine slows whichever side runs next; interleaved timing needs them idle.
        so.add_session_config_entry("session.intra_op.allow_spinning", "0")
        self.ort, self.model, self.graph = ort, model, graph
        #: the device buffers its decode loops bind, kept across loops (ort_loop says why)
        self.bound_buffers: dict[tuple, Any] = {}
        self.session = ort.InferenceSession(model, so, providers=provs)
        self.on_cuda = self.session.get_providers()[0] == "CUDAExecutionProvider"
        self.name = ORT_GRAPH_SIDE if graph else "onnxruntime" + ("-cuda" if self.on_cuda else "")
        self.version = ort.__version__
        self._loop: Any = None

    def run(self, feeds):
        if self.graph:
            raise NotSupported(
                f"{ORT_GRAPH_SIDE} times decode steps only: give --decode STEPS (its graph "
                "needs inputs bound at fixed addresses)"
            )
        return self.session.run(None, dict(feeds))

    def decode_loop(self, spec, prompt, tokens, dims, output_names):
        """IO binding with the KV caches shared in place where GroupQueryAttention makes
        them; else (graph off) host feeds, the cache round-tripping through NumPy."""
        from .ort_loop import OrtBoundLoop, shares_caches

        why = shares_caches(self.model, spec) if isinstance(self.model, str) else "no path"
        if why is None:
            self._loop = OrtBoundLoop(self, spec, prompt, tokens, dims, self.decode_capacity)
            return self._loop
        if self.graph:
            raise NotSupported(f"{ORT_GRAPH_SIDE} needs every cache shared in place: {why}")
        self._loop = None
        return super().decode_loop(spec, prompt, tokens, dims, output_names)

    def describe(self):
        providers = self.session.get_providers()
        out = {"name": self.name, "version": self.version, "providers": providers}
        if self._loop is not None:
            out["decode"] = (
                f"IO binding, {sum(1 for s in self._loop.spec.states if s.grow_axis is not None)}"
                f" KV buffer(s) of {self._loop.capacity} rows shared as past and present"
                + (", CUDA graph" if self.graph else "")
            )
        return out


class ReferenceSide(Side):
    def __init__(self, model: str) -> None:
        import onnx
        from onnx.reference import ReferenceEvaluator

        self.session = ReferenceEvaluator(model)
        self.name = "reference"
        self.version = onnx.__version__

    def run(self, feeds):
        return list(self.session.run(None, dict(feeds)))

    def describe(self):
        return {"name": self.name, "version": self.version}


class TorchSide(Side):
    """The same architecture and weights in PyTorch (factory models carry what it needs)."""

    def __init__(self, model: str, device: str = "cpu", module: Any = None) -> None:
        import torch

        from .torch_peer import load_torch_peer

        self.torch = torch
        # a module already loaded for another torch side (same model, device) is shared
        self.module = module if module is not None else load_torch_peer(model, device)
        self.name = "torch" + ("-cuda" if device.startswith("cuda") else "")
        self.version = torch.__version__
        self.device = device

    def run(self, feeds):
        with self.torch.inference_mode():
            return self.module.run(feeds)

    def sync(self) -> None:
        if self.device.startswith("cuda"):
            self.torch.cuda.synchronize()

    def decode_loop(self, spec, prompt, tokens, dims, output_names):
        """The peer's own greedy loop, its cache kept in torch tensors on its device."""
        from .loops import TorchLoop

        return TorchLoop(self, spec, prompt, tokens, dims)

    def describe(self):
        return {"name": self.name, "version": self.version, "device": self.device}


#: the torch peer with a static cache, its decode step one CUDA graph
TORCH_GRAPH_SIDE = "torch-graph"


class TorchGraphSide(TorchSide):
    """The torch peer as a torch user makes decode fast: static cache, step as a CUDA graph.

    Decode only (``bench --decode``): a latency run of single feeds has no step to capture.
    Its ``capture_timed`` counters are those of the timed decode (the capture happens
    right after that decode's untimed prefill)."""

    def __init__(self, model: str, want_cuda: bool, module: Any = None) -> None:
        import torch

        from .torch_static import cuda_graph_unavailable

        if not want_cuda:
            raise NotSupported(
                f"{TORCH_GRAPH_SIDE} needs a CUDA provider in --providers (it is compared with "
                "onnxep on the GPU)"
            )
        why = cuda_graph_unavailable(torch)
        if why is not None:
            raise NotSupported(why)
        super().__init__(model, "cuda", module)
        self.name = TORCH_GRAPH_SIDE

    def run(self, feeds):
        raise NotSupported(
            f"{TORCH_GRAPH_SIDE} times decode steps only: give --decode STEPS "
            "(a latency run has no step to capture)"
        )

    def decode_loop(self, spec, prompt, tokens, dims, output_names):
        from .loops import StaticTorchLoop

        return StaticTorchLoop(self, prompt, tokens, graph=True)

    def describe(self):
        out = super().describe()
        if self.timed_loop is not None:
            dec = self.timed_loop.decoder
            out["capacity"] = dec.capacity
            out["capture_timed"] = dec.counters()
        return out


SIDES = ("onnxruntime", "reference", "torch", GRAPH_SIDE, TORCH_GRAPH_SIDE, ORT_GRAPH_SIDE)


def _loaded_module(loaded: Sequence[Side] | None, device: str) -> Any:
    return next(
        (s.module for s in loaded or () if isinstance(s, TorchSide) and s.device == device), None
    )


def make_peer(kind: str, model: str, want_cuda: bool, loaded: Sequence[Side] | None = None) -> Side:
    """The peer ``kind``; ``loaded``: sides made already, whose torch module (the weights on
    a device) a torch side on the same device shares instead of loading a second copy."""
    if kind == "onnxruntime":
        return OrtSide(model, want_cuda)
    if kind == ORT_GRAPH_SIDE:
        return OrtSide(model, want_cuda, graph=True)
    if kind == "reference":
        return ReferenceSide(model)
    if kind == "torch":
        dev = "cpu"
        if want_cuda:
            import torch

            dev = "cuda" if torch.cuda.is_available() else "cpu"
        return TorchSide(model, dev, _loaded_module(loaded, dev))
    if kind == TORCH_GRAPH_SIDE:
        return TorchGraphSide(model, want_cuda, _loaded_module(loaded, "cuda"))
    if kind == GRAPH_SIDE:
        raise ValueError(f"{GRAPH_SIDE} is made by bench() from onnxep's own providers")
    raise ValueError(f"unknown peer {kind!r}; choose from {', '.join(SIDES)}")
