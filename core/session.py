"""InferenceSession: load, rewrite, partition, plan once; run many times from many threads."""

from __future__ import annotations

import gc
import logging
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from onnxep.providers import CaptureConfig, Provider

from .compile.islands import MOVED_BY_MEASUREMENT
from .compile.placement import CopyPlacement, MeasuredPlacement, NodePlacement, PlacementReport
from .compiled_graph import CompileContext
from .compiled_model import CompiledModel
from .errors import InvalidArgument
from .execute.codegen import reusable_inputs
from .execute.profiling import Profiler
from .iobinding import IOBinding
from .loading.load import load
from .loading.read import ModelLike
from .measured_placement import Candidate, candidates, measure, timing_feeds
from .model_io import NodeArg
from .options import (
    ALLOW_SPINNING,
    GraphOptimizationLevel,
    PlacementSettings,
    RunOptions,
    SessionOptions,
    placement_settings,
)
from .ortvalue import OrtValue
from .plugins.config import load_config
from .plugins.host import PluginHost, get_host, register_plugin
from .plugins.selection import create_providers, select_providers
from .rewrites.plugin import plugin as basic_rewrites
from .rewrites.stage import RewriteOutcome, rewrite_basic, rewrite_extended

register_plugin(basic_rewrites, name="onnxep.rewrites")

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
        spinning = self._options.config_entries.get(ALLOW_SPINNING)
        for name, opts in selected:
            if name != "cpu":
                continue
            if self._options.intra_op_num_threads:
                # onnxruntime's session option; the CPU provider applies it to NumPy's BLAS
                opts.setdefault("intra_op_num_threads", self._options.intra_op_num_threads)
            if spinning is not None:
                opts.setdefault("allow_spinning", spinning)
        self._providers: list[Provider] = create_providers(
            self._host, selected, strict=self._options.strict()
        )
        self._provider_options = {p.name: dict(p.options) for p in self._providers}
        host = next((p for p in self._providers if p.name == "cpu"), None)

        loaded = load(model, self._options.free_dimension_overrides)
        self._load_notes = loaded.notes
        self._proto_meta = loaded.proto
        self._model_path = loaded.path
        ir_model = loaded.model

        disabled = [n for n, on in self._config.rewrites.items() if not on]
        self._disabled = disabled + list(self._options.disabled_rewrites)
        basic = RewriteOutcome()
        if self._options.graph_optimization_level >= GraphOptimizationLevel.ORT_ENABLE_BASIC:
            rewrite_basic(ir_model, self._host, host, self._disabled, basic)
        self._opsets = {("" if k == "ai.onnx" else k): v for k, v in ir_model.opset_imports.items()}
        self._profiler = (
            Profiler(self._options.profile_file_prefix) if self._options.enable_profiling else None
        )
        chosen = candidates(self._providers, host, 0)[0]  # the list as given
        self._measured: MeasuredPlacement | None = None
        settings = placement_settings(self._options, self._config)
        if settings.mode == "measured":
            chosen, self._measured = self._measure(ir_model, basic, host, settings)
        self._providers = list(chosen.providers)
        self._provider_options = {p.name: dict(p.options) for p in self._providers}
        self._compiled, self._rewrites = self._build(ir_model, basic, host, chosen)
        self._input_args = [NodeArg.of(v) for v in self._compiled.inputs]
        self._output_args = [NodeArg.of(v) for v in ir_model.graph.outputs]
        if self._options.optimized_model_filepath:
            self._write_optimized(self._options.optimized_model_filepath)
        self._log_summary()

    def _build(
        self,
        ir_model: Any,
        basic: RewriteOutcome,
        host: Provider | None,
        cand: Candidate,
        measuring: bool = False,
    ) -> tuple[CompiledModel, RewriteOutcome]:
        """``ir_model`` (after the basic rewrites) compiled for ``cand``: its providers'
        fusions, partition, plan. ``measuring`` compiles a copy, and profiles nothing."""
        model = ir_model.clone() if measuring else ir_model
        outcome = RewriteOutcome(
            dict(basic.counts), list(basic.skipped), list(basic.fusions), dict(basic.refusals)
        )
        providers = list(cand.providers)
        if self._options.graph_optimization_level >= GraphOptimizationLevel.ORT_ENABLE_EXTENDED:
            rewrite_extended(model, self._host, providers, self._opsets, self._disabled, outcome)
        profiler = None if measuring else self._profiler
        ctx = CompileContext(
            providers=providers,
            opsets=self._opsets,
            host=host,
            disable_fallback=self._options.disable_fallback,
            profiler=profiler,
            island_nodes=cand.island_nodes,
        )
        compiled = CompiledModel(model, ctx, lambda: self._capture_config(providers), profiler)
        return compiled, outcome

    def _measure(
        self,
        ir_model: Any,
        basic: RewriteOutcome,
        host: Provider | None,
        settings: PlacementSettings,
    ) -> tuple[Candidate, MeasuredPlacement]:
        """The fastest of the candidate placements, timed as docs/placement.md says."""
        if self._options.disable_fallback:
            raise InvalidArgument(
                "placement='measured' and disable_fallback cannot both be set: the candidates "
                "other than the list as given move nodes off the first provider; choose one"
            )
        cands = candidates(self._providers, host, settings.island_nodes)

        def feeds_for(compiled: CompiledModel) -> dict[str, Any]:
            return timing_feeds(
                [NodeArg.of(v) for v in compiled.inputs],
                compiled.model.graph,
                self.model_path,
                self._options.free_dimension_overrides,
                self._options.placement_shapes,
                self._options.placement_int_ranges,
            )

        chosen = measure(
            cands,
            lambda c: self._build(ir_model, basic, host, c, measuring=True)[0],
            feeds_for,
            settings.budget_ms,
            settings.island_nodes,
        )
        # The timed plans hold device weights and buffers in reference cycles (a capture
        # runner calls back into its model): free them before the kept plan is built.
        gc.collect()
        return chosen

    def _write_optimized(self, path: str | os.PathLike) -> None:
        """The model after this session's rewrites (fusions produce ``onnxep`` domain ops,
        as onnxruntime's produce ``com.microsoft`` ones), as onnxruntime writes it."""
        import onnx
        import onnx_ir as ir

        proto = ir.serde.serialize_model(self._compiled.model)
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

    def inplace_pairs(self) -> dict[str, str]:
        """Graph inputs whose buffer the model may update in place, each with its output: bind
        one device buffer (IO binding) as both, and the step writes the output there (a
        recurrent or conv state) instead of a new buffer to copy back."""
        return {x: out for x, (_, out) in self._compiled.inplace.items()}

    def _capture_config(self, providers: Sequence[Provider]) -> CaptureConfig | None:
        """The first device provider's capture policy (``onnxep_capture_policy``), if any."""
        for p in providers:
            if p.device == "cpu":
                continue
            cfg = self._host.capture_policy(p, dict(p.options))
            if cfg is not None:
                return cfg
        return None

    def _log_summary(self) -> None:
        level = _SEVERITY.get(self._options.log_severity_level, logging.WARNING)
        if not logger.isEnabledFor(level) and not logger.isEnabledFor(logging.WARNING):
            return
        rep = self.placement()
        if logger.isEnabledFor(level) and level <= logging.INFO:
            logger.log(level, "placement of %s:\n%s", self.model_path or "<model>", rep.format())
        first = self._providers[0].name
        moved = [
            n
            for n in rep.fallbacks
            if n.role == "compute"
            and first != n.provider
            and not n.declined[-1][1].startswith(MOVED_BY_MEASUREMENT)
        ]
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

    # -- onnxruntime's API ---------------------------------------------------------
    def get_inputs(self) -> list[NodeArg]:
        return list(self._input_args)

    def get_outputs(self) -> list[NodeArg]:
        return list(self._output_args)

    def get_overridable_initializers(self) -> list[NodeArg]:
        return [NodeArg.of(v) for v in self._compiled.overridable]

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
        return self._compiled.run(input_feed, output_names, run_options=run_options)

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
        outs = self._compiled.run(feeds, output_names, on_device=True, run_options=run_options)
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
        iobinding.run(run_options)

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
        for cg in self._compiled.graphs:
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
            report.steps += len(cg.plan.steps)
            report.direct_steps += sum(s.direct is not None for s in cg.plan.steps)
            report.in_place_steps += len(reusable_inputs(cg.plan))
        report.load_notes = list(self._load_notes)
        report.provider_notes = {
            p.name: notes for p in self._providers if (notes := p.session_notes())
        }
        report.rewrites = dict(self._rewrites.counts)
        report.output_nodes = self._compiled.output_nodes()
        report.skipped_rewrites = list(self._rewrites.skipped)
        report.fusions = list(self._rewrites.fusions)
        report.rewrite_refusals = {k: dict(v) for k, v in self._rewrites.refusals.items()}
        report.measured = self._measured
        return report

    def capture_stats(self) -> dict[str, Any]:
        """Capture counters (captures, replays, fallbacks, invalidations, segments) and the
        policy chosen with its reason; the reasons of failed captures under ``failures``."""
        if self._compiled.capture is None:
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
        return self._compiled.capture.stats.as_dict()

    def capture_plan(self) -> Any:
        """The segmentation (a ``CapturePlan``: each step's role, seams with reasons), or
        None when no provider offers capture."""
        capture = self._compiled.capture
        return None if capture is None else capture.capture_plan

    @property
    def providers(self) -> list[Provider]:
        return list(self._providers)

    @property
    def compiled(self) -> CompiledModel:
        """The compiled model this session runs (what IO binding and the decoder hold)."""
        return self._compiled

    @property
    def model_path(self) -> str | None:
        return None if self._model_path is None else os.fspath(self._model_path)
