"""Experiment: what the label check's read-back costs at the start of a call, and whether another way is cheaper.

The fused loss launches label_stats_kernel and reads its (B, 5) counts back before its first GEMM; the
GPU idles meanwhile. Each variant below runs after ``busy_ms`` of GEMMs and a synchronisation, as a
call of the benchmark does, then: launch the label kernel, bring the counts to the host, queue a GEMM.
Reported per variant: host microseconds to the counts, and the GPU's idle time before the GEMM
(CUDA events). ``busy_ms = 0`` is the warm case (no wait before the call).

    python experiments/readback.py      # on a CUDA machine, from the repository root
"""
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.getcwd())
from orpo_lib import bench, sequence_kernels  # noqa: E402

H, V = 4096, 128256


def main():
    device = torch.device("cuda")
    gen = torch.Generator(device="cuda").manual_seed(0)
    weight = torch.randn(V, H, device=device, dtype=torch.bfloat16, generator=gen) * H ** -0.5
    x = torch.randn(2048, H, device=device, dtype=torch.bfloat16, generator=gen)
    logits = torch.empty(2048, V, device=device, dtype=torch.bfloat16)
    target = torch.randint(0, V, (2, 1024), device=device, generator=gen)
    pinned = torch.empty(2, 5, dtype=torch.int32, pin_memory=True)

    def counts():
        return sequence_kernels.label_stats(target, None, V, -100, True)[2]

    def via_event(stats):
        pinned.copy_(stats, non_blocking=True)
        event = torch.cuda.Event()
        event.record()
        event.synchronize()
        return pinned.t().tolist()

    def via_stream(stats):
        pinned.copy_(stats, non_blocking=True)
        torch.cuda.current_stream().synchronize()
        return pinned.t().tolist()

    variants = {
        "tolist of the transposed counts (the library)": lambda: counts().t().tolist(),
        "tolist, then transposed on the host": lambda: list(zip(*counts().tolist())),
        "pinned copy + event sync": lambda: via_event(counts()),
        "pinned copy + stream sync": lambda: via_stream(counts()),
        "synchronize only (no kernel, no copy)": torch.cuda.synchronize,
    }
    rows = []
    for busy_ms in (0, 3, 10, 30):
        gemms = round(busy_ms / 3)  # one 2048-row logits GEMM is about 3 ms
        for name, read_back in variants.items():
            host_us, idle_us = [], []
            for rep in range(25):
                for _ in range(gemms):
                    torch.mm(x, weight.t(), out=logits)
                torch.cuda.synchronize()
                start, before_gemm = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                t0 = time.perf_counter()
                start.record()
                read_back()
                host = time.perf_counter() - t0
                before_gemm.record()
                torch.mm(x, weight.t(), out=logits)
                torch.cuda.synchronize()
                if rep >= 5:
                    host_us.append(host * 1e6)
                    idle_us.append(start.elapsed_time(before_gemm) * 1e3)
            rows.append({"busy_ms": busy_ms, "variant": name, "host_us": statistics.median(host_us),
                         "gpu_idle_us": statistics.median(idle_us)})
            print(rows[-1], flush=True)
    bench.save_experiment("readback", rows, device)
    print(f"\n{'busy ms':>7}  {'variant':48s} {'host µs':>8} {'GPU idle µs':>11}")
    for r in rows:
        print(f"{r['busy_ms']:7d}  {r['variant']:48s} {r['host_us']:8.0f} {r['gpu_idle_us']:11.0f}")


if __name__ == "__main__":
    main()
