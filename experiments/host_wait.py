"""Experiment: how long the GPU waits on the host before a fused call's first logits GEMM.

CUDA events mark the start of the call, the return of the label check (its counts read back), the
start of the chunked run's setup and the moment the first GEMM is queued. The GPU is idle in
between, so each event's time is the host's: the differences split the fixed per-call wait.

    python experiments/host_wait.py      # on a CUDA machine, from the repository root
"""
import json
import os
import statistics
import sys

import torch

sys.path.insert(0, os.getcwd())
from orpo_lib import bench, fused  # noqa: E402

H, V = 4096, 128256


def main():
    marks = {}  # name -> the event recorded at its first passage in the current call

    def marked(name, function):
        def wrapper(*args, **kwargs):
            if name not in marks:
                marks[name] = torch.cuda.Event(enable_timing=True)
                marks[name].record()
            return function(*args, **kwargs)
        return wrapper

    def counted(*args, **kwargs):  # the mark goes after the check returns
        result = count_tokens(*args, **kwargs)
        marks["counts back"] = torch.cuda.Event(enable_timing=True)
        marks["counts back"].record()
        return result
    count_tokens = fused.count_tokens
    fused.count_tokens = counted
    fused.ChunkedORPO.__init__ = marked("setup", fused.ChunkedORPO.__init__)
    fused.ChunkedORPO._logits = marked("first GEMM", fused.ChunkedORPO._logits)

    rows = []
    for batch, seq in ((2, 1024), (4, 1024), (8, 1024), (2, 4096)):
        gen = torch.Generator(device="cuda").manual_seed(0)
        hidden = torch.randn(batch, seq, H, device="cuda", dtype=torch.bfloat16, generator=gen).requires_grad_()
        weight = (torch.randn(V, H, device="cuda", dtype=torch.bfloat16, generator=gen) * H ** -0.5).requires_grad_()
        target = torch.randint(0, V, (batch, seq), device="cuda", generator=gen)
        for mode in ("full", "eval"):
            waits, totals = {"counts back": [], "setup": [], "first GEMM": []}, []
            for rep in range(13):
                marks.clear()
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                with torch.set_grad_enabled(mode == "full"):
                    out = fused.fused_linear_orpo_loss(hidden, weight, target)
                if mode == "full":
                    out.loss.backward()
                    hidden.grad = weight.grad = None
                end.record()
                end.synchronize()
                if rep >= 3:  # after warm-up
                    for name, times in waits.items():
                        times.append(start.elapsed_time(marks[name]))
                    totals.append(start.elapsed_time(end))
            row = {"shape": f"{batch}x{seq}", "mode": mode, "call_ms": statistics.median(totals),
                   **{f"{name} at ms": statistics.median(times) for name, times in waits.items()}}
            rows.append(row)
            print(json.dumps(row), flush=True)
    bench.save_experiment("host-wait", rows, torch.device("cuda"))


if __name__ == "__main__":
    main()
