"""A small synthetic seed-shapes record, shaped as ``python -m orpo_lib.workbook.bench`` writes one on a GPU, for
the tests of what the workbook reads from it. Its numbers are made up (GPU-like, seeded), never measured."""

import json
import random
from pathlib import Path

import torch

from orpo_lib import schedule
from orpo_lib.workbook import bench, grad_gemm

GPU = "NVIDIA H200"
COMMAND = ("python -m orpo_lib.workbook.bench --shapes 2x1024,8x4096 --providers floor,fused --modes full,eval "
           "--sweeps chunk,stages,row_kernel,profile,accuracy,stats_gemm,grad_gemm --sweep-shape 8x4096 "
           "--out figures/data/seed-shapes-h200.json --commit 0123abcd")
STAGES = ["logits GEMM", "row stats (read)", "copy (restores the chunk)", "row grads (read, write) + copy", "dX GEMM",
          "dW GEMM (weight dtype out)", "dW GEMM (fp32 accumulate)"]
# (rows, hidden, vocab) -> medians in ms of cuBLAS's logits GEMM alone, then row_stats, and the statistics GEMM
STATS_GEMM_TIMES = {(4096, 4096, 128256): (6.4, 6.8, 6.7), (16384, 4096, 128256): (25.0, 26.4, 25.2),
                    (16384, 2048, 151936): (15.0, 16.5, 17.0)}


def in_library(gpu, rows, hidden, vocab) -> bool:
    """The library's rule on a Hopper card of that name, as the harness records it (bf16, no bias)."""
    return schedule.statistics_in_gemm((9, 0), gpu, torch.bfloat16, False, hidden, vocab, rows)


def _result(provider, mode, batch, seq, median_ms, peak):
    return {"provider": provider, "mode": mode, "batch": batch, "seq": seq, "hidden": 4096, "vocab": 128256,
            "dtype": "bf16", "mask": "none", "chunk_size": None, "median_ms": median_ms, "min_ms": 0.99 * median_ms,
            "max_ms": 1.01 * median_ms, "reps": 5, "peak_gib": peak + 3.0, "peak_over_inputs_gib": peak,
            "tflops": 600.0, "status": "ok", "error": None, "extra": {}}


def stats_gemm_row(rows, hidden, vocab, cublas_mm, row_stats, stats_gemm, in_library) -> dict:
    """One row of the ``stats_gemm`` sweep, with every key ``bench.stats_gemm_sweep`` writes."""
    row = {"rows": rows, "hidden": hidden, "vocab": vocab, "dtype": "bf16", "in_library": in_library, "status": "ok",
           "error": None, "reps": 5, "lse_max_abs_diff": 2.4e-4, "logp_max_abs_diff": 3.1e-4}
    for path, ms in zip(bench.STATS_GEMM_PATHS, (cublas_mm, row_stats, stats_gemm)):
        row.update({f"{path}_ms": ms, f"{path}_min_ms": 0.995 * ms, f"{path}_max_ms": 1.005 * ms})
    for path, (written, read) in bench.stats_gemm_bytes(rows, vocab, 2).items():
        row[f"{path}_written_bytes"], row[f"{path}_read_bytes"] = written, read
    return row


# (rows, hidden, vocab) -> medians in ms of cuBLAS's dX and dW GEMMs, row_grads, the three, the Gluon dX and dW GEMMs
# and the two
GRAD_GEMM_TIMES = {(8192, 4096, 128256): (12.0, 12.4, 0.9, 25.3, 12.3, 12.9, 24.6),
                   (8192, 1024, 32000): (0.75, 0.8, 0.22, 1.77, 0.84, 0.85, 1.66)}


def grad_gemm_row(rows, hidden, vocab, *times) -> dict:
    """One row of the ``grad_gemm`` sweep, with every key ``grad_gemm.grad_gemm_sweep`` writes."""
    row = {"rows": rows, "hidden": hidden, "vocab": vocab, "dtype": "bfloat16", "status": "ok", "error": None, "reps": 5,
           "flops": 2 * rows * vocab * hidden, "buffer_bytes": 4 * rows * vocab, "buffer_dx_rel_err": 2.1e-3,
           "buffer_dw_rel_err": 2.4e-3, "gluon_dx_rel_err": 2.0e-3, "gluon_dw_rel_err": 2.3e-3,
           "bitwise_repeatable": True}
    for path, ms in zip(grad_gemm.GRAD_GEMM_PATHS, times):
        row.update({f"{path}_ms": ms, f"{path}_min_ms": 0.995 * ms, f"{path}_max_ms": 1.005 * ms})
    return row


def seed_shapes_record(gpu: str = GPU) -> dict:
    rng = random.Random(0)
    results = [_result(p, m, b, t, ms * (1.04 if p == "fused" else 1.0), peak)
               for b, t, base in ((2, 1024, 5.0), (8, 4096, 80.0))
               for p, peak in (("floor", 0.5), ("fused", 1.2))
               for m, ms in (("full", 3 * base), ("eval", base))]
    chunk = [{"chunk_size": c, "fp32_weight_grad": fp32, "median_ms": 80.0 + 8e4 / c + (2.0 if fp32 else 0.0),
              "peak_over_inputs_gib": 0.6 + c / 4096, "status": "ok", "error": None}
             for c in (1024, 2048, 4096, 8192, 16384) for fp32 in (True, False)]
    stages = [{"stage": name, "median_ms": ms, "min_ms": 0.98 * ms, "max_ms": 1.03 * ms, "chunk_rows": 4096,
               "logit_bytes": 4096 * 128256 * 2}
              for name, ms in zip(STAGES, (6.2, 0.36, 0.31, 0.9, 6.3, 6.4, 6.6))]
    row_kernel = [{"kernel": kernel, "block_v": launch.block_v, "num_warps": launch.num_warps,
                   "median_ms": ms, "gbps": (1 if kernel == "stats" else 2) * 4096 * 128256 * 2 / (ms * 1e-3) / 1e9}
                  for launch in bench.row_launches(True) for kernel in ("stats", "grads")
                  for ms in [rng.uniform(0.3, 0.6) * (1 if kernel == "stats" else 2)]]
    profile = [{"kernel": "nvjet_tst_256x128_64x4_2x1_v_bz_coopB_TNT", "calls": 6, "device_ms": 60.0},
               {"kernel": "row_grads_kernel", "calls": 2, "device_ms": 1.8},
               {"kernel": "row_stats_kernel", "calls": 2, "device_ms": 0.7},
               {"kernel": "void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<float>>", "calls": 9,
                "device_ms": 0.05}]
    workloads = [(2, 512, "none"), (2, 500, "none"), (4, 1000, "prompt-half")]
    accuracy = [{"workload": {"batch": b, "seq": t, "hidden": 4096, "vocab": 128256, "dtype": "bf16", "mask": mask},
                 "relative_error": {"fused": {"loss": 1e-4, "grad_hidden": 3e-3, "grad_weight": 4e-3 + i * 1e-4},
                                    "baseline": {"loss": 1e-4, "grad_hidden": 3e-3, "grad_weight": 3.6e-3 + i * 5e-4}}}
                for i, (b, t, mask) in enumerate(workloads)]
    stats_gemm = [stats_gemm_row(*shape, *times, in_library(gpu, *shape)) for shape, times in STATS_GEMM_TIMES.items()]
    grad_gemm_sweep = [grad_gemm_row(*shape, *times) for shape, times in GRAD_GEMM_TIMES.items()]
    provenance = {"gpu": gpu, "torch": "2.11.0+cu130", "triton": "3.6.0", "liger": None, "interpreter": False,
                  "date": "2026-12-08T10:00:00+00:00", "commit": "0123abcd", "command": COMMAND}
    return {"provenance": provenance, "results": results,
            "sweeps": {"chunk": chunk, "stages": stages, "row_kernel": row_kernel, "profile": profile,
                       "accuracy": accuracy, "stats_gemm": stats_gemm, "grad_gemm": grad_gemm_sweep}}


def write_seed_shapes_record(folder: Path, gpu: str = GPU) -> Path:
    path = Path(folder) / "seed-shapes-h200.json"
    path.write_text(json.dumps(seed_shapes_record(gpu), indent=1) + "\n")
    return path
