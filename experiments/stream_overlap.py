"""Experiment: can the row kernels run beside the GEMMs instead of after them?

The row kernels are memory-bound and the GEMMs compute-bound, yet the fused loss runs them one
after the other: about 5% of the three GEMMs. Split a block of rows into k pieces and the work of
one piece can overlap the GEMM of the next:

    forward   L1 ; [S1 ‖ L2] ; ... ; Sk                (L: logits GEMM, S: row_stats)
    gradient  R1 ; [R2 ‖ D1] ; ... ; Dk ; dW           (R: row_grads in place, D: dX = G·W)

The row kernel goes on a second stream. With one program per row (as in the library) its programs
queue behind the GEMM's; a persistent version with a few programs, each looping over rows, takes a
few SMs and leaves the rest to the GEMM. Each schedule is timed against its GEMMs alone (the floor
of this piece of work); every variant is checked bitwise against the sequential schedule first.

    python experiments/stream_overlap.py      # on a CUDA machine, from the repository root
"""
import os
import random
import statistics
import sys

import torch
import triton
import triton.language as tl

sys.path.insert(0, os.getcwd())
from orpo_lib import bench, kernels  # noqa: E402
from orpo_lib.kernels import _row_grads, _row_stats  # noqa: E402

H, V = 4096, 128256
ROWS = 8192  # one block: a pair of 4096-token sequences
REPS = 15


@triton.jit
def persistent_row_stats_kernel(logits_ptr, stride_row, target_ptr, nll_target_ptr, token_ptr, logp_ptr, nll_logp_ptr,
                                logit_sum_ptr, lse_ptr, n_rows, V, BLOCK_V: tl.constexpr, SLOT: tl.constexpr):
    for row in range(tl.program_id(0), n_rows, tl.num_programs(0)):
        _row_stats(row, logits_ptr, stride_row, target_ptr, nll_target_ptr, token_ptr, logp_ptr, nll_logp_ptr,
                   logit_sum_ptr, lse_ptr, V, BLOCK_V, SLOT)


@triton.jit
def persistent_row_grads_kernel(logits_ptr, stride_row, target_ptr, nll_target_ptr, token_ptr, logp_ptr, nll_logp_ptr,
                                lse_ptr, seq_coef_ptr, nll_coef, seq_len, n_rows, V, BLOCK_V: tl.constexpr):
    for row in range(tl.program_id(0), n_rows, tl.num_programs(0)):
        _row_grads(row, logits_ptr, stride_row, target_ptr, nll_target_ptr, token_ptr, logp_ptr, nll_logp_ptr,
                   lse_ptr, seq_coef_ptr, seq_coef_ptr, nll_coef, seq_len, V, False, BLOCK_V)


class Problem:
    def __init__(self, device):
        gen = torch.Generator(device=device).manual_seed(0)
        self.weight = torch.randn(V, H, device=device, dtype=torch.bfloat16, generator=gen) * H ** -0.5
        self.x = torch.randn(ROWS, H, device=device, dtype=torch.bfloat16, generator=gen)
        self.logits = torch.empty(ROWS, V, device=device, dtype=torch.bfloat16)
        self.target = torch.randint(0, V, (ROWS,), device=device, dtype=torch.int32, generator=gen)
        self.nll_target = torch.randint(0, V, (ROWS,), device=device, dtype=torch.int32, generator=gen)
        self.token = torch.arange(ROWS, device=device)
        self.stats = [torch.empty(ROWS, device=device) for _ in range(4)]  # logp, nll_logp, logit_sum, lse
        self.seq_coef = torch.rand(2, device=device, generator=gen) * 1e-4
        self.dx = torch.empty(ROWS, H, device=device, dtype=torch.bfloat16)

    def piece(self, i, k):
        rows = ROWS // k
        return slice(i * rows, (i + 1) * rows)

    def gemm(self, i, k):
        s = self.piece(i, k)
        torch.mm(self.x[s], self.weight.t(), out=self.logits[s])

    def dx_gemm(self, i, k):
        s = self.piece(i, k)
        torch.mm(self.logits[s], self.weight, out=self.dx[s])

    def dw_gemm(self):
        return torch.mm(self.logits.t(), self.x)

    def stats_kernel(self, i, k, programs):
        s = self.piece(i, k)
        args = (self.target[s], self.nll_target[s], self.token[s], *self.stats)
        if programs is None:
            kernels.row_stats(self.logits[s], *args)
            return
        launch = kernels.STATS_LAUNCH
        block_v = kernels._block_v(V, launch)
        persistent_row_stats_kernel[(programs,)](
            self.logits[s], V, *args, ROWS // k, V, BLOCK_V=block_v, SLOT=kernels.stats_slot(block_v),
            num_warps=launch.num_warps)

    def grads_kernel(self, i, k, programs):
        s = self.piece(i, k)
        logp, nll_logp, _, lse = self.stats
        args = (self.target[s], self.nll_target[s], self.token[s], logp, nll_logp, lse, self.seq_coef)
        if programs is None:
            kernels.row_grads(self.logits[s], *args, nll_coef=-1e-4, seq_len=ROWS // 2)
            return
        launch = kernels.GRADS_LAUNCH
        persistent_row_grads_kernel[(programs,)](
            self.logits[s], V, *args, -1e-4, ROWS // 2, ROWS // k, V, BLOCK_V=kernels._block_v(V, launch),
            num_warps=launch.num_warps)


def forward_schedule(p, k, programs, side):
    """Logits GEMM and statistics of k pieces; with ``side``, each piece's statistics beside the next GEMM."""
    main = torch.cuda.current_stream()
    for i in range(k):
        p.gemm(i, k)
        if programs == "none":
            continue
        if side is None:
            p.stats_kernel(i, k, programs)
            continue
        side.wait_stream(main)
        with torch.cuda.stream(side):
            p.stats_kernel(i, k, programs)
    if side is not None:
        main.wait_stream(side)


def gradient_schedule(p, k, programs, side):
    """Rewrite into G and dX GEMM of k pieces, then dW; with ``side``, each rewrite beside the previous dX GEMM."""
    if side is None or programs == "none":
        for i in range(k):
            if programs != "none":
                p.grads_kernel(i, k, programs)
            p.dx_gemm(i, k)
        p.dw_gemm()
        return
    main = torch.cuda.current_stream()
    p.grads_kernel(0, k, programs)
    for i in range(k):
        if i + 1 < k:  # R_{i+1} on the side stream while main runs D_i; D_{i+1} waits for it
            side.wait_stream(main)
            with torch.cuda.stream(side):
                p.grads_kernel(i + 1, k, programs)
        p.dx_gemm(i, k)
        main.wait_stream(side)
    p.dw_gemm()


def timed(fn, before=None):
    if before is not None:
        before()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end)


def main():
    device = torch.device("cuda")
    p = Problem(device)
    streams = {"high": torch.cuda.Stream(priority=-1), "normal": torch.cuda.Stream()}

    # Variants: (phase, k, programs, stream priority); programs "none" is the GEMMs alone, None one program per row.
    variants = []
    for k in (2, 4):
        for phase in ("forward", "gradient"):
            variants.append((phase, k, "none", None))
            variants.append((phase, k, None, None))
            for programs in (None, 16, 33, 66, 132):
                for prio in ("high", "normal"):
                    variants.append((phase, k, programs, prio))

    def refill():
        for i in range(2):
            p.gemm(i, 2)

    def run(variant):
        phase, k, programs, prio = variant
        side = streams[prio] if prio else None
        if phase == "forward":
            return lambda: forward_schedule(p, k, programs, side), None
        return lambda: gradient_schedule(p, k, programs, side), refill

    # Bitwise checks against the sequential schedule.
    checks = []
    for variant in variants:
        phase, k, programs, prio = variant
        if programs == "none":
            continue
        fn, before = run(variant)
        refill()
        for t in p.stats:
            t.fill_(float("nan"))
        if phase == "forward":
            fn()
            got = [t.clone() for t in p.stats]
            forward_schedule(p, k, None, None)
            want = p.stats
        else:
            forward_schedule(p, 1, None, None)
            fn()
            got = [p.dx.clone(), p.logits.clone()]
            refill()
            gradient_schedule(p, k, None, None)
            want = [p.dx, p.logits]
        torch.cuda.synchronize()
        ok = all(torch.equal(a, b) for a, b in zip(got, want))
        checks.append({"variant": list(variant), "bitwise_equal": ok})
        if not ok:
            print("MISMATCH", variant, flush=True)

    forward_schedule(p, 1, None, None)  # real statistics for the gradient phase
    times = {v: [] for v in variants}
    rng = random.Random(0)
    for rep in range(REPS + 2):
        order = list(variants)
        rng.shuffle(order)
        for variant in order:
            fn, before = run(variant)
            ms = timed(fn, before)
            if rep >= 2:
                times[variant].append(ms)

    rows = []
    floors = {(v[0], v[1]): statistics.median(times[v]) for v in variants if v[2] == "none"}
    for v in variants:
        phase, k, programs, prio = v
        ms = statistics.median(times[v])
        floor = floors[(phase, k)]
        rows.append({"phase": phase, "pieces": k, "programs": "gemm only" if programs == "none" else
                     ("one per row" if programs is None else programs), "side_stream": prio or "none",
                     "median_ms": ms, "min_ms": min(times[v]), "over_gemms_ms": ms - floor,
                     "x_gemms": ms / floor})
    bench.save_experiment("stream-overlap", {"rows": rows, "checks": checks, "rows_per_block": ROWS,
                                             "hidden": H, "vocab": V, "reps": REPS}, device)
    print(f"\nbitwise equal to sequential: {sum(c['bitwise_equal'] for c in checks)}/{len(checks)}")
    print(f"{'phase':9s} {'k':>2s} {'programs':>12s} {'side':>7s} {'ms':>8s} {'+ms':>7s} {'×GEMMs':>7s}")
    for r in rows:
        print(f"{r['phase']:9s} {r['pieces']:2d} {str(r['programs']):>12s} {r['side_stream']:>7s} "
              f"{r['median_ms']:8.3f} {r['over_gemms_ms']:7.3f} {r['x_gemms']:7.3f}")


if __name__ == "__main__":
    main()
