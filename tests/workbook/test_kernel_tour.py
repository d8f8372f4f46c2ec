"""The kernel notebook's helpers: the chunk plan it draws is the loss's own, and its references are exact."""

import pytest
import torch

from orpo_lib import schedule
from orpo_lib.chunked import planning as chunked  # (Options, make_plan)
from orpo_lib.validation import count_tokens
from orpo_lib.workbook import kernel_tour, memory, plots


@pytest.mark.parametrize("batch,seq,chunk_rows", [(2, 7, 5), (4, 7, 14), (6, 7, 5), (4, 7, 0), (8, 3, 9)])
def test_chunk_plan_is_the_plan_the_loss_makes(batch, seq, chunk_rows):
    target = torch.randint(0, 50, (batch, seq), generator=torch.Generator().manual_seed(batch))
    counts = count_tokens(target, None, 50, -100, True)
    opts = chunked.Options(0.1, True, chunk_rows or None, True, True, True, True, single_block=False)
    loss_plan = chunked.make_plan(torch.zeros(batch, seq, 16), 50, counts, opts)
    plan = kernel_tour.chunk_plan(batch, seq, chunk_rows, hidden=16, vocab=50, dtype_bytes=4)
    assert plan.groups == loss_plan.groups and plan.buffer_rows == loss_plan.buffer_rows


@pytest.mark.parametrize("batch,seq,chunk_rows", [(16, 4096, 0), (8, 3072, 4096), (2, 32768, 0), (16, 1024, 1024), (4, 100, 0)])
def test_chunk_plan_agrees_with_the_memory_model(batch, seq, chunk_rows):
    plan = kernel_tour.chunk_plan(batch, seq, chunk_rows)
    model = memory.chunking(batch, seq, chunk_rows or None, 128256, hidden=4096)
    assert (plan.blocks, plan.buffer_rows) == (model.count, model.rows)
    kind = "one pass, per sequence" if model.one_pass else "two passes" if model.passes == 2 else "one pass"
    assert {kernel_tour.group_pass(g) for g in plan.groups} == {kind}


def test_group_pass_names_a_style_for_every_kind():
    one, two = schedule.ChunkGroup(0, 1, [(0, 8)]), schedule.ChunkGroup(0, 1, [(0, 4), (4, 8)])
    per_sequence = schedule.ChunkGroup(0, 1, [(0, 4), (4, 8)], rejected_start=4)
    kinds = [kernel_tour.group_pass(g) for g in (one, two, per_sequence)]
    assert kinds == ["one pass", "two passes", "one pass, per sequence"]
    assert set(plots.PASS_STYLE) == set(kinds)


def test_references_are_exact_where_torch_cancels():
    toy = kernel_tour.toy_rows(rows=3, vocab=64, seed=1)
    exact = kernel_tour.precise_log_probs(toy.logits, toy.target)
    # away from p ≈ 1 the exact form and float64 log_softmax agree to rounding
    assert torch.allclose(exact[1:], kernel_tour.log_softmax_log_probs(toy.logits, toy.target)[1:], rtol=1e-12)
    # at p ≈ 1, log p ≈ -(1 - p): the sum of the other probabilities, computed directly
    z = toy.logits[0].double()
    others = torch.exp(z - z[toy.target[0]]).sum() - 1
    assert exact[0].item() == pytest.approx(-others.item(), rel=1e-9)
    grads = kernel_tour.autograd_row_grads(toy)
    target_grads = grads.gather(1, toy.target.long()[:, None])[:, 0]
    assert torch.allclose(kernel_tour.precise_target_grads(toy)[1:], target_grads[1:], rtol=1e-10)


def test_library_kernels_on_toy_rows_match():
    toy = kernel_tour.toy_rows(rows=4, vocab=300, seed=2)
    stats = kernel_tour.library_row_stats(toy)
    assert kernel_tour.max_rel_error(stats["logp"], kernel_tour.precise_log_probs(toy.logits, toy.target)) < 1e-5
    grads = kernel_tour.library_row_grads(toy, stats)
    assert kernel_tour.max_error_over_largest(grads, kernel_tour.autograd_row_grads(toy)) < 1e-6


def test_kernel_sources_and_launches():
    sources = kernel_tour.kernel_sources()
    assert set(sources) == {"row_stats_kernel", "log_probs", "row_grads_kernel", "target_columns"}
    assert all(text.startswith("@triton.jit") for text in sources.values())
    launches = {row["kernel"]: row for row in kernel_tour.launch_rows(4096, 128256)}
    assert launches["row_stats_kernel"]["BLOCK_V"] == 1024 and launches["row_grads_kernel"]["BLOCK_V"] == 8192
    assert launches["row_stats_kernel"]["loop_steps"] == 126  # 125 whole blocks and a partial one
