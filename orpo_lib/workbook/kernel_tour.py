"""The kernel notebook's helpers: toy rows, float64 references, the library's row kernels on them, what
each kernel moves per logit, and the chunk plan as data.

The toy kernels themselves live in ``notebooks/02-kernels.ipynb``, because reading them is the point.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass

import torch

from .. import kernels, schedule
from ..kernels.row_grads import row_grads_kernel, target_columns
from ..kernels.row_layout import block_v
from ..kernels.row_stats import log_probs, row_stats_kernel
from .memory import chunk_row_limit, one_pass_fits

# Where a toy row keeps its near-certain target: the target logit this far above the row's largest other.
NEAR_CERTAIN_MARGIN = 30.0


@dataclass(frozen=True)
class ToyRows:
    """A few rows of logits with two targets each and the scalars of their gradient."""

    logits: torch.Tensor  # (R, V) float32
    target: torch.Tensor  # (R,) int32 odds-ratio target y
    nll_target: torch.Tensor  # (R,) int32 NLL target y' (row 0: y' = y)
    a: torch.Tensor  # (R,) float32 dL/dlogp(y) of each row
    b: torch.Tensor  # (R,) float32 dL/dlogp(y') of each row: -1 / (number of NLL tokens)


def toy_rows(rows: int = 6, vocab: int = 1000, seed: int = 0, device="cpu") -> ToyRows:
    """Seeded rows whose awkward cases are known: row 0's target is the row maximum by
    ``NEAR_CERTAIN_MARGIN`` (p ≈ 1 - 1e-13, and y' = y), row 1's the last column (in the partial last
    block), row 2's the first column; the rest are random."""
    gen = torch.Generator().manual_seed(seed)
    logits = torch.randn(rows, vocab, generator=gen) * 3
    target = torch.randint(0, vocab, (rows,), generator=gen)
    target[1], target[2] = vocab - 1, 0
    logits[0, target[0]] = logits[0].max() + NEAR_CERTAIN_MARGIN
    nll_target = torch.randint(0, vocab, (rows,), generator=gen)
    nll_target[0] = target[0]
    a = torch.randn(rows, generator=gen) * 0.1
    b = torch.full((rows,), -1.0 / rows)
    return ToyRows(*(t.to(device) for t in (logits, target.int(), nll_target.int(), a, b)))


def log_softmax_log_probs(logits, target) -> torch.Tensor:
    """log p(target) from torch's float64 log_softmax (z_y - logsumexp(z): it cancels when p ≈ 1)."""
    return torch.log_softmax(logits.double(), dim=-1).gather(1, target.long()[:, None])[:, 0]


def precise_log_probs(logits, target) -> torch.Tensor:
    """log p(target) in float64 without cancellation: -log1p(sum over v != y of exp(z_v - z_y))."""
    z = logits.double()
    rel = z - z.gather(1, target.long()[:, None])
    others = torch.exp(rel).scatter(1, target.long()[:, None], 0.0)
    return -torch.log1p(others.sum(dim=1))


def reference_lse(logits) -> torch.Tensor:
    return torch.logsumexp(logits.double(), dim=-1)


def autograd_row_grads(toy: ToyRows) -> torch.Tensor:
    """G = d(a·log p(y) + b·log p(y'))/dz of every row, by float64 autograd."""
    z = toy.logits.double().requires_grad_()
    logp = torch.log_softmax(z, dim=-1)
    picked = toy.a.double() * logp.gather(1, toy.target.long()[:, None])[:, 0]
    picked = picked + toy.b.double() * logp.gather(1, toy.nll_target.long()[:, None])[:, 0]
    picked.sum().backward()
    return z.grad


def precise_target_grads(toy: ToyRows) -> torch.Tensor:
    """G[y] of every row in float64 from p(y) - 1 = expm1(log p(y)), so that nothing cancels when p ≈ 1:
    G[y] = a + b·[y' = y] - (a + b)·p(y) = -(a + b)·expm1(log p(y)) - b·[y' != y]."""
    different = (toy.nll_target != toy.target).double()
    logp = precise_log_probs(toy.logits, toy.target)
    return -(toy.a + toy.b).double() * torch.expm1(logp) - toy.b.double() * different


def max_rel_error(actual, expected) -> float:
    """Largest |actual - expected| / |expected| over the entries (each entry its own scale)."""
    actual, expected = actual.double(), expected.double()
    return ((actual - expected).abs() / expected.abs()).max().item()


def max_error_over_largest(actual, expected) -> float:
    """Largest |actual - expected| over the largest |expected| (a whole-row scale)."""
    actual, expected = actual.double(), expected.double()
    return ((actual - expected).abs().max() / expected.abs().max()).item()


# ---- the library's kernels on the toy rows ---------------------------------------------------------

def library_row_stats(toy: ToyRows) -> dict:
    """``kernels.row_stats`` on the toy rows (each row its own token): log p(y), log p(y'), logsumexp."""
    rows = toy.logits.shape[0]
    logp, nll_logp, logit_sum, lse = torch.zeros(4, rows, device=toy.logits.device)
    tokens = torch.arange(rows, device=toy.logits.device)
    kernels.row_stats(toy.logits, toy.target, toy.nll_target, tokens, logp, nll_logp, logit_sum, lse)
    return {"logp": logp, "nll_logp": nll_logp, "logit_sum": logit_sum, "lse": lse}


def library_row_grads(toy: ToyRows, stats: dict) -> torch.Tensor:
    """``kernels.row_grads`` on a copy of the toy rows: each row is a sequence of one token, so its
    coefficient is its own a; b is the NLL term's -1 / (NLL tokens), here one per row."""
    grads = toy.logits.clone()
    tokens = torch.arange(grads.shape[0], device=grads.device)
    kernels.row_grads(grads, toy.target, toy.nll_target, tokens, stats["logp"],
                      stats["nll_logp"], stats["lse"], toy.a, nll_tokens=grads.shape[0], seq_len=1)
    return grads


def kernel_sources() -> dict[str, str]:
    """The source of the library's two row kernels and the @triton.jit helpers they call."""
    functions = (row_stats_kernel, log_probs, row_grads_kernel, target_columns)
    return {fn.fn.__name__: inspect.getsource(fn.fn) for fn in functions}


def launch_rows(rows: int, vocab: int) -> list[dict]:
    """Grid and launch configuration of each row kernel for a (rows, vocab) chunk."""
    table = []
    for name, launch in (("row_stats_kernel", kernels.STATS_LAUNCH), ("row_grads_kernel", kernels.GRADS_LAUNCH)):
        block = block_v(vocab, launch)
        table.append({"kernel": name, "grid": f"({rows},)", "BLOCK_V": block, "num_warps": launch.num_warps,
                      "loop_steps": -(-vocab // block), "RowLaunch.block_v": launch.block_v})
    return table


def bytes_moved(itemsize: int = 2, stats_itemsize: int = 4) -> list[dict]:
    """What each row kernel reads and writes in HBM: per logit, and per row (labels, token index and the
    per-token statistics; int32 labels, int64 token index)."""
    labels = 2 * 4 + 8  # target, nll_target (int32) and the token index (int64)
    return [
        {"kernel": "row_stats_kernel", "reads_per_logit": itemsize, "writes_per_logit": 0,
         "bytes_per_logit": itemsize,
         "reads_per_row": labels + 2 * itemsize,  # and the two target logits, again
         "writes_per_row": 4 * stats_itemsize},  # log p(y), log p(y'), logit sum, logsumexp
        {"kernel": "row_grads_kernel", "reads_per_logit": itemsize, "writes_per_logit": itemsize,
         "bytes_per_logit": 2 * itemsize,
         "reads_per_row": labels + 4 * stats_itemsize,  # log p(y), log p(y'), logsumexp, the sequence's a
         "writes_per_row": 0},
    ]


# ---- the chunk plan --------------------------------------------------------------------------------

def group_pass(group: schedule.ChunkGroup) -> str:
    """How a group goes through the buffer; the drawing styles each kind (``plots.PASS_STYLE``)."""
    if group.one_pass:
        return "one pass, per sequence"
    return "one pass" if len(group.blocks) == 1 else "two passes"


@dataclass(frozen=True)
class ChunkPlan:
    """The library's schedule for B sequences of T tokens, every token counted."""

    batch: int
    seq: int
    chunk_rows: int  # the limit the plan was made with
    limit_source: str  # where the limit came from
    groups: list  # schedule.ChunkGroup

    @property
    def buffer_rows(self) -> int:
        """Height of the logits buffer: its largest block."""
        return max(end - start for g in self.groups for start, end in g.blocks)

    @property
    def blocks(self) -> int:
        return sum(len(g.blocks) for g in self.groups)


def chunk_plan(batch: int, seq: int, chunk_rows: int = 0, hidden: int = 4096, vocab: int = 128256,
               dtype_bytes: int = 2) -> ChunkPlan:
    """``schedule.plan_chunks`` over B/2 pairs of 2·T rows (pair order: chosen i, then rejected i), with
    ``chunk_rows`` rows at most (0: the library's default for this shape, as ``memory.chunk_row_limit``)."""
    if batch % 2:
        raise ValueError(f"batch must be even (chosen half, rejected half), got {batch}")
    limit = chunk_row_limit(batch, seq, chunk_rows or None, vocab, dtype_bytes, hidden)
    source = "given" if chunk_rows else f"the library's default at H={hidden}, V={vocab}, {dtype_bytes}-byte logits"
    pairs = batch // 2
    groups = schedule.plan_chunks([2 * seq] * pairs, limit)
    if not chunk_rows:  # the automatic chunk size: a long pair takes one pass where its sums fit the budget
        one_pass = [one_pass_fits(seq, hidden, vocab, dtype_bytes, dw_fp32=True)] * pairs
        groups = schedule.plan_passes(groups, [seq] * pairs, [0] * pairs, one_pass, schedule.one_pass_block_rows(limit))
    return ChunkPlan(batch, seq, limit, source, groups)


def plan_rows(plan: ChunkPlan) -> list[dict]:
    """One row per group: its pairs, rows, blocks and pass."""
    return [{"group": i, "pairs": f"{g.first_pair}–{g.end_pair - 1}", "rows": f"{g.blocks[0][0]}–{g.blocks[-1][1] - 1}",
             "blocks": len(g.blocks), "block_rows": g.blocks[0][1] - g.blocks[0][0], "pass": group_pass(g)}
            for i, g in enumerate(plan.groups)]
