from onnxep.errors import NotSupported
from onnxep.providers.kernel import kernel


@kernel("DepthToSpace", since=1)
def depth_to_space(node, xp):
    bs = node.attr("blocksize")
    mode = node.attr("mode", "DCR") if node.opset >= 11 else "DCR"
    if mode not in ("DCR", "CRD"):
        raise NotSupported(f"DepthToSpace: mode {mode!r} is not DCR or CRD")

    def run(x):
        b, c, h, w = x.shape
        c2 = c // (bs * bs)
        if mode == "DCR":
            t = xp.reshape(x, (b, bs, bs, c2, h, w))
            t = xp.transpose(t, (0, 3, 4, 1, 5, 2))
        else:
            t = xp.reshape(x, (b, c2, bs, bs, h, w))
            t = xp.transpose(t, (0, 1, 4, 2, 5, 3))
        return (xp.reshape(t, (b, c2, h * bs, w * bs)),)

    return run
