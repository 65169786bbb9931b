"""InferenceSession: load, rewrite, partition, plan once; run many times from many threads."""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnx_ir as ir

from onnxep.providers.discovery import PluginHost, get_host, register_plugin
from onnxep.providers.inplace import donating
from onnxep.providers.provider import Provider
from onnxep.providers.rewrite import FusionPass

from .axis_checks import check_axes
from .captured import CaptureConfig, CapturedRunner, graph_id_of
from .compile import CompileContext, CompiledGraph, compile_graph
from .config import load_config
from .errors import InvalidArgument, InvalidGraph, with_cause
from .iobinding import IOBinding
from .loading import ModelLike, check_model, load_external_data, read_model
from .map_types import restore_map_types, strip_map_types
from .model_io import FeedCheck, NodeArg
from .options import GraphOptimizationLevel, RunOptions, SessionOptions
from .ortvalue import OrtValue
from .partition import ownership
from .placement import CopyPlacement, FusionReport, NodePlacement, PlacementReport
from .profiling import Profiler
from .providers_select import create_providers, select_providers
from .rewrites import RewriteManager
from .rewrites.plugin import plugin as _basic_rewrites

register_plugin(_basic_rewrites, name="onnxep.rewrites")

logger = logging.getLogger("onnxep")
# onnxruntime's severities: 0 verbose, 1 info, 2 warning, 3 error, 4 fatal.
_SEVERITY = {
    0: logging.DEBUG,
    1: logging.INFO,
    2: logging.WARNING,
    3: logging.ERROR,
    4: logging.CRITICAL,
}


@dataclass(frozen=True)
class ModelMetadata:
    producer_name: str
    graph_name: str
    domain: str
    description: str
    graph_description: str
    version: int
    custom_metadata_map: dict[str, str] = field(default_factory=dict)


def _infer_shapes(proto: onnx.ModelProto) -> onnx.ModelProto:
    try:
        return onnx.shape_inference.infer_shapes(proto, strict_mode=False, data_prop=True)
    except Exception:
        return proto  # shapes only help kernels pick; the run does not depend on them


def _override_free_dims(proto: onnx.ModelProto, overrides: Mapping[str, int]) -> None:
    """SessionOptions.add_free_dimension_override_by_name: a named dim becomes that size."""
    if not overrides:
        return
    for value in proto.graph.input:
        if value.type.WhichOneof("value") != "tensor_type":
            continue
        for dim in value.type.tensor_type.shape.dim:
            if dim.HasField("dim_param") and dim.dim_param in overrides:
                dim.dim_value = overrides[dim.dim_param]


def _to_ir(proto: onnx.ModelProto) -> ir.Model:
    # onnx-ir has no map types: they are taken off before and put back after (map_types).
    proto, maps = strip_map_types(proto)
    try:
        model = ir.serde.deserialize_model(proto)
    except Exception as exc:
        raise InvalidGraph(f"the model could not be read into onnx-ir: {with_cause(exc)}") from exc
    restore_map_types(model, maps)
    if model.functions:
        ir.passes.common.InlinePass()(model)
    return model


class InferenceSession:
    """A model compiled for a list of providers, in priority order.

    ``model`` is a path, bytes or an ``onnx.ModelProto``. ``providers`` lists
    names (``"cuda"``, ``"cpu"``, or onnxruntime's ``"CUDAExecutionProvider"``),
    ``(name, options)`` tuples, or ``None`` for every available provider in
    plugins.toml order. The CPU provider is appended as last resort.
    """

    def __init__(
        self,
        model: ModelLike,
        sess_options: SessionOptions | None = None,
        providers: Sequence[Any] | None = None,
        provider_options: Sequence[dict[str, Any]] | None = None,
        **kwargs: Any,
    ) -> None:
        if kwargs:
            raise InvalidArgument(f"unexpected arguments: {', '.join(sorted(kwargs))}")
        self._source = model  # set_providers compiles it again
        self._options = sess_options or SessionOptions()
        self._config = load_config(self._options.plugins_config)
        self._host: PluginHost = get_host(self._config)
        selected = select_providers(
            self._host, providers, provider_options, strict=self._options.strict()
        )
        if self._options.intra_op_num_threads:
            # onnxruntime's session option; the CPU provider applies it to NumPy's BLAS
            for name, opts in selected:
                if name == "cpu":
                    opts.setdefault("intra_op_num_threads", self._options.intra_op_num_threads)
        self._providers: list[Provider] = create_providers(
            self._host, selected, strict=self._options.strict()
        )
        self._provider_options = {p.name: dict(p.options) for p in self._providers}
        host = next((p for p in self._providers if p.name == "cpu"), None)

        loaded = read_model(model)
        self._load_notes: list[str] = check_model(loaded.proto)
        _override_free_dims(loaded.proto, self._options.free_dimension_overrides)
        proto = _infer_shapes(loaded.proto)
        check_axes(proto)
        loaded.proto = proto
        load_external_data(loaded, self._load_notes)
        self._proto_meta = proto
        self._model = _to_ir(proto)
        self._model_path = loaded.path

        disabled = [n for n, on in self._config.rewrites.items() if not on]
        disabled += list(self._options.disabled_rewrites)
        self._rewrites: dict[str, int] = {}
        self._skipped: list[str] = []
        self._fusions: list[FusionReport] = []
        if self._options.graph_optimization_level >= GraphOptimizationLevel.ORT_ENABLE_BASIC:
            manager = RewriteManager(self._host.rewrites(host, "basic"), disabled)
            report = manager.run(self._model)
            self._rewrites.update(report.counts)
            self._skipped += report.skipped

        opsets = {("" if k == "ai.onnx" else k): v for k, v in self._model.opset_imports.items()}
        if self._options.graph_optimization_level >= GraphOptimizationLevel.ORT_ENABLE_EXTENDED:
            self._provider_rewrites(opsets, disabled)
        self._profiler = (
            Profiler(self._options.profile_file_prefix) if self._options.enable_profiling else None
        )
        self._ctx = CompileContext(
            providers=self._providers,
            opsets=opsets,
            host=host,
            disable_fallback=self._options.disable_fallback,
            profiler=self._profiler,
        )
        graph = self._model.graph
        self._main: CompiledGraph = compile_graph(graph, self._ctx)

        inits = {id(v) for v in graph.initializers.values()}
        self._inputs = [v for v in graph.inputs if id(v) not in inits]
        self._overridable = [v for v in graph.inputs if id(v) in inits]
        self._checks = {v.name: FeedCheck(v) for v in graph.inputs}
        self._input_order = [v.name or "" for v in graph.inputs]
        self._defaults = {v.name: v.const_value.numpy() for v in self._overridable}
        self._output_names = [v.name or "" for v in graph.outputs]
        self._output_index = {n: i for i, n in enumerate(self._output_names)}
        self._output_args = [NodeArg.of(v) for v in graph.outputs]
        self._input_args = [NodeArg.of(v) for v in self._inputs]
        self._capture = self._capture_runner()
        self._inplace = self._inplace_pairs()
        if self._options.optimized_model_filepath:
            self._write_optimized(self._options.optimized_model_filepath)
        self._log_summary()

    def _write_optimized(self, path: str | os.PathLike) -> None:
        """The model after this session's rewrites (fusions produce ``onnxep`` domain ops,
        as onnxruntime's produce ``com.microsoft`` ones), as onnxruntime writes it."""
        proto = ir.serde.serialize_model(self._model)
        big = proto.ByteSize() > 1_800_000_000  # protobuf's 2 GB limit
        try:
            onnx.save_model(
                proto,
                os.fspath(path),
                save_as_external_data=big,
                location=f"{Path(path).name}.data" if big else None,
            )
        except (OSError, ValueError) as exc:
            raise InvalidArgument(
                f"optimized_model_filepath {os.fspath(path)!r} could not be written: {exc}"
            ) from exc

    def _inplace_pairs(self) -> dict[str, tuple[str, str]]:
        """Graph inputs a kernel may update in place (``KernelSpec.inplace``) when a caller
        binds one buffer as that input and as the paired graph output: input name ->
        (node name, output name). Only where the node is the input's one reader and its
        output is the graph output itself (see ``onnxep.providers.inplace``)."""
        pairs: dict[str, tuple[str, str]] = {}
        graph = self._model.graph
        for p in self._main.placed:
            node = p.node
            for i, o in p.claim.spec.inplace:
                if i >= len(node.inputs) or o >= len(node.outputs) or node.inputs[i] is None:
                    continue
                x, y = node.inputs[i], node.outputs[o]
                readers = {id(u.node) for u in x.uses()}
                if (
                    x.is_graph_input()
                    and not x.is_graph_output()
                    and readers == {id(node)}
                    and sum(v is y for v in graph.outputs) == 1
                    and x.name
                    and y.name
                ):
                    pairs[x.name] = (p.name, y.name)
        return pairs

    def inplace_pairs(self) -> dict[str, str]:
        """Graph inputs whose buffer the model may update in place, each with its output: bind
        one device buffer (IO binding) as both, and the step writes the output there (a
        recurrent or conv state) instead of a new buffer to copy back."""
        return {x: out for x, (_, out) in self._inplace.items()}

    def _capture_runner(self) -> CapturedRunner | None:
        """The first device provider's capture policy (``onnxep_capture_policy``), if any."""
        for p in self._providers:
            if p.device == "cpu":
                continue
            opts = self._provider_options.get(p.name, {})
            for _, cfg in self._host.call_each("onnxep_capture_policy", provider=p, options=opts):
                if isinstance(cfg, CaptureConfig):
                    ex = self._main.executor
                    return CapturedRunner(
                        self._main.plan,
                        cfg,
                        self._eager_run,
                        ex._enter_contexts,  # noqa: SLF001 - the runner enters what a run enters
                    )
        return None

    def _eager_run(self, feeds: list[Any], on_device: bool, protect: bool) -> list[Any]:
        ex = self._main.executor
        return ex.run_on_device(feeds, protect_feeds=protect) if on_device else ex.run(feeds)

    def _log_summary(self) -> None:
        level = _SEVERITY.get(self._options.log_severity_level, logging.WARNING)
        if not logger.isEnabledFor(level) and not logger.isEnabledFor(logging.WARNING):
            return
        rep = self.placement()
        if logger.isEnabledFor(level) and level <= logging.INFO:
            logger.log(level, "placement of %s:\n%s", self.model_path or "<model>", rep.format())
        first = self._providers[0].name
        moved = [n for n in rep.fallbacks if n.role == "compute" and first != n.provider]
        if moved and self._options.log_severity_level <= 2:
            logger.warning(
                "%d node(s) fell back from %r (see InferenceSession.placement()): %s",
                len(moved),
                first,
                ", ".join(sorted({n.op_type for n in moved})),
            )
        if self._options.log_severity_level <= 2:
            for f in self._host.failures_to_log():  # each failure once per process
                logger.warning("%s", f)

    def _provider_rewrites(self, opsets: dict[str, int], disabled: list[str]) -> None:
        """Each provider's fusions, on the nodes it would be given (``extended`` level).

        A fusion pass that breaks the rewrite contract is rolled back by the
        manager; it is recorded against its plugin and listed as skipped.
        """
        owner = ownership(self._providers, opsets)
        for provider in self._providers:
            sourced = self._host.rewrites_by_plugin(provider, "extended")
            passes = [p for _, p in sourced]
            plugin_of = {id(p): plugin for plugin, p in sourced}
            for p in passes:
                if isinstance(p, FusionPass):
                    p.bind(provider, lambda n, prov=provider: owner(n) is prov, opsets)
            report = RewriteManager(passes, disabled).run(self._model)
            for name, count in report.counts.items():
                self._rewrites[name] = self._rewrites.get(name, 0) + count
            self._skipped += [s for s in report.skipped if s not in self._skipped]
            rolled_back = {id(r.rewrite) for r in report.rejected}
            self._fusions += [
                FusionReport.of(p, provider.name, disabled, id(p) in rolled_back) for p in passes
            ]
            for rejected in report.rejected:
                plugin = plugin_of.get(id(rejected.rewrite), "?")
                self._host.pass_rolled_back(plugin, provider.name, str(rejected))

    # -- onnxruntime's API ---------------------------------------------------------
    def get_inputs(self) -> list[NodeArg]:
        return list(self._input_args)

    def get_outputs(self) -> list[NodeArg]:
        return list(self._output_args)

    def get_overridable_initializers(self) -> list[NodeArg]:
        return [NodeArg.of(v) for v in self._overridable]

    def get_providers(self) -> list[str]:
        return [p.name for p in self._providers]

    def get_provider_options(self) -> dict[str, dict[str, Any]]:
        return {k: dict(v) for k, v in self._provider_options.items()}

    def get_session_options(self) -> SessionOptions:
        return self._options

    def get_modelmeta(self) -> ModelMetadata:
        p = self._proto_meta
        return ModelMetadata(
            producer_name=p.producer_name,
            graph_name=p.graph.name,
            domain=p.domain,
            description=p.doc_string,
            graph_description=p.graph.doc_string,
            version=p.model_version,
            custom_metadata_map={e.key: e.value for e in p.metadata_props},
        )

    def run(
        self,
        output_names: Sequence[str] | None,
        input_feed: Mapping[str, Any],
        run_options: RunOptions | None = None,
    ) -> list[Any]:
        """Run the model; ``output_names`` None or empty returns every output, in model order."""
        feeds = self._feeds(input_feed)
        pick = self._pick(output_names)
        if self._capture is not None and self._profiler is None:
            outs = self._capture.run(feeds, graph_id_of(run_options))
        elif self._profiler is None:
            outs = self._main.run(feeds)
        else:
            t0 = self._profiler.now_us()
            outs = self._main.run(feeds)
            self._profiler.record("model_run", "Session", t0, self._profiler.now_us() - t0)
        return [outs[i] for i in pick]

    def _run_on_device(
        self,
        feeds: Mapping[str, Any],
        output_names: Sequence[str] | None = None,
        run_options: RunOptions | None = None,
    ) -> list[Any]:
        """Run, leaving each output in its producing provider's memory (for IOBinding)."""
        inputs = self._feeds(feeds)
        pick = self._pick(output_names)
        outs = self._device_run(inputs, run_options)
        return [outs[i] for i in pick]

    def _device_run(
        self,
        inputs: list[Any],
        run_options: RunOptions | None = None,
        protect: bool = True,
        in_place: Sequence[int] = (),
        donated: Mapping[str, int] | None = None,
    ) -> list[Any]:
        """The plan run on the device, through captured graphs when a policy applies;
        ``protect=False`` is IO binding's sharing path (see ``Executor.run_on_device``),
        ``in_place`` its shared buffers, which graphs read where they are, and ``donated``
        those a node may overwrite (node name -> address; ``onnxep.providers.inplace``)."""
        with donating(donated or {}):
            if self._capture is not None and self._profiler is None:
                gid = graph_id_of(run_options)
                return self._capture.run(inputs, gid, True, protect, in_place)
            return self._main.executor.run_on_device(inputs, protect_feeds=protect)

    def run_with_ort_values(
        self,
        output_names: Sequence[str] | None,
        input_dict_ort_values: Mapping[str, Any],
        run_options: RunOptions | None = None,
    ) -> list[OrtValue]:
        """onnxruntime's run on OrtValues: inputs read where they are (host or device),
        outputs left where their provider made them."""
        feeds = {
            k: (v.array if isinstance(v, OrtValue) else v) for k, v in input_dict_ort_values.items()
        }
        outs = self._run_on_device(feeds, output_names, run_options)
        device = next((p for p in self._providers if p.device != "cpu"), None)
        return [
            OrtValue(v)
            if isinstance(v, np.ndarray) or device is None
            else OrtValue(v, v, device.to_host)
            for v in outs
        ]

    def set_providers(
        self,
        providers: Sequence[Any] | None = None,
        provider_options: Sequence[dict[str, Any]] | None = None,
    ) -> None:
        """Compile the model again for ``providers`` (onnxruntime's ``set_providers``)."""
        self.__init__(self._source, self._options, providers, provider_options)

    def io_binding(self) -> IOBinding:
        """An onnxruntime-style binding: bind inputs and outputs, then ``run_with_iobinding``."""
        return IOBinding(self)

    def run_with_iobinding(
        self, iobinding: IOBinding, run_options: RunOptions | None = None
    ) -> None:
        iobinding._run(run_options)  # noqa: SLF001 - the binding belongs to this session

    def end_profiling(self) -> str:
        """Write the Chrome-trace JSON of the runs so far; return its path ('' if not profiling)."""
        if self._profiler is None:
            return ""
        return self._profiler.write()

    @property
    def profiler(self) -> Profiler | None:
        return self._profiler

    # -- onnxep's additions --------------------------------------------------------
    def placement(self) -> PlacementReport:
        """Every node's provider, and the reason each provider ahead of it declined."""
        report = PlacementReport(providers=self.get_providers())
        for cg in [self._main, *self._ctx.subgraphs]:
            for p in cg.placed:
                report.nodes.append(
                    NodePlacement(
                        p.name,
                        p.info.op_type,
                        p.info.domain,
                        p.provider.name,
                        p.role,
                        tuple(p.declined),
                    )
                )
            report.copies += [
                CopyPlacement(c.value, c.src, c.dst, c.consumer) for c in cg.plan.copies
            ]
        report.load_notes = list(self._load_notes)
        report.rewrites = dict(self._rewrites)
        report.output_nodes = self._output_nodes()
        report.skipped_rewrites = list(self._skipped)
        report.fusions = list(self._fusions)
        return report

    def _output_nodes(self) -> dict[str, tuple[str, ...]]:
        """Each graph output's ancestry: the placed nodes of the main graph it depends on."""
        name_of = {id(p.node): p.name for p in self._main.placed}
        out: dict[str, tuple[str, ...]] = {}
        for value in self._model.graph.outputs:
            seen: set[int] = set()
            stack = [value.producer()]
            while stack:
                node = stack.pop()
                if node is None or id(node) in seen:
                    continue
                seen.add(id(node))
                stack += [v.producer() for v in node.inputs if v is not None]
            out[value.name or ""] = tuple(name_of[i] for i in seen if i in name_of)
        return out

    def capture_stats(self) -> dict[str, Any]:
        """Capture counters (captures, replays, fallbacks, invalidations, segments) and the
        policy chosen with its reason; the reasons of failed captures under ``failures``."""
        if self._capture is None:
            return {
                "captures": 0,
                "replays": 0,
                "fallbacks": 0,
                "invalidations": 0,
                "rebinds": 0,
                "copies": 0,
                "segments": 0,
                "policy": "off",
                "reason": "no provider of this session offers graph capture",
                "failures": [],
            }
        return self._capture.stats.as_dict()

    def capture_plan(self) -> Any:
        """The segmentation (a ``CapturePlan``: each step's role, seams with reasons), or
        None when no provider offers capture."""
        return None if self._capture is None else self._capture.capture_plan

    @property
    def providers(self) -> list[Provider]:
        return list(self._providers)

    @property
    def model_path(self) -> str | None:
        return None if self._model_path is None else os.fspath(self._model_path)

    # -- feeds ---------------------------------------------------------------------
    def _feeds(self, input_feed: Mapping[str, Any]) -> list[Any]:
        if not isinstance(input_feed, Mapping):
            raise InvalidArgument(
                f"input_feed must be a dict of input name to array, got {type(input_feed).__name__}"
            )
        extra = [k for k in input_feed if k not in self._checks]
        if extra:
            expected = ", ".join(repr(a.name) for a in self._input_args)
            raise InvalidArgument(
                f"unknown input(s) {', '.join(map(repr, extra))}; the model's inputs are {expected}"
            )
        feeds: list[Any] = []
        for name in self._input_order:
            if name in input_feed:
                feeds.append(self._checks[name](input_feed[name]))
            elif name in self._defaults:
                feeds.append(self._defaults[name])
            else:
                raise InvalidArgument(
                    f"missing input {name!r} ({self._checks[name].arg.type}, shape "
                    f"{self._checks[name].arg.shape}); every model input must be fed"
                )
        return feeds

    def _pick(self, output_names: Sequence[str] | None) -> list[int]:
        if isinstance(output_names, str):
            raise InvalidArgument("output_names must be a list of names or None, not a string")
        if not output_names:  # None or [] mean every output, as in onnxruntime
            return list(range(len(self._output_names)))
        out = []
        for n in output_names:
            if n not in self._output_index:
                raise InvalidArgument(
                    f"unknown output {n!r}; the model's outputs are "
                    f"{', '.join(map(repr, self._output_names))}"
                )
            out.append(self._output_index[n])
        return out
