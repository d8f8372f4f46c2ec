"""One call of the chunked loss as data flow: the row order, the blocks of logits, and the step functions.

How one block of C token rows is processed (G is dL/dlogits, P the softmax, X the block's hidden rows):

1. ``logits = X @ W.T (+ bias)`` into a C×V buffer (cuBLAS), whose rows are a multiple of 16 columns wide; at
   an odd vocabulary each GEMM over the buffer's columns is two (``gemms.gemm_head``): W's first rows, a multiple
   of 16, and a 16-row copy of the rest with zero rows up to the buffer's width, so that every load is aligned.
   (The padding columns hold zeros, which stay zeros through steps 2 to 4.)
2. ``row_stats_kernel`` reads it once: log-sum-exp, target log-probs and logit sums per row. None of
   this depends on the other sequence of the pair.
3. ``pair_terms_kernel``, once every row of the chunk's pairs has its log-prob: each sequence's mean
   log-prob, the odds ratio, and per token ``a = dL/dlogp`` of the odds-ratio target and ``b`` of the
   NLL target, so that ``G = a·onehot(y) + b·onehot(y') - (a + b)·P``.
4. ``row_grads_kernel`` rewrites the buffer in place into G (one read, one write), its two target
   columns from the float32 log-probs so that nothing cancels when p ≈ 1.
5. ``dX = G @ W`` and ``dW += G.T @ X``: the GEMMs see the gradient exactly as the materialising
   baseline would, rounded once to the input dtype. Both take G's rows with their padding columns, so that
   every dimension is aligned: dW's sum then has a zero row per padding column, left out at the end.

After the last block, ``call_terms_kernel`` forms the loss and the metrics vector in one launch.

A pair longer than a chunk is split into blocks (``schedule.plan_passes`` decides how). In one pass,
where every token the odds ratio counts has its target id as NLL id (or there is no NLL term), G = c·U
on each sequence's response rows, with U = d log p(y) / dlogits = onehot(y) - P and one coefficient c
per sequence (a, plus b on the chosen one). Each such block goes through steps 1, 2 and 4 with c = 1, and
its GEMMs at once, into the pair's sums: Q = U·W in float32 for its rows and, per sequence, Σ Uᵀ·X and Σ U.
The chosen sequence's NLL-only rows (TRL's prompt: the odds ratio ignores them), which come before its
response rows, have G = b·(onehot(y') - P) with b = -1/N known before any GEMM: their blocks go through
steps 1, 2, 4 and 5 at once, into the call's sums. At the pair's end step 3 gives the two coefficients,
and dX = c·Q (rounded once), dW += c_c·Σ_c + c_r·Σ_r. Otherwise the pair takes two passes: steps 1 and 2
for every block, then 3, then each block's logits again for 4 and 5.

Without gradients on an H200 (``schedule.statistics_in_gemm``), steps 1 and 2 are one Gluon kernel
(``kernels.gluon_row_stats``) that reduces each tile of logits inside the GEMM: there is no buffer.

When every row fits in one block (``schedule.single_block``, decided from shapes) and there are more rows
than ``schedule.early_rows`` (``schedule.overlaps_read_backs``), the logits of that many first rows are
queued before the label counts are read back (``driver.early_logits``): the block's rows begin with them
whatever the counts turn out to be, so the GPU works while the host reads the counts and plans. This holds
with or without gradients, but not where a call without them may take its statistics from inside the GEMM.

``driver.forward`` returns the loss terms and what backward needs. With several blocks, that is the unscaled
sums dX, dW and dbias, which ``backward.backward_from_sums`` multiplies by the upstream gradient into new
tensors. With one block it is G itself: ``backward.backward_from_logit_grads`` runs step 5, dW with the
upstream gradient as the GEMM's scale factor and dX (where the block overlaps its read-backs) in float32
scaled on the device, so every gradient is rounded once. Either way the saved tensors are only read, so a
second backward through a retained graph gives the same gradients again.

The modules, in the order data flows through them:

* ``planning`` — the call's options, its dtypes, and the plan made before the first GEMM: which rows go
  through the buffer together, in which order, in how many passes.
* ``gemms`` — the logits buffer and the GEMMs over its columns (``Head``): logits, G·W, Gᵀ·X.
* ``steps`` — one block's steps (its logits, row statistics, rewrite into G, gradient GEMMs) on the
  per-token statistics and the gradient sums of the call (``Call``).
* ``passes`` — a chunk group's schedule: statistics only, two passes, or one pass with the pair's sums.
* ``dropped`` — the logit sums of the tokens no target needs, which the logit-mean metrics count.
* ``driver`` — ``forward``: the plan, the first logits (early, before the counts, where that pays), every
  group's passes, the loss terms.
* ``backward`` — the gradients from what forward saved, times the upstream gradient.

Functions are called through their module (``gemms.linear_into``), so that a call names where a step lives;
the data types are imported by name.
"""
