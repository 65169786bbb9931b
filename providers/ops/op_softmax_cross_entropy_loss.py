"""SoftmaxCrossEntropyLoss: log-softmax over the class axis, then the NLL loss."""

from onnxep.providers.kernel import kernel

from .reduce import log_softmax, loss_attrs, nll_loss, widen


@kernel("SoftmaxCrossEntropyLoss", since=(12, 13))
def softmax_cross_entropy_loss(node, xp):
    reduction, ignore_index = loss_attrs(node)
    want_log_prob = node.has_output(1)

    def run(scores, labels, weights=None):
        logp = log_softmax(widen(scores, xp), 1, xp)
        w = None if weights is None else widen(weights, xp)
        loss = nll_loss(logp, labels, w, reduction, ignore_index, xp, node.op_type)
        loss = xp.asarray(loss).astype(scores.dtype, copy=False)
        if want_log_prob:
            return (loss, logp.astype(scores.dtype, copy=False))
        return (loss,)

    return run
