"""Experiment: what the float32 dW accumulation costs per chunk, and whether another GEMM call makes it cheaper.

With several chunks the fused loss adds each chunk's G.T @ X (bf16 operands) into a float32 (V, H)
sum: ``torch.addmm(acc, G.t(), X, out_dtype=float32, out=acc)``. Besides the GEMM's arithmetic this
reads and writes the V×H float32 sum: 2 · 4 · V · H = 4.2 GB per chunk at V = 128256, H = 4096, or
about 0.9 ms at 4.8 TB/s if nothing hides it. Each variant below is timed (CUDA events, medians of
interleaved repetitions) at K = 4096 and 8192 rows per chunk, against the same GEMM with a bf16
result and no sum (the floor's dW GEMM), and checked against the library's sum first. The kernels
each variant launches are named from the profiler.

    python experiments/dw_accumulate.py      # on a CUDA machine, from the repository root
"""
import contextlib
import os
import statistics
import sys

import torch

sys.path.insert(0, os.getcwd())
from orpo_lib import bench, kernels  # noqa: E402

H, V = 4096, 128256
REPS = 15


@contextlib.contextmanager
def blas(library):
    before = torch.backends.cuda.preferred_blas_library()
    torch.backends.cuda.preferred_blas_library(library)
    try:
        yield
    finally:
        torch.backends.cuda.preferred_blas_library(before)


def variants(g, x, acc, acc_t, dw, grad_scale):
    """name → (call, the float32 sum it leaves as a (V, H) view, or None)."""
    def lt(call):
        def run():
            with blas("cublaslt"):
                call()
        return run

    accumulate = lambda: torch.addmm(acc, g.t(), x, out_dtype=torch.float32, out=acc)  # noqa: E731
    accumulate_t = lambda: torch.addmm(acc_t, x.t(), g, out_dtype=torch.float32, out=acc_t)  # noqa: E731
    return {
        "bf16 result, no sum (the floor's dW GEMM)": (lambda: torch.mm(g.t(), x, out=dw), None),
        "float32 result, no sum (a first chunk)": (lambda: torch.mm(g.t(), x, out_dtype=torch.float32, out=acc), None),
        "bf16 sum (dw.addmm_)": (lambda: dw.addmm_(g.t(), x), None),
        "float32 sum, (V, H) (the library)": (accumulate, acc),
        "float32 sum, (H, V) transposed": (accumulate_t, acc_t.t()),
        "float32 sum, (V, H), cublasLt": (lt(accumulate), acc),
        "float32 sum, (H, V), cublasLt": (lt(accumulate_t), acc_t.t()),
        # the last step of each layout: scale by the upstream gradient, cast to bf16, (V, H) contiguous
        "final scale + cast from (V, H) (scale_kernel)": (lambda: kernels.scale(acc, grad_scale, out=dw), None),
        "final scale + cast from (H, V) (torch.mul)": (lambda: torch.mul(acc_t.t(), grad_scale, out=dw), None),
    }


def main():
    device = torch.device("cuda")
    gen = torch.Generator(device="cuda").manual_seed(0)
    acc = torch.empty(V, H, device=device)
    acc_t = torch.empty(H, V, device=device)
    dw = torch.empty(V, H, device=device, dtype=torch.bfloat16)
    grad_scale = torch.tensor(0.5, device=device)
    results = []
    for rows in (4096, 8192):
        g = torch.randn(rows, V, device=device, dtype=torch.bfloat16, generator=gen) * V ** -0.5
        x = torch.randn(rows, H, device=device, dtype=torch.bfloat16, generator=gen)
        start = torch.randn(V, H, device=device, generator=gen)  # the sum so far
        expected = start + (g.t().double() @ x.double()).float()
        calls = variants(g, x, acc, acc_t, dw, grad_scale)
        for name, (run, total) in calls.items():
            if total is not None:  # each sum variant must give the library's sum
                acc.copy_(start)
                acc_t.copy_(start.t())
                run()
                error = ((total - expected).abs().max() / expected.abs().max()).item()
                assert error < 1e-5, f"{name}: relative error {error:.2e}"
        times = bench.time_interleaved({name: run for name, (run, _) in calls.items()}, device, warmup=3, reps=REPS)
        flops = 2 * rows * V * H
        for name, (run, _) in calls.items():
            ms = statistics.median(times[name])
            results.append({"rows": rows, "variant": name, "ms": ms, "min_ms": min(times[name]),
                            "tflops": flops / ms / 1e9 if "final" not in name else None,
                            "kernels": bench.kernel_names(run)})
            print(results[-1], flush=True)
        del g, x, start, expected
        torch.cuda.empty_cache()
    bench.save_experiment("dw-accumulate", results, device)
    print(f"\n{'rows':>5}  {'variant':48s} {'ms':>7} {'TFLOP/s':>8}")
    for r in results:
        print(f"{r['rows']:5d}  {r['variant']:48s} {r['ms']:7.3f} {r['tflops'] or float('nan'):8.0f}")


if __name__ == "__main__":
    main()
