"""Correctness and interleaved timing: cuBLAS logits GEMM alone, cuBLAS + row_stats, gluon_row_stats as used,
and the ping-pong statistics GEMM at several ring depths. python lab/pingpong_bench.py OUT COMMIT"""

import json
import random
import sys

import torch

sys.path.insert(0, "lab")
from pingpong_stats import pingpong_row_stats  # noqa: E402

from orpo_lib import kernels  # noqa: E402
from orpo_lib.kernels import gluon_gemm, gluon_row_stats  # noqa: E402
from orpo_lib.workbook.bench import provenance  # noqa: E402

SHAPES = [(4096, 4096, 128256), (16384, 4096, 128256), (8192, 2048, 151936), (8192, 1024, 151936),
          (8192, 1024, 32000), (16384, 1024, 32000), (4096, 2048, 256000)]
SMALL = [(1000, 776, 1000), (37, 264, 72), (130, 8, 8), (300, 1001, 72), (2048, 32000, 1024)]
REPS = 15
CHECKED = ("gluon_now", "pingpong4", "pingpong5", "pp4_late_turn")


def problem(rows, size, vocab, seed):
    gen = torch.Generator(device="cuda").manual_seed(seed)
    x = (torch.randn(rows, size, device="cuda", generator=gen) / size ** 0.25).to(torch.bfloat16)
    weight = (torch.randn(vocab, size, device="cuda", generator=gen) / size ** 0.25).to(torch.bfloat16)
    target = torch.randint(0, vocab, (rows,), device="cuda", generator=gen, dtype=torch.int32)
    target[::5] = -1
    target[1::7] = vocab - 1
    nll_target = target.clone()
    nll_target[::3] = torch.randint(0, vocab, (nll_target[::3].shape[0],), device="cuda", generator=gen,
                                    dtype=torch.int32)
    token = torch.randperm(2 * rows, device="cuda", generator=gen)[:rows]
    return x, weight, target, nll_target, token


def outputs(n):
    return [torch.full((n,), float("nan"), device="cuda") for _ in range(4)]


def variants(x, weight, target, nll_target, token, logits):
    outs = {}

    def cublas():
        torch.mm(x, weight.t(), out=logits)

    def cublas_stats():
        torch.mm(x, weight.t(), out=logits)
        kernels.row_stats(logits, target, nll_target, token, *outs["cublas_stats"])

    def gluon_now():
        gluon_row_stats.logits_row_stats(x, weight, target, nll_target, token, *outs["gluon_now"])

    def pingpong(name, stages, **flags):
        return lambda: pingpong_row_stats(x, weight, target, nll_target, token, *outs[name], stages=stages, **flags)

    def gluon_gemm_only():
        gluon_gemm.gluon_matmul_abt(x, weight, torch.bfloat16, out=logits)

    fns = {"cublas": cublas, "cublas_stats": cublas_stats, "gluon_now": gluon_now, "gluon_gemm": gluon_gemm_only,
           "pingpong4": pingpong("pingpong4", 4), "pingpong5": pingpong("pingpong5", 5),
           "pp4_late_turn": pingpong("pp4_late_turn", 4, early_turn=False),
           "pp4_no_stats": pingpong("pp4_no_stats", 4, stats=False)}
    for name in fns:
        outs[name] = outputs(2 * x.shape[0])
    return fns, outs


def max_rel_diff(a, b):
    """Largest |a - b| / (1 + |b|) over the written entries; NaN where one wrote and the other did not."""
    both = ~torch.isnan(b)
    if not torch.equal(both, ~torch.isnan(a)):
        return float("nan")
    return ((a[both] - b[both]).abs() / (1 + b[both].abs())).max().item() if both.any() else 0.0


def check(rows, size, vocab, seed):
    x, weight, target, nll_target, token = problem(rows, size, vocab, seed)
    logits = torch.empty(rows, vocab, device="cuda", dtype=torch.bfloat16)
    fns, outs = variants(x, weight, target, nll_target, token, logits)
    for name in ("cublas_stats", ) + CHECKED:
        fns[name]()
    torch.cuda.synchronize()
    ref = outs["cublas_stats"]
    return {name: [max_rel_diff(o, r) for o, r in zip(outs[name], ref)]
            for name in CHECKED}


def timing(rows, size, vocab):
    x, weight, target, nll_target, token = problem(rows, size, vocab, seed=1)
    logits = torch.empty(rows, vocab, device="cuda", dtype=torch.bfloat16)
    fns, outs = variants(x, weight, target, nll_target, token, logits)
    for fn in fns.values():
        fn()
        fn()
    torch.cuda.synchronize()
    times = {name: [] for name in fns}
    order = list(fns)
    for _ in range(REPS):
        random.shuffle(order)
        for name in order:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fns[name]()
            end.record()
            end.synchronize()
            times[name].append(start.elapsed_time(end))
    med = {name: sorted(t)[len(t) // 2] for name, t in times.items()}
    diffs = {name: [max_rel_diff(o, r) for o, r in zip(outs[name], outs["cublas_stats"])]
             for name in CHECKED}
    return med, diffs


def main():
    out, commit = sys.argv[1], sys.argv[2]
    random.seed(0)
    result = {"provenance": provenance(torch.device("cuda"), "python lab/pingpong_bench.py OUT " + commit, commit),
              "legend": {"cublas": "torch.mm into a bf16 logits buffer", "cublas_stats": "that + row_stats (the buffer path)",
                         "gluon_now": "kernels.gluon_row_stats as used (epilogue partition, 4-stage ring)",
                         "gluon_gemm": "kernels.gluon_gemm, bf16 logits (the warp-specialised skeleton, 4 stages)",
                         "pingpongS": "statistics in the two MMA warpgroups' registers, S-stage ring",
                         "pp4_late_turn": "pingpong4 passing the turn after its last wgmma completes, not after its issue",
                         "pp4_no_stats": "pingpong4's K loops and turns with a row max for epilogue (timing only)",
                         "diff": "max |a-b|/(1+|b|) against cublas_stats of logp, nll_logp, logit_sum, lse"},
              "checks": [], "results": []}
    for i, (rows, vocab, size) in enumerate(SMALL):
        result["checks"].append({"rows": rows, "hidden": size, "vocab": vocab, "diff": check(rows, size, vocab, i)})
        print("check", rows, size, vocab, result["checks"][-1]["diff"], flush=True)
    for rows, size, vocab in SHAPES:
        med, diffs = timing(rows, size, vocab)
        row = {"rows": rows, "hidden": size, "vocab": vocab, "median_ms": med,
               "x_cublas": {k: v / med["cublas"] for k, v in med.items()}, "diff": diffs}
        result["results"].append(row)
        print(rows, size, vocab, " ".join(f"{k}={v:.3f}" for k, v in row["x_cublas"].items()),
              f"cublas={med['cublas']:.3f}ms", flush=True)
        with open(out, "w") as f:
            json.dump(result, f, indent=1)
    print("max diff", max(max(v) for r in result["results"] for v in r["diff"].values()))


if __name__ == "__main__":
    main()
