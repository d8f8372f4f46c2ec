"""The one-pass schedule of a pair longer than a chunk: the schedule's choice, and the loss, metrics and every
gradient against the float64 reference when pairs are split into several blocks."""

import pytest
import torch

import orpo_lib
from orpo_lib import schedule
from orpo_lib.causal_lm import orpo_targets
from conftest import (make_problem, plan_of, reference_with_grads, rel_err, run_with_grads, split_passes,
                      with_trl_labels)
from test_loss import TOLERANCE, assert_matches_reference

H, V = 48, 517
REFERENCE_OPTIONS = ("beta", "compute_nll_loss")  # the others choose how the fused loss computes, not what


@pytest.fixture
def logit_rows(monkeypatch):
    """Let at most ``rows`` rows of the problem's logits exist at once under the automatic chunk size (the
    one-pass schedule is the automatic one's: a chunk size given bounds the memory, and takes two passes)."""
    def limit(problem, rows):
        weight = problem["weight"]
        monkeypatch.setattr(schedule, "LOGITS_BUDGET_BYTES", rows * weight.shape[0] * weight.element_size())
    return limit


def check(problem, tol=TOLERANCE[torch.float32], upstream=1.0, **options):
    ref, ref_grads = reference_with_grads(problem, **{k: v for k, v in options.items() if k in REFERENCE_OPTIONS})
    out, grads = run_with_grads(orpo_lib.fused_linear_orpo_loss, problem, upstream=upstream, **options)
    assert_matches_reference(out, {k: g / upstream for k, g in grads.items()}, ref, ref_grads, tol)
    return out, grads


def assert_second_backward_adds_the_same(problem):
    """A second backward through the retained graph adds exactly the first one's gradients again."""
    leaves = [problem[k].clone().requires_grad_() for k in ("hidden", "weight", "bias")]
    loss = orpo_lib.fused_linear_orpo_loss(*leaves[:2], problem["target"], leaves[2],
                                           nll_target=problem["nll_target"]).loss
    (loss * 0.5).backward(retain_graph=True)
    first = [leaf.grad.clone() for leaf in leaves]
    (loss * 0.5).backward()
    for leaf, grad in zip(leaves, first):
        assert torch.equal(leaf.grad, 2 * grad)


# ---- the schedule -------------------------------------------------------------------------------

def test_eligible_pairs_are_those_without_one_pass_blockers():
    # per sequence, chosen then rejected: pair 1's chosen sequence has 3 blockers (labels.py counts them)
    assert schedule.eligible_pairs([0, 3, 0, 0]) == [True, False]
    assert schedule.eligible_pairs([0, 0]) == [True]


def test_one_pass_bytes_count_the_sums_and_the_dx_rows():
    """At 2×32768, H = 4096, V = 128256: two float32 V×H dW sums, two V dbias sums and 65536 float32 dX rows."""
    size, vocab, rows = 4096, 128256, 65536
    full = schedule.one_pass_bytes(rows, size, vocab, nll_only_rows=0, sum_itemsize=4, stats_itemsize=4,
                                   grad_hidden=True, grad_weight=True, grad_bias=True)
    assert full == 2 * vocab * size * 4 + 2 * vocab * 4 + rows * size * 4
    assert schedule.one_pass_bytes(rows, size, vocab, nll_only_rows=0, sum_itemsize=2, stats_itemsize=4,
                                   grad_hidden=False, grad_weight=True, grad_bias=False) == 2 * vocab * size * 2


def test_one_pass_bytes_at_an_odd_vocabulary():
    """The dW sums have a row per column of the buffer (128257 → 128272), the dbias sums one per token id."""
    size, vocab, rows = 4096, 128257, 65536
    full = schedule.one_pass_bytes(rows, size, vocab, nll_only_rows=0, sum_itemsize=4, stats_itemsize=4,
                                   grad_hidden=True, grad_weight=True, grad_bias=True)
    assert full == 2 * 128272 * size * 4 + 2 * vocab * 4 + rows * size * 4


def test_one_pass_bytes_with_nll_only_rows():
    """A prompt of 1000 NLL-only rows: their dX rows are final (no float32 staging), and the call's own dW
    and dbias sums, which they add to before the pair's end, are counted as a third V×H and V sum."""
    size, vocab, rows, prompt = 4096, 128256, 65536, 1000
    trl = schedule.one_pass_bytes(rows, size, vocab, nll_only_rows=prompt, sum_itemsize=4, stats_itemsize=4,
                                  grad_hidden=True, grad_weight=True, grad_bias=True)
    assert trl == 3 * vocab * size * 4 + 3 * vocab * 4 + (rows - prompt) * size * 4


def test_choose_one_pass_by_eligibility_and_budget():
    assert schedule.choose_one_pass([True, False, True], [10, 10, 11], budget=10) == [True, False, False]
    assert schedule.one_pass_budget(None, torch.device("cpu")) == schedule.ONE_PASS_BUDGET_BYTES
    assert schedule.one_pass_budget(1024, torch.device("cpu")) == 0  # a chunk size given bounds the memory


def test_one_pass_blocks_stay_within_one_sequence():
    groups = schedule.plan_chunks([3, 20, 4], chunk_rows=8)
    assert [g.blocks for g in groups] == [[(0, 3)], [(3, 10), (10, 17), (17, 23)], [(23, 27)]]
    # pair 1: 11 chosen rows [3, 14) and 9 rejected rows [14, 23), each in blocks of at most 8
    planned = schedule.plan_passes(groups, chosen_rows=[2, 11, 2], nll_only_rows=[0, 0, 0], one_pass=[True] * 3,
                                   block_rows=8)
    assert planned[1] == schedule.ChunkGroup(1, 2, [(3, 9), (9, 14), (14, 19), (19, 23)], rejected_start=14,
                                             response_start=3)
    assert planned[0] == groups[0] and planned[2] == groups[2]  # a whole pair in one block is left as it is
    assert [g.one_pass for g in planned] == [False, True, False]
    two_pass = schedule.plan_passes(groups, chosen_rows=[2, 11, 2], nll_only_rows=[0, 0, 0],
                                    one_pass=[True, False, True], block_rows=8)
    assert two_pass == groups and not two_pass[1].one_pass


def test_one_pass_block_rows():
    assert schedule.one_pass_block_rows(33487) == schedule.ONE_PASS_BLOCK_ROWS == 8192
    assert schedule.one_pass_block_rows(4096) == 4096


@pytest.mark.parametrize("nll,compute_nll_loss,passes", [
    ("same", True, [1, 1]),
    ("differs", True, [2, 2]),  # the NLL term's own target: two passes
    ("differs", False, [1, 1]),  # without the NLL term its target does not matter
    ("differs in pair 1", True, [1, 2]),
])
def test_plan_chooses_the_pass_per_pair(logit_rows, nll, compute_nll_loss, passes):
    problem = make_problem(4, 9, H, V, with_nll_target=nll != "same", seed=20)
    logit_rows(problem, 6)
    if nll == "differs in pair 1":
        problem["nll_target"][0] = problem["target"][0]  # pair 0's chosen sequence: NLL ids = target ids
    plan = plan_of(problem, compute_nll_loss=compute_nll_loss)
    assert split_passes(plan) == passes
    check(problem, compute_nll_loss=compute_nll_loss)


def test_budget_too_small_takes_two_passes(logit_rows, monkeypatch):
    problem = make_problem(4, 9, H, V, with_bias=True, seed=21)
    logit_rows(problem, 6)
    assert split_passes(plan_of(problem)) == [1, 1]
    monkeypatch.setattr(schedule, "ONE_PASS_BUDGET_BYTES", 0)
    assert split_passes(plan_of(problem)) == [2, 2]
    check(problem)


# ---- the loss and its gradients -----------------------------------------------------------------

@pytest.mark.parametrize("batch,seq,chunk_size", [
    (2, 13, 5),  # one pair: dW made in place of the chosen sequence's sum
    (4, 11, 6),  # two long pairs: the second adds to the first's dW
    (6, 7, 4),  # three
])
@pytest.mark.parametrize("with_bias", [False, True])
@pytest.mark.parametrize("ignored_fraction", [0.0, 0.3])  # token order; pair order without the dropped rows
def test_split_pairs_match_reference(logit_rows, batch, seq, chunk_size, with_bias, ignored_fraction):
    problem = make_problem(batch, seq, H, V, with_bias=with_bias, ignored_fraction=ignored_fraction,
                           seed=batch * seq + chunk_size)
    logit_rows(problem, chunk_size)
    plan = plan_of(problem)
    assert split_passes(plan) == [1] * (batch // 2)
    assert plan.token_order == (ignored_fraction == 0.0 and batch == 2)
    check(problem)


@pytest.mark.parametrize("long_pairs_first", [True, False])
def test_one_pass_pairs_next_to_whole_pairs(logit_rows, long_pairs_first):
    """Pairs that fit a chunk (one block, one pass of the usual kind) and pairs split in one pass, in either order,
    all adding to one dW, dbias and dX."""
    problem = make_problem(6, 12, H, V, with_bias=True, ignored_fraction=0.0, seed=22)
    logit_rows(problem, 10)
    short = [0] if long_pairs_first else [2]
    for pair in short:
        problem["target"][[pair, pair + 3], 3:] = -100
    plan = plan_of(problem)
    passes = [(g.first_pair, g.one_pass) for g in plan.groups]
    assert sorted(passes) == sorted([(p, p not in short) for p in range(3)])
    check(problem)


@pytest.mark.parametrize("options", [
    dict(compute_nll_loss=False),
    dict(fp32_weight_grad=False),
    dict(beta=0.7),
])
def test_options_in_one_pass(logit_rows, options):
    problem = make_problem(4, 9, H, V, with_bias=True, seed=23)
    logit_rows(problem, 5)
    assert split_passes(plan_of(problem, compute_nll_loss=options.get("compute_nll_loss", True))) == [1, 1]
    out, _ = check(problem, **options)
    if options.get("compute_nll_loss") is False:
        assert out.nll_loss.item() == 0.0


def test_upstream_gradient_and_second_backward(logit_rows):
    problem = make_problem(4, 9, H, V, with_bias=True, seed=24)
    logit_rows(problem, 5)
    check(problem, upstream=-2.5)
    assert_second_backward_adds_the_same(problem)


def test_deterministic_in_one_pass(logit_rows):
    problem = make_problem(4, 9, H, V, with_bias=True, ignored_fraction=0.3, seed=25)
    logit_rows(problem, 5)
    first_out, first = run_with_grads(orpo_lib.fused_linear_orpo_loss, problem)
    second_out, second = run_with_grads(orpo_lib.fused_linear_orpo_loss, problem)
    assert torch.equal(first_out.loss, second_out.loss)
    for name in first:
        assert torch.equal(first[name], second[name]), name


def test_float64_in_one_pass(logit_rows):
    problem = make_problem(4, 7, H, V, dtype=torch.float64, with_bias=True, seed=26)
    logit_rows(problem, 5)
    assert split_passes(plan_of(problem)) == [1, 1]
    out, grads = check(problem, tol=1e-10)
    assert grads["weight"].dtype == torch.float64


def test_gradcheck_in_one_pass(logit_rows):
    problem = make_problem(2, 5, 6, 11, dtype=torch.float64, with_bias=True, seed=27)
    logit_rows(problem, 3)
    assert split_passes(plan_of(problem)) == [1]
    inputs = tuple(problem[k].clone().requires_grad_() for k in ("hidden", "weight", "bias"))

    def loss(hidden, weight, bias):
        return orpo_lib.fused_linear_orpo_loss(hidden, weight, problem["target"], bias, beta=0.5).loss
    assert torch.autograd.gradcheck(loss, inputs, eps=1e-6, atol=1e-7, rtol=1e-5, fast_mode=True)


# The interpreter rounds float16 stores to nearest, as the GPU does, but truncates bfloat16 ones (the
# fused loss's stores, not the baseline's torch casts): one pass must then be within that truncation's cost.
BASELINE_FACTOR = {torch.float16: 1.25, torch.bfloat16: 2.0}


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("ignored_fraction", [0.0, 0.3])
def test_half_precision_as_accurate_as_the_baseline(logit_rows, dtype, ignored_fraction):
    """Half-precision inputs: one pass is as close to float64 as the materialising baseline."""
    problem = make_problem(2, 16, 64, 1031, dtype=dtype, with_bias=True, ignored_fraction=ignored_fraction,
                           logit_scale=3.0, seed=28)
    logit_rows(problem, 6)
    assert split_passes(plan_of(problem)) == [1]
    ref, ref_grads = reference_with_grads(problem)
    errors = {}
    for name, fn, options in (("one pass", orpo_lib.fused_linear_orpo_loss, {}),
                              ("baseline", orpo_lib.orpo_loss_baseline, {})):
        out, grads = run_with_grads(fn, problem, **options)
        errors[name] = {"loss": rel_err(out.loss.detach(), ref["loss"].detach()),
                        **{k: rel_err(g, ref_grads[k]) for k, g in grads.items()}}
    for key, err in errors["one pass"].items():
        assert err < TOLERANCE[dtype], (key, errors)
        assert err <= BASELINE_FACTOR[dtype] * errors["baseline"][key], (key, errors)


def test_a_chunk_size_given_takes_two_passes(logit_rows):
    """A chunk size is a bound on the call's memory: the one-pass sums would exceed it, so long pairs take two
    passes there, with the same results."""
    problem = make_problem(4, 9, H, V, with_bias=True, seed=29)
    assert split_passes(plan_of(problem, 6)) == [2, 2]
    check(problem, chunk_size=6)
    logit_rows(problem, 6)
    assert split_passes(plan_of(problem)) == [1, 1]


# ---- TRL's labels: the NLL on prompt and response, the odds ratio on the response ---------------

def block_kinds(group):
    """Each block of a one-pass group as 'nll only', 'chosen' or 'rejected'; none may straddle two."""
    kinds = []
    for start, end in group.blocks:
        if end <= group.response_start:
            kinds.append("nll only")
        elif group.response_start <= start and end <= group.rejected_start:
            kinds.append("chosen")
        else:
            assert start >= group.rejected_start, (start, end, group)
            kinds.append("rejected")
    return kinds


def test_one_pass_blocks_with_nll_only_rows():
    groups = schedule.plan_chunks([3, 20], chunk_rows=8)
    # pair 1: 13 chosen rows [3, 16), the first 5 NLL-only, and 7 rejected rows [16, 23), in blocks of at most 4
    planned = schedule.plan_passes(groups, chosen_rows=[2, 13], nll_only_rows=[1, 5], one_pass=[True, True],
                                   block_rows=4)
    assert planned[0] == groups[0]  # a whole pair in one block is left as it is, NLL-only rows or not
    assert planned[1] == schedule.ChunkGroup(1, 2, [(3, 6), (6, 8), (8, 12), (12, 16), (16, 20), (20, 23)],
                                             rejected_start=16, response_start=8)
    assert block_kinds(planned[1]) == ["nll only"] * 2 + ["chosen"] * 2 + ["rejected"] * 2


def test_trl_labels_at_long_context_fit_one_pass():
    """2×32768, H = 4096, V = 128256, a 1024-token prompt: the pair's sums fit the one-pass budget, and at its
    end the buffer, three float32 V×H sums, the response's float32 dX rows, dX, its staged response rows
    (pair order: the rejected prompt is dropped), a block of gathered rows and the per-token state stay
    under 12 GiB (7.37 GiB without the prompt)."""
    size, vocab, seq, prompt = 4096, 128256, 32768, 1024
    rows = 2 * seq - prompt  # the rejected sequence's prompt counts for neither target
    sums = schedule.one_pass_bytes(rows, size, vocab, nll_only_rows=prompt, sum_itemsize=4, stats_itemsize=4,
                                   grad_hidden=True, grad_weight=True, grad_bias=False)
    assert schedule.choose_one_pass([True], [sums], schedule.one_pass_budget(None, torch.device("cpu"))) == [True]
    block, tokens = schedule.ONE_PASS_BLOCK_ROWS, 2 * seq
    pair_end = (block * vocab * 2 + sums + tokens * size * 2 + (rows - prompt) * size * 2 + block * size * 2
                + tokens * 32)
    assert pair_end / 2**30 < 12


def trl_problem(batch, seq=12, *, with_bias=True, dtype=torch.float32, seed=30):
    """Chosen prompts of 7 and 3 rows (7: two NLL-only blocks of at most 5 rows), padding at the end."""
    prompt_rows, padding = [7, 3, 4, 5, 2, 6][:batch], [1, 0, 2, 0, 1, 1][:batch]
    return with_trl_labels(make_problem(batch, seq, H, V, dtype=dtype, with_bias=with_bias, seed=seed),
                           prompt_rows, padding, seed=seed)


@pytest.mark.parametrize("batch", [
    2,  # the NLL-only blocks make the call's dW sum, which the pair's end adds to
    4,  # the second pair's NLL-only blocks add to the first pair's dW
])
@pytest.mark.parametrize("with_bias", [False, True])
def test_trl_labels_in_one_pass_match_reference(logit_rows, batch, with_bias):
    problem = trl_problem(batch, with_bias=with_bias)
    logit_rows(problem, 5)
    plan = plan_of(problem)
    assert split_passes(plan) == [1] * (batch // 2)
    assert not plan.token_order  # the rejected prompts and the padding are dropped
    for group, prompt, padding in zip(plan.groups, [7, 3], [1, 0]):
        start = group.blocks[0][0]
        assert (group.response_start - start, group.rejected_start - start) == (prompt, 12 - padding)
        assert block_kinds(group)[:2] == ["nll only", "nll only" if prompt > 5 else "chosen"]
    check(problem)


def test_trl_labels_in_token_order(logit_rows):
    """Every row kept (no padding, a rejected sequence without a prompt): the NLL-only blocks write dX in place."""
    problem = with_trl_labels(make_problem(2, 13, H, V, with_bias=True, seed=31), prompt_rows=[6, 0], padding=[0, 0])
    logit_rows(problem, 4)
    plan = plan_of(problem)
    assert plan.token_order and split_passes(plan) == [1]
    assert block_kinds(plan.groups[0]) == ["nll only"] * 2 + ["chosen"] * 2 + ["rejected"] * 4
    check(problem)


@pytest.mark.parametrize("options", [dict(fp32_weight_grad=False), dict(beta=0.7)])
def test_options_with_trl_labels(logit_rows, options):
    problem = trl_problem(4, seed=32)
    logit_rows(problem, 5)
    assert split_passes(plan_of(problem, fp32_weight_grad=options.get("fp32_weight_grad", True))) == [1, 1]
    check(problem, **options)


def test_trl_labels_upstream_gradient_and_second_backward(logit_rows):
    problem = trl_problem(2, seed=33)
    logit_rows(problem, 5)
    check(problem, upstream=-2.5)
    assert_second_backward_adds_the_same(problem)


def test_trl_labels_float64_and_gradcheck(logit_rows):
    problem = trl_problem(4, seq=9, dtype=torch.float64, seed=34)
    logit_rows(problem, 5)
    assert split_passes(plan_of(problem)) == [1, 1]
    check(problem, tol=1e-10)
    tiny = with_trl_labels(make_problem(2, 6, 6, 11, dtype=torch.float64, with_bias=True, seed=35),
                           prompt_rows=[3, 1], padding=[1, 0], seed=35)
    logit_rows(tiny, 3)
    assert split_passes(plan_of(tiny)) == [1]
    inputs = tuple(tiny[k].clone().requires_grad_() for k in ("hidden", "weight", "bias"))

    def loss(hidden, weight, bias):
        return orpo_lib.fused_linear_orpo_loss(hidden, weight, tiny["target"], bias, beta=0.5,
                                               nll_target=tiny["nll_target"]).loss
    assert torch.autograd.gradcheck(loss, inputs, eps=1e-6, atol=1e-7, rtol=1e-5, fast_mode=True)


@pytest.mark.parametrize("change,passes", [
    ("none", [1, 1]),
    ("NLL-only token after the response starts", [2, 1]),  # the chosen rows interleave NLL-only and response
    ("response token with another NLL id", [2, 1]),
    ("response token the NLL ignores", [2, 1]),
    ("no NLL term", [1, 1]),  # then the prompt rows count for nothing: they are dropped
])
def test_trl_labels_fall_back_to_two_passes(logit_rows, change, passes):
    problem = trl_problem(4, seed=36)
    position = 8  # in pair 0's chosen response: prompt [0, 7), response [7, 11), padding [11, 12)
    if change == "NLL-only token after the response starts":
        problem["target"][0, position + 1] = -100
    elif change == "response token with another NLL id":
        problem["nll_target"][0, position] = (problem["target"][0, position] + 1) % V
    elif change == "response token the NLL ignores":
        problem["nll_target"][0, position] = -100
    compute_nll_loss = change != "no NLL term"
    logit_rows(problem, 5)
    assert split_passes(plan_of(problem, compute_nll_loss=compute_nll_loss)) == passes
    check(problem, compute_nll_loss=compute_nll_loss)


def test_orpo_targets_take_one_pass(logit_rows):
    """causal_lm.orpo_targets on a toy batch (shared prompts, right padding): its labels take one pass."""
    batch, seq = 4, 14
    gen = torch.Generator().manual_seed(37)
    input_ids = torch.randint(0, V, (batch, seq), generator=gen)
    input_ids[2:, :5] = input_ids[:2, :5]  # each pair's prompt: 5 tokens, then the two responses
    attention_mask = torch.ones_like(input_ids)
    attention_mask[1, 11:] = attention_mask[2, 12:] = 0
    labels = torch.where(attention_mask == 1, input_ids, -100)
    labels[:, :5] = -100
    target, nll_target = orpo_targets(input_ids, attention_mask, labels)
    problem = {**make_problem(batch, seq - 1, H, V, with_bias=True, seed=37), "target": target,
               "nll_target": nll_target}
    logit_rows(problem, 8)
    assert split_passes(plan_of(problem)) == [1, 1]
    check(problem)
