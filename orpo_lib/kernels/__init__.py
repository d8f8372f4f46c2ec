"""The Triton kernels of the chunked loss, one module per role, in the order a call runs them:

* ``labels`` — ``label_stats_kernel``: checks the labels, counts each sequence's tokens (and what keeps
  its pair from one pass), writes the int32 target ids and the kept tokens' indices in pair order, or token
  order for a single block (one program per sequence, before any GEMM and before the read-back).
* ``row_stats`` — ``row_stats_kernel``: a chunk's log-sum-exp, target log-probs and logit sums
  (one program per row, one read of the logits).
* ``pair_terms`` — ``pair_terms_kernel``: each pair's odds ratio and every token's dL/dlogp
  (one program per pair); ``call_terms_kernel``: the loss and the metrics, at the end (one program).
* ``row_grads`` — ``row_grads_kernel``: the chunk rewritten in place into dL/dlogits (one program
  per row, one read and one write); in the one-pass schedule a response row into d log p / dlogits,
  not yet scaled. ``grad_coefficients_kernel``: per row, what a GEMM that forms dL/dlogits as it loads
  the logits needs instead (``gluon_grad_gemm``).
* ``pair_sums`` — ``pair_sum_kernel``: a one-pass pair's per-sequence dW sums, each times its sequence's
  coefficient, added up (one pass over V×H).
* ``dropped_sums`` — ``dropped_row_sums_kernel``: per half, the sum of the rows of hidden that no target
  needs, whose logits' sum the logit-mean metrics count (one program per half and column block).
* ``scaling`` — ``scale_kernel``: backward's upstream gradient applied to the summed gradients, and a
  one-pass pair's dX rows scaled by their sequence's coefficient.

``numerics`` holds the precise device math they share, ``row_layout`` how a row kernel addresses a chunk,
``offline_compile`` how the CPU tests compile a Gluon kernel for sm_90a without a GPU.
The Gluon modules for Hopper are not imported here (their import needs triton's Gluon): ``gluon_pipeline``, the
warp-specialised pipeline (TMA producer, MMA warpgroups) the two kernels share; ``gluon_gemm``, a plain
C = A·Bᵀ on it; ``gluon_row_stats``, the logits GEMM with the row statistics in its epilogue, which calls
without gradients use on an H200 (``schedule.statistics_in_gemm``); and ``gluon_grad_gemm``, dX = G·W and dW = Gᵀ·X with
G formed from the logits inside the GEMMs (measured by the benchmark's ``grad_gemm`` sweep, not yet used by the loss).
Each module pairs its ``@triton.jit`` kernel with a host function that checks shapes and launches it.
"""

from .dropped_sums import dropped_row_sums
from .labels import LABEL_STATS, label_stats
from .pair_sums import pair_sum
from .pair_terms import call_terms, pair_terms
from .row_grads import GRADS_LAUNCH, row_grads, row_logp_grads
from .row_layout import RowLaunch
from .row_stats import STATS_LAUNCH, row_stats
from .scaling import scale

__all__ = ["GRADS_LAUNCH", "LABEL_STATS", "RowLaunch", "STATS_LAUNCH", "call_terms", "dropped_row_sums", "label_stats",
           "pair_sum", "pair_terms", "row_grads", "row_logp_grads", "row_stats", "scale"]
