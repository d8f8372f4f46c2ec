"""The ``grad_gemm`` sweep of the benchmark harness: dX = G·W and dW = Gᵀ·X with G formed inside the GEMMs
(``kernels.gluon_grad_gemm``) against the buffer path the loss runs today, at shapes of its own.

Per (rows, hidden, vocab), on one logits buffer of that many rows, timed interleaved (``timing.time_interleaved``):

* ``cublas_dx``, ``cublas_dw`` — cuBLAS's dX GEMM (bf16 out) and dW GEMM (float32 out, as the loss sums dW) over a
  buffer that already holds G: the floor of each;
* ``row_grads`` — the pass that rewrites the buffer into G (one read and one write of it);
* ``buffer`` — the three, as the loss runs them;
* ``gluon_dx``, ``gluon_dw`` — the Gluon GEMMs that form G from the logits as they load them, each with the per-row
  coefficients (``row_grads.grad_coefficients``) it needs;
* ``gluon`` — the coefficients once, then both.

The accuracy check runs every path on the shape's first ``CHECKED_ROWS`` rows against float64 (relative Frobenius
errors of dX and dW), and each Gluon GEMM against a second run of itself (``bitwise_repeatable``). Every token
counts, its odds-ratio target its NLL target, a tenth of the rows with p ≈ 1 at the target. Each GEMM is
2·rows·vocab·hidden FLOPs (``flops``); ``buffer_bytes`` is what row_grads reads and writes.
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
GRAD_GEMM_PATHS = ("cublas_dx", "cublas_dw", "row_grads", "buffer", "gluon_dx", "gluon_dw", "gluon")
CHECKED_ROWS = 512  # of each shape, against float64


def gluon_supported(device, dtype) -> bool:
    """Whether the Gluon GEMMs run here: compiled kernels on a Hopper GPU (capability 9.0: wgmma and TMA) with bf16
    or fp16 operands."""
    return (device.type == "cuda" and not INTERPRET and torch.cuda.get_device_capability(device) == (9, 0)
            and dtype in (torch.bfloat16, torch.float16))


def gluon_calls(logits, weight, x, ids, sizes, dx, dw) -> dict:
    """The Gluon paths (gluon_dx, gluon_dw, gluon) as calls: dX into ``dx``, dW into ``dw``, each forming G as it loads the
    logits; ``ids``: target, NLL target, token, logp, nll_logp, lse, seq_coef; ``sizes``: nll_tokens, seq_len."""
    from ..kernels.gluon_grad_gemm import grad_t_times_hidden, grad_times_weight  # Gluon: only where it runs

    def gluon_dx():
        grad_times_weight(logits, weight, *grad_coefficients(*ids, **sizes), dx)

    def gluon_dw():
        grad_t_times_hidden(logits, x, *grad_coefficients(*ids, **sizes), dw)

    def gluon():
        coefficients, columns = grad_coefficients(*ids, **sizes)
        grad_times_weight(logits, weight, coefficients, columns, dx)
        grad_t_times_hidden(logits, x, coefficients, columns, dw)

    return {"gluon_dx": gluon_dx, "gluon_dw": gluon_dw, "gluon": gluon}


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
               **{f"{path}_{grad}_rel_err": None for path in ("buffer", "gluon") for grad in ("dx", "dw")},
               "bitwise_repeatable": None}
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
    seq_len = max(rows // 2, 1)
    token = torch.arange(rows, device=device)
    seq_coef = torch.randn(-(-rows // seq_len), device=device, generator=gen)
    stats = torch.zeros(4, rows, device=device)  # logp, nll_logp, logit_sum, lse
    kernels.row_stats(logits, target, target, token, *stats)
    ids = (target, target, token, stats[0], stats[1], stats[3], seq_coef)
    return x, weight, logits, ids, dict(nll_tokens=rows, seq_len=seq_len)


class _Paths:
    """Every path of one shape over the same inputs, writing into buffers of its own."""

    def __init__(self, x, weight, logits, ids, sizes, gluon: bool):
        self.x, self.ids, self.sizes = x, ids, sizes
        self.head = gemms.gemm_head(weight, None)
        self.grad = gemms.new_logits_buffer(*logits.shape, logits)  # the buffer path's, rewritten into G
        gemms.with_padding(self.grad).copy_(gemms.with_padding(logits))
        self.dx = torch.empty(x.shape, device=x.device, dtype=x.dtype)
        self.dw = torch.empty(weight.shape, device=x.device, dtype=torch.float32)
        self.calls = {"cublas_dx": self.cublas_dx, "cublas_dw": self.cublas_dw, "row_grads": self.row_grads,
                      "buffer": self.buffer}
        if gluon:  # (their outputs: a dW of float32 is (V, H), gigabytes at a large vocabulary)
            self.gluon_dx, self.gluon_dw = torch.empty_like(self.dx), torch.empty_like(self.dw)
            self.calls |= gluon_calls(logits, weight, x, ids, sizes, self.gluon_dx, self.gluon_dw)

    def row_grads(self):  # (on G itself from the second call on: the same reads, writes and exps)
        kernels.row_grads(self.grad, *self.ids, **self.sizes)

    def cublas_dx(self):
        gemms.grads_times_head(gemms.with_padding(self.grad), self.head, self.dx)

    def cublas_dw(self):
        gemms.mm_into(self.dw, self.grad.t(), self.x)

    def buffer(self):
        self.row_grads()
        self.cublas_dx()
        self.cublas_dw()


def _float64_grads(logits, weight, x, ids, sizes):
    """dX and dW in float64 (the statistics recomputed in float64)."""
    target, nll_target, token, _, _, _, seq_coef = ids
    grad = logits.double()
    stats = torch.zeros(4, logits.shape[0], device=logits.device, dtype=torch.float64)
    kernels.row_stats(grad, target, nll_target, token, *stats)
    kernels.row_grads(grad, target, nll_target, token, stats[0], stats[1], stats[3], seq_coef.double(), **sizes)
    return grad @ weight.double(), grad.t() @ x.double()


def _check(row, x, weight, logits, ids, sizes, gluon: bool) -> None:
    """Every path on the shape's first CHECKED_ROWS rows against float64, into ``row``."""
    checked = min(logits.shape[0], CHECKED_ROWS)
    sub = [t[:checked] if t.dim() and t.shape[0] == logits.shape[0] else t for t in (x, logits, *ids)]
    x_sub, logits_sub, ids_sub = sub[0], sub[1], tuple(sub[2:])
    exact = _float64_grads(logits_sub, weight, x_sub, ids_sub, sizes)
    rel_err = lambda got, ref: ((got.double() - ref).norm() / ref.norm()).item()
    paths = _Paths(x_sub, weight, logits_sub, ids_sub, sizes, gluon)
    paths.buffer()
    row["buffer_dx_rel_err"], row["buffer_dw_rel_err"] = rel_err(paths.dx, exact[0]), rel_err(paths.dw, exact[1])
    if not gluon:
        return
    paths.calls["gluon"]()
    first = paths.gluon_dx.clone(), paths.gluon_dw.clone()
    paths.calls["gluon"]()
    row["gluon_dx_rel_err"], row["gluon_dw_rel_err"] = (rel_err(paths.gluon_dx, exact[0]),
                                                        rel_err(paths.gluon_dw, exact[1]))
    row["bitwise_repeatable"] = torch.equal(first[0], paths.gluon_dx) and torch.equal(first[1], paths.gluon_dw)


def _time_paths(row, device, dtype, gluon, *, warmup, reps) -> None:
    x, weight, logits, ids, sizes = _problem(row["rows"], row["hidden"], row["vocab"], device, dtype)
    try:
        _check(row, x, weight, logits, ids, sizes, gluon)
    except Exception as exc:  # the buffer paths are still timed
        if not gluon or row["buffer_dw_rel_err"] is None:
            raise
        row["status"], row["error"], gluon = "error", f"{type(exc).__name__}: {exc}", False
    paths = _Paths(x, weight, logits, ids, sizes, gluon)
    for path, measured in time_interleaved(paths.calls, device, warmup, reps).items():
        row[f"{path}_ms"], row[f"{path}_min_ms"], row[f"{path}_max_ms"], row["reps"] = time_summary(measured)
