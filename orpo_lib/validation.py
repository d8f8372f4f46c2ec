"""Input checks shared by every implementation: a clear error naming the argument, before any work."""

import contextlib
import math
import numbers
from collections.abc import Callable
from dataclasses import dataclass

import torch

from ._triton_mode import INTERPRET
from .kernels import label_stats


def check_arguments(hidden, weight, target, bias, nll_target) -> None:
    """Shape, dtype and device checks of the tensors, which need no look at their values."""
    for name, tensor in (("hidden", hidden), ("weight", weight), ("target", target)):
        if not isinstance(tensor, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(tensor).__name__}")
    if hidden.dim() == 2 and weight.dim() == 3:
        raise ValueError(f"hidden comes first, then weight: got a 2-D hidden {tuple(hidden.shape)} and a 3-D weight "
                         f"{tuple(weight.shape)} (Liger's ORPO loss takes the weight first)")
    if hidden.dim() != 3:
        raise ValueError(f"hidden must be 3-D (batch, seq, hidden), got shape {tuple(hidden.shape)}")
    batch, seq, hidden_size = hidden.shape
    if batch == 0 or batch % 2:
        raise ValueError(
            f"hidden's batch must be even and non-zero (chosen rows, then rejected rows), got {batch}"
        )
    if seq == 0:
        raise ValueError("hidden's sequence length must be at least 1")
    if not hidden.is_floating_point():
        raise TypeError(f"hidden must be a floating-point tensor, got {hidden.dtype}")
    if weight.dim() != 2:
        raise ValueError(f"weight must be 2-D (vocab, hidden), got shape {tuple(weight.shape)}")
    if weight.shape[1] != hidden_size:
        raise ValueError(
            f"weight's hidden size {weight.shape[1]} does not match hidden's {hidden_size}"
        )
    if weight.dtype != hidden.dtype:
        raise TypeError(f"weight dtype {weight.dtype} does not match hidden dtype {hidden.dtype}")
    if weight.device != hidden.device:
        raise ValueError(f"weight is on {weight.device} but hidden is on {hidden.device}")
    if bias is not None:
        if not isinstance(bias, torch.Tensor):
            raise TypeError(f"bias must be a torch.Tensor or None, got {type(bias).__name__}")
        if tuple(bias.shape) != (weight.shape[0],):
            raise ValueError(f"bias must have shape ({weight.shape[0]},), got {tuple(bias.shape)}")
        if bias.dtype != hidden.dtype:
            raise TypeError(f"bias dtype {bias.dtype} does not match hidden dtype {hidden.dtype}")
        if bias.device != hidden.device:
            raise ValueError(f"bias is on {bias.device} but hidden is on {hidden.device}")
    for name, labels in (("target", target), ("nll_target", nll_target)):
        if labels is None:
            continue
        if not isinstance(labels, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(labels).__name__}")
        if tuple(labels.shape) != (batch, seq):
            raise ValueError(f"{name} must have shape ({batch}, {seq}), got {tuple(labels.shape)}")
        if labels.dtype not in (torch.int32, torch.int64, torch.int16, torch.uint8, torch.int8):
            raise TypeError(f"{name} must be an integer tensor of token ids, got {labels.dtype}")
        if labels.device != hidden.device:
            raise ValueError(f"{name} is on {labels.device} but hidden is on {hidden.device}")


def check_options(*, beta, ignore_index, compute_nll_loss, chunk_size=None, fp32_weight_grad=True) -> None:
    """The non-tensor options: right type and range, or an error naming the option."""
    if not isinstance(beta, numbers.Real) or isinstance(beta, bool):
        raise TypeError(f"beta must be a real number, got {type(beta).__name__}")
    if not math.isfinite(beta):
        raise ValueError(f"beta must be finite, got {beta}")
    if not isinstance(ignore_index, numbers.Integral) or isinstance(ignore_index, bool):
        raise TypeError(f"ignore_index must be an int, got {type(ignore_index).__name__}")
    for name, flag in (("compute_nll_loss", compute_nll_loss), ("fp32_weight_grad", fp32_weight_grad)):
        if not isinstance(flag, bool):
            raise TypeError(f"{name} must be a bool, got {type(flag).__name__}")
    if chunk_size is not None:
        if not isinstance(chunk_size, numbers.Integral) or isinstance(chunk_size, bool):
            raise TypeError(f"chunk_size must be an int or None, got {type(chunk_size).__name__}")
        if chunk_size <= 0:
            raise ValueError(f"chunk_size must be a positive number of token rows, got {chunk_size}")


@dataclass
class TokenCounts:
    """Which tokens take part, and the per-sequence counts read back to the host once."""

    target_ids: torch.Tensor  # (B, T) int32 odds-ratio target, -1 where the token does not count
    nll_ids: torch.Tensor  # (B, T) int32 NLL target, -1 where it does not count (and in the rejected half)
    stats: torch.Tensor  # (B, 6) int32 on the device: the LABEL_STATS of each sequence
    kept_order: torch.Tensor  # (kept,) int64 on the device: the kept tokens' flattened indices in pair order
    target_per_seq: list  # odds-ratio tokens of each sequence
    kept_per_seq: list  # tokens that any target needs (the others cost no GEMM work)
    nll_tokens: int  # NLL tokens in the chosen half
    one_pass_blockers: list  # per sequence: what keeps its pair from one pass (labels.py; 0 without the NLL term)

    @property
    def nll_only_per_seq(self) -> list:
        """Tokens of each sequence that count for the NLL alone (0 in the rejected half)."""
        return [kept - target for kept, target in zip(self.kept_per_seq, self.target_per_seq)]

    @property
    def tokens_per_seq(self) -> torch.Tensor:
        """(B,) float32 on the device: the odds-ratio tokens of each sequence."""
        return self.stats[:, 0].float()

    @property
    def target_valid(self) -> torch.Tensor:
        return self.target_ids >= 0

    @property
    def nll_valid(self) -> torch.Tensor:
        return self.nll_ids >= 0

    @property
    def kept_mask(self) -> torch.Tensor:
        """(B, T) the tokens some target needs."""
        return self.target_valid | self.nll_valid


def on_device(device):
    """Make ``device`` the current CUDA device while kernels launch: Triton launches on the current one,
    and an LM head on another GPU than the current (a model split over GPUs) must not get the wrong one."""
    return torch.cuda.device(device) if device.type == "cuda" else contextlib.nullcontext()


@dataclass(frozen=True)
class LabelCheck:
    """The label check, queued on the device, and the way to its per-sequence counts on the host."""

    target_ids: torch.Tensor  # (B, T) int32, as TokenCounts
    nll_ids: torch.Tensor  # (B, T) int32
    stats: torch.Tensor  # (B, 6) int32 on the device
    kept_order: torch.Tensor  # (B*T,) int64: the kept tokens, then zeros (kernels.label_stats)
    stats_on_host: Callable[[], torch.Tensor]  # stats on the host (a copy queued by check_labels), or as they are
    vocab: int
    ignore_index: int
    compute_nll_loss: bool
    nll_target_given: bool


def check_labels(target, nll_target, vocab: int, ignore_index: int, compute_nll_loss: bool, *,
                 pair_order: bool = True, copy_now: bool = False) -> LabelCheck:
    """Queue the label check (one kernel, which also orders the kept tokens, in pair order or token order);
    ``read_counts`` reads its counts back. With ``copy_now`` their copy to the host is queued at once, so that
    work queued before ``read_counts`` runs while the host waits for the copy (which costs a little more host
    time than a plain read-back, so only where such work exists)."""
    if target.device.type == "cpu" and not INTERPRET:
        raise ValueError("the tensors are on the CPU, but the Triton kernels were compiled for the GPU: move them "
                         "to CUDA, or set TRITON_INTERPRET=1 before importing orpo_lib")
    with on_device(target.device):
        target_ids, nll_ids, stats, kept_order = label_stats(target, nll_target, vocab, ignore_index,
                                                             compute_nll_loss, pair_order)
    stats_on_host = copy_to_host(stats) if copy_now else lambda: stats
    return LabelCheck(target_ids, nll_ids, stats, kept_order, stats_on_host, vocab, ignore_index, compute_nll_loss,
                      nll_target is not None)


def read_counts(check: LabelCheck) -> TokenCounts:
    """Wait for the label check's counts, raise a clear error for bad labels, and count the tokens that take part."""
    vocab, ignore_index = check.vocab, check.ignore_index
    # rows read back as they are (transposing on the device first costs a copy kernel, ~30 µs here)
    per_seq, kept, nll_per_seq, bad_target, bad_nll, blockers = zip(*check.stats_on_host().tolist())
    if sum(bad_target):
        raise ValueError(
            f"target holds {sum(bad_target)} token id(s) outside [0, {vocab}) that are not ignore_index={ignore_index}"
        )
    if sum(bad_nll):
        raise ValueError(
            f"nll_target holds {sum(bad_nll)} token id(s) outside [0, {vocab}) that are not ignore_index={ignore_index}"
        )
    empty = [i for i, n in enumerate(per_seq) if n == 0]
    if empty:
        raise ValueError(
            f"target has no tokens other than ignore_index={ignore_index} in sequence(s) {empty[:8]}"
            " (rows [0, B/2) chosen, [B/2, B) rejected): their log-probability is undefined"
        )
    if check.compute_nll_loss and sum(nll_per_seq) == 0:
        name = "nll_target" if check.nll_target_given else "target"
        raise ValueError(
            f"{name} has no tokens other than ignore_index={ignore_index} in the chosen half: the NLL"
            " term is undefined (pass compute_nll_loss=False to train on the odds ratio alone)"
        )
    return TokenCounts(check.target_ids, check.nll_ids, check.stats, check.kept_order[: sum(kept)], list(per_seq),
                       list(kept), sum(nll_per_seq), list(blockers))


def count_tokens(target, nll_target, vocab: int, ignore_index: int, compute_nll_loss: bool) -> TokenCounts:
    """Check the label values and count the tokens that take part: one kernel, one device-to-host transfer."""
    return read_counts(check_labels(target, nll_target, vocab, ignore_index, compute_nll_loss))


def copy_to_host(tensor):
    """A function that returns ``tensor`` on the host. On a GPU its copy is queued now, into pinned memory, so
    that work queued after it runs while the host waits for the copy alone."""
    if not tensor.is_cuda:
        return lambda: tensor
    with on_device(tensor.device):
        host = torch.empty(tensor.shape, dtype=tensor.dtype, pin_memory=True)
        host.copy_(tensor, non_blocking=True)
        copied = torch.cuda.Event()
        copied.record()

    def wait():
        copied.synchronize()
        return host
    return wait
