"""NegativeLogLikelihoodLoss: pick -input[n, target[n, ...], ...], weighted and reduced."""

from onnxep.providers.kernel import kernel

from .reduce import loss_attrs, nll_loss, widen


@kernel("NegativeLogLikelihoodLoss", since=(12, 13, 22))
def negative_log_likelihood_loss(node, xp):
    reduction, ignore_index = loss_attrs(node)

    def run(x, target, weight=None):
        w = None if weight is None else widen(weight, xp)
        loss = nll_loss(widen(x, xp), target, w, reduction, ignore_index, xp)
        return (xp.asarray(loss).astype(x.dtype, copy=False),)

    return run
