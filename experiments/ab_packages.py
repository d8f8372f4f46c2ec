"""Experiment: an earlier version of the package against the working tree, the floor beside them,
all three interleaved in one run (orpo_lib.bench.measure_interleaved), so that a change is measured
on the same GPU, inputs and clock drift as what it replaces.

    mkdir -p build/ab && git archive <rev> orpo_lib | tar -x -C build/ab && mv build/ab/orpo_lib build/ab/orpo_lib_before
    python experiments/ab_packages.py 16x1024,4x4096 [none,prompt-half]     # on a CUDA machine
"""
import os
import sys

import torch

sys.path.insert(0, os.getcwd())
sys.path.insert(0, os.path.join(os.getcwd(), "build", "ab"))
from orpo_lib import bench  # noqa: E402
from orpo_lib.fused import fused_linear_orpo_loss as after  # noqa: E402
from orpo_lib_before.fused import fused_linear_orpo_loss as before  # noqa: E402


def provider(loss_function):
    def make_run(w, inputs, mode):
        return bench._loss_call(lambda h, wt, t, nt: loss_function(h, wt, t, nll_target=nt).loss, inputs, mode)
    return make_run


def main(shapes, masks):
    device = torch.device("cuda")
    rows = []
    for mask in masks:
        for batch, seq in bench.parse_shapes(shapes):
            w = bench.Workload(batch, seq, bench.SEED_HIDDEN, bench.SEED_VOCAB, "bf16", mask)
            torch.cuda.empty_cache()
            inputs = bench.make_inputs(w, device)
            for mode in ("full", "eval"):
                jobs = [("floor", None, None), ("before", None, provider(before)), ("after", None, provider(after))]
                results = bench.measure_interleaved(jobs, mode, w, inputs, device, warmup=2,
                                                    reps=12 if seq <= 1024 else 6)
                floor_ms = results[0].median_ms
                for r in results:
                    rows.append(dict(shape=f"{batch}x{seq}", mask=mask, mode=mode, provider=r.provider,
                                     median_ms=r.median_ms, min_ms=r.min_ms, ratio=r.median_ms / floor_ms,
                                     peak_gib=r.peak_over_inputs_gib, status=r.status, error=r.error))
            del inputs
    bench.save_experiment("ab", rows, device)
    print(f"{'shape':8} {'mask':11} {'mode':5} {'before':>8} {'after':>8}  (÷ floor)")
    for floor, old, new in zip(rows[0::3], rows[1::3], rows[2::3]):
        print(f"{floor['shape']:8} {floor['mask']:11} {floor['mode']:5} {old['ratio']:8.3f} {new['ratio']:8.3f}"
              f"   floor {floor['median_ms']:.2f} ms")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2].split(",") if len(sys.argv) > 2 else ["none"])
