"""SessionOptions and RunOptions, with onnxruntime's names."""

from __future__ import annotations

import enum
import os
from dataclasses import dataclass, field
from typing import Any

from .errors import InvalidArgument


class GraphOptimizationLevel(enum.IntEnum):
    ORT_DISABLE_ALL = 0
    ORT_ENABLE_BASIC = 1
    ORT_ENABLE_EXTENDED = 2
    ORT_ENABLE_ALL = 99


#: onnxruntime's session config key for its intra-op threads' spin-wait ("0" or "1").
ALLOW_SPINNING = "session.intra_op.allow_spinning"


@dataclass
class SessionOptions:
    """Options for one session; names follow onnxruntime where it has them.

    ``disable_fallback`` makes any compute node that leaves the first provider
    an error, and a listed provider that is unavailable here too.
    ``strict_providers`` makes only the latter an error: by default such a
    provider is skipped with one warning, as onnxruntime does. ``plugins_config``
    names a plugins.toml that overrides the default key by key (as
    ``$ONNXEP_PLUGINS`` does). ``disabled_rewrites``
    switches rewrite passes off by name for this session.

    ``placement`` is ``"priority"`` (each node to the first provider in the list that
    claims it) or ``"measured"`` (time the candidate placements at session creation on
    feeds made from the inputs' declared shapes, ``placement_shapes`` and
    ``placement_int_ranges`` as the CLI's ``--shape`` and ``--int-range``, and keep the
    fastest; docs/placement.md). None of the ``placement*`` settings set here means
    plugins.toml's ``[placement]`` value.
    """

    graph_optimization_level: GraphOptimizationLevel = GraphOptimizationLevel.ORT_ENABLE_ALL
    disable_fallback: bool = False
    strict_providers: bool = False
    log_severity_level: int = 2
    log_verbosity_level: int = 0
    logid: str = ""
    enable_profiling: bool = False
    profile_file_prefix: str = "onnxep_profile"
    plugins_config: str | os.PathLike | None = None
    disabled_rewrites: list[str] = field(default_factory=list)
    intra_op_num_threads: int = 0
    inter_op_num_threads: int = 0
    #: where the session writes its model after rewrites ("" writes nothing), as onnxruntime
    optimized_model_filepath: str = ""
    placement: str | None = None
    #: the time ``placement="measured"`` may spend running candidates, in milliseconds
    placement_budget_ms: float | None = None
    #: device islands of fewer nodes than this are moved to the CPU in one candidate
    placement_island_nodes: int | None = None
    placement_shapes: dict[str, list[int]] = field(default_factory=dict)
    placement_int_ranges: dict[str, tuple[int, int]] = field(default_factory=dict)

    def strict(self) -> bool:
        """Whether a listed provider that is unavailable here is an error (else a warning)."""
        return self.disable_fallback or self.strict_providers

    def add_free_dimension_override_by_name(self, dim_name: str, dim_value: int) -> None:
        """Fix the symbolic dim ``dim_name`` of the model's inputs to ``dim_value`` (as
        onnxruntime does): feeds must then have that size there, and kernels plan for it."""
        if isinstance(dim_value, bool) or not isinstance(dim_value, int) or dim_value < 0:
            raise InvalidArgument(
                f"add_free_dimension_override_by_name({dim_name!r}, {dim_value!r}): the value "
                "must be a whole number >= 0"
            )
        self.free_dimension_overrides[str(dim_name)] = int(dim_value)

    def add_session_config_entry(self, key: str, value: str) -> None:
        """onnxruntime's session config entries. ``session.intra_op.allow_spinning``
        (``"1"``, the default, or ``"0"``) is passed to the CPU provider: with ``"0"`` the
        threads of its split kernels sleep after each split instead of polling for the
        next; other entries are kept but not interpreted."""
        self.config_entries[key] = value

    def get_session_config_entry(self, key: str) -> str:
        """The value ``add_session_config_entry`` set for ``key`` (KeyError if none)."""
        return self.config_entries[key]

    def __post_init__(self) -> None:
        self.config_entries: dict[str, str] = {}
        self.free_dimension_overrides: dict[str, int] = {}


@dataclass(frozen=True)
class PlacementSettings:
    """How a session places nodes: SessionOptions' ``placement*`` over plugins.toml's."""

    mode: str = "priority"
    budget_ms: float = 2000.0
    island_nodes: int = 8


def placement_settings(options: SessionOptions, config: Any) -> PlacementSettings:
    """The session's placement settings, checked (``config``: the session's plugins.toml,
    whose ``[placement]`` values were checked when it was read)."""
    from .plugins.config import placement_problem

    table = dict(getattr(config, "placement", {}) or {})
    default = PlacementSettings()
    values = {}
    for key, option in (
        ("mode", "placement"),
        ("budget_ms", "placement_budget_ms"),
        ("island_nodes", "placement_island_nodes"),
    ):
        value = getattr(options, option)
        if value is None:
            value = table.get(key, getattr(default, key))
        else:
            what = placement_problem(key, value)
            if what:
                raise InvalidArgument(f"SessionOptions.{option}={value!r}: it must be {what}")
        values[key] = value
    return PlacementSettings(
        str(values["mode"]), float(values["budget_ms"]), int(values["island_nodes"])
    )


@dataclass
class RunOptions:
    """Options for one run. ``add_run_config_entry("gpu_graph_id", "N")`` (onnxruntime's
    spelling) picks the captured graph a run replays; ``-1`` runs it without capture."""

    log_severity_level: int = 2
    log_verbosity_level: int = 0
    logid: str = ""
    terminate: bool = False

    def __post_init__(self) -> None:
        self.config_entries: dict[str, str] = {}

    def add_run_config_entry(self, key: str, value: str) -> None:
        self.config_entries[key] = str(value)

    def get_run_config_entry(self, key: str) -> str:
        return self.config_entries[key]
