"""The fused loss and the baseline against the float64 reference: loss, every metric, every gradient."""

import math

import pytest
import torch

import orpo_lib
from orpo_lib import fused, schedule
from orpo_lib.chunked import driver, dropped, gemms, planning, steps
from orpo_lib.schedule import plan_chunks
from orpo_lib.validation import count_tokens
from conftest import make_problem, reference_with_grads, rel_err, run_with_grads

METRICS = ["nll_loss", "or_loss", "chosen_logps", "rejected_logps", "log_odds_ratio", "log_odds_chosen",
           "chosen_rewards", "rejected_rewards", "reward_accuracy", "reward_margin", "chosen_logits_mean",
           "rejected_logits_mean"]
TOLERANCE = {torch.float32: 2e-5, torch.float16: 1e-2, torch.bfloat16: 4e-2}


def assert_matches_reference(out, grads, ref, ref_grads, tol):
    assert torch.isfinite(out.loss).all()
    assert rel_err(out.loss.detach(), ref["loss"].detach()) < tol
    for name in METRICS:
        assert rel_err(getattr(out, name), ref[name]) < tol or abs(
            getattr(out, name).double().cpu() - ref[name]).max() < tol, name
    for name, grad in ref_grads.items():
        assert grads[name] is not None, name
        assert torch.isfinite(grads[name]).all(), name
        assert rel_err(grads[name], grad) < tol, name


@pytest.mark.parametrize("shape", [(2, 1, 48, 517), (4, 7, 48, 517), (6, 13, 40, 1031)])
@pytest.mark.parametrize("with_bias", [False, True])
def test_fused_matches_reference(shape, with_bias):
    batch, seq, hidden, vocab = shape
    problem = make_problem(batch, seq, hidden, vocab, with_bias=with_bias, seed=sum(shape))
    ref, ref_grads = reference_with_grads(problem)
    out, grads = run_with_grads(orpo_lib.fused_linear_orpo_loss, problem)
    assert_matches_reference(out, grads, ref, ref_grads, TOLERANCE[torch.float32])


@pytest.mark.parametrize("chunk_size", [1, 3, 7, 14, 15, 40, 1000])
def test_chunk_sizes_including_two_pass(chunk_size):
    """Chunks smaller than a pair (14 rows here) take the two-pass schedule; every size gives the same result."""
    problem = make_problem(4, 7, 48, 517, with_nll_target=True, with_bias=True, seed=3)
    ref, ref_grads = reference_with_grads(problem)
    out, grads = run_with_grads(orpo_lib.fused_linear_orpo_loss, problem, chunk_size=chunk_size)
    assert_matches_reference(out, grads, ref, ref_grads, TOLERANCE[torch.float32])


@pytest.mark.parametrize("options", [
    dict(beta=0.5),
    dict(beta=0.0),
    dict(compute_nll_loss=False),
    dict(ignore_index=3),  # an ignore_index that is also a real vocabulary id
])
def test_options(options):
    ignore_index = options.get("ignore_index", -100)
    problem = make_problem(4, 9, 48, 517, with_nll_target=True, ignore_index=ignore_index, seed=11)
    ref, ref_grads = reference_with_grads(problem, **options)
    out, grads = run_with_grads(orpo_lib.fused_linear_orpo_loss, problem, **options)
    assert_matches_reference(out, grads, ref, ref_grads, TOLERANCE[torch.float32])
    if options.get("compute_nll_loss") is False:
        assert out.nll_loss.item() == 0.0


def test_ignore_index_equal_to_a_vocab_id_is_ignored():
    problem = make_problem(2, 5, 48, 517, seed=5, ignored_fraction=0.0)
    problem["target"][:, 0] = 3
    a = orpo_lib.fused_linear_orpo_loss(problem["hidden"], problem["weight"], problem["target"], ignore_index=3)
    dropped = problem["target"].clone()
    dropped[:, 0] = -100
    b = orpo_lib.fused_linear_orpo_loss(problem["hidden"], problem["weight"], dropped)
    assert a.nll_loss.item() == pytest.approx(b.nll_loss.item(), rel=1e-6)
    assert a.loss.item() == pytest.approx(b.loss.item(), rel=1e-6)


def test_heavy_masking_drops_rows_and_keeps_metrics():
    """Most tokens ignored (prompt and padding): compaction must not change the loss, grads or logits means."""
    problem = make_problem(4, 16, 48, 517, ignored_fraction=0.8, with_bias=True, seed=8)
    problem["target"][:, :6] = -100  # a prompt
    ref, ref_grads = reference_with_grads(problem)
    out, grads = run_with_grads(orpo_lib.fused_linear_orpo_loss, problem, chunk_size=9)
    assert_matches_reference(out, grads, ref, ref_grads, TOLERANCE[torch.float32])
    assert (grads["hidden"][:, :6] == 0).all()  # dropped rows get exactly zero gradient


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_low_precision_inputs(dtype):
    problem = make_problem(4, 6, 64, 517, dtype=dtype, with_nll_target=True, seed=21)
    ref, ref_grads = reference_with_grads(problem)
    out, grads = run_with_grads(orpo_lib.fused_linear_orpo_loss, problem)
    assert_matches_reference(out, grads, ref, ref_grads, TOLERANCE[dtype])
    assert grads["hidden"].dtype == dtype and grads["weight"].dtype == dtype


def test_weight_dtype_accumulation_is_an_option(problem):
    ref, ref_grads = reference_with_grads(problem)
    out, grads = run_with_grads(orpo_lib.fused_linear_orpo_loss, problem, chunk_size=5, fp32_weight_grad=False)
    assert_matches_reference(out, grads, ref, ref_grads, TOLERANCE[torch.float32])


def test_upstream_gradient_scales_every_gradient():
    problem = make_problem(4, 7, 48, 517, with_bias=True, seed=4)
    _, ref_grads = reference_with_grads(problem)
    for chunk_size in (None, 5):  # one chunk (scale folded into the GEMMs) and several (scaled at the end)
        _, grads = run_with_grads(orpo_lib.fused_linear_orpo_loss, problem, upstream=-2.5, chunk_size=chunk_size)
        for name, grad in ref_grads.items():
            assert rel_err(grads[name], -2.5 * grad) < 2e-5, (name, chunk_size)


@pytest.mark.parametrize("out_dtype", [torch.float32, torch.float16])
def test_scale_kernel_in_place_and_casting(out_dtype):
    """Backward's upstream scale: one float32 product per element, rounded once to out's dtype, at a size
    that is no multiple of the block."""
    from orpo_lib import kernels

    gen = torch.Generator().manual_seed(5)
    x = torch.randn(10007, generator=gen) * 3
    g = torch.tensor(-0.37)
    out = kernels.scale(x, g, out=torch.empty(10007, dtype=out_dtype))
    assert out.dtype == out_dtype and torch.equal(out, (x * g).to(out_dtype))
    y = x.to(out_dtype, copy=True)
    expected = (y.float() * g).to(out_dtype)
    assert kernels.scale(y, g, out=y) is y and torch.equal(y, expected)
    with pytest.raises(ValueError, match="contiguous"):
        kernels.scale(x[::2], g, out=torch.empty(5004))


@pytest.mark.parametrize("batch,chunk_size,token_order", [
    (2, None, True),  # one block
    (2, 5, True),  # one pair in three blocks (two passes)
    (4, None, True),  # two pairs in one block
    (4, 14, False),  # a group per pair
    (6, 5, False),  # a group per pair, each in three blocks
])
def test_every_token_kept_in_token_or_pair_order(batch, chunk_size, token_order):
    """With no token dropped, one group of every pair reads hidden's rows and writes dX's in place
    (token order); several groups gather and scatter rows in pair order. Same results either way."""
    problem = make_problem(batch, 7, 48, 517, ignored_fraction=0.0, with_bias=True, seed=batch + (chunk_size or 0))
    counts = count_tokens(problem["target"], None, 517, -100, True)
    opts = planning.Options(0.1, True, chunk_size, True, True, True, True, single_block=False)
    assert planning.make_plan(problem["hidden"], 517, counts, opts).token_order == token_order
    ref, ref_grads = reference_with_grads(problem)
    out, grads = run_with_grads(orpo_lib.fused_linear_orpo_loss, problem, upstream=0.75, chunk_size=chunk_size)
    assert_matches_reference(out, {k: g / 0.75 for k, g in grads.items()}, ref, ref_grads, TOLERANCE[torch.float32])
    with torch.no_grad():  # without gradients the chunks need no whole pairs: token order, any chunk size
        eval_out = orpo_lib.fused_linear_orpo_loss(problem["hidden"], problem["weight"], problem["target"],
                                                   problem["bias"], chunk_size=chunk_size)
    assert rel_err(eval_out.loss, ref["loss"].detach()) < TOLERANCE[torch.float32]


@pytest.mark.parametrize("with_grad", [True, False])
@pytest.mark.parametrize("ignored_fraction", [0.0, 0.25])
@pytest.mark.parametrize("early_rows", [5, 10**6])
def test_first_gemm_is_queued_before_the_counts_are_read(monkeypatch, ignored_fraction, early_rows, with_grad):
    """A single block's first logits GEMM (``schedule.early_rows`` rows) is queued before the label counts
    are read back, the rest of its rows after, where there are more rows than early ones
    (``schedule.overlaps_read_backs``); otherwise the counts come first. The per-token outputs are allocated
    after the GEMMs. With gradients or without, dropped tokens or not, the result is the reference's."""
    problem = make_problem(4, 7, 48, 517, ignored_fraction=ignored_fraction, seed=9)
    monkeypatch.setattr(schedule, "early_rows", lambda *args: early_rows)
    events = []
    # (at this odd vocabulary a logits GEMM is two torch.mm: gemms.gemm_head)
    linear = gemms.linear_into
    monkeypatch.setattr(gemms, "linear_into", lambda *args: events.append("mm") or linear(*args))
    read, allocate = fused.read_counts, steps.new_token_stats
    monkeypatch.setattr(fused, "read_counts", lambda *args: events.append("read") or read(*args))
    monkeypatch.setattr(steps, "new_token_stats", lambda *args: events.append("allocate") or allocate(*args))
    ref, ref_grads = reference_with_grads(problem)
    if with_grad:
        out, grads = run_with_grads(orpo_lib.fused_linear_orpo_loss, problem)
        assert_matches_reference(out, grads, ref, ref_grads, TOLERANCE[torch.float32])
    else:
        with torch.no_grad():
            out = orpo_lib.fused_linear_orpo_loss(problem["hidden"], problem["weight"], problem["target"])
        assert_matches_reference(out, {}, ref, {}, TOLERANCE[torch.float32])
    if early_rows == 5:  # the rest after the read-back (with the dropped tokens' sum rows, if any, appended)
        first = ["mm", "read", "mm"]
    else:  # every row would be early: a call bound by the host, which reads the counts back first
        first = ["read", "mm"]
    assert events[:len(first) + 1] == first + ["allocate"] and events.count("allocate") == 1, events


@pytest.mark.parametrize("early_rows, dropped_tokens", [(5, "many"), (1000, "many"), (5, "three")])
def test_dropped_logit_sums_from_the_gemm_or_from_w(monkeypatch, early_rows, dropped_tokens):
    """The logit means count the dropped tokens: from rows appended to a single block's GEMM after the early
    rows, or from W's row sum where there are no early rows (a call with no more rows than them) or the buffer
    has no room for those rows (fewer than four tokens dropped). With a bias, against the reference."""
    if dropped_tokens == "many":
        problem = make_problem(4, 9, 48, 517, ignored_fraction=0.4, with_bias=True, with_nll_target=True, seed=21)
    else:
        problem = make_problem(4, 9, 48, 517, ignored_fraction=0.0, with_bias=True, seed=21)
        problem["target"][:3, 0] = -100
    monkeypatch.setattr(schedule, "early_rows", lambda *args: early_rows)
    from_w, row_sums = [], dropped.dropped_logit_sums
    monkeypatch.setattr(dropped, "dropped_logit_sums", lambda *args: from_w.append(1) or row_sums(*args))
    ref, ref_grads = reference_with_grads(problem)
    out, grads = run_with_grads(orpo_lib.fused_linear_orpo_loss, problem)
    assert_matches_reference(out, grads, ref, ref_grads, TOLERANCE[torch.float32])
    assert len(from_w) == (0 if (early_rows, dropped_tokens) == (5, "many") else 1)


@pytest.mark.parametrize("chunk_size", [None, 6])  # one block, overlapped; several blocks (unaffected)
def test_overlapped_single_block_matches_reference_again_and_again(monkeypatch, chunk_size):
    """The overlapped single block (early rows, the counts' copy, backward's float32 dX scaled on the device)
    with a bias, an NLL target, dropped tokens and an upstream gradient of 0.75 matches the reference, and a
    second backward through the retained graph adds the same gradients again."""
    monkeypatch.setattr(schedule, "early_rows", lambda *args: 7)
    problem = make_problem(4, 9, 48, 517, ignored_fraction=0.3, with_bias=True, with_nll_target=True, seed=33)
    ref, ref_grads = reference_with_grads(problem)
    out, grads = run_with_grads(orpo_lib.fused_linear_orpo_loss, problem, upstream=0.75, chunk_size=chunk_size)
    assert_matches_reference(out, {k: g / 0.75 for k, g in grads.items()}, ref, ref_grads, TOLERANCE[torch.float32])
    hidden = problem["hidden"].clone().requires_grad_()
    loss = orpo_lib.fused_linear_orpo_loss(hidden, problem["weight"], problem["target"], problem["bias"],
                                           nll_target=problem["nll_target"], chunk_size=chunk_size).loss
    loss.backward(retain_graph=True)
    once = hidden.grad.clone()
    loss.backward()
    torch.testing.assert_close(hidden.grad, 2 * once, rtol=0, atol=0)


def test_only_calls_longer_than_the_early_rows_overlap_their_read_backs():
    rows = schedule.early_rows(4096, 128256)
    assert schedule.overlaps_read_backs(rows + 1, 4096, 128256) and not schedule.overlaps_read_backs(rows, 4096, 128256)
    assert not schedule.overlaps_read_backs(2048, 1024, 32000)  # 0.55 ms of GEMMs: bound by the host
    assert schedule.overlaps_read_backs(2048, 4096, 128256)


def test_early_rows_are_about_0_4_ms_of_gemm_in_whole_tiles():
    for (hidden, vocab), rows in {(4096, 128256): 256, (2048, 151936): 512, (1024, 32000): 3840}.items():
        assert schedule.early_rows(hidden, vocab) == rows
        assert 2 * rows * hidden * vocab >= schedule.EARLY_GEMM_FLOPS > 2 * (rows - 256) * hidden * vocab


def test_bad_labels_raise_after_the_early_gemm_and_change_nothing(monkeypatch):
    """The early GEMM runs before the labels are known to be good: a bad label still raises before any
    result exists, with gradients or without, and no gradient is written."""
    monkeypatch.setattr(schedule, "early_rows", lambda *args: 5)
    problem = make_problem(4, 7, 48, 517, seed=4)
    target = problem["target"].clone()
    target[1, 2] = 517
    hidden, weight = problem["hidden"].requires_grad_(), problem["weight"].requires_grad_()
    early = []
    monkeypatch.setattr(driver, "early_logits", lambda *args, _early=driver.early_logits: early.append(1) or _early(*args))
    with pytest.raises(ValueError, match="target holds 1 token id"):
        orpo_lib.fused_linear_orpo_loss(hidden, weight, target).loss.backward()
    assert hidden.grad is None and weight.grad is None
    with torch.no_grad(), pytest.raises(ValueError, match="target holds 1 token id"):
        orpo_lib.fused_linear_orpo_loss(hidden, weight, target)
    assert early == [1, 1]  # both calls queued the early GEMM before the check failed


@pytest.mark.parametrize("vocab", [2, 5, 8, 9])
def test_tiny_vocabularies(vocab):
    """Rows shorter than a row kernel's usual step (and than a slot of row_stats) still match the reference."""
    problem = make_problem(4, 5, 16, vocab, with_nll_target=True, with_bias=True, seed=vocab)
    ref, ref_grads = reference_with_grads(problem)
    out, grads = run_with_grads(orpo_lib.fused_linear_orpo_loss, problem)
    assert_matches_reference(out, grads, ref, ref_grads, TOLERANCE[torch.float32])


def test_non_contiguous_hidden():
    problem = make_problem(4, 7, 48, 517, seed=6)
    ref, ref_grads = reference_with_grads(problem)
    hidden = problem["hidden"].transpose(0, 1).contiguous().transpose(0, 1).requires_grad_()
    assert not hidden.is_contiguous()
    weight = problem["weight"].clone().requires_grad_()
    out = orpo_lib.fused_linear_orpo_loss(hidden, weight, problem["target"])
    out.loss.backward()
    assert rel_err(out.loss.detach(), ref["loss"]) < 2e-5
    assert rel_err(hidden.grad, ref_grads["hidden"]) < 2e-5
    assert rel_err(weight.grad, ref_grads["weight"]) < 2e-5


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_transposed_weight_over_several_chunks(dtype):
    """A (V, H) weight that is the transpose of an (H, V) tensor, with dW summed over several chunks
    (in float32 for fp16, then cast)."""
    problem = make_problem(4, 7, 48, 517, dtype=dtype, seed=8)
    ref, ref_grads = reference_with_grads(problem)
    hidden = problem["hidden"].clone().requires_grad_()
    weight = problem["weight"].t().contiguous().t().requires_grad_()
    assert not weight.is_contiguous()
    out = orpo_lib.fused_linear_orpo_loss(hidden, weight, problem["target"], chunk_size=9)
    out.loss.backward()
    assert weight.grad.dtype == dtype
    assert rel_err(out.loss.detach(), ref["loss"]) < TOLERANCE[dtype]
    assert rel_err(hidden.grad, ref_grads["hidden"]) < TOLERANCE[dtype]
    assert rel_err(weight.grad, ref_grads["weight"]) < TOLERANCE[dtype]


def test_frozen_weight_gets_no_gradient(problem):
    _, ref_grads = reference_with_grads(problem)
    hidden = problem["hidden"].clone().requires_grad_()
    weight = problem["weight"].clone()
    orpo_lib.fused_linear_orpo_loss(hidden, weight, problem["target"]).loss.backward()
    assert weight.grad is None
    assert rel_err(hidden.grad, ref_grads["hidden"]) < 2e-5


def test_no_grad_forward_matches(problem):
    ref, _ = reference_with_grads(problem)
    hidden = problem["hidden"].clone().requires_grad_()
    with torch.no_grad():
        out = orpo_lib.fused_linear_orpo_loss(hidden, problem["weight"], problem["target"], chunk_size=4)
    assert not out.loss.requires_grad
    assert rel_err(out.loss, ref["loss"]) < 2e-5
    assert rel_err(out.chosen_logps, ref["chosen_logps"]) < 2e-5


@pytest.mark.parametrize("chunk_size", [None, 5])  # one block (G kept for backward) and several (sums kept)
def test_second_backward_adds_the_gradients_again(chunk_size):
    """Through a retained graph, each backward gives the same gradients, as autograd does elsewhere."""
    problem = make_problem(4, 7, 48, 517, with_bias=True, with_nll_target=True, seed=13)
    leaves = [problem[k].clone().requires_grad_() for k in ("hidden", "weight", "bias")]
    loss = orpo_lib.fused_linear_orpo_loss(*leaves[:2], problem["target"], leaves[2], nll_target=problem["nll_target"],
                                           chunk_size=chunk_size).loss
    (loss * 0.5).backward(retain_graph=True)
    first = [leaf.grad.clone() for leaf in leaves]
    (loss * 0.5).backward()
    for leaf, grad in zip(leaves, first):
        assert torch.equal(leaf.grad, 2 * grad)  # the same gradients again, added: exactly twice the first


@pytest.mark.parametrize("chunk_size", [None, 5])
def test_deterministic(chunk_size):
    problem = make_problem(4, 7, 48, 517, with_bias=True, with_nll_target=True, seed=9)
    first_out, first = run_with_grads(orpo_lib.fused_linear_orpo_loss, problem, chunk_size=chunk_size)
    second_out, second = run_with_grads(orpo_lib.fused_linear_orpo_loss, problem, chunk_size=chunk_size)
    assert torch.equal(first_out.loss, second_out.loss)
    for name in first:
        assert torch.equal(first[name], second[name]), name


def test_module_matches_function(problem):
    module = orpo_lib.FusedLinearORPOLoss(beta=0.3, chunk_size=6)  # options are keyword-only
    a = module(problem["hidden"], problem["weight"], problem["target"])
    b = orpo_lib.fused_linear_orpo_loss(problem["hidden"], problem["weight"], problem["target"], beta=0.3, chunk_size=6)
    assert torch.equal(a.loss, b.loss)
    assert "beta=0.3" in repr(module)


def test_baseline_matches_reference():
    problem = make_problem(4, 7, 48, 517, with_bias=True, with_nll_target=True, seed=12)
    ref, ref_grads = reference_with_grads(problem)
    out, grads = run_with_grads(orpo_lib.orpo_loss_baseline, problem)
    assert_matches_reference(out, grads, ref, ref_grads, TOLERANCE[torch.float32])


def near_certain_problem(margin, vocab=517, seq=5, certain_rows=(0,)):
    """Logits are `margin` at the target and 0 elsewhere in the given rows: p(target) rounds to 1 in float32."""
    batch, hidden = 4, vocab
    gen = torch.Generator().manual_seed(1)
    target = torch.randint(0, vocab, (batch, seq), generator=gen)
    weight = torch.eye(vocab, hidden, dtype=torch.float64)
    h = torch.randn(batch, seq, hidden, generator=gen, dtype=torch.float64) * 0.5
    for row in certain_rows:
        h[row] = torch.nn.functional.one_hot(target[row], hidden).double() * margin
    return dict(hidden=h.float(), weight=weight.float(), bias=None, target=target, nll_target=None)


@pytest.mark.parametrize("certain_rows", [(0,), (2,), (0, 2)])
def test_near_certain_sequences_keep_their_log_prob(certain_rows):
    """Margin 25: p = 1 - 516·e^-25 ≈ 1 - 7e-9 rounds to 1 in float32; the log-prob must stay ≈ -7e-9, not 0."""
    problem = near_certain_problem(25.0, certain_rows=certain_rows)
    ref, ref_grads = reference_with_grads(problem)
    out, grads = run_with_grads(orpo_lib.fused_linear_orpo_loss, problem)
    expected = -516 * math.exp(-25)
    logps = torch.cat([out.chosen_logps, out.rejected_logps])
    for row in certain_rows:
        assert logps[row].item() == pytest.approx(expected, rel=1e-4)
    assert_matches_reference(out, grads, ref, ref_grads, 1e-4)


@pytest.mark.parametrize("certain_rows", [(0,), (2,), (0, 2)])
def test_certain_sequences_are_finite(certain_rows):
    """Margin 200: the log-prob is exactly 0 in float32. The loss and every gradient stay finite."""
    problem = near_certain_problem(200.0, certain_rows=certain_rows)
    for loss_fn in (orpo_lib.fused_linear_orpo_loss, orpo_lib.orpo_loss_baseline):
        out, grads = run_with_grads(loss_fn, problem)
        assert torch.isfinite(out.loss), loss_fn.__name__
        assert all(torch.isfinite(g).all() for g in grads.values()), loss_fn.__name__
        assert math.isfinite(out.log_odds_chosen.item())


def test_plan_chunks_packs_whole_pairs_and_splits_long_ones():
    groups = plan_chunks([3, 4, 10, 2, 2], chunk_rows=8)
    assert [(g.first_pair, g.end_pair, g.blocks) for g in groups] == [
        (0, 2, [(0, 7)]),
        (2, 3, [(7, 12), (12, 17)]),  # one pair longer than a chunk: two passes over equal token blocks
        (3, 5, [(17, 21)]),
    ]
    assert [g.blocks for g in plan_chunks([20], chunk_rows=6)] == [[(0, 5), (5, 10), (10, 15), (15, 20)]]
    assert [g.blocks for g in plan_chunks([13], chunk_rows=6)] == [[(0, 5), (5, 10), (10, 13)]]


@pytest.mark.parametrize("logp", [-80.0, -87.0, -88.5, -95.0, -103.5, -110.0])
def test_target_gradient_is_exact_at_subnormal_probabilities(logp):
    """A target log-prob of -87.3 or below makes p a float32 subnormal (or 0): the target column of the
    gradient, -(1 - p) per unit of the coefficient, must still be float32-exact against float64."""
    weight = torch.eye(2)
    hidden = torch.tensor([[[0.0, logp]], [[0.0, -1.0]]])  # chosen row: logits (0, logp), target 1
    target = torch.tensor([[1], [1]])
    problem = dict(hidden=hidden, weight=weight, bias=None, target=target, nll_target=None)
    ref, ref_grads = reference_with_grads(problem, beta=1.0, compute_nll_loss=False)
    out, grads = run_with_grads(orpo_lib.fused_linear_orpo_loss, problem, beta=1.0, compute_nll_loss=False)
    for name, grad in ref_grads.items():
        torch.testing.assert_close(grads[name].double(), grad, rtol=2e-6, atol=0), name
    assert rel_err(out.loss.detach(), ref["loss"]) < 1e-6


def test_liger_float32_case_at_its_real_shape():
    """Liger's own fp32 ORPO test shape (16 rows of T=128, H=1024, V=4096, unscaled randn weights, so logits with
    std ≈ 32 and target log-probs deep in the float32-subnormal range), with its tolerances (atol 1e-5, rtol 5e-4)
    against float64, bias and a vocabulary id as ignore_index included."""
    gen = torch.Generator().manual_seed(0)
    batch, seq, hidden_size, vocab = 16, 128, 1024, 4096
    hidden = torch.randn(batch, seq, hidden_size, generator=gen)
    weight = torch.randn(vocab, hidden_size, generator=gen)
    bias = torch.randn(vocab, generator=gen)
    target = torch.randint(0, vocab, (batch, seq), generator=gen)
    target.view(-1)[torch.randperm(batch * seq, generator=gen)[:700]] = 42
    problem = dict(hidden=hidden, weight=weight, bias=bias, target=target, nll_target=None)
    ref, ref_grads = reference_with_grads(problem, beta=0.2, ignore_index=42)
    out, grads = run_with_grads(orpo_lib.fused_linear_orpo_loss, problem, beta=0.2, ignore_index=42)
    torch.testing.assert_close(out.loss.double(), ref["loss"].detach(), atol=1e-5, rtol=5e-4)
    for name, grad in ref_grads.items():
        torch.testing.assert_close(grads[name].double(), grad, atol=1e-5, rtol=5e-4, msg=name)


def test_float64_in_float64_out():
    """float64 inputs: float64 statistics, loss, metrics and gradients, as close to the reference as float64 allows."""
    problem = make_problem(4, 7, 48, 517, dtype=torch.float64, with_bias=True, with_nll_target=True, seed=14)
    ref, ref_grads = reference_with_grads(problem)
    for chunk_size in (None, 5):
        out, grads = run_with_grads(orpo_lib.fused_linear_orpo_loss, problem, chunk_size=chunk_size)
        assert out.loss.dtype == torch.float64 and out.chosen_logps.dtype == torch.float64
        assert_matches_reference(out, grads, ref, ref_grads, 1e-10)
    for dtype in (torch.float32, torch.bfloat16):
        low = make_problem(4, 7, 48, 517, dtype=dtype, seed=14)
        assert orpo_lib.fused_linear_orpo_loss(low["hidden"], low["weight"], low["target"]).loss.dtype == torch.float32
    assert orpo_lib.orpo_loss_baseline(problem["hidden"], problem["weight"], problem["target"]).loss.dtype == torch.float64


@pytest.mark.parametrize("chunk_size", [None, 3])  # one block; several chunks with two-pass pairs
def test_gradcheck_in_float64(chunk_size):
    """Also checks an undefined upstream gradient (gradcheck's check_undefined_grad)."""
    problem = make_problem(2, 5, 6, 11, dtype=torch.float64, with_bias=True, with_nll_target=True, seed=15)
    inputs = tuple(problem[k].clone().requires_grad_() for k in ("hidden", "weight", "bias"))

    def loss(hidden, weight, bias):
        return orpo_lib.fused_linear_orpo_loss(hidden, weight, problem["target"], bias, nll_target=problem["nll_target"],
                                               chunk_size=chunk_size, beta=0.5).loss
    assert torch.autograd.gradcheck(loss, inputs, eps=1e-6, atol=1e-7, rtol=1e-5, fast_mode=True)

