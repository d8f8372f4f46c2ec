"""Experiment: can a Triton GEMM with a row-statistics epilogue beat a cuBLAS GEMM + row_stats_kernel?

logits = X @ W.T for X (M, K), W (N, K), M = 4096 rows, K = 4096, N = 128256, bf16. A persistent
TMA GEMM whose epilogue writes, per (row, BN-column tile), partial statistics; ``STATS`` picks how many:
0 none; 1 the tile's max and sum of exp(x - max); 2 the same with the target's column left out;
3 also the target and NLL-target logits and the row sum, from the bf16-rounded logits. Each level
is timed with and without storing the logits (eval needs no logits stored).

    python experiments/gemm_stats_epilogue.py      # on a CUDA machine, from the repository root

Recorded: figures/data/gemm-epilogue-2026-12-02-h200.json.
"""
import json
import os
import sys
import time

import torch
import triton
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor

sys.path.insert(0, os.getcwd())
from orpo_lib import kernels  # noqa: E402

@triton.jit
def gemm_stats_kernel(a_desc, b_desc, c_desc, target_ptr, nll_ptr, pmax_ptr, psum_ptr, plsum_ptr, ptgt_ptr, pnll_ptr,
                      M, N, K,
                      BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, GROUP_M: tl.constexpr,
                      NUM_SMS: tl.constexpr, STORE: tl.constexpr, STATS: tl.constexpr, SUBTILE: tl.constexpr,
                      WS: tl.constexpr):
    start_pid = tl.program_id(0)
    num_pid_m = tl.cdiv(M, BM)
    num_pid_n = tl.cdiv(N, BN)
    num_tiles = num_pid_m * num_pid_n
    k_tiles = tl.cdiv(K, BK)
    num_in_group = GROUP_M * num_pid_n
    tile_c = start_pid - NUM_SMS
    for tile_id in tl.range(start_pid, num_tiles, NUM_SMS, flatten=True, warp_specialize=WS):
        group = tile_id // num_in_group
        first_m = group * GROUP_M
        gsize = min(num_pid_m - first_m, GROUP_M)
        pid_m = first_m + (tile_id % gsize)
        pid_n = (tile_id % num_in_group) // gsize
        acc = tl.zeros((BM, BN), dtype=tl.float32)
        for ki in range(k_tiles):
            a = a_desc.load([pid_m * BM, ki * BK])
            b = b_desc.load([pid_n * BN, ki * BK])
            acc = tl.dot(a, b.T, acc)
        tile_c += NUM_SMS
        group = tile_c // num_in_group
        first_m = group * GROUP_M
        gsize = min(num_pid_m - first_m, GROUP_M)
        pid_m = first_m + (tile_c % gsize)
        pid_n = (tile_c % num_in_group) // gsize
        m0 = pid_m * BM
        n0 = pid_n * BN
        logits = acc.to(c_desc.dtype)
        if STORE:
            if SUBTILE:
                h = tl.reshape(logits, (BM, 2, BN // 2))
                h = tl.permute(h, (0, 2, 1))
                h0, h1 = tl.split(h)
                c_desc.store([m0, n0], h0)
                c_desc.store([m0, n0 + BN // 2], h1)
            else:
                c_desc.store([m0, n0], logits)
        if STATS == 1:  # max and sum of exp only, on the fp32 accumulator
            tmax = tl.max(acc, axis=1)
            tsum = tl.sum(tl.exp2((acc - tmax[:, None]) * 1.4426950408889634), axis=1)
            rows = m0 + tl.arange(0, BM)
            tl.store(pmax_ptr + pid_n * M + rows, tmax, mask=rows < M)
            tl.store(psum_ptr + pid_n * M + rows, tsum, mask=rows < M)
        if STATS == 2:  # ... leaving the target's column out of the sum
            rows = m0 + tl.arange(0, BM)
            cols = n0 + tl.arange(0, BN)
            tgt = tl.load(target_ptr + rows, mask=rows < M, other=-1)
            tmax = tl.max(acc, axis=1)
            terms = tl.exp2((acc - tmax[:, None]) * 1.4426950408889634)
            tsum = tl.sum(tl.where(cols[None, :] == tgt[:, None], 0.0, terms), axis=1)
            tl.store(pmax_ptr + pid_n * M + rows, tmax, mask=rows < M)
            tl.store(psum_ptr + pid_n * M + rows, tsum, mask=rows < M)
        if STATS == 3:
            x = logits.to(tl.float32)
            rows = m0 + tl.arange(0, BM)
            cols = n0 + tl.arange(0, BN)
            in_rows = rows < M
            tgt = tl.load(target_ptr + rows, mask=in_rows, other=-1)
            nll = tl.load(nll_ptr + rows, mask=in_rows, other=-1)
            is_t = cols[None, :] == tgt[:, None]
            valid = cols[None, :] < N
            tmax = tl.max(tl.where(valid, x, float("-inf")), axis=1)
            terms = tl.exp2((x - tmax[:, None]) * 1.4426950408889634)
            tsum = tl.sum(tl.where(valid & ~is_t, terms, 0.0), axis=1)
            lsum = tl.sum(tl.where(valid, x, 0.0), axis=1)
            tval = tl.sum(tl.where(is_t, x, 0.0), axis=1)
            nval = tl.sum(tl.where(cols[None, :] == nll[:, None], x, 0.0), axis=1)
            out = pid_n * M + rows
            tl.store(pmax_ptr + out, tmax, mask=in_rows)
            tl.store(psum_ptr + out, tsum, mask=in_rows)
            tl.store(plsum_ptr + out, lsum, mask=in_rows)
            tl.store(ptgt_ptr + rows, tval, mask=in_rows & (tgt >= n0) & (tgt < n0 + BN))
            tl.store(pnll_ptr + rows, nval, mask=in_rows & (nll >= n0) & (nll < n0 + BN))


def run_gemm(x, w, out, tgt, nll, parts, cfg, store=True, stats=3):
    M, K = x.shape
    N = w.shape[0]
    BM, BN, BK = cfg["BM"], cfg["BN"], cfg["BK"]
    a_desc = TensorDescriptor.from_tensor(x, [BM, BK])
    b_desc = TensorDescriptor.from_tensor(w, [BN, BK])
    c_desc = TensorDescriptor.from_tensor(out, [BM, BN // 2 if cfg["SUBTILE"] else BN])
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    grid = (min(sms, triton.cdiv(M, BM) * triton.cdiv(N, BN)),)
    gemm_stats_kernel[grid](a_desc, b_desc, c_desc, tgt, nll, *parts, M, N, K, BM=BM, BN=BN, BK=BK,
                            GROUP_M=cfg["GROUP_M"], NUM_SMS=sms, STORE=store, STATS=stats, SUBTILE=cfg["SUBTILE"],
                            WS=cfg["WS"], num_warps=cfg["warps"], num_stages=cfg["stages"])


def bench(fn, reps=30):
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    ts = []
    for _ in range(reps):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        fn()
        e.record()
        e.synchronize()
        ts.append(s.elapsed_time(e))
    ts.sort()
    return ts[len(ts) // 2]


def main():
    out_dir = os.environ.get("OUT", "/tmp")
    torch.manual_seed(0)
    M, K, N = 4096, 4096, 128256
    dev = "cuda"
    x = torch.randn(M, K, device=dev, dtype=torch.bfloat16)
    w = torch.randn(N, K, device=dev, dtype=torch.bfloat16) * K ** -0.5
    tgt = torch.randint(0, N, (M,), device=dev, dtype=torch.int32)
    nll = torch.randint(0, N, (M,), device=dev, dtype=torch.int32)
    logits = torch.empty(M, N, device=dev, dtype=torch.bfloat16)
    ref = torch.mm(x, w.t())
    flops = 2 * M * N * K
    token = torch.arange(M, device=dev)
    st = [torch.zeros(M, device=dev) for _ in range(4)]
    rows = []

    def add(name, ms, **kw):
        rows.append(dict(name=name, ms=ms, tflops=flops / ms / 1e9, **kw))
        print(f"{name:60s} {ms:7.3f} ms {flops / ms / 1e9:6.0f} TFLOP/s {kw}", flush=True)

    cublas = lambda: torch.mm(x, w.t(), out=logits)
    stats = lambda: kernels.row_stats(logits, tgt, nll, token, *st)
    both = lambda: (cublas(), stats())
    for _ in range(2):
        add("cublas mm", bench(cublas))
        add("row_stats", bench(stats))
        add("cublas mm + row_stats", bench(both))

    configs = [dict(BM=128, BN=256, BK=64, stages=3, warps=8, SUBTILE=False, GROUP_M=32, WS=False),
               dict(BM=128, BN=256, BK=64, stages=3, warps=8, SUBTILE=True, GROUP_M=8, WS=False)]
    for cfg in configs:
        n_tiles = triton.cdiv(N, cfg["BN"])
        parts = [torch.empty(n_tiles, M, device=dev) for _ in range(3)] + [torch.zeros(M, device=dev),
                                                                          torch.zeros(M, device=dev)]
        tag = "bm{BM} bn{BN} bk{BK} s{stages} w{warps} sub{SUBTILE} g{GROUP_M}".format(**cfg)
        for level in (0, 1, 2, 3):
            for store in (True, False) if level else (True,):
                fn = lambda: run_gemm(x, w, logits, tgt, nll, parts, cfg, store=store, stats=level)
                fn()
                add(f"triton stats{level} store{int(store)} " + tag, bench(fn))
    # plain Triton GEMM against cuBLAS at other chunk heights
    cfg = configs[0]
    for rows_m in (2048, 8192):
        xm = torch.randn(rows_m, K, device=dev, dtype=torch.bfloat16)
        out_m = torch.empty(rows_m, N, device=dev, dtype=torch.bfloat16)
        parts = [torch.empty(triton.cdiv(N, 256), rows_m, device=dev) for _ in range(3)] + [
            torch.zeros(rows_m, device=dev), torch.zeros(rows_m, device=dev)]
        t_m = torch.randint(0, N, (rows_m,), device=dev, dtype=torch.int32)
        ms_c = bench(lambda: torch.mm(xm, w.t(), out=out_m))
        ms_t = bench(lambda: run_gemm(xm, w, out_m, t_m, t_m, parts, cfg, stats=0))
        scale = rows_m / M
        add(f"cublas mm M={rows_m}", ms_c / scale)
        add(f"triton plain M={rows_m}", ms_t / scale)
    add("cublas mm (again)", bench(cublas))
    add("cublas mm + row_stats (again)", bench(both))
    json.dump(rows, open(os.path.join(out_dir, "probe.json"), "w"), indent=1)
    print("\nSUMMARY")
    for r in rows:
        if "ms" in r:
            print(f"{r['name']:60s} {r['ms']:7.3f} {r['tflops']:5.0f}")


if __name__ == "__main__":
    main()
