"""The base of onnxep's passes: an onnx-ir in-place pass with a name and a counter."""

from __future__ import annotations

import onnx_ir as ir


class RewritePass(ir.passes.InPlacePass):
    """A pass with a switch name (plugins.toml ``[rewrites]``) and a count of what it did.

    Subclasses implement ``call(model) -> PassResult`` and add to ``self.count``
    each time they rewrite something; the count shows in the placement report.
    """

    name: str = "rewrite"

    def __init__(self) -> None:
        super().__init__()
        self.count = 0
