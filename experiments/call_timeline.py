"""Experiment: the GPU timeline of one fused call, to find where the time between the floor and the call goes.

For each shape and mode, one call (after warm-up, started after a synchronisation as in the benchmark)
is traced with the PyTorch profiler. Reported: each GPU kernel and copy in order with its start
(µs after the call began on the host), its duration, and the idle gap before it. The profiler slows
the host several-fold, so host gaps here are upper bounds; the kernels' durations are the GPU's.

    python experiments/call_timeline.py      # on a CUDA machine, from the repository root
"""
import os
import sys

import torch
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, os.getcwd())
from orpo_lib import bench  # noqa: E402

H, V = 4096, 128256


def timeline(run):
    for _ in range(3):
        run()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        with torch.profiler.record_function("call"):
            run()
        torch.cuda.synchronize()
    events = prof.events()
    call = next(e for e in events if e.name == "call")
    gpu = sorted((e for e in events if e.device_type == torch.autograd.DeviceType.CUDA and e.name != "call"),
                 key=lambda e: e.time_range.start)
    rows, previous_end = [], call.time_range.start
    for e in gpu:
        start, end = e.time_range.start, e.time_range.end
        rows.append({"kernel": e.name[:90], "start_us": start - call.time_range.start, "us": end - start,
                     "gap_before_us": start - previous_end})
        previous_end = max(previous_end, end)
    return {"host_call_us": call.time_range.end - call.time_range.start,
            "gpu_end_us": previous_end - call.time_range.start, "kernels": rows}


def main():
    device = torch.device("cuda")
    results = []
    for batch, seq in ((2, 1024), (4, 4096)):
        w = bench.Workload(batch, seq, H, V, "bf16")
        inputs = bench.make_inputs(w, device)
        for mode in ("eval", "full"):
            for provider in ("floor", "fused"):
                trace = timeline(bench.PROVIDERS[provider](w, inputs, mode))
                results.append({"shape": f"{batch}x{seq}", "mode": mode, "provider": provider, **trace})
                print(f"\n{batch}x{seq} {mode} {provider}: host call {trace['host_call_us']:.0f} µs, "
                      f"GPU done at {trace['gpu_end_us']:.0f} µs")
                for k in trace["kernels"]:
                    if k["us"] > 20 or k["gap_before_us"] > 20:
                        print(f"  {k['start_us']:9.0f} {k['us']:8.0f} gap {k['gap_before_us']:6.0f}  {k['kernel']}")
                small = [k for k in trace["kernels"] if k["us"] <= 20 and k["gap_before_us"] <= 20]
                print(f"  + {len(small)} small ones: {sum(k['us'] for k in small):.0f} µs busy, "
                      f"{sum(k['gap_before_us'] for k in small):.0f} µs of gaps")
        del inputs
        torch.cuda.empty_cache()
    bench.save_experiment("call-timeline", results, device)


if __name__ == "__main__":
    main()
