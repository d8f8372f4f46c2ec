"""The ``grad_gemm`` sweep of the benchmark harness: dX = G·W with G formed inside the GEMM (``kernels.gluon_grad_gemm``)
against the buffer path the loss runs today, at shapes of its own.

Per (rows, hidden, vocab), on one logits buffer of that many rows, timed interleaved (``timing.time_interleaved``):

* ``cublas_dx`` — cuBLAS's dX GEMM over a buffer that already holds G (bf16 out): the floor of this GEMM;
* ``row_grads`` — the pass that rewrites the buffer into G (one read and one write of it);
* ``buffer_dx`` — the two, as the loss runs them;
* ``gluon_dx`` — the per-row coefficients (``row_grads.grad_coefficients``) and the Gluon GEMM that forms G from the
  logits as it loads them (bf16 out).

Each shape's G·W is checked against float64 on its first rows (the relative Frobenius error of ``buffer_dx`` and of
``gluon_dx``), and the Gluon result against a second run of itself (``bitwise_repeatable``). Every token counts, its
odds-ratio target its NLL target, a tenth of the rows with p ≈ 1 at the target. The FLOPs are 2·rows·vocab·hidden on
every path; the bytes of the passes are in ``buffer_bytes`` (what row_grads reads and writes).
"""

import torch

from .. import kernels
from .._triton_mode import INTERPRET
from ..chunked import gemms
from ..kernels.row_grads import grad_coefficients
from .timing import record_failure, time_interleaved, time_summary

# (rows, hidden, vocab) on CUDA: the Llama-3-8B head at two chunks of rows, and the small models' heads
GRAD_GEMM_SHAPES = [(8192, 4096, 128256), (4096, 4096, 128256), (8192, 2048, 151936), (8192, 1024, 32000)]
GRAD_GEMM_CPU_SHAPES = [(24, 40, 272)]
GRAD_GEMM_PATHS = ("cublas_dx", "row_grads", "buffer_dx", "gluon_dx")
CHECKED_ROWS = 512  # of each shape, against float64


def gluon_supported(device, dtype) -> bool:
    """Whether the Gluon GEMMs run here: compiled kernels on a Hopper GPU with bf16 or fp16 operands."""
    return (device.type == "cuda" and not INTERPRET and torch.cuda.get_device_capability(device) == (9, 0)
            and dtype in (torch.bfloat16, torch.float16))


def gluon_dx_call(logits, weight, ids, sizes, out) -> None:
    """dX into ``out`` as the Gluon path forms it: each row's coefficients, then the GEMM that forms G as it loads
    the logits. ``ids``: target, NLL target, token, logp, nll_logp, lse, seq_coef; ``sizes``: nll_tokens, seq_len."""
    from ..kernels.gluon_grad_gemm import grad_times_weight  # Gluon: imported only where it runs

    coefficients, columns = grad_coefficients(*ids, **sizes)
    grad_times_weight(logits, weight, coefficients, columns, out)


def grad_gemm_sweep(device, shapes, dtype, *, warmup, reps) -> list:
    """One row per shape (see the module's docstring); a shape that fails is recorded with its status ("oom",
    "error") and what was measured before the failure."""
    gluon = gluon_supported(device, dtype)
    out = []
    for rows, hidden, vocab in shapes:
        row = {"rows": rows, "hidden": hidden, "vocab": vocab, "dtype": str(dtype).removeprefix("torch."),
               "status": "ok" if gluon else "unsupported", "error": None, "reps": 0,
               "flops": 2 * rows * vocab * hidden, "buffer_bytes": 2 * rows * vocab * dtype.itemsize,
               **{f"{path}_{stat}": None for path in GRAD_GEMM_PATHS for stat in ("ms", "min_ms", "max_ms")},
               "buffer_dx_rel_err": None, "gluon_dx_rel_err": None, "bitwise_repeatable": None}
        record_failure(row, lambda: _time_paths(row, device, dtype, gluon, warmup=warmup, reps=reps), device)
        out.append(row)
    return out


def _problem(rows, hidden, vocab, device, dtype):
    gen = torch.Generator(device=device).manual_seed(7)
    x = (torch.randn(rows, hidden, device=device, generator=gen) / hidden ** 0.25).to(dtype)
    weight = (torch.randn(vocab, hidden, device=device, generator=gen) / hidden ** 0.25).to(dtype)
    logits = gemms.linear_into(gemms.new_logits_buffer(rows, vocab, x), x, gemms.gemm_head(weight, None))
    target = torch.randint(0, vocab, (rows,), device=device, dtype=torch.int32, generator=gen)
    logits[::10].scatter_(1, target[::10].long()[:, None], 40.0)  # p ≈ 1 at the target
    seq_len = rows // 2
    token = torch.arange(rows, device=device)
    seq_coef = torch.randn(2, device=device, generator=gen)
    stats = torch.zeros(4, rows, device=device)  # logp, nll_logp, logit_sum, lse
    kernels.row_stats(logits, target, target, token, *stats)
    ids = (target, target, token, stats[0], stats[1], stats[3], seq_coef)
    return weight, logits, ids, dict(nll_tokens=rows, seq_len=seq_len)


def _float64_dx(logits, weight, ids, sizes, rows):
    """G·W in float64 for the first ``rows`` rows (their statistics recomputed in float64)."""
    target, nll_target, token, _, _, _, seq_coef = (t[:rows] if t.dim() and t.shape[0] == logits.shape[0] else t
                                                    for t in ids)
    grad = logits[:rows].double()
    stats = torch.zeros(4, rows, device=logits.device, dtype=torch.float64)
    kernels.row_stats(grad, target, nll_target, token, *stats)
    kernels.row_grads(grad, target, nll_target, token, stats[0], stats[1], stats[3], seq_coef.double(), **sizes)
    return grad @ weight.double()


def _time_paths(row, device, dtype, gluon, *, warmup, reps) -> None:
    rows, hidden, vocab = row["rows"], row["hidden"], row["vocab"]
    weight, logits, ids, sizes = _problem(rows, hidden, vocab, device, dtype)
    head = gemms.gemm_head(weight, None)
    grad = gemms.new_logits_buffer(rows, vocab, logits)  # the buffer path's, rewritten into G on every call
    dx = torch.empty(rows, hidden, device=device, dtype=dtype)

    def row_grads():  # (on G itself from the second call on: the same reads, writes and exps)
        kernels.row_grads(grad, *ids, **sizes)

    def cublas_dx():
        gemms.grads_times_head(gemms.with_padding(grad), head, dx)

    def buffer_dx():
        row_grads()
        cublas_dx()

    gemms.with_padding(grad).copy_(gemms.with_padding(logits))
    kernels.row_grads(grad, *ids, **sizes)
    cublas_dx()
    checked = min(rows, CHECKED_ROWS)
    exact = _float64_dx(logits, weight, ids, sizes, checked)
    rel_err = lambda got: ((got[:checked].double() - exact).norm() / exact.norm()).item()
    row["buffer_dx_rel_err"] = rel_err(dx)
    calls = {"cublas_dx": cublas_dx, "row_grads": row_grads, "buffer_dx": buffer_dx}
    if gluon:
        gluon_out = torch.empty(rows, hidden, device=device, dtype=dtype)

        def gluon_dx():
            gluon_dx_call(logits, weight, ids, sizes, gluon_out)

        try:
            gluon_dx()
            first = gluon_out.clone()
            gluon_dx()
        except Exception as exc:  # the buffer paths are still timed
            row["status"], row["error"] = "error", f"{type(exc).__name__}: {exc}"
        else:
            row["gluon_dx_rel_err"] = rel_err(gluon_out)
            row["bitwise_repeatable"] = torch.equal(first, gluon_out)
            calls["gluon_dx"] = gluon_dx
    for path, measured in time_interleaved(calls, device, warmup, reps).items():
        row[f"{path}_ms"], row[f"{path}_min_ms"], row[f"{path}_max_ms"], row["reps"] = time_summary(measured)
