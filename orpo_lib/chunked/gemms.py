"""The logits buffer and the GEMMs over its columns: logits = X·Wᵀ (+ bias), dX = G·W, dW = Gᵀ·X.

A buffer's rows are ``schedule.logits_row_columns`` wide, the vocabulary rounded up to a multiple of 16
(``new_logits_buffer`` hands out a (rows, V) view; ``with_padding`` the whole rows). ``gemm_head`` takes W and bias
apart as the GEMMs over those columns want them (``Head``), so that every GEMM dimension is a multiple of 16;
``linear_into`` writes logits through it and ``grads_times_head`` multiplies G by it. The rest are the products the
step functions and backward form from G and X: ``mm`` and ``mm_into`` (summed in float32, rounded once),
``accumulate_mm`` (into a sum), ``scaled_mm`` (a host scale applied by the GEMM).
"""

from dataclasses import dataclass

import torch

from .. import schedule
from . import planning

__all__ = ["Head", "accumulate_mm", "gemm_head", "grads_times_head", "linear_into", "mm", "mm_into",
           "new_logits_buffer", "scaled_mm", "with_padding"]


def new_logits_buffer(rows: int, vocab: int, like):
    """A (rows, vocab) logits buffer in ``like``'s dtype whose rows start on 16-byte boundaries
    (``schedule.logits_row_columns``): a view of a slightly wider buffer where the vocabulary is not a multiple
    of 16."""
    return like.new_empty(rows, schedule.logits_row_columns(vocab))[:, :vocab]


def with_padding(logits):
    """The rows of a ``new_logits_buffer`` view with their padding columns: a contiguous (rows, padded) tensor, as
    a custom op's output must be (the compiler takes its strides from the fake implementation's)."""
    return logits.as_strided((logits.shape[0], logits.stride(0)), (logits.stride(0), 1))


@dataclass(frozen=True)
class Head:
    """W and bias as the GEMMs over the logits buffer's columns take them (``gemm_head``)."""

    weight: torch.Tensor  # W's rows for the buffer's first columns, a multiple of 16 of them (a view)
    bias: torch.Tensor | None = None
    tail: torch.Tensor | None = None  # (16, H) at an odd vocabulary: W's last rows, then zero rows (a copy)
    tail_bias: torch.Tensor | None = None


def gemm_head(weight, bias) -> Head:
    """W and bias split where the vocabulary is not a multiple of 16: its first rows, a multiple of 16, and a
    16-row copy of the rest with zero rows (and zero bias) up to the buffer's row width
    (``schedule.logits_row_columns``). Each GEMM over the buffer's columns is then two, each of whose dimensions is a
    multiple of 16: at an odd vocabulary cuBLAS runs the logits and dX GEMMs six to eight times slower otherwise (at
    8192×1024×50257 on an H100 the logits GEMM took 8.66 against 1.30 ms and the dX GEMM 5.97 against 0.95 ms,
    odd-vocab-steps-h100.json). At a vocabulary that is a multiple of 16: W and bias whole."""
    vocab = weight.shape[0]
    columns = schedule.logits_row_columns(vocab)
    if columns == vocab:
        return Head(weight, bias)
    main = columns - 16
    tail = weight.new_zeros(16, weight.shape[1])
    tail[:vocab - main] = weight[main:]
    if bias is None:
        return Head(weight[:main], None, tail)
    return Head(weight[:main], bias[:main], tail, torch.cat([bias[main:], bias.new_zeros(columns - vocab)]))


def linear_into(out, x, head: Head):
    """out = x @ W.T (+ bias), for ``out`` a view of the logits buffer: the GEMMs write whole rows of the buffer,
    zeros in its padding columns. Returns out."""
    rows = with_padding(out)
    main = head.weight.shape[0]
    _linear(rows[:, :main], x, head.weight, head.bias)
    if head.tail is not None:
        _linear(rows[:, main:], x, head.tail, head.tail_bias)
    return out


def _linear(out, x, weight, bias):
    if bias is None:
        torch.mm(x, weight.t(), out=out)
    else:
        torch.addmm(bias, x, weight.t(), out=out)


def grads_times_head(grads, head: Head, out):
    """out = G·W for ``grads`` the buffer's whole rows (with their padding columns), the products summed in float32
    (or out's dtype) and rounded once to out's dtype; at an odd vocabulary through a float32 sum of ``head``'s two
    GEMMs. Returns out."""
    if head.tail is None:
        return mm_into(out, grads, head.weight)
    main = head.weight.shape[0]
    acc_dtype = planning.stats_dtype(out.dtype)
    acc = out if out.dtype == acc_dtype else out.new_empty(out.shape, dtype=acc_dtype)
    mm_into(acc, grads[:, :main], head.weight)
    accumulate_mm(acc, grads[:, main:], head.tail)
    return out if acc is out else out.copy_(acc)


def mm(a, b, out_dtype):
    """a @ b as a new tensor of ``out_dtype`` (products summed in float32 whatever the operand dtype)."""
    return mm_into(a.new_empty(a.shape[0], b.shape[1], dtype=out_dtype), a, b)


def accumulate_mm(acc, a, b):
    """acc += a @ b, accumulating in acc's dtype."""
    if acc.dtype == a.dtype:
        acc.addmm_(a, b)
    elif a.is_cuda:
        torch.addmm(acc, a, b, out_dtype=acc.dtype, out=acc)
    else:
        acc.addmm_(a.to(acc.dtype), b.to(acc.dtype))


def mm_into(out, a, b):
    """out = a @ b, the products summed in float32 (or out's dtype) and rounded once to out's dtype; returns out."""
    if a.dtype == out.dtype:
        return torch.mm(a, b, out=out)
    if a.is_cuda:
        return torch.mm(a, b, out_dtype=out.dtype, out=out)
    return torch.mm(a.to(out.dtype), b.to(out.dtype), out=out)


def scaled_mm(a, b, scale: float):
    """scale · (a @ b), the scale applied by the GEMM before its one rounding."""
    out = a.new_empty(a.shape[0], b.shape[1])
    return torch.addmm(out, a, b, beta=0, alpha=scale, out=out)  # beta = 0: out's contents are never read
