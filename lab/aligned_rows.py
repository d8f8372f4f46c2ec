"""Experiment: logits rows whose stride is not a multiple of 16 bytes (V odd, e.g. 50257 or 32001), against the
same rows in a buffer padded to a multiple of 8 columns: the row kernels and the three GEMMs."""
import datetime, json, os, sys

import torch
import triton

from orpo_lib import kernels

dev = torch.device("cuda")
torch.manual_seed(0)
bench = lambda fn: triton.testing.do_bench(fn, warmup=10, rep=60, return_mode="median")
results = []
for rows, hidden, vocab in [(8192, 1024, 50257), (8192, 2048, 32001), (8192, 1024, 32000), (4096, 4096, 128257)]:
    x = torch.randn(rows, hidden, device=dev).bfloat16()
    w = (torch.randn(vocab, hidden, device=dev) / hidden ** 0.5).bfloat16()
    padded_vocab = -(-vocab // 8) * 8
    contiguous = torch.empty(rows, vocab, device=dev, dtype=torch.bfloat16)
    padded = torch.empty(rows, padded_vocab, device=dev, dtype=torch.bfloat16)[:, :vocab]
    torch.mm(x, w.t(), out=contiguous)
    torch.mm(x, w.t(), out=padded)
    same = torch.equal(contiguous, padded)
    target = torch.randint(0, vocab, (rows,), device=dev, dtype=torch.int32)
    token = torch.arange(rows, device=dev)
    stats = [torch.zeros(rows, device=dev) for _ in range(4)]
    coef = torch.full((rows,), -1e-3, device=dev)
    row = {"rows": rows, "hidden": hidden, "vocab": vocab, "padded_vocab": padded_vocab, "equal_logits": same}
    for name, buf in (("contiguous", contiguous), ("padded", padded)):
        row[name] = {
            "logits_gemm_ms": bench(lambda: torch.mm(x, w.t(), out=buf)),
            "row_stats_ms": bench(lambda: kernels.row_stats(buf, target, target, token, *stats)),
            "row_grads_ms": bench(lambda: kernels.row_grads(buf, target, target, token, stats[0], stats[1], stats[3], coef,
                                                            nll_tokens=rows, seq_len=1)),
            "dx_gemm_ms": bench(lambda: torch.mm(buf, w)),
            "dw_gemm_ms": bench(lambda: torch.mm(buf.t(), x)),
        }
    results.append(row)
    c, p = row["contiguous"], row["padded"]
    print(f"{rows}x{hidden}x{vocab} equal={same}: " + ", ".join(f"{k[:-3]} {c[k]:.3f}->{p[k]:.3f}" for k in c), flush=True)
    del contiguous, padded, buf
    torch.cuda.empty_cache()
prov = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__,
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"), "commit": sys.argv[1],
        "command": "python lab/aligned_rows.py " + sys.argv[1]}
json.dump({"provenance": prov, "results": results}, open(os.path.join(os.environ.get("OUT", "."), "aligned-rows.json"), "w"), indent=1)
