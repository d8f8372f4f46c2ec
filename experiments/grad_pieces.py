"""Experiment: the fused loss with its gradient rewrite beside the dX GEMMs (fused.GRAD_PIECE_ROWS rows a
piece) against the same loss with one piece a block (the rewrite, then one dX GEMM), the floor beside
them, all interleaved in one run (orpo_lib.bench.measure_interleaved).

    python experiments/grad_pieces.py 4x1024,4x4096      # on a CUDA machine, from the repository root
"""
import os
import sys

import torch

sys.path.insert(0, os.getcwd())
from orpo_lib import bench, fused  # noqa: E402

PIECE_ROWS = {"one piece": 1 << 30, "4096": 4096, "2048": 2048, "1024": 1024}


def provider(piece_rows):
    def make_run(w, inputs, mode):
        call = bench._loss_call(lambda h, wt, t, nt: fused.fused_linear_orpo_loss(h, wt, t, nll_target=nt).loss,
                                inputs, mode)

        def run():
            fused.GRAD_PIECE_ROWS = piece_rows
            return call()
        return run
    return make_run


def main(shapes):
    device = torch.device("cuda")
    default = fused.GRAD_PIECE_ROWS
    rows = []
    for batch, seq in bench.parse_shapes(shapes):
        w = bench.Workload(batch, seq, bench.SEED_HIDDEN, bench.SEED_VOCAB, "bf16", "none")
        torch.cuda.empty_cache()
        inputs = bench.make_inputs(w, device)
        jobs = [("floor", None, None)] + [(name, None, provider(n)) for name, n in PIECE_ROWS.items()]
        results = bench.measure_interleaved(jobs, "full", w, inputs, device, warmup=2, reps=12 if seq <= 1024 else 6)
        floor_ms = results[0].median_ms
        for r in results:
            rows.append(dict(shape=f"{batch}x{seq}", provider=r.provider, median_ms=r.median_ms, min_ms=r.min_ms,
                             ratio=r.median_ms / floor_ms, peak_gib=r.peak_over_inputs_gib, status=r.status,
                             error=r.error))
        del inputs
    fused.GRAD_PIECE_ROWS = default
    bench.save_experiment("grad-pieces", rows, device)
    names = list(PIECE_ROWS)
    print(f"{'shape':8} {'floor ms':>9} " + " ".join(f"{n:>10}" for n in names) + "   (÷ floor, forward + backward)")
    for i in range(0, len(rows), len(names) + 1):
        floor, *fused_rows = rows[i:i + len(names) + 1]
        print(f"{floor['shape']:8} {floor['median_ms']:9.2f} " + " ".join(f"{r['ratio']:10.3f}" for r in fused_rows))


if __name__ == "__main__":
    main(sys.argv[1])
