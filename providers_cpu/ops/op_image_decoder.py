"""ImageDecoder (CPU): decodes with Pillow when it is installed, else declines the node."""

from __future__ import annotations

import io

import numpy as np

from onnxep.errors import NotSupported
from onnxep.providers.kernel import kernel


@kernel("ImageDecoder", since=20)
def image_decoder(node, xp):
    try:
        from PIL import Image
    except ImportError:
        raise NotSupported(
            "ImageDecoder: decoding JPEG/PNG/BMP needs Pillow, which onnxep does not depend on;"
            " install it (pip install pillow) to run this node"
        ) from None
    fmt = node.attr("pixel_format", "RGB")
    fmt = fmt.decode() if isinstance(fmt, bytes) else fmt
    if fmt not in ("RGB", "BGR", "Grayscale"):
        raise NotSupported(f"ImageDecoder: pixel_format {fmt!r} is not supported")

    def run(data):
        img = Image.open(io.BytesIO(np.asarray(data, dtype=np.uint8).tobytes()))
        if fmt == "Grayscale":
            return (np.asarray(img.convert("L"), dtype=np.uint8)[:, :, None],)
        arr = np.asarray(img.convert("RGB"), dtype=np.uint8)
        if fmt == "BGR":
            arr = np.ascontiguousarray(arr[:, :, ::-1])
        return (arr,)

    return run
