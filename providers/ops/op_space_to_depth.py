from onnxep.errors import NotSupported
from onnxep.providers.kernel import kernel


@kernel("SpaceToDepth", since=1)
def space_to_depth(node, xp):
    bs = node.attr("blocksize")
    mode = node.attr("mode", "DCR") if node.opset >= 28 else "DCR"
    if mode not in ("DCR", "CRD"):
        raise NotSupported(f"SpaceToDepth: mode {mode!r} is not DCR or CRD")

    def run(x):
        b, c, h, w = x.shape
        t = xp.reshape(x, (b, c, h // bs, bs, w // bs, bs))
        # the inverse permutations of DepthToSpace's
        perm = (0, 3, 5, 1, 2, 4) if mode == "DCR" else (0, 1, 3, 5, 2, 4)
        t = xp.transpose(t, perm)
        return (xp.reshape(t, (b, c * bs * bs, h // bs, w // bs)),)

    return run
