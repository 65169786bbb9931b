from __future__ import annotations

from onnxep.providers.kernel import kernel

from .nn import cosine_window


@kernel("HannWindow", since=17, host_inputs=(0,))
def hann_window(node, xp):
    return cosine_window(node, xp, (0.5, -0.5))
