"""Experiment: logits rows at an odd vocabulary (e.g. 50257, 32001, 128257), packed back to back, against the
library's layout: rows padded to a multiple of 16 columns, and W with zero rows to match (chunked.gemm_head) for
the logits and dX GEMMs. Times the three GEMMs, the two row kernels and the copy of W."""
import datetime, json, os, sys

import torch
import triton

from orpo_lib import chunked, kernels

dev = torch.device("cuda")
torch.manual_seed(0)
bench = lambda fn: triton.testing.do_bench(fn, warmup=10, rep=60, return_mode="median")
results = []
for rows, hidden, vocab in [(8192, 1024, 50257), (8192, 2048, 32001), (8192, 1024, 32000), (4096, 4096, 128257)]:
    x = torch.randn(rows, hidden, device=dev).bfloat16()
    w = (torch.randn(vocab, hidden, device=dev) / hidden ** 0.5).bfloat16()
    w_pad, _ = chunked.gemm_head(w, None)
    packed = torch.empty(rows, vocab, device=dev, dtype=torch.bfloat16)
    padded = chunked.new_logits_buffer(rows, vocab, x)
    full = chunked.with_padding(padded)
    torch.mm(x, w.t(), out=packed)
    chunked.linear_into(padded, x, w_pad, None)
    target = torch.randint(0, vocab, (rows,), device=dev, dtype=torch.int32)
    token = torch.arange(rows, device=dev)
    stats = [torch.zeros(rows, device=dev) for _ in range(4)]
    coef = torch.full((rows,), -1e-3, device=dev)
    row = {"rows": rows, "hidden": hidden, "vocab": vocab, "columns": full.shape[1],
           "equal_logits": torch.equal(packed, padded),
           "equal_dx": torch.equal(torch.mm(packed, w), torch.mm(full, w_pad)),
           "head_copy_ms": bench(lambda: chunked.gemm_head(w, None))}
    layouts = {"packed": (packed, packed, w), "padded": (padded, full, w_pad)}
    for name, (view, whole, head) in layouts.items():
        row[name] = {
            "logits_gemm_ms": bench(lambda: torch.mm(x, head.t(), out=whole)),
            "row_stats_ms": bench(lambda: kernels.row_stats(view, target, target, token, *stats)),
            "row_grads_ms": bench(lambda: kernels.row_grads(view, target, target, token, stats[0], stats[1], stats[3], coef,
                                                            nll_tokens=rows, seq_len=1)),
            "dx_gemm_ms": bench(lambda: torch.mm(whole, head)),
            "dw_gemm_ms": bench(lambda: torch.mm(view.t(), x)),
        }
    results.append(row)
    c, p = row["packed"], row["padded"]
    print(f"{rows}x{hidden}x{vocab} equal={row['equal_logits']},{row['equal_dx']} head copy {row['head_copy_ms']:.3f}: "
          + ", ".join(f"{k[:-3]} {c[k]:.3f}->{p[k]:.3f}" for k in c), flush=True)
    del packed, padded, full, layouts
    torch.cuda.empty_cache()
prov = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__,
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"), "commit": sys.argv[1],
        "command": "python lab/aligned_rows.py " + sys.argv[1]}
json.dump({"provenance": prov, "results": results}, open(os.path.join(os.environ.get("OUT", "."), "aligned-rows.json"), "w"), indent=1)
