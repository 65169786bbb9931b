"""Graph rewrite passes (onnx-ir's pass contract) and the manager that runs them."""

from .base import RewritePass
from .dead_nodes import RemoveDeadNodes
from .fold_batch_norm import FoldBatchNorm
from .fold_constants import FoldConstants, FoldSubgraphConstants
from .identity import EliminateIdentity
from .manager import RewriteManager, RewriteReport

__all__ = [
    "EliminateIdentity",
    "FoldBatchNorm",
    "FoldConstants",
    "FoldSubgraphConstants",
    "RemoveDeadNodes",
    "RewriteManager",
    "RewritePass",
    "RewriteReport",
]
