from __future__ import annotations

from onnxep.providers.kernel import kernel

from .nn import cosine_window


@kernel("BlackmanWindow", since=17, host_inputs=(0,))
def blackman_window(node, xp):
    return cosine_window(node, xp, (0.42, -0.5, 0.08))
