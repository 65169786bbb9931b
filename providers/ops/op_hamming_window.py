from __future__ import annotations

from onnxep.providers.kernel import kernel

from .nn import cosine_window


@kernel("HammingWindow", since=17, host_inputs=(0,))
def hamming_window(node, xp):
    return cosine_window(node, xp, (25 / 46, -21 / 46))
