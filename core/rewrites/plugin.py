"""The core's own plugin: the basic passes every session runs before partitioning."""

from __future__ import annotations

from typing import Any

from onnxep.providers import hookimpl

from .dead_nodes import RemoveDeadNodes
from .fold_batch_norm import FoldBatchNorm
from .fold_constants import FoldConstants, FoldSubgraphConstants
from .identity import EliminateIdentity
from .inline_if import InlineConstantIf
from .propagate_dtypes import PropagateContribDtypes
from .static_shapes import InferStaticShapes


class BasicRewrites:
    @hookimpl
    def onnxep_graph_rewrites(self, provider: Any, level: str) -> Any:
        if level != "basic":
            return None
        # Types first: the fusion passes (extended level) read the dtypes it fills in.
        passes: list[Any] = [PropagateContribDtypes(), EliminateIdentity()]
        if provider is not None:
            passes += [FoldConstants(provider), FoldSubgraphConstants(provider)]
        # After folding: shapes its constants make static (so the next round folds their
        # Shape nodes), then the If nodes those folds decide.
        passes += [InferStaticShapes(), InlineConstantIf()]
        # After constant folding: a BatchNormalization's statistics may come from Constant nodes.
        passes += [FoldBatchNorm(), RemoveDeadNodes()]
        return passes


plugin = BasicRewrites()
