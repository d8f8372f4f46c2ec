"""The gradients from what forward saved, times the upstream gradient g, each a new tensor rounded once.

Several blocks saved their summed dX, dW and dbias (``steps.GradSums``): ``backward_from_sums`` scales them. A
single block saved its G (``driver.Forward.logit_grads``): ``backward_from_logit_grads`` runs its gradient GEMMs
now, with g as the GEMMs' scale or, where the GEMMs are long enough, dX in float32 scaled on the device while the
host waits for g. The saved tensors are only read, so a second backward gives the same gradients again.
"""

import torch

from .. import kernels, schedule
from ..validation import copy_to_host
from . import gemms, planning
from .gemms import Head
from .steps import GradSums

__all__ = ["backward_from_logit_grads", "backward_from_sums"]


def backward_from_sums(grad_loss, sums: GradSums, hidden_shape, vocab: int, weight_dtype):
    """Several blocks: the upstream gradient times the saved sums, into new tensors (dW: (vocab, H), bias: (vocab,),
    in the weight dtype)."""
    dx = dw = db = None
    if sums.dx is not None:
        dx = kernels.scale(sums.dx, grad_loss, out=torch.empty_like(sums.dx)).view(hidden_shape)
    if sums.dw is not None:  # a float32 sum is cast to the weight dtype as it is scaled; its padding rows left out
        rows = sums.dw[:vocab]
        dw = kernels.scale(rows, grad_loss, out=rows.new_empty(rows.shape, dtype=weight_dtype))
    if sums.db is not None:
        db = (sums.db * grad_loss).to(weight_dtype)
    return dx, dw, db


def backward_from_logit_grads(grad_loss, hidden, weight, logit_grads, row_tokens, *, grad_hidden: bool,
                              grad_weight: bool, grad_bias: bool):
    """One block: dX = g·G·W, dW = g·Gᵀ·X, dbias = g·Σ G, with G as forward left it (``logit_grads``: its rows
    with their padding columns, zeros, which the dX GEMMs take with ``gemms.gemm_head``'s zero rows and the dW GEMM
    turns into zero rows of its result, left out).

    cuBLAS applies the upstream gradient g to dW as the GEMM's scale factor, which it takes from the host.
    Where the GEMMs are long enough (``schedule.overlaps_read_backs``), g's copy to the host is queued first,
    then the dX GEMM, which needs g only on the device (its float32 result is scaled by a kernel): the GPU
    runs that GEMM while the host waits for g. Otherwise g is read back first and scales both GEMMs. Each
    gradient is rounded once, and G stays as it is for another backward.
    """
    batch, seq, size = hidden.shape
    overlap = schedule.overlaps_read_backs(batch * seq, size, weight.shape[0])
    copied = copy_to_host(grad_loss) if overlap and grad_weight else None  # waited for at the dW GEMM
    scale = None if overlap else grad_loss.item()
    dx = dw = db = None
    if grad_hidden:
        head = gemms.gemm_head(weight, None)
        if overlap or head.tail is not None:  # (an odd vocabulary's two GEMMs sum in float32 anyway)
            rows = _scaled_on_device(grad_loss, logit_grads, head)
        else:
            rows = gemms.scaled_mm(logit_grads, head.weight, scale)
        dx = _token_rows(rows, row_tokens, hidden).view(hidden.shape)
    if grad_weight:
        x = planning.hidden_rows(hidden) if row_tokens is None else planning.gather_rows(hidden, row_tokens)
        dw = gemms.scaled_mm(logit_grads.t(), x, copied().item() if overlap else scale)[:weight.shape[0]]
    if grad_bias:
        grads = logit_grads[:, :weight.shape[0]]
        db = (grads.sum(0, dtype=planning.stats_dtype(hidden.dtype)) * grad_loss).to(hidden.dtype)
    return dx, dw, db


def _scaled_on_device(grad_loss, grads, head: Head):
    """g · G·W in G's dtype: the GEMMs in float32 (a temporary, freed on return), then scaled by g on the device
    and rounded once."""
    unscaled = gemms.grads_times_head(grads, head, grads.new_empty(grads.shape[0], head.weight.shape[1],
                                                                    dtype=grad_loss.dtype))
    return kernels.scale(unscaled, grad_loss, out=grads.new_empty(unscaled.shape))


def _token_rows(rows, row_tokens, hidden):
    """(B*T, H): the block's rows (in token order where ``row_tokens`` is None) at their tokens, 0 elsewhere."""
    if row_tokens is None:
        return rows
    return hidden.new_zeros(hidden.shape[0] * hidden.shape[1], hidden.shape[2]).index_copy_(0, row_tokens, rows)
