"""Experiment: a row's statistics and U = onehot(u) - P in one kernel, against row_stats + row_grads.

Persistent programs take the rows in turn, so that the rewrite could find the row still in L2 (4 bytes of HBM
per logit instead of 6). Run: python lab/row_logp_grads_sweep.py COMMIT (on a GPU); writes $OUT/row-pass-sweep.json.
"""
import datetime, json, os, sys

import torch
import triton
import triton.language as tl

from orpo_lib import kernels
from orpo_lib.kernels.numerics import expm1
from orpo_lib.kernels.row_grads import target_columns
from orpo_lib.kernels.row_layout import RowLaunch, block_v, rows_of, this_row
from orpo_lib.kernels.row_stats import log_probs, stats_slot


@triton.jit
def row_statistics(row_ptr, target, nll_target, V, lse_ptr, BLOCK_V: tl.constexpr, SLOT: tl.constexpr):
    # One read of a row: its log-sum-exp, the log-probs of its two targets and its logit sum, in lse_ptr's dtype.
    acc = lse_ptr.dtype.element_ty  # float32, or float64 for float64 inputs
    target_logit = tl.load(row_ptr + target, mask=target >= 0, other=0.0).to(acc)
    nll_logit = tl.load(row_ptr + nll_target, mask=nll_target >= 0, other=0.0).to(acc)

    # Online log-sum-exp. The target's own term is left out of the sum so that a near-certain
    # target (the row maximum) gets log p = -log1p(sum of the others) rather than a rounded 0.
    # The partial block at the end of the row goes first, with masks; the whole blocks then need
    # none, and only the one holding the target compares columns.
    offs = tl.arange(0, BLOCK_V)
    tail = V // BLOCK_V * BLOCK_V
    cols = tail + offs
    in_row = cols < V
    x = tl.load(row_ptr + cols, mask=in_row, other=float("-inf")).to(acc)
    tail_max = tl.max(x, axis=0)  # -inf when V is a multiple of BLOCK_V (an empty tail)
    tail_ref = tl.where(tail_max == float("-inf"), 0.0, tail_max)  # so that no -inf - -inf is ever formed
    tail_sum = tl.sum(tl.where(in_row & (cols != target), tl.exp(x - tail_ref), 0.0), axis=0)
    logit_sum = tl.sum(tl.where(in_row, x, 0.0), axis=0)

    # The whole blocks as (BLOCK_V / SLOT, SLOT) tiles: each slot of SLOT adjacent columns (one
    # thread's vector load) keeps its own running max and sum, so that a step reduces within threads
    # only; the slots are combined once, after the loop. The next block is loaded before the current
    # one is reduced, so a load is always in flight.
    slot = tl.arange(0, BLOCK_V // SLOT)[:, None] * SLOT + tl.arange(0, SLOT)[None, :]
    slot_max = tl.full([BLOCK_V // SLOT], float("-inf"), acc)
    slot_sum = tl.zeros([BLOCK_V // SLOT], acc)
    slot_logit_sum = tl.zeros([BLOCK_V // SLOT], acc)
    last_start = tail - BLOCK_V
    next_x = tl.load(row_ptr + slot)
    for start in range(0, tail, BLOCK_V):
        block = next_x.to(acc)
        # the last step reloads its own block rather than reading past the whole blocks
        next_x = tl.load(row_ptr + tl.minimum(start + BLOCK_V, last_start) + slot)
        new_max = tl.maximum(slot_max, tl.max(block, axis=1))
        terms = tl.exp(block - new_max[:, None])
        if (target >= start) & (target < start + BLOCK_V):
            terms = tl.where(start + slot != target, terms, 0.0)
        slot_sum = slot_sum * tl.exp(slot_max - new_max) + tl.sum(terms, axis=1)
        slot_logit_sum += tl.sum(block, axis=1)
        slot_max = new_max
    row_max = tl.maximum(tl.max(slot_max, axis=0), tail_max)
    other_sum = tl.sum(slot_sum * tl.exp(slot_max - row_max), axis=0) + tail_sum * tl.exp(tail_max - row_max)
    logit_sum += tl.sum(slot_logit_sum, axis=0)
    lse, logp, nll_logp = log_probs(row_max, other_sum, target_logit, nll_logit, target, nll_target)
    return lse, logp, nll_logp, logit_sum


@triton.jit
def store_statistics(token, target, nll_target, lse, logp, nll_logp, logit_sum, logp_ptr, nll_logp_ptr,
                     logit_sum_ptr, lse_ptr):
    tl.store(logp_ptr + token, tl.where(target >= 0, logp, 0.0))
    tl.store(nll_logp_ptr + token, tl.where(nll_target >= 0, nll_logp, 0.0))
    tl.store(logit_sum_ptr + token, logit_sum)
    tl.store(lse_ptr + token, lse)


@triton.jit
def rewrite_row(row_ptr, V, lse, neg_s, target, nll_target, target_grad, nll_grad, BLOCK_V: tl.constexpr):
    # The row's logits z rewritten into -s·exp(z - lse), its two target columns set to the values given.
    # Whole blocks without masks (only a block holding a target compares columns), then the tail.
    out_dtype = row_ptr.dtype.element_ty
    offs = tl.arange(0, BLOCK_V)
    tail = V // BLOCK_V * BLOCK_V
    for start in range(0, tail, BLOCK_V):
        x = tl.load(row_ptr + start + offs)
        grad = neg_s * tl.exp(x.to(lse.dtype) - lse)
        if ((target >= start) & (target < start + BLOCK_V)) | ((nll_target >= start) & (nll_target < start + BLOCK_V)):
            grad = target_columns(grad, start + offs, target, nll_target, target_grad, nll_grad)
        tl.store(row_ptr + start + offs, grad.to(out_dtype))
    cols = tail + offs
    in_row = cols < V
    x = tl.load(row_ptr + cols, mask=in_row, other=float("-inf"))  # exp(-inf) = 0: nothing overflows
    grad = target_columns(neg_s * tl.exp(x.to(lse.dtype) - lse), cols, target, nll_target, target_grad, nll_grad)
    tl.store(row_ptr + cols, grad.to(out_dtype), mask=in_row)


@triton.jit
def row_logp_grads_kernel(
    logits_ptr,  # (C, V) chunk of logits: read for the statistics, then rewritten in place into U
    stride_row,
    target_ptr, nll_target_ptr, token_ptr,  # as row_stats_kernel's
    logp_ptr, nll_logp_ptr, logit_sum_ptr, lse_ptr,  # (B*T,) out, as row_stats_kernel's
    C,
    V,  # at least BLOCK_V
    BLOCK_V: tl.constexpr,
    SLOT: tl.constexpr,
):
    # Persistent: a few programs per SM take the rows in turn, so that the rows being read are few enough
    # for the rewrite to find each one still in L2 (one read of HBM instead of two).
    for row in range(tl.program_id(0), C, tl.num_programs(0)):
        row_ptr, target, nll_target, token = this_row(row, logits_ptr, stride_row, target_ptr, nll_target_ptr,
                                                      token_ptr)
        lse, logp, nll_logp, logit_sum = row_statistics(row_ptr, target, nll_target, V, lse_ptr, BLOCK_V, SLOT)
        store_statistics(token, target, nll_target, lse, logp, nll_logp, logit_sum, logp_ptr, nll_logp_ptr,
                         logit_sum_ptr, lse_ptr)
        # U = onehot(u) - P, its target column -expm1(log p(u)) = 1 - p(u); -1 where the row has neither target
        has_target = target >= 0
        u = tl.where(has_target, target, nll_target)
        logp_u = tl.where(has_target, logp, nll_logp)
        rewrite_row(row_ptr, V, lse, tl.full((), -1.0, lse.dtype), u, tl.full((), -1, tl.int32), -expm1(logp_u),
                    0.0, BLOCK_V)



def sm_count(device) -> int:
    return torch.cuda.get_device_properties(device).multi_processor_count


def row_logp_grads(logits, target, nll_target, token, logp, nll_logp, logit_sum, lse, *,
                   launch: RowLaunch = RowLaunch(8192, 16), programs_per_sm: int = 2) -> None:
    """Launch ``row_logp_grads_kernel``: ``row_stats``' outputs, and every row of ``logits`` rewritten into
    d log p(u) / dlogits = onehot(u) - softmax (u: the target, else the NLL target). A row with both targets
    must have them equal (its gradient is then c·U)."""
    rows, vocab = rows_of(logits)
    block = block_v(vocab, launch)
    programs = min(rows, programs_per_sm * sm_count(logits.device))
    row_logp_grads_kernel[(max(programs, 1),)](
        logits, logits.stride(0), target, nll_target, token, logp, nll_logp, logit_sum, lse, rows, vocab,
        BLOCK_V=block, SLOT=stats_slot(block), num_warps=launch.num_warps,
    )




dev = torch.device("cuda")
torch.manual_seed(0)
SHAPES = [(16384, 32000), (8192, 50257), (4096, 128256), (4096, 151936), (4096, 256000)]
CONFIGS = [(8192, 16, 1), (8192, 16, 2), (8192, 16, 4), (4096, 8, 2), (4096, 8, 4), (4096, 8, 8),
           (4096, 4, 8), (2048, 4, 8), (16384, 16, 1), (16384, 32, 1), (8192, 16, 0), (1024, 1, 0)]  # 0: one program per row
def outs(n):
    return [torch.zeros(n, device=dev) for _ in range(4)]
def bench(fn):
    return triton.testing.do_bench(fn, warmup=10, rep=60, return_mode="median")
results = []
for rows, vocab in SHAPES:
    logits = (torch.randn(rows, vocab, device=dev) * 3).bfloat16()
    target = torch.randint(0, vocab, (rows,), device=dev, dtype=torch.int32)
    target[::7] = -1
    nll = target.clone(); nll[::5] = -1
    nll[::7] = torch.randint(0, vocab, (len(nll[::7]),), device=dev, dtype=torch.int32)  # NLL-only rows
    token = torch.arange(rows, device=dev)
    # reference: the two kernels, and U in float32
    ref = outs(rows)
    kernels.row_stats(logits, target, nll, token, *ref)
    timing = outs(rows)
    u = torch.where(target >= 0, target, nll).long()
    z = logits[:512].float()
    u_ref = -torch.softmax(z, 1); has = u[:512] >= 0
    u_ref[has.nonzero()[:, 0], u[:512][has]] += 1
    seq_coef = torch.randn(rows, device=dev) * 1e-3
    buf = logits.clone()
    two = lambda: (kernels.row_stats(buf, target, nll, token, *timing),
                   kernels.row_grads(buf, target, nll, token, timing[0], timing[1], timing[3], seq_coef, nll_tokens=rows, seq_len=1))
    t_two = bench(two)
    t_stats = bench(lambda: kernels.row_stats(buf, target, nll, token, *timing))
    t_copy = bench(lambda: buf.mul_(1))
    gb = rows * vocab * 2 / 1e9
    row = {"rows": rows, "vocab": vocab, "two_kernels_ms": t_two, "row_stats_ms": t_stats, "inplace_mul_ms": t_copy, "fused": []}
    for block, warps, per_sm in CONFIGS:
        launch = RowLaunch(block, warps)
        per = per_sm if per_sm else 10**9
        got = outs(rows); b2 = logits.clone()
        row_logp_grads(b2, target, nll, token, *got, launch=launch, programs_per_sm=per)
        stats_err = max((g - r).abs().max().item() for g, r in zip(got, ref))
        u_err = (b2[:512].float() - u_ref).abs().max().item()
        t = bench(lambda: row_logp_grads(buf, target, nll, token, *timing, launch=launch, programs_per_sm=per))
        row["fused"].append({"block_v": block, "num_warps": warps, "programs_per_sm": per_sm, "ms": t,
                             "stats_max_abs_diff": stats_err, "u_max_abs_err": u_err})
    results.append(row)
    best = min(row["fused"], key=lambda f: f["ms"])
    print(f"{rows}x{vocab}: two kernels {t_two:.3f} ms ({3*gb/t_two:.2f} TB/s at 6 B), stats {t_stats:.3f}, mul_ {t_copy:.3f} ms;"
          f" fused best {best['ms']:.3f} ms ({2*gb/best['ms']:.2f} TB/s at 4 B) {best['block_v'], best['num_warps'], best['programs_per_sm']}", flush=True)
    for f in row["fused"]:
        print(f"   {f['block_v']:6d} {f['num_warps']:3d} {f['programs_per_sm']:2d}  {f['ms']:.3f} ms  stats diff {f['stats_max_abs_diff']:.2e}  U err {f['u_max_abs_err']:.2e}")
    del logits, buf
    torch.cuda.empty_cache()
prov = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__,
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"), "commit": sys.argv[1],
        "command": "python lab/row_logp_grads_sweep.py " + sys.argv[1]}
json.dump({"provenance": prov, "results": results}, open(os.path.join(os.environ.get("OUT", "."), "row-logp-grads-sweep.json"), "w"), indent=1)
