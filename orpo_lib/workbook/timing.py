"""Timing a call on the GPU (CUDA events) or the CPU: one call, repeated calls, several calls taking turns."""

import random
import statistics
import time

import torch


def elapsed_ms(run, device, lead=None) -> float:
    """Milliseconds of one call; CUDA events on the GPU, the start event after what ``lead`` queues."""
    if lead is not None:
        lead()
    if device.type == "cuda":
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        run()
        end.record()
        end.synchronize()
        return start.elapsed_time(end)
    t0 = time.perf_counter()
    run()
    return (time.perf_counter() - t0) * 1e3


def time_summary(times):
    """(median, min, max, count) of a list of milliseconds."""
    return statistics.median(times), min(times), max(times), len(times)


def stand_in_model(device):
    """A function that queues about 1.5 ms of GEMM on an H100 (an 8192³ bf16 product), standing in for the
    model's work ahead of the loss: timed after it, a call counts only the GPU's waits on the host that a
    training step would see too."""
    a = torch.randn(8192, 8192, device=device, dtype=torch.bfloat16)
    return lambda: torch.mm(a, a)


def time_call(run, device, warmup=2, reps=10):
    """Median, min and max milliseconds over ``reps`` calls after ``warmup``; CUDA events on the GPU."""
    for _ in range(warmup):
        run()
    return time_summary([elapsed_ms(run, device) for _ in range(reps)])


def time_interleaved(calls: dict, device, warmup=2, reps=10) -> dict:
    """Milliseconds of each call in ``calls`` (name → call), ``reps`` of each after ``warmup``: every round
    takes each call once, in a new seeded order, as ``measure_interleaved`` does. Returns name → times."""
    for run in calls.values():
        for _ in range(warmup):
            run()
    times = {name: [] for name in calls}
    order, names = random.Random(0), list(calls)
    for _ in range(reps):
        order.shuffle(names)
        for name in names:
            times[name].append(elapsed_ms(calls[name], device))
    return times


def record_failure(row: dict, measure, device) -> None:
    """``measure()``, which fills ``row``; a failure is recorded in the row's status ("oom", "error") and error, with
    what was measured before it, not raised, so that a sweep goes on with its next shape. The cache is emptied
    after each on the GPU."""
    try:
        measure()
    except torch.cuda.OutOfMemoryError as exc:
        row["status"], row["error"] = "oom", str(exc).splitlines()[0]
    except Exception as exc:
        row["status"], row["error"] = "error", f"{type(exc).__name__}: {exc}"
    if device.type == "cuda":
        torch.cuda.empty_cache()
