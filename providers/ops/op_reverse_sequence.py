from onnxep.providers.kernel import kernel

from .indices import checked_indices


@kernel("ReverseSequence", since=10)
def reverse_sequence(node, xp):
    time_axis = node.attr("time_axis", 0)
    batch_axis = node.attr("batch_axis", 1)

    def run(x, sequence_lens):
        t_len, b_len = x.shape[time_axis], x.shape[batch_axis]
        t = xp.arange(t_len).reshape(t_len, 1)
        # a length reads steps 0..len-1, so it must lie in [0, T] as onnxruntime checks
        lens = checked_indices(
            xp,
            sequence_lens,
            t_len + 1,
            "ReverseSequence",
            name="sequence_lens",
            negative=False,
            extent=f"a time axis of {t_len} steps",
        )
        lens = lens.astype(xp.int64).reshape(1, b_len)
        # source time step of each (t, b): mirrored inside the sequence, else itself
        src = xp.where(t < lens, lens - 1 - t, t)
        if time_axis > batch_axis:
            src = src.T
        src = src.reshape(src.shape + (1,) * (x.ndim - 2))
        src = xp.broadcast_to(src, x.shape)
        return (xp.take_along_axis(x, src, axis=time_axis),)

    return run
