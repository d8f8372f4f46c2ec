"""Experiment: the no-grad forward of one chunk, cuBLAS + row_stats_kernel against stats_gemm.logits_stats.

For C rows of hidden (H = 4096, V = 128256, bf16): ``torch.mm`` into a C×V buffer followed by
``kernels.row_stats``, against the logits GEMM with the statistics in its epilogue (no logits stored), for
several tile configurations and chunk heights. Every configuration is checked against the cuBLAS path
first (log-probs, log-sum-exp, logit sums); times are medians of CUDA-event timed calls.

    python experiments/stats_gemm_sweep.py      # on a CUDA machine, from the repository root
"""
import os
import sys
from dataclasses import asdict

import torch

sys.path.insert(0, os.getcwd())
from orpo_lib import bench, kernels  # noqa: E402
import stats_gemm  # noqa: E402  (experiments/, beside this file)
from stats_gemm import GemmConfig  # noqa: E402

H, V = 4096, 128256
VARIANTS = [  # (configuration, whether the NLL target is a separate array)
    (GemmConfig(), True),
    (GemmConfig(), False),
    (GemmConfig(warp_specialize=True), True),
    (GemmConfig(num_stages=4), True),
    (GemmConfig(group_m=8), True),
    (GemmConfig(block_n=128, num_stages=4), True),
]


def main():
    device = torch.device("cuda")
    gen = torch.Generator(device="cuda").manual_seed(0)
    weight = torch.randn(V, H, device=device, dtype=torch.bfloat16, generator=gen) * H ** -0.5
    rows_out = []
    for rows in (2048, 4096, 8192, 16384):
        x = torch.randn(rows, H, device=device, dtype=torch.bfloat16, generator=gen)
        target = torch.randint(0, V, (rows,), device=device, dtype=torch.int32, generator=gen)
        nll_target = target.clone()
        nll_target[rows // 2:] = -1
        token = torch.arange(rows, device=device)
        buffer = torch.empty(rows, V, device=device, dtype=torch.bfloat16)
        reference = [torch.empty(rows, device=device) for _ in range(4)]
        outputs = [torch.empty(rows, device=device) for _ in range(4)]

        def cublas_stats():
            torch.mm(x, weight.t(), out=buffer)
            kernels.row_stats(buffer, target, nll_target, token, *reference)

        cublas_stats()
        flops = 2 * rows * H * V
        timings = {"cublas mm": lambda: torch.mm(x, weight.t(), out=buffer), "cublas mm + row_stats": cublas_stats}
        for name, run in timings.items():
            ms = bench.time_call(run, device, warmup=3, reps=20)[0]
            rows_out.append({"rows": rows, "variant": name, "ms": ms, "tflops": flops / ms / 1e9})
            print(rows_out[-1], flush=True)
        for config, separate_nll in VARIANTS:
            entry = {"rows": rows, "variant": "logits_stats", "config": asdict(config), "separate_nll": separate_nll}
            try:
                workspace = stats_gemm.workspace(rows, V, device, config)

                def run():
                    stats_gemm.tile_stats(x, weight, None, target, nll_target, workspace, config,
                                          separate_nll=separate_nll)
                    stats_gemm.combine(workspace, rows, V, target, nll_target, token, *outputs, config)
                run()
                entry["max_abs_diff"] = {name: (out - ref).abs().max().item() for name, out, ref in
                                         zip(("logp", "nll_logp", "logit_sum", "lse"), outputs, reference)}
                entry["ms"] = bench.time_call(run, device, warmup=3, reps=20)[0]
                entry["tflops"] = flops / entry["ms"] / 1e9
            except Exception as exc:  # a configuration that does not compile or fit is recorded as such
                entry["error"] = f"{type(exc).__name__}: {str(exc)[-300:]}"
            rows_out.append(entry)
            print(entry, flush=True)
        del x, buffer
        torch.cuda.empty_cache()
    bench.save_experiment("stats-gemm-sweep", rows_out, device)
    print("\nrows  variant                                   ms     TFLOP/s")
    for r in rows_out:
        cfg = r.get("config")
        tag = r["variant"] if not cfg else "stats {block_m}x{block_n}x{block_k} g{group_m} s{num_stages} w{num_warps}".format(
            **cfg) + " ws" * cfg["warp_specialize"] + " nll" * r["separate_nll"]
        print(f"{r['rows']:6d} {tag:40s} {r.get('ms', float('nan')):7.3f} {r.get('tflops', float('nan')):6.0f} "
              f"{r.get('error', '')}")


if __name__ == "__main__":
    main()
