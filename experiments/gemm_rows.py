"""Experiment: how fast cuBLAS runs the logits and dX GEMMs when their rows come in pieces of m rows.

The fused loss issues a block's logits GEMM (X @ W.T, C×V out) and dX GEMM (G @ W, C×H out) as one
call over the block's C rows: 8192 at T = 4096. cuBLAS picks its kernel from the shape, so the same
rows in pieces of another height may run at another rate. Here 16384 rows (H = 4096, V = 128256,
bf16) go through each GEMM in pieces of m rows, back to back as in a call of the loss, so that the
clocks are those of sustained work; times are medians of interleaved repetitions (CUDA events), and
the kernels that cuBLAS chose are named from the profiler.

    python experiments/gemm_rows.py      # on a CUDA machine, from the repository root
"""
import os
import statistics
import sys

import torch

sys.path.insert(0, os.getcwd())
from orpo_lib import bench  # noqa: E402

H, V = 4096, 128256
ROWS = 16384
PIECES = (2048, 4096, 8192, 16384)
REPS = 10


def main():
    device = torch.device("cuda")
    gen = torch.Generator(device="cuda").manual_seed(0)
    weight = torch.randn(V, H, device=device, dtype=torch.bfloat16, generator=gen) * H ** -0.5
    x = torch.randn(ROWS, H, device=device, dtype=torch.bfloat16, generator=gen)
    logits = torch.empty(max(PIECES), V, device=device, dtype=torch.bfloat16)  # the chunk buffer
    grad = torch.randn(max(PIECES), V, device=device, dtype=torch.bfloat16, generator=gen) * V ** -0.5
    dx = torch.empty(ROWS, H, device=device, dtype=torch.bfloat16)

    def logits_gemm(m):
        def run():
            for start in range(0, ROWS, m):
                torch.mm(x[start:start + m], weight.t(), out=logits[:m])
        return run

    def dx_gemm(m):
        def run():
            for start in range(0, ROWS, m):
                torch.mm(grad[:m], weight, out=dx[start:start + m])
        return run

    calls = {(gemm, m): make(m) for gemm, make in (("logits", logits_gemm), ("dX", dx_gemm)) for m in PIECES}
    times = bench.time_interleaved(calls, device, warmup=2, reps=REPS)
    flops = 2 * ROWS * H * V
    results = []
    for (gemm, m), run in calls.items():
        ms = statistics.median(times[gemm, m])
        results.append({"gemm": gemm, "piece_rows": m, "rows": ROWS, "ms": ms, "min_ms": min(times[gemm, m]),
                        "tflops": flops / ms / 1e9, "kernels": bench.kernel_names(run, skip=("Memset",))})
        print(results[-1], flush=True)
    bench.save_experiment("gemm-rows", results, device)
    print(f"\n{'GEMM':6} {'piece rows':>10} {'ms':>8} {'TFLOP/s':>8}  kernel")
    for r in results:
        print(f"{r['gemm']:6} {r['piece_rows']:10d} {r['ms']:8.2f} {r['tflops']:8.0f}  {', '.join(r['kernels'])}")


if __name__ == "__main__":
    main()
