import numpy as np

from onnxep.providers.kernel import kernel


@kernel("Dropout", since=(1, 6, 7, 10))
def dropout_old(node, xp):
    # before opset 12 Dropout has no training mode at inference: identity, mask of ones
    mask_dtype = node.outputs[1].dtype if node.has_output(1) else None
    if mask_dtype is None:
        mask_dtype = np.dtype(bool) if node.opset >= 10 else node.input_dtype(0)
    want_mask = node.has_output(1)

    def run(x):
        if want_mask:
            return x, xp.ones(x.shape, dtype=mask_dtype or x.dtype)
        return (x,)

    return run


@kernel(
    "Dropout",
    since=(12, 13, 22),
    host_inputs=(1, 2),
)
def dropout(node, xp):
    seed = node.attr("seed", None)
    want_mask = node.has_output(1)

    def run(x, ratio=None, training_mode=None):
        r = 0.5 if ratio is None else float(np.asarray(ratio).reshape(()))
        training = training_mode is not None and bool(np.asarray(training_mode).reshape(()))
        if not training or r == 0:
            if want_mask:
                return x, xp.ones(x.shape, dtype=bool)
            return (x,)
        if not 0 <= r < 1:
            raise ValueError(f"Dropout: ratio {r} is outside [0, 1)")
        # same generator as NumPy's legacy seeding, so a seed reproduces exactly
        rng = xp.random.RandomState(seed) if seed is not None else xp.random.RandomState()
        mask = rng.uniform(0.0, 1.0, x.shape) >= r
        y = (x * mask * (1.0 / (1.0 - r))).astype(x.dtype)
        if want_mask:
            return y, mask
        return (y,)

    return run
