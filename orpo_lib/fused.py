"""Fused linear + ORPO loss: the loss and its gradients in chunks, never materialising (B*T, V) logits.

The chunked computation (``orpo_lib.chunked``) is two functions, each also registered as a ``torch.library``
custom op, so that ``torch.compile`` sees each as one opaque call with a fake (shape-only)
implementation and never traces the Triton launches or the in-place rewrites of the logits buffer.
An ``autograd.Function`` joins them; it calls the ops when traced and the functions themselves otherwise:

* ``orpo_lib::fused_linear_orpo_forward_v2`` — label check, chunk loop, loss terms; it also returns what
  backward needs (the unscaled gradient sums, or the gradient of the logits of a single block).
* ``orpo_lib::fused_linear_orpo_backward_v2`` — applies the upstream gradient to those, into new tensors.

The ops take and return flat lists of tensors and numbers, in the order of their schemas (``_forward``'s and
``_backward``'s signatures). Everything around them passes those by name: ``_OpOptions`` (the forward op's
arguments after its tensors), ``_Terms`` and ``_Saved`` (its outputs, in that order).

Which of the two kinds of saved state forward returns is decided from shapes and options alone
(``schedule.single_block``: with gradients, one block saves its gradient of the logits), so the compiled
graph's shapes do not depend on the labels' values; the row count of a single block's gradient does, and is
an unbacked size in the fake implementation.
"""

from typing import NamedTuple, Optional

import torch

from . import schedule
from .chunked import backward, driver, planning
from .chunked.steps import GradSums
from .logit_transform import LogitTransform, logit_transform
from .output import METRICS, ORPOOutput, output_from_metrics
from .validation import check_arguments, check_labels, check_options, on_device, read_counts

__all__ = ["BACKWARD_OP", "FORWARD_OP", "FusedLinearORPOLoss", "OPS_VERSION", "fused_linear_orpo_loss"]

# The ops' namespace is the package's name, so that a second copy of the package loaded beside this one
# (the benchmark's --before) registers ops of its own instead of clashing with these.
_OPS = __package__
# Inductor's FX graph cache keys a compiled graph on the ops' names, not on their fake implementations
# (pytorch/pytorch#160472; torch 2.13 still does), so a cache written with an older copy of this package would
# bring back the shapes that copy's ops returned, and fail at the first call. The names carry the version of what
# the ops return: change it with any change to a fake implementation (tests/loss/test_compile.py holds the shapes
# of this version).
OPS_VERSION = 2
FORWARD_OP, BACKWARD_OP = (f"fused_linear_orpo_{step}_v{OPS_VERSION}" for step in ("forward", "backward"))


class _OpOptions(NamedTuple):
    """The forward op's arguments after its five tensors (hidden, weight, bias, target, nll_target)."""

    beta: float
    ignore_index: int
    compute_nll_loss: bool
    chunk_size: Optional[int]
    fp32_weight_grad: bool
    grad_hidden: bool
    grad_weight: bool
    grad_bias: bool
    single_block: bool  # schedule.single_block: which of the two kinds of saved state forward returns
    logit_scale: float
    logit_softcap: Optional[float]


class _Terms(NamedTuple):
    """The forward op's first outputs: the loss, the only one with a gradient, and what the caller reads."""

    loss: torch.Tensor  # 0-d, in the statistics dtype
    metrics: torch.Tensor  # output.METRICS, then the chosen and the rejected rewards
    seq_logp: torch.Tensor  # (B,) chosen sequences, then rejected ones


class _Saved(NamedTuple):
    """The forward op's other outputs, what backward reads, each empty where not needed: with several blocks the
    unscaled sums, with one block its gradient of the logits and its rows' tokens (``chunked.driver.Forward``)."""

    dx_sum: torch.Tensor  # (B*T, H) in hidden's dtype
    dw_sum: torch.Tensor  # (padded V, H) in the dW sum dtype: a row per column of the buffer, zeros past V
    db_sum: torch.Tensor  # (V,) in the statistics dtype
    logit_grads: torch.Tensor  # (kept, padded V) in hidden's dtype
    row_tokens: torch.Tensor  # (kept,) int64; empty where the rows are in token order


def _split_outputs(outputs) -> tuple[_Terms, _Saved]:
    """The forward op's outputs, ``_Terms`` then ``_Saved``, by name."""
    terms = len(_Terms._fields)
    return _Terms(*outputs[:terms]), _Saved(*outputs[terms:])


def _empty(like):
    return like.new_empty(0)


def _forward(hidden: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor], target: torch.Tensor,
             nll_target: Optional[torch.Tensor], beta: float, ignore_index: int, compute_nll_loss: bool,
             chunk_size: Optional[int], fp32_weight_grad: bool, grad_hidden: bool, grad_weight: bool,
             grad_bias: bool, single_block: bool, logit_scale: float = 1.0, logit_softcap: Optional[float] = None,
             ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor,
                        torch.Tensor]:
    """The forward op: ``_Terms``, then ``_Saved``."""
    opts = planning.Options(beta, compute_nll_loss, chunk_size, fp32_weight_grad, grad_hidden, grad_weight,
                            grad_bias, single_block, LogitTransform(logit_scale, logit_softcap))
    # A single block's rows may come in token order (any order serves one block), so that its first logits,
    # queued before the counts are read back, are the same rows whether or not some tokens are dropped. (Not
    # where a call without gradients may take its statistics from inside the GEMM, which has no buffer.)
    tokens = hidden.shape[0] * hidden.shape[1]
    overlap = (single_block and schedule.overlaps_read_backs(tokens, hidden.shape[2], weight.shape[0])
               and not planning.statistics_in_gemm(hidden, weight, bias, tokens, opts))
    check = check_labels(target, nll_target, weight.shape[0], ignore_index, compute_nll_loss,
                         pair_order=not single_block, copy_now=overlap)
    with on_device(hidden.device), torch.autocast(hidden.device.type, enabled=False):
        early = driver.early_logits(hidden, weight, bias, check.kept_order) if overlap else None
        counts = read_counts(check)  # bad labels raise here, before any result exists
        out = driver.forward(hidden, weight, bias, counts, opts, early)
    sums = out.sums or GradSums(None, None, None)
    dx_sum, dw_sum, db_sum, logit_grads = (_empty(hidden) if t is None else t
                                           for t in (sums.dx, sums.dw, sums.db, out.logit_grads))
    row_tokens = target.new_empty(0, dtype=torch.int64) if out.row_tokens is None else out.row_tokens
    return (*_Terms(out.loss, out.metrics, out.seq_logp),
            *_Saved(dx_sum, dw_sum, db_sum, logit_grads, row_tokens))


_forward_op = torch.library.custom_op(f"{_OPS}::{FORWARD_OP}", _forward, mutates_args=())


@_forward_op.register_fake
def _forward_fake(hidden, weight, bias, target, nll_target, beta, ignore_index, compute_nll_loss, chunk_size,
                  fp32_weight_grad, grad_hidden, grad_weight, grad_bias, single_block, logit_scale=1.0,
                  logit_softcap=None):
    batch, seq, size = hidden.shape
    vocab = weight.shape[0]
    acc = planning.stats_dtype(hidden.dtype)
    terms = _Terms(hidden.new_empty((), dtype=acc), hidden.new_empty(len(METRICS) + batch, dtype=acc),
                   hidden.new_empty(batch, dtype=acc))
    dx_sum, dw_sum, db_sum, logit_grads = (_empty(hidden) for _ in range(4))
    columns = schedule.logits_row_columns(vocab)  # the buffer's row width, padding included
    row_tokens = target.new_empty(0, dtype=torch.int64)
    if single_block:
        if grad_hidden or grad_weight or grad_bias:  # (without gradients a single block saves nothing)
            ctx = torch.library.get_ctx()
            # as many rows as the labels keep, each with the buffer's padding
            logit_grads = hidden.new_empty(ctx.new_dynamic_size(), columns)
            row_tokens = target.new_empty(ctx.new_dynamic_size(), dtype=torch.int64)  # 0 rows in token order
    else:
        if grad_hidden:
            dx_sum = hidden.new_empty(batch * seq, size)
        if grad_weight:
            # a row per column of the buffer: the padding's rows are zeros
            dw_sum = hidden.new_empty(columns, size, dtype=planning.dw_sum_dtype(hidden.dtype, fp32_weight_grad))
        if grad_bias:
            db_sum = hidden.new_empty(vocab, dtype=acc)
    return (*terms, *_Saved(dx_sum, dw_sum, db_sum, logit_grads, row_tokens))


def _backward(grad_loss: torch.Tensor, hidden: torch.Tensor, weight: torch.Tensor, dx_sum: torch.Tensor,
              dw_sum: torch.Tensor, db_sum: torch.Tensor, logit_grads: torch.Tensor, row_tokens: torch.Tensor,
              grad_hidden: bool, grad_weight: bool, grad_bias: bool,
              single_block: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The backward op: dx, dw, db (empty where not needed), each a new tensor: the saved ones are only read."""
    grad_loss = grad_loss.to(planning.stats_dtype(hidden.dtype))
    with on_device(hidden.device), torch.autocast(hidden.device.type, enabled=False):
        if single_block:
            grads = backward.backward_from_logit_grads(grad_loss, hidden, weight, logit_grads,
                                                       row_tokens if row_tokens.numel() else None,
                                                       grad_hidden=grad_hidden, grad_weight=grad_weight,
                                                       grad_bias=grad_bias)
        else:
            sums = GradSums(dx_sum if grad_hidden else None, db_sum if grad_bias else None,
                            dw_sum.dtype if grad_weight else None, dw_sum if grad_weight else None)
            grads = backward.backward_from_sums(grad_loss, sums, hidden.shape, weight.shape[0], weight.dtype)
    return tuple(_empty(hidden) if g is None else g for g in grads)


_backward_op = torch.library.custom_op(f"{_OPS}::{BACKWARD_OP}", _backward, mutates_args=())


@_backward_op.register_fake
def _backward_fake(grad_loss, hidden, weight, dx_sum, dw_sum, db_sum, logit_grads, row_tokens, grad_hidden,
                   grad_weight, grad_bias, single_block):
    return (hidden.new_empty(hidden.shape) if grad_hidden else _empty(hidden),
            weight.new_empty(weight.shape) if grad_weight else _empty(hidden),
            weight.new_empty(weight.shape[0]) if grad_bias else _empty(hidden))


def _traced(*tensors) -> bool:
    """Whether a tracer (torch.compile, export, fake tensors) sees this call: then it must meet the custom ops."""
    return torch.compiler.is_compiling() or any(
        t is not None and type(t) not in (torch.Tensor, torch.nn.Parameter) for t in tensors)


class _FusedLinearORPO(torch.autograd.Function):
    """The autograd boundary over the two ops. Traced, forward and backward call the custom ops, which the
    compiler sees as opaque calls; in eager mode they call the same functions directly, because the
    dispatcher's handling of the forward op's 16 arguments and 8 outputs costs tens of µs a call on the host,
    which the GPU waits for at small shapes."""

    @staticmethod
    def forward(ctx, hidden, weight, bias, target, nll_target, options: _OpOptions):
        forward_fn = _forward_op if _traced(hidden, weight, bias, target, nll_target) else _forward
        outputs = forward_fn(hidden, weight, bias, target, nll_target, **options._asdict())
        terms, saved = _split_outputs(outputs)
        ctx.options = options
        ctx.save_for_backward(hidden, weight, *saved)
        # Only the loss has a gradient. The saved state is returned too, because a compiled graph must
        # return the unbacked sizes of a single block's gradient.
        ctx.mark_non_differentiable(terms.metrics, terms.seq_logp, *saved)
        ctx.set_materialize_grads(False)
        return outputs

    @staticmethod
    def backward(ctx, grad_loss, *_metrics_and_saved):
        # one gradient per argument of forward: hidden, weight, bias, then none for the labels and the options
        if grad_loss is None:  # the loss was not used (gradients are not materialised as zeros)
            return None, None, None, None, None, None
        hidden, weight, *saved = ctx.saved_tensors
        options = ctx.options
        backward_fn = _backward_op if _traced(grad_loss, hidden, weight) else _backward
        dx, dw, db = backward_fn(grad_loss, hidden, weight, **_Saved(*saved)._asdict(),
                                 grad_hidden=options.grad_hidden, grad_weight=options.grad_weight,
                                 grad_bias=options.grad_bias, single_block=options.single_block)
        return (dx if options.grad_hidden else None, dw if options.grad_weight else None,
                db if options.grad_bias else None, None, None, None)


def fused_linear_orpo_loss(hidden, weight, target, bias=None, *, beta=0.1, ignore_index=-100, nll_target=None,
                           compute_nll_loss=True, chunk_size=None, fp32_weight_grad=True, logit_scale=1.0,
                           logit_softcap=None) -> ORPOOutput:
    """ORPO loss of the logits ``hidden @ weight.T (+ bias)`` without materialising them.

    hidden: (B, T, H), rows [0, B/2) the chosen responses and [B/2, B) the rejected ones (pair i
    is rows i and i + B/2); weight: (V, H); target: (B, T) token ids, already shifted,
    ``ignore_index`` where a position does not count; nll_target: optional labels for the NLL term
    (default: ``target``); chunk_size: the most token rows whose logits exist at once (None: chosen
    from a memory budget); fp32_weight_grad: accumulate dW across chunks in float32 (False: in the
    weight's dtype, which saves V×H×4 bytes at some cost in precision); logit_scale, logit_softcap: the
    model's logits are ``cap·tanh(scale·z / cap)`` of the head's z (``scale·z`` without a cap), as a model's
    forward computes them (``orpo_lib.logit_transform``; ``orpo_lib.causal_lm.logit_options`` reads them from
    a Hugging Face config).

    Gradients flow to hidden, weight and bias, each only if it requires grad. The loss is float32
    (float64 for float64 inputs). Safe inside ``torch.compile``, including ``fullgraph=True``.
    """
    check_arguments(hidden, weight, target, bias, nll_target)
    check_options(beta=beta, ignore_index=ignore_index, compute_nll_loss=compute_nll_loss, chunk_size=chunk_size,
                  fp32_weight_grad=fp32_weight_grad)
    transform = logit_transform(logit_scale, logit_softcap)
    hidden, weight, bias = _autocast_inputs(hidden, weight, bias)
    grad_on = torch.is_grad_enabled()
    grad_hidden = grad_on and hidden.requires_grad
    grad_weight = grad_on and weight.requires_grad
    grad_bias = grad_on and bias is not None and bias.requires_grad
    batch, seq, size = hidden.shape
    single_block = schedule.single_block(batch, seq, size, weight.shape[0], hidden.element_size(),
                                         chunk_size=chunk_size, fp32_weight_grad=fp32_weight_grad,
                                         grad_weight=grad_weight)
    options = _OpOptions(beta=float(beta), ignore_index=int(ignore_index), compute_nll_loss=compute_nll_loss,
                         chunk_size=None if chunk_size is None else int(chunk_size),
                         fp32_weight_grad=fp32_weight_grad, grad_hidden=grad_hidden, grad_weight=grad_weight,
                         grad_bias=grad_bias, single_block=single_block, logit_scale=transform.scale,
                         logit_softcap=transform.softcap)
    terms, _ = _split_outputs(_FusedLinearORPO.apply(hidden, weight, bias, target, nll_target, options))
    return output_from_metrics(terms.loss, terms.metrics, terms.seq_logp)


def _autocast_inputs(hidden, weight, bias):
    """Under autocast, the LM-head GEMMs run in the autocast dtype, as ``F.linear`` would (the casts are
    differentiable, so float32 parameters still get float32 gradients); the custom ops themselves then run
    with autocast off, on inputs of one dtype."""
    device = hidden.device.type
    if not torch.is_autocast_enabled(device):
        return hidden, weight, bias
    dtype = torch.get_autocast_dtype(device)
    return hidden.to(dtype), weight.to(dtype), None if bias is None else bias.to(dtype)


class FusedLinearORPOLoss(torch.nn.Module):
    """``fused_linear_orpo_loss`` with its options held by the module (all keyword-only)."""

    def __init__(self, *, beta=0.1, ignore_index=-100, compute_nll_loss=True, chunk_size=None, fp32_weight_grad=True,
                 logit_scale=1.0, logit_softcap=None):
        super().__init__()
        check_options(beta=beta, ignore_index=ignore_index, compute_nll_loss=compute_nll_loss, chunk_size=chunk_size,
                      fp32_weight_grad=fp32_weight_grad)
        logit_transform(logit_scale, logit_softcap)
        self.beta, self.ignore_index, self.compute_nll_loss = beta, ignore_index, compute_nll_loss
        self.chunk_size, self.fp32_weight_grad = chunk_size, fp32_weight_grad
        self.logit_scale, self.logit_softcap = logit_scale, logit_softcap

    def forward(self, hidden, weight, target, bias=None, *, nll_target=None) -> ORPOOutput:
        return fused_linear_orpo_loss(hidden, weight, target, bias, beta=self.beta, ignore_index=self.ignore_index,
                                      nll_target=nll_target, compute_nll_loss=self.compute_nll_loss,
                                      chunk_size=self.chunk_size, fp32_weight_grad=self.fp32_weight_grad,
                                      logit_scale=self.logit_scale, logit_softcap=self.logit_softcap)

    def extra_repr(self) -> str:
        return (f"beta={self.beta}, ignore_index={self.ignore_index}, compute_nll_loss={self.compute_nll_loss}, "
                f"chunk_size={self.chunk_size}, fp32_weight_grad={self.fp32_weight_grad}, "
                f"logit_scale={self.logit_scale}, logit_softcap={self.logit_softcap}")
