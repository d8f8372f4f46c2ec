"""The benchmark harness: every provider on the same inputs in one run, recorded with provenance.

    python -m orpo_lib.workbook.bench                       # seed workloads on CUDA, tiny shapes on CPU
    python -m orpo_lib.workbook.bench --shapes 2x1024,16x4096 --providers floor,fused --modes full

Providers: ``floor`` (the three GEMMs any fused linear loss must do, torch.matmul on the same
shapes; in ``eval`` mode only the logits GEMM), ``baseline`` (materialising, TRL style),
``baseline_compiled`` (the same under ``torch.compile``), ``fused``
(this library, default settings), ``fused_lean`` (small chunks, two-pass, dW accumulated in the
weight dtype), ``liger`` (Liger-Kernel's fused ORPO, when importable). Modes: ``forward``, ``full``
(forward + backward), ``eval`` (forward under no_grad). Times are CUDA-event medians after
warm-up, the providers' repetitions interleaved in a shuffled order, so that the GPU's clock drift
weighs on all alike; memory is the peak allocated during the call, absolute and over what was
allocated before. Each timed call starts on an idle GPU, so the host's work before its first kernel
counts; with ``--busy-gpu`` a stand-in for the model's GEMMs is queued first and the clock starts
after it, so that the host runs ahead as in training.
"""

import argparse
import datetime
import json
import os
import platform
import random
import re
import subprocess
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

from .. import kernels
from .._triton_mode import INTERPRET
from ..baseline import orpo_loss_baseline
from ..chunked.gemms import accumulate_mm
from ..fused import fused_linear_orpo_loss
from .grad_gemm import GRAD_GEMM_CPU_SHAPES, GRAD_GEMM_SHAPES, gluon_supported, grad_gemm_sweep
from .memory import LEAN_CHUNK_ROWS, fused_chunk_rows
from .timing import elapsed_ms, record_failure, stand_in_model, time_call, time_interleaved, time_summary

SEED_SHAPES = [(b, t) for t in (1024, 4096) for b in (2, 4, 8, 16)]
SEED_HIDDEN, SEED_VOCAB = 4096, 128256
CPU_SHAPES = [(2, 32), (4, 32)]
CPU_HIDDEN, CPU_VOCAB = 64, 1000
GIB = 1 << 30
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


@dataclass
class Workload:
    batch: int
    seq: int
    hidden: int
    vocab: int
    dtype: str = "bf16"
    # "none": every token counts, for the odds ratio and the NLL alike (nll_target=None, the default);
    # "prompt-half": the first half of each sequence is prompt, which no target counts; "trl": TRL's batches,
    # the odds ratio on the response (the last three quarters), the NLL on prompt and response
    mask: str = "none"

    @property
    def tokens(self) -> int:
        return self.batch * self.seq

    def gemm_flops(self) -> int:
        """FLOPs of one of the three GEMMs (logits, dX, dW): 2·N·H·V."""
        return 2 * self.tokens * self.hidden * self.vocab


@dataclass
class Result:
    provider: str
    mode: str
    batch: int
    seq: int
    hidden: int
    vocab: int
    dtype: str
    mask: str
    chunk_size: int = None
    median_ms: float = None
    min_ms: float = None
    max_ms: float = None
    reps: int = 0
    peak_gib: float = None
    peak_over_inputs_gib: float = None
    tflops: float = None  # the GEMM FLOPs the mode needs, over the median time
    status: str = "ok"
    error: str = None
    extra: dict = field(default_factory=dict)


def make_inputs(w: Workload, device, seed=0):
    """Random hidden, weight and labels (never zeros); weights scaled so logits are O(1)."""
    gen = torch.Generator(device=device).manual_seed(seed)
    dtype = DTYPES[w.dtype]
    hidden = torch.randn(w.batch, w.seq, w.hidden, device=device, dtype=dtype, generator=gen)
    weight = torch.randn(w.vocab, w.hidden, device=device, dtype=dtype, generator=gen) * w.hidden ** -0.5
    target = torch.randint(0, w.vocab, (w.batch, w.seq), device=device, generator=gen)
    nll_target = None
    if w.mask == "prompt-half":
        target[:, : w.seq // 2] = -100
    elif w.mask == "trl":
        nll_target = target.clone()
        target[:, : w.seq // 4] = -100
    return hidden.requires_grad_(), weight.requires_grad_(), target, nll_target


# ---- providers: each returns a closure that runs one call in the given mode -----------------------

def _floor(w, inputs, mode):
    hidden, weight, _, _ = inputs
    x = hidden.detach().view(-1, w.hidden)
    wt = weight.detach()
    logits = torch.randn(w.tokens, w.vocab, device=x.device, dtype=x.dtype)

    def run():
        torch.mm(x, wt.t(), out=logits)
        if mode == "full":
            torch.mm(logits, wt)
            torch.mm(logits.t(), x)
    return run


def _loss_call(loss_fn, inputs, mode):
    hidden, weight, target, nll_target = inputs

    def run():
        if mode == "eval":
            with torch.no_grad():
                loss_fn(hidden, weight, target, nll_target)
            return
        loss = loss_fn(hidden, weight, target, nll_target)
        if mode == "full":
            loss.backward()
            hidden.grad = weight.grad = None
    return run


def _fused(chunk_size=None, fp32_weight_grad=True, **logit_options):
    def provider(w, inputs, mode):
        def loss_fn(h, wt, t, nt):
            return fused_linear_orpo_loss(h, wt, t, nll_target=nt, chunk_size=chunk_size,
                                          fp32_weight_grad=fp32_weight_grad, **logit_options).loss
        return _loss_call(loss_fn, inputs, mode)
    return provider


def _baseline(w, inputs, mode):
    return _loss_call(lambda h, wt, t, nt: orpo_loss_baseline(h, wt, t, nll_target=nt).loss, inputs, mode)


def _baseline_compiled(w, inputs, mode):
    # dynamic=True: one graph for every shape, as a training loop with varying lengths ends up compiling it;
    # the compile cache survives main()'s dynamo reset between workloads, so each workload only re-traces.
    compiled = torch.compile(orpo_loss_baseline, dynamic=True)
    return _loss_call(lambda h, wt, t, nt: compiled(h, wt, t, nll_target=nt).loss, inputs, mode)


def _liger(w, inputs, mode):
    from liger_kernel.chunked_loss import LigerFusedLinearORPOLoss

    # Liger compiles its chunk function; recompiling with dynamic shapes crashed on torch 2.11, so
    # shapes stay static (main() clears the compile cache whenever the workload changes).
    torch._dynamo.config.automatic_dynamic_shapes = False
    liger = LigerFusedLinearORPOLoss()

    def loss_fn(h, wt, t, nt):
        out = liger(wt, h, t, nll_target=nt)
        return out[0] if isinstance(out, tuple) else out
    return _loss_call(loss_fn, inputs, mode)


def load_before(folder) -> None:
    """Adds the provider ``before``: the fused loss of an earlier copy of the package, unpacked as
    ``<folder>/orpo_lib_before`` (``git archive <rev> orpo_lib | tar -x -C <folder>``, then rename), so that a
    change is measured in the same run, on the same inputs and clock drift, as what it replaces."""
    sys.path.insert(0, str(Path(folder).resolve()))
    from orpo_lib_before import fused_linear_orpo_loss as before

    PROVIDERS["before"] = lambda w, inputs, mode: _loss_call(
        lambda h, wt, t, nt: before(h, wt, t, nll_target=nt).loss, inputs, mode)


PROVIDERS = {
    "floor": _floor,
    "baseline": _baseline,
    "baseline_compiled": _baseline_compiled,
    "fused": _fused(),
    "fused_lean": _fused(chunk_size=LEAN_CHUNK_ROWS, fp32_weight_grad=False),
    # the heads of Granite (logits / 8) and Gemma-2 (30·tanh(logits / 30)): what a scale and a cap cost
    "fused_scaled": _fused(logit_scale=0.125),
    "fused_capped": _fused(logit_softcap=30.0),
    "liger": _liger,
}


def liger_version():
    try:
        from importlib.metadata import version
        return version("liger-kernel")
    except Exception:
        return None


# ---- timing -----------------------------------------------------------------------------------------

def kernel_names(run, skip=()) -> list:
    """The names (first 100 characters) of the GPU kernels one call of ``run`` launches, but those that
    contain a string of ``skip``, from the PyTorch profiler."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        run()
        torch.cuda.synchronize()
    return sorted({e.key[:100] for e in prof.key_averages()
                   if e.device_time_total > 0 and not any(s in e.key for s in skip)})


def peak_memory(run, device):
    """(peak GiB, peak GiB over what was allocated before the call); None on the CPU."""
    if device.type != "cuda":
        return None, None
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    run()
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated()
    return peak / GIB, (peak - before) / GIB


def _release(inputs, device):
    """Drops the inputs' gradients (a failed call can leave some) and, on the GPU, the allocator's cache."""
    for tensor in inputs[:2]:
        tensor.grad = None
    if device.type == "cuda":
        torch.cuda.empty_cache()


def _measurement(result, make_run, w, inputs, device, warmup, reps, lead):
    """One provider's measurement into ``result``, one step per ``next``: peak memory, warm-up, then
    each timed call."""
    make_run = make_run or PROVIDERS[result.provider]
    # This closure is dropped at once and built again for the timing, so that while a peak is measured
    # no other provider's closure holds memory (the floor's holds a tokens × vocab logits tensor). Its
    # first call keeps one-time allocations (a library's workspaces) out of the peak.
    run = make_run(w, inputs, result.mode)
    run()
    result.peak_gib, result.peak_over_inputs_gib = peak_memory(run, device)
    del run
    yield
    run = make_run(w, inputs, result.mode)
    for _ in range(warmup):
        run()
    yield
    times = []
    for _ in range(reps):
        times.append(elapsed_ms(run, device, lead))
        yield
    result.median_ms, result.min_ms, result.max_ms, result.reps = time_summary(times)
    gemms = 1 if result.mode != "full" else 3
    result.tflops = gemms * w.gemm_flops() / (result.median_ms * 1e-3) / 1e12


def _step(result, steps, inputs, device) -> bool:
    """Takes the next step of a measurement; False once it is done or has failed. A failure is recorded
    in ``result``, not raised, so that one failing provider does not stop the others."""
    try:
        next(steps)
        return True
    except StopIteration:
        return False
    except torch.cuda.OutOfMemoryError as exc:
        result.status, result.error = "oom", str(exc).splitlines()[0]
    except Exception as exc:
        result.status, result.error = "error", f"{type(exc).__name__}: {exc}"
    _release(inputs, device)
    return False


def measure_interleaved(jobs, mode, w, inputs, device, *, warmup, reps, lead=None) -> list:
    """Providers in one mode on the same inputs, one ``Result`` each; ``jobs`` holds (provider,
    chunk_size, make_run) triples, ``make_run`` None for ``PROVIDERS[provider]``.

    The providers take turns: the peak memory of each, the warm-up of each, then rep 1 of each, rep 2
    of each, ..., each round in a new (seeded) order. The GPU's clocks drift over a run and depend on
    what ran just before (power, heat): interleaved repetitions share the drift, and the changing
    order gives no provider a fixed predecessor, so the ratios between providers hold steady. ``lead``
    (``stand_in_model``) queues work ahead of each timed call.
    """
    results = [Result(provider, mode, w.batch, w.seq, w.hidden, w.vocab, w.dtype, w.mask, chunk_size)
               for provider, chunk_size, _ in jobs]
    pending = [(result, _measurement(result, make_run, w, inputs, device, warmup, reps, lead))
               for result, (_, _, make_run) in zip(results, jobs)]
    order = random.Random(0)
    try:
        while pending:  # one round: the next step of every provider still measuring
            order.shuffle(pending)
            pending = [(result, steps) for result, steps in pending if _step(result, steps, inputs, device)]
    finally:
        _release(inputs, device)
    return results


def measure(provider, mode, w, inputs, device, *, warmup, reps, chunk_size=None, make_run=None) -> Result:
    """One provider in one mode: peak memory, then timing; ``make_run`` overrides ``PROVIDERS[provider]``."""
    return measure_interleaved([(provider, chunk_size, make_run)], mode, w, inputs, device,
                               warmup=warmup, reps=reps)[0]


# ---- accuracy: bf16 against float64 ------------------------------------------------------------------

def accuracy(w: Workload, device, seed=1) -> dict:
    """Relative errors of loss, dX and dW against a float64 reference, for fused and baseline on the same inputs."""
    from ..reference import orpo_loss_reference

    hidden, weight, target, nll_target = make_inputs(w, device, seed)
    h64 = hidden.detach().double().requires_grad_()
    w64 = weight.detach().double().requires_grad_()
    ref = orpo_loss_reference(h64, w64, target, nll_target=nll_target)
    ref["loss"].backward()
    out = {}
    for name, fn in (("fused", fused_linear_orpo_loss), ("baseline", orpo_loss_baseline)):
        loss = fn(hidden, weight, target, nll_target=nll_target).loss
        loss.backward()

        def rel(a, b):
            return ((a.double() - b).norm() / b.norm()).item()
        out[name] = {"loss": abs(loss.item() - ref["loss"].item()) / abs(ref["loss"].item()),
                     "grad_hidden": rel(hidden.grad, h64.grad), "grad_weight": rel(weight.grad, w64.grad)}
        hidden.grad = weight.grad = None
    return out


# ---- sweeps for the tuning notebook --------------------------------------------------------------------

def chunk_sweep(w: Workload, device, chunks, *, warmup, reps) -> list:
    """Time and memory of the fused loss (forward + backward) against chunk_size, fp32 and weight-dtype dW."""
    inputs = make_inputs(w, device)
    rows = []
    for chunk in chunks:
        for fp32_dw in (True, False):
            r = measure("fused", "full", w, inputs, device, warmup=warmup, reps=reps, chunk_size=chunk,
                        make_run=_fused(chunk_size=chunk, fp32_weight_grad=fp32_dw))
            rows.append({"chunk_size": chunk, "fp32_weight_grad": fp32_dw, "median_ms": r.median_ms,
                         "peak_over_inputs_gib": r.peak_over_inputs_gib, "status": r.status, "error": r.error})
    return rows


def stage_times(w: Workload, device, chunk_rows, *, warmup, reps) -> list:
    """Each stage of one chunk timed alone: the GEMMs and the two row kernels."""
    dtype = DTYPES[w.dtype]
    gen = torch.Generator(device=device).manual_seed(2)
    x = torch.randn(chunk_rows, w.hidden, device=device, dtype=dtype, generator=gen)
    weight = torch.randn(w.vocab, w.hidden, device=device, dtype=dtype, generator=gen) * w.hidden ** -0.5
    logits = torch.empty(chunk_rows, w.vocab, device=device, dtype=dtype)
    target = torch.randint(0, w.vocab, (chunk_rows,), device=device, dtype=torch.int32, generator=gen)
    nll_target = torch.randint(0, w.vocab, (chunk_rows,), device=device, dtype=torch.int32, generator=gen)
    token = torch.arange(chunk_rows, device=device)
    logp, nll_logp, logit_sum, lse = (torch.zeros(chunk_rows, device=device) for _ in range(4))
    seq_coef = -torch.rand(chunk_rows, device=device, generator=gen)
    acc = torch.zeros(w.vocab, w.hidden, device=device)
    torch.mm(x, weight.t(), out=logits)
    snapshot = logits.clone()

    def row_stats():
        kernels.row_stats(logits, target, nll_target, token, logp, nll_logp, logit_sum, lse)

    def row_grads():
        logits.copy_(snapshot)  # every repetition rewrites real logits, not last round's gradient
        kernels.row_grads(logits, target, nll_target, token, logp, nll_logp, lse, seq_coef,
                          nll_tokens=chunk_rows, seq_len=1)

    row_stats()  # real statistics for the gradient pass
    stages = {
        "logits GEMM": lambda: torch.mm(x, weight.t(), out=logits),
        "row stats (read)": row_stats,
        "copy (restores the chunk)": lambda: logits.copy_(snapshot),
        "row grads (read, write) + copy": row_grads,
        "dX GEMM": lambda: torch.mm(logits, weight),
        "dW GEMM (weight dtype out)": lambda: torch.mm(logits.t(), x),
        "dW GEMM (fp32 accumulate)": lambda: accumulate_mm(acc, logits.t(), x),
    }
    logit_bytes = chunk_rows * w.vocab * logits.element_size()
    rows = []
    for name, run in stages.items():
        median, low, high, n = time_call(run, device, warmup, reps)
        rows.append({"stage": name, "median_ms": median, "min_ms": low, "max_ms": high,
                     "chunk_rows": chunk_rows, "logit_bytes": logit_bytes})
    return rows


def row_launches(on_gpu: bool) -> list:
    """Launch configurations to sweep: 4 to 64 vocabulary entries per thread and step."""
    if not on_gpu:
        return [kernels.RowLaunch(256, 4), kernels.RowLaunch(1024, 4)]
    return [kernels.RowLaunch(block, warps) for block in (1024, 2048, 4096, 8192, 16384)
            for warps in (1, 2, 4, 8, 16, 32) if 4 <= block // (32 * warps) <= 64]


def row_kernel_sweep(w: Workload, device, chunk_rows, launches, *, warmup, reps) -> list:
    """Time of each row kernel ("stats": one read; "grads": one read and one write) for each launch
    configuration, on random logits."""
    dtype = DTYPES[w.dtype]
    gen = torch.Generator(device=device).manual_seed(3)
    logits = torch.randn(chunk_rows, w.vocab, device=device, dtype=dtype, generator=gen) * 3
    snapshot = logits.clone()
    target = torch.randint(0, w.vocab, (chunk_rows,), device=device, dtype=torch.int32, generator=gen)
    token = torch.arange(chunk_rows, device=device)
    seq_coef = -torch.rand(chunk_rows, device=device, generator=gen)
    logp, nll_logp, logit_sum, lse = (torch.zeros(chunk_rows, device=device) for _ in range(4))
    kernels.row_stats(logits, target, target, token, logp, nll_logp, logit_sum, lse)  # real statistics for "grads"
    nbytes = logits.numel() * logits.element_size()
    copy_ms = time_call(lambda: logits.copy_(snapshot), device, warmup, reps)[0]
    calls = {
        "stats": lambda launch: kernels.row_stats(logits, target, target, token, logp, nll_logp, logit_sum, lse,
                                                  launch=launch),
        "grads": lambda launch: kernels.row_grads(logits, target, target, token, logp, nll_logp, lse, seq_coef,
                                                  nll_tokens=chunk_rows, seq_len=1, launch=launch),
    }
    rows = []
    for launch in launches:
        for kernel, call in calls.items():
            writes = kernel == "grads"

            def run():
                if writes:  # every repetition rewrites real logits, not last round's gradient
                    logits.copy_(snapshot)
                call(launch)
            median = time_call(run, device, warmup, reps)[0] - (copy_ms if writes else 0.0)
            hbm_bytes = nbytes * (2 if writes else 1)
            rows.append({"kernel": kernel, "block_v": launch.block_v, "num_warps": launch.num_warps,
                         "median_ms": median, "gbps": hbm_bytes / (median * 1e-3) / 1e9})
    return rows


def profile_fused(w: Workload, device, chunk_size=None) -> list:
    """Device time per kernel of one fused forward + backward, from the PyTorch profiler."""
    inputs = make_inputs(w, device)
    run = _fused(chunk_size=chunk_size)(w, inputs, "full")
    run()
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        run()
        torch.cuda.synchronize()
    rows = [{"kernel": e.key[:120], "calls": e.count, "device_ms": e.device_time_total / 1e3}
            for e in prof.key_averages() if e.device_time_total > 0]
    return sorted(rows, key=lambda r: -r["device_ms"])[:30]


# ---- the row statistics inside the logits GEMM, against cuBLAS -------------------------------------------

# (rows, hidden, vocab) of the stats_gemm sweep on CUDA: a Llama-3-8B head at one default chunk of rows and at
# four, and a Qwen2.5-3B head at four; on the CPU one tiny shape (the interpreter takes about 20 ms per row), its
# last column tile partial. Every vocabulary is a multiple of 16, so that the buffer path is one GEMM into a plain
# buffer, as the library runs it (``schedule.logits_row_columns``).
STATS_GEMM_SHAPES = [(4096, 4096, 128256), (16384, 4096, 128256), (16384, 2048, 151936)]
STATS_GEMM_CPU_SHAPES = [(24, 40, 272)]
# cuBLAS's logits GEMM alone; the same GEMM, then row_stats over its buffer; the Gluon statistics GEMM
STATS_GEMM_PATHS = ("cublas_mm", "cublas_row_stats", "stats_gemm")


def stats_gemm_call(x, weight, target, nll_target, token, stats) -> None:
    """The Gluon statistics GEMM into ``stats`` (logp, nll_logp, logit_sum, lse), as a no-grad call of the library
    runs it: no logits stored."""
    from ..kernels.gluon_row_stats import logits_row_stats  # Gluon: imported only where it runs

    logits_row_stats(x, weight, target, nll_target, token, *stats)


def stats_gemm_bytes(rows: int, vocab: int, itemsize: int) -> dict:
    """Per path, (bytes written, bytes read back) of what its statistics come from: the (rows, V) logits buffer, or
    the statistics GEMM's partials (three float32 per row and column tile, and the two target logits per row),
    which its fold reads back. X, W and the per-row outputs, the same on every path, are left out."""
    from .memory import STATS_TILE_COLUMNS

    logits = rows * vocab * itemsize
    partials = rows * 4 * (3 * -(-vocab // STATS_TILE_COLUMNS) + 2)
    return {"cublas_mm": (logits, 0), "cublas_row_stats": (logits, logits), "stats_gemm": (partials, partials)}


def stats_gemm_sweep(device, shapes, dtype: str = "bf16", *, warmup, reps) -> list:
    """The row statistics of X·Wᵀ at each (rows, hidden, vocab), three ways on the same inputs, timed interleaved
    (``STATS_GEMM_PATHS``). The Gluon path runs where ``grad_gemm.gluon_supported``; elsewhere the row's status is
    "unsupported" and its times are None. Its statistics are checked against the buffer path's: the largest
    absolute difference of the log-sum-exp and of the two target log-probs. Every token counts, with its
    odds-ratio target as its NLL target (the library's default labels). One row per shape, with the bytes of
    ``stats_gemm_bytes`` and ``in_library``: whether the library's rule (``schedule.statistics_in_gemm``) takes a
    no-grad call of that many kept rows through the Gluon kernel on this GPU. A shape that fails is recorded with
    its status ("oom", "error") and what was measured before the failure."""
    torch_dtype = DTYPES[dtype]
    gluon = gluon_supported(device, torch_dtype)
    rows_out = []
    for rows, hidden, vocab in shapes:
        row = {"rows": rows, "hidden": hidden, "vocab": vocab, "dtype": dtype,
               "in_library": _stats_gemm_in_library(device, torch_dtype, rows, hidden, vocab),
               "status": "ok" if gluon else "unsupported", "error": None, "reps": 0,
               **{f"{path}_{stat}": None for path in STATS_GEMM_PATHS for stat in ("ms", "min_ms", "max_ms")},
               "lse_max_abs_diff": None, "logp_max_abs_diff": None}
        for path, (written, read) in stats_gemm_bytes(rows, vocab, torch_dtype.itemsize).items():
            row[f"{path}_written_bytes"], row[f"{path}_read_bytes"] = written, read
        record_failure(row, lambda: _time_stats_gemm_paths(row, device, torch_dtype, gluon, warmup=warmup, reps=reps),
                       device)
        rows_out.append(row)
    return rows_out


def _stats_gemm_in_library(device, dtype, rows, hidden, vocab) -> bool:
    from .. import schedule

    if device.type != "cuda" or INTERPRET:
        return False
    return schedule.statistics_in_gemm(torch.cuda.get_device_capability(device), torch.cuda.get_device_name(device),
                                       dtype, False, hidden, vocab, rows)


def _time_stats_gemm_paths(row, device, dtype, gluon: bool, *, warmup, reps) -> None:
    """One shape of ``stats_gemm_sweep``: the statistics check, then the interleaved timing, into ``row``."""
    rows, hidden, vocab = row["rows"], row["hidden"], row["vocab"]
    if vocab % 16:
        raise ValueError(f"the stats_gemm sweep takes vocabularies that are a multiple of 16, not {vocab}")
    gen = torch.Generator(device=device).manual_seed(4)
    x = torch.randn(rows, hidden, device=device, dtype=dtype, generator=gen)
    weight = torch.randn(vocab, hidden, device=device, dtype=dtype, generator=gen) * hidden ** -0.5
    target = torch.randint(0, vocab, (rows,), device=device, dtype=torch.int32, generator=gen)
    token = torch.arange(rows, device=device)
    logits = torch.empty(rows, vocab, device=device, dtype=dtype)
    buffer_stats, gemm_stats = (torch.zeros(4, rows, device=device).unbind(0) for _ in range(2))

    def logits_gemm():
        torch.mm(x, weight.t(), out=logits)

    def buffer_path():
        logits_gemm()
        kernels.row_stats(logits, target, target, token, *buffer_stats)

    def gemm_path():
        stats_gemm_call(x, weight, target, target, token, gemm_stats)

    calls = {"cublas_mm": logits_gemm, "cublas_row_stats": buffer_path}
    if gluon:
        buffer_path()
        try:
            gemm_path()
        except Exception as exc:  # the buffer paths are still timed
            row["status"], row["error"] = "error", f"{type(exc).__name__}: {exc}"
        else:
            logp, nll_logp, _, lse = ((a - b).abs().max().item() for a, b in zip(gemm_stats, buffer_stats))
            row["lse_max_abs_diff"], row["logp_max_abs_diff"] = lse, max(logp, nll_logp)
            calls["stats_gemm"] = gemm_path
    times = time_interleaved(calls, device, warmup, reps)
    for path, measured in times.items():
        row[f"{path}_ms"], row[f"{path}_min_ms"], row[f"{path}_max_ms"], row["reps"] = time_summary(measured)


# ---- the run -------------------------------------------------------------------------------------------

def provenance(device, command, commit=None) -> dict:
    if commit is None:
        try:
            commit = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True,
                                    check=True).stdout.strip()
        except (OSError, subprocess.CalledProcessError):
            commit = os.environ.get("ORPO_COMMIT", "unknown")
    import triton
    return {
        "gpu": torch.cuda.get_device_name(device) if device.type == "cuda" else f"CPU ({platform.processor() or platform.machine()})",
        "torch": torch.__version__,
        "triton": triton.__version__,
        "liger": liger_version(),
        "interpreter": INTERPRET,
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "commit": commit,
        "command": command,
    }


def write_json(path, record) -> Path:
    """Write a record as indented JSON, making its folder if needed."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(record, indent=1) + "\n")
    return path


def device_slug(device) -> str:
    """A short name for record files: the GPU's model ("h200" for "NVIDIA H200"), or "cpu"."""
    if device.type != "cuda":
        return "cpu"
    model = re.search(r"\b[A-Z]+\d+[A-Za-z]*\b", torch.cuda.get_device_name(device))
    return model.group(0).lower() if model else "gpu"


# Named workloads for --shapes, as BxT (at --hidden and --vocab) or BxTxHxV.
SHAPE_PRESETS = {
    # long-context preference tuning: one pair longer than any chunk
    "long-context": "2x8192,2x16384,2x32768",
    # the models most people fine-tune: small hidden sizes, small and large vocabularies
    "small-models": ",".join(f"8x2048x{h}x{v}" for h in (1024, 2048) for v in (32000, 151936, 256000)),
}


def parse_shapes(text) -> list[tuple]:
    """``BxT`` or ``BxTxHxV`` items, comma-separated, or the name of a preset in ``SHAPE_PRESETS``."""
    items = [item for name in text.split(",") if name for item in SHAPE_PRESETS.get(name, name).split(",")]
    shapes = [tuple(int(v) for v in item.split("x")) for item in items]
    for item, shape in zip(items, shapes):
        if len(shape) not in (2, 4):
            raise ValueError(f"a shape is BxT or BxTxHxV (or one of {sorted(SHAPE_PRESETS)}), got {item!r}")
    return shapes


def _shape_key(r) -> tuple:
    return r.batch, r.seq, r.hidden, r.vocab


def format_table(results, floor_by_shape) -> str:
    """One line per result; ``floor_by_shape`` maps (batch, seq, hidden, vocab, mode) to the floor's ms."""
    lines = [f"{'B×T':>8} {'H':>5} {'V':>6} {'mask':>11} {'provider':>11} {'mode':>7} {'median ms':>10} {'× floor':>8} "
             f"{'over inputs GiB':>16} status"]
    for r in results:
        floor = floor_by_shape.get((*_shape_key(r), r.mode))
        ratio = f"{r.median_ms / floor:.3f}" if floor and r.median_ms else "-"
        ms = f"{r.median_ms:.2f}" if r.median_ms else "-"
        mem = f"{r.peak_over_inputs_gib:.2f}" if r.peak_over_inputs_gib is not None else "-"
        lines.append(f"{r.batch}×{r.seq:<5} {r.hidden:>5} {r.vocab:>6} {r.mask:>11} {r.provider:>11} {r.mode:>7} {ms:>10} "
                     f"{ratio:>8} {mem:>16} {r.status}")
    return "\n".join(lines)


SWEEPS = ("chunk", "stages", "row_kernel", "profile", "accuracy", "stats_gemm", "grad_gemm")


def _sweep_list(text) -> list:
    names = [s for s in text.split(",") if s]
    unknown = sorted(set(names) - set(SWEEPS))
    if unknown:
        raise argparse.ArgumentTypeError(f"unknown sweep(s) {unknown}: expected some of {','.join(SWEEPS)}")
    return names


def parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--providers", default="floor,baseline,fused,fused_lean,liger")
    parser.add_argument("--before", default=None, metavar="FOLDER",
                        help="also measure the provider 'before': FOLDER/orpo_lib_before, an earlier copy of the package")
    parser.add_argument("--before-commit", default=None, help="the commit that copy came from, for the record")
    parser.add_argument("--modes", default="full,forward,eval")
    parser.add_argument("--shapes", default=None, help="BxT,BxT,... (default: the seed workloads on CUDA)")
    parser.add_argument("--hidden", type=int, default=None)
    parser.add_argument("--vocab", type=int, default=None)
    parser.add_argument("--dtype", default=None, choices=sorted(DTYPES))
    parser.add_argument("--masks", default="none", help="none,prompt-half,trl")
    parser.add_argument("--warmup", type=int, default=None)
    parser.add_argument("--reps", type=int, default=None)
    parser.add_argument("--sweeps", default="", type=_sweep_list, help=",".join(SWEEPS))
    parser.add_argument("--sweep-shape", default=None, help="BxT of the sweeps (default 8x4096 on CUDA, 4x32 on CPU)")
    parser.add_argument("--busy-gpu", action="store_true",
                        help="queue a stand-in for the model's GEMMs before each timed call (CUDA only)")
    parser.add_argument("--out", default=None,
                        help="JSON record (default build/bench-<date>-<device>.json, busy-gpu-... with --busy-gpu)")
    parser.add_argument("--commit", default=None)
    return parser.parse_args(argv)


def run_workloads(workloads, providers, modes, device, *, warmup, reps, lead=None) -> list:
    """Every provider in every mode on each workload, interleaved per mode; one result dict each."""
    results = []
    for n, w in enumerate(workloads, 1):
        print(f"[{n}/{len(workloads)}] {w.batch}x{w.seq} mask={w.mask}", file=sys.stderr, flush=True)
        if device.type == "cuda":
            torch.cuda.empty_cache()
            torch._dynamo.reset()
        inputs = make_inputs(w, device)
        by_job = {}
        for mode in modes:
            # No forward-only floor (the eval floor, the logits GEMM, serves), and no forward-only Liger:
            # Liger does all its gradient work in forward, so its forward is its full step.
            jobs = [(p, fused_chunk_rows(p, None), None) for p in providers
                    if not (p in ("floor", "liger") and mode == "forward")]
            for result in measure_interleaved(jobs, mode, w, inputs, device, warmup=warmup, reps=reps, lead=lead):
                by_job[result.provider, mode] = result
        results += [asdict(by_job[p, m]) for p in providers for m in modes if (p, m) in by_job]
        del inputs  # freed before the next workload's are made
    return results


def run_sweeps(sweeps, w: Workload, device, *, warmup, reps) -> dict:
    """The named sweeps at one workload (chunk size, stages, row-kernel launches, profile, accuracy); the
    statistics GEMM's (``stats_gemm``) and the gradient GEMM's (``grad_gemm``) at shapes of their own."""
    on_gpu = device.type == "cuda"
    chunk_rows = 4096 if on_gpu else 64
    out = {}
    if "chunk" in sweeps:
        chunks = [1024, 2048, 4096, 8192, 16384] if on_gpu else [16, 64, 256]
        out["chunk"] = chunk_sweep(w, device, chunks, warmup=warmup, reps=reps)
    if "stages" in sweeps:
        out["stages"] = stage_times(w, device, chunk_rows, warmup=warmup, reps=reps)
    if "row_kernel" in sweeps:
        out["row_kernel"] = row_kernel_sweep(w, device, chunk_rows, row_launches(on_gpu), warmup=warmup, reps=reps)
    if "profile" in sweeps and on_gpu:
        out["profile"] = profile_fused(w, device)
    if "accuracy" in sweeps:
        # Token counts that are powers of two make the baseline's NLL gradient (-1/count) exact in
        # bf16, which flatters it; awkward counts show the usual rounding.
        dtype = "bf16" if on_gpu else "fp32"
        cases = (Workload(2, 512, w.hidden, w.vocab, dtype), Workload(2, 500, w.hidden, w.vocab, dtype),
                 Workload(4, 1000, w.hidden, w.vocab, dtype, mask="prompt-half"))
        out["accuracy"] = [{"workload": asdict(case), "relative_error": accuracy(case, device)} for case in cases]
    if "stats_gemm" in sweeps:
        shapes = STATS_GEMM_SHAPES if on_gpu else STATS_GEMM_CPU_SHAPES
        out["stats_gemm"] = stats_gemm_sweep(device, shapes, w.dtype, warmup=warmup, reps=reps)
    if "grad_gemm" in sweeps:
        shapes = GRAD_GEMM_SHAPES if on_gpu else GRAD_GEMM_CPU_SHAPES
        out["grad_gemm"] = grad_gemm_sweep(device, shapes, DTYPES[w.dtype], warmup=warmup, reps=reps)
    return out


def summary_table(record) -> str:
    """The record's results as a table, each time also as a multiple of its floor (same shape and mode)."""
    results = [Result(**r) for r in record["results"]]
    # The floor's GEMMs do not read the labels: any mask's floor serves, the unmasked one where there is one.
    floors = sorted((r for r in results if r.provider == "floor"), key=lambda r: r.mask == "none")
    floor = {(*_shape_key(r), r.mode): r.median_ms for r in floors}
    for r in results:  # the forward floor is the logits GEMM, measured in eval mode
        if r.provider == "floor" and r.mode == "eval":
            floor[(*_shape_key(r), "forward")] = r.median_ms
    return format_table(results, floor)


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    on_gpu = device.type == "cuda"
    if args.busy_gpu and not on_gpu:
        raise SystemExit("--busy-gpu needs a CUDA device")
    shapes = parse_shapes(args.shapes) if args.shapes else (SEED_SHAPES if on_gpu else CPU_SHAPES)
    hidden = args.hidden or (SEED_HIDDEN if on_gpu else CPU_HIDDEN)
    vocab = args.vocab or (SEED_VOCAB if on_gpu else CPU_VOCAB)
    dtype = args.dtype or ("bf16" if on_gpu else "fp32")  # the interpreter computes bf16 wrongly
    warmup = args.warmup if args.warmup is not None else (2 if on_gpu else 1)
    reps = args.reps or (10 if on_gpu else 2)
    providers = [p for p in args.providers.split(",") if p]
    if "liger" in providers and (not on_gpu or liger_version() is None):
        providers.remove("liger")  # Liger needs CUDA and its package
    if args.before:
        load_before(args.before)
        providers.append("before")
    masks = [m for m in args.masks.split(",") if m]

    record = {"provenance": provenance(device, "python -m orpo_lib.workbook.bench " + " ".join(argv), args.commit)}
    if args.before:
        record["provenance"]["before_commit"] = args.before_commit or "unknown"
    workloads = [Workload(*shape[:2], *(shape[2:] or (hidden, vocab)), dtype, mask)
                 for mask in masks for shape in shapes]
    record["results"] = run_workloads(workloads, providers, [m for m in args.modes.split(",") if m], device,
                                      warmup=warmup, reps=reps, lead=stand_in_model(device) if args.busy_gpu else None)
    b, t = parse_shapes(args.sweep_shape or ("8x4096" if on_gpu else "4x32"))[0]
    sweep_workload = Workload(b, t, hidden, vocab, dtype)
    # the workbook's records are what records.py writes, named by what they measure; a run of its own goes to build/
    kind = "busy-gpu" if args.busy_gpu else "bench"
    out = Path(args.out) if args.out else Path("build") / (
        f"{kind}-{datetime.date.today().isoformat()}-{device_slug(device)}.json")
    # The record is written after the results and again after each sweep (the gradient GEMMs' last): a run killed
    # at a time limit, or by a kernel that hangs on a GPU it has not run on, leaves what it measured on disk.
    record["sweeps"] = {}
    write_json(out, record)
    for sweep in sorted(args.sweeps, key=SWEEPS.index):
        record["sweeps"] |= run_sweeps([sweep], sweep_workload, device, warmup=warmup, reps=reps)
        write_json(out, record)
    print(summary_table(record))
    print(f"record: {out}")
    return record


if __name__ == "__main__":
    main()
