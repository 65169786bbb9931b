from onnxep.providers.kernel import kernel

from .shape import ints, norm_axis, scalar_int


@kernel("Tile", since=1, host_inputs=(1, 2))
def tile_v1(node, xp):
    # Tile-1 repeats along a single axis given as an input
    def run(x, tiles, axis):
        reps = [1] * x.ndim
        reps[norm_axis(scalar_int(axis), x.ndim, "Tile")] = scalar_int(tiles)
        return (xp.tile(x, tuple(reps)),)

    return run


@kernel("Tile", since=6, host_inputs=(1,))
def tile(node, xp):
    def run(x, repeats):
        return (xp.tile(x, tuple(ints(repeats))),)

    return run
