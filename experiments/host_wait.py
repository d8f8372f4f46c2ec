"""Experiment: how long the GPU waits on the host before a fused call's first logits GEMM.

CUDA events mark the start of the call and the moment the first GEMM is queued (the GPU is idle in
between, so the second event's time is the host's). Their difference, against the whole call's
time, is the fixed per-call wait: label check, its read-back, and the setup after it.

    python experiments/host_wait.py      # on a CUDA machine, from the repository root
"""
import json
import os
import statistics
import sys

import torch

sys.path.insert(0, os.getcwd())
from orpo_lib import fused  # noqa: E402

H, V = 4096, 128256


def main():
    first_gemm = []
    queue_logits = fused.ChunkedORPO._logits

    def marked_logits(self, span):
        if not first_gemm or first_gemm[-1] is None:  # the call's first block
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            first_gemm[-1:] = [event]
        return queue_logits(self, span)
    fused.ChunkedORPO._logits = marked_logits

    rows = []
    for batch, seq in ((2, 1024), (4, 1024), (8, 1024), (2, 4096)):
        gen = torch.Generator(device="cuda").manual_seed(0)
        hidden = torch.randn(batch, seq, H, device="cuda", dtype=torch.bfloat16, generator=gen).requires_grad_()
        weight = (torch.randn(V, H, device="cuda", dtype=torch.bfloat16, generator=gen) * H ** -0.5).requires_grad_()
        target = torch.randint(0, V, (batch, seq), device="cuda", generator=gen)
        for mode in ("full", "eval"):
            waits, totals = [], []
            for rep in range(13):
                first_gemm.append(None)
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                with torch.set_grad_enabled(mode == "full"):
                    out = fused.fused_linear_orpo_loss(hidden, weight, target)
                if mode == "full":
                    out.loss.backward()
                    hidden.grad = weight.grad = None
                end.record()
                end.synchronize()
                if rep >= 3:  # after warm-up
                    waits.append(start.elapsed_time(first_gemm[-1]))
                    totals.append(start.elapsed_time(end))
            row = {"shape": f"{batch}x{seq}", "mode": mode, "wait_ms": statistics.median(waits),
                   "call_ms": statistics.median(totals)}
            rows.append(row)
            print(json.dumps(row), flush=True)
    json.dump(rows, open(os.path.join(os.environ.get("OUT", "/tmp"), "host-wait.json"), "w"), indent=1)


if __name__ == "__main__":
    main()
