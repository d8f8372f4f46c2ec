"""Experiment: the host's side of a fused call, to go with host_wait.py's view from the GPU.

For each shape: the cost of single host steps timed in a tight loop (warm), the host clock at the
same marks as host_wait.py inside timed calls (each call starts after a synchronisation, as in the
benchmark), and cProfile's view of ten forward+backward calls.

    python experiments/host_profile.py      # on a CUDA machine, from the repository root
"""
import cProfile
import io
import json
import os
import pstats
import statistics
import sys
import time

import torch

sys.path.insert(0, os.getcwd())
from orpo_lib import bench, fused, sequence_kernels, validation  # noqa: E402

H, V = 4096, 128256


def loop_us(step, calls=200):
    """Host microseconds per call of ``step`` in a tight loop (the GPU drains only at the end)."""
    for _ in range(5):
        step()
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(calls):
        step()
    host_us = (time.perf_counter() - start) / calls * 1e6
    torch.cuda.synchronize()
    return host_us


def in_call_marks(hidden, weight, target, mode, reps=15, warmup=5):
    """Median host microseconds from a call's start to its label check, the counts' return, the setup,
    the first GEMM and the return of the loss function (before backward)."""
    marks = {}
    originals = fused.count_tokens, fused.ChunkedORPO.__init__, fused.ChunkedORPO._logits

    def count_tokens(*args, **kwargs):
        marks.setdefault("label check", time.perf_counter())
        result = originals[0](*args, **kwargs)
        marks.setdefault("counts back", time.perf_counter())
        return result

    def init(*args, **kwargs):
        marks.setdefault("setup", time.perf_counter())
        return originals[1](*args, **kwargs)

    def logits(*args, **kwargs):
        marks.setdefault("first GEMM", time.perf_counter())
        return originals[2](*args, **kwargs)

    fused.count_tokens, fused.ChunkedORPO.__init__, fused.ChunkedORPO._logits = count_tokens, init, logits
    try:
        times = {}
        for rep in range(warmup + reps):
            torch.cuda.synchronize()
            marks.clear()
            start = time.perf_counter()
            with torch.set_grad_enabled(mode == "full"):
                out = fused.fused_linear_orpo_loss(hidden, weight, target)
            marks["loss returned"] = time.perf_counter()
            if mode == "full":
                out.loss.backward()
                hidden.grad = weight.grad = None
            torch.cuda.synchronize()
            if rep >= warmup:
                for name, t in marks.items():
                    times.setdefault(name, []).append((t - start) * 1e6)
        return {name: statistics.median(values) for name, values in times.items()}
    finally:
        fused.count_tokens, fused.ChunkedORPO.__init__, fused.ChunkedORPO._logits = originals


def profile_calls(hidden, weight, target, calls=10):
    profiler = cProfile.Profile()
    for _ in range(calls):
        torch.cuda.synchronize()
        profiler.enable()
        fused.fused_linear_orpo_loss(hidden, weight, target).loss.backward()
        profiler.disable()
        hidden.grad = weight.grad = None
    torch.cuda.synchronize()
    text = io.StringIO()
    pstats.Stats(profiler, stream=text).sort_stats("cumulative").print_stats(30)
    return text.getvalue()


def main():
    device = torch.device("cuda")
    rows = []
    for batch, seq in ((2, 1024), (8, 1024), (2, 4096)):
        gen = torch.Generator(device="cuda").manual_seed(0)
        hidden = torch.randn(batch, seq, H, device="cuda", dtype=torch.bfloat16, generator=gen).requires_grad_()
        weight = (torch.randn(V, H, device="cuda", dtype=torch.bfloat16, generator=gen) * H ** -0.5).requires_grad_()
        target = torch.randint(0, V, (batch, seq), device="cuda", generator=gen)
        row = {"shape": f"{batch}x{seq}", "warm loop us": {
            "check_arguments": loop_us(lambda: validation.check_arguments(hidden, weight, target, None, None, beta=0.1)),
            "label_stats launch": loop_us(lambda: sequence_kernels.label_stats(target, None, V, -100, True)),
            "count_tokens (waits)": loop_us(lambda: validation.count_tokens(target, None, V, -100, True), 50),
            "torch.cuda.mem_get_info": loop_us(lambda: torch.cuda.mem_get_info(device)),
            "torch.empty": loop_us(lambda: torch.empty(batch * seq, device=device)),
            "torch.zeros": loop_us(lambda: torch.zeros(batch * seq, device=device)),
        }}
        for mode in ("full", "eval"):
            row[f"{mode}: host us from the call's start"] = in_call_marks(hidden, weight, target, mode)
        row["cProfile of 10 full calls"] = profile_calls(hidden, weight, target)
        rows.append(row)
        print(json.dumps({k: v for k, v in row.items() if not k.startswith("cProfile")}, indent=1), flush=True)
        del hidden, weight, target
        torch.cuda.empty_cache()
    bench.save_experiment("host-profile", rows, device)


if __name__ == "__main__":
    main()
