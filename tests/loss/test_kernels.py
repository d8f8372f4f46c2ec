"""The per-sequence kernels against the torch formulas they replace (CPU: Triton interpreter)."""

import math

import pytest
import torch

from orpo_lib import kernels
from orpo_lib.pairs import odds_ratio_terms
from orpo_lib.kernels import LABEL_STATS, call_terms, dropped_row_sums, dropped_sums, label_stats, pair_terms
from orpo_lib.output import METRICS, orpo_output


@pytest.mark.parametrize("beta", [0.1, 0.25, 3.0])
def test_pair_terms_match_odds_ratio_terms(beta):
    """Sequence means, log-odds, loss and per-token coefficients, from far-off to certain sequences."""
    pairs, seq = 6, 37
    gen = torch.Generator().manual_seed(4)
    counted = torch.rand(2 * pairs, seq, generator=gen) < 0.7
    counted[:, 0] = True
    logp = -torch.rand(2 * pairs, seq, generator=gen, dtype=torch.float64) * 6
    logp[0] = -1e-12  # near-certain chosen sequence
    logp[pairs + 1] = 0.0  # a certain rejected one (capped)
    logp[2] = -0.7  # both sides of -ln 2
    logp[pairs + 2] = -0.69
    logp = torch.where(counted, logp, 0.0).float()
    tokens = counted.sum(1).float()

    seq_logp = torch.full((2 * pairs,), math.nan)
    seq_coef = torch.full((2 * pairs,), math.nan)
    log_odds = torch.full((pairs,), math.nan, dtype=torch.float64)
    pair_loss = torch.full((pairs,), math.nan, dtype=torch.float64)
    for first, end in ((0, 2), (2, pairs)):  # two groups of pairs, as two chunks would launch them
        pair_terms(logp.view(-1), tokens, seq_logp, seq_coef, log_odds, pair_loss, first_pair=first, end_pair=end,
                   seq_len=seq, beta=beta)

    torch.testing.assert_close(seq_logp, logp.double().sum(1).div(tokens).float(), rtol=1e-6, atol=0)
    # The float64 pair math from the kernel's own means (float32 sums in another order would move
    # a log-odds near 0 by more than the formulas' rounding).
    want_loss, want_log_odds, d_chosen, d_rejected = odds_ratio_terms(seq_logp[:pairs], seq_logp[pairs:], beta)
    torch.testing.assert_close(log_odds, want_log_odds, rtol=1e-12, atol=0)
    torch.testing.assert_close(pair_loss, want_loss, rtol=1e-12, atol=0)
    want_coef = torch.cat([(d_chosen / pairs).float() / tokens[:pairs], (d_rejected / pairs).float() / tokens[pairs:]])
    torch.testing.assert_close(seq_coef, want_coef, rtol=1e-6, atol=0)
    assert torch.isfinite(seq_coef).all()


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("dropped", [False, True])
@pytest.mark.parametrize("compute_nll", [True, False])
def test_call_terms_match_the_torch_output(dtype, dropped, compute_nll):
    """The loss and every metric from one launch against ``orpo_output`` and the torch sums it replaces: three
    pairs (not a power of 2), a reward tie, and halves longer than one block of tokens."""
    pairs, seq, vocab, beta = 3, 700, 517, 0.25
    gen = torch.Generator().manual_seed(6)
    seq_logp = -torch.rand(2 * pairs, generator=gen, dtype=dtype) * 3
    seq_logp[pairs + 1] = seq_logp[1]  # equal rewards count as not won
    log_odds = torch.randn(pairs, generator=gen, dtype=torch.float64) * 4
    pair_loss = -beta * torch.nn.functional.logsigmoid(log_odds)
    nll_logp = -torch.rand(2 * pairs * seq, generator=gen, dtype=dtype) * 5
    nll_logp[pairs * seq:] = 0.0  # the rejected half has no NLL tokens
    logit_sum = 20 + torch.randn(2 * pairs * seq, generator=gen, dtype=dtype) * 5  # of one sign: no cancellation
    dropped_sums = torch.randn(2, generator=gen, dtype=dtype) * 100 if dropped else None
    nll_tokens = 1234

    loss, metrics = call_terms(pair_loss, log_odds, seq_logp, nll_logp, logit_sum, dropped_sums,
                               nll_tokens=nll_tokens, vocab=vocab, beta=beta, compute_nll=compute_nll)

    nll_loss = -nll_logp.sum() / nll_tokens if compute_nll else torch.zeros((), dtype=dtype)
    or_loss = pair_loss.mean().to(dtype)
    logit_sums = logit_sum.view(2, -1).sum(1) + (0 if dropped_sums is None else dropped_sums)
    means = logit_sums / (pairs * seq * vocab)
    want = orpo_output(nll_loss + or_loss, nll_loss, or_loss, seq_logp[:pairs], seq_logp[pairs:], log_odds, beta=beta,
                       chosen_logits_mean=means[0], rejected_logits_mean=means[1])
    rtol = 1e-5 if dtype == torch.float32 else 1e-13  # (sums of 2100 numbers, in another order)
    assert loss.dtype == metrics.dtype == dtype and loss.shape == () and metrics.shape == (len(METRICS) + 2 * pairs,)
    torch.testing.assert_close(loss, want.loss, rtol=rtol, atol=0)
    for i, name in enumerate(METRICS):
        torch.testing.assert_close(metrics[i], getattr(want, name), rtol=rtol, atol=0, msg=name)
    torch.testing.assert_close(metrics[len(METRICS):], torch.cat([want.chosen_rewards, want.rejected_rewards]),
                               rtol=rtol, atol=0)
    assert metrics[METRICS.index("reward_accuracy")] * pairs == sum(
        float(a > b) for a, b in zip(want.chosen_rewards, want.rejected_rewards))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("split_tokens", [2048, 48])  # a half in one program; in two, split off a block's middle
def test_dropped_row_sums_match_a_masked_sum(monkeypatch, dtype, split_tokens):
    """Per half, the sum of the rows no id counts: through hidden's strides (a non-contiguous view), with a
    hidden size that is not a multiple of the column block, over halves longer than one block of tokens (in
    one program or split over two), a token counted by the NLL alone kept, and a half with nothing dropped
    giving zeros."""
    monkeypatch.setattr(dropped_sums, "SPLIT_TOKENS", split_tokens)
    batch, seq, size = 4, 40, 100
    gen = torch.Generator().manual_seed(9)
    hidden = torch.randn(batch, size, seq, generator=gen, dtype=dtype).transpose(1, 2)  # strides (H*T, 1, T)
    target_ids = torch.randint(0, 50, (batch, seq), generator=gen, dtype=torch.int32)
    nll_ids = target_ids.clone()
    target_ids[: batch // 2][torch.rand(batch // 2, seq, generator=gen) < 0.4] = -1
    nll_ids[: batch // 2][torch.rand(batch // 2, seq, generator=gen) < 0.5] = -1  # some counted by one target only
    nll_ids[batch // 2:] = -1  # the rejected half: nothing dropped (every token has a target id)

    sums = dropped_row_sums(hidden, target_ids, nll_ids)

    dropped = ((target_ids < 0) & (nll_ids < 0)).view(2, -1, 1)
    assert dropped[0].any() and not dropped[1].any()
    want = torch.where(dropped, hidden.double().reshape(2, -1, size), 0.0).sum(1).to(dtype)
    assert sums.dtype == dtype and sums.shape == (2, size)
    single = dtype == torch.float32
    torch.testing.assert_close(sums, want, rtol=1e-6 if single else 1e-13, atol=1e-5 if single else 1e-12)
    assert bool((sums[1] == 0).all())


@pytest.mark.parametrize("dtype", [torch.int64, torch.int32, torch.uint8])
@pytest.mark.parametrize("compute_nll", [True, False])
def test_label_stats_match_torch_counts(dtype, compute_nll):
    batch, seq, vocab, ignore = 6, 45, 200, -100 if dtype != torch.uint8 else 7
    gen = torch.Generator().manual_seed(5)
    wide = torch.randint(-3, vocab + 3, (batch, 2 * seq), generator=gen)
    wide[torch.rand(batch, 2 * seq, generator=gen) < 0.3] = ignore
    if dtype == torch.uint8:
        wide = wide.clamp(0, 255)
    target = wide.to(dtype)[:, ::2]  # a strided view: the kernel reads through the strides
    nll_target = torch.roll(target, 1, dims=1)
    nll_target[0] = target[0]  # a chosen sequence whose NLL ids are its target ids: no mismatch

    target_ids, nll_ids, stats, kept_order = poisoned_label_stats(target, nll_target, vocab, ignore, compute_nll)

    target_valid = target.long() != ignore
    nll_valid = (nll_target.long() != ignore) & compute_nll
    nll_valid[batch // 2:] = False
    torch.testing.assert_close(target_ids, torch.where(target_valid, target.long(), -1).int())
    torch.testing.assert_close(nll_ids, torch.where(nll_valid, nll_target.long(), -1).int())

    chosen_with_nll = (torch.arange(batch) < batch // 2)[:, None] & compute_nll

    def bad(labels, valid):
        return (((labels.long() < 0) | (labels.long() >= vocab)) & valid).sum(1)
    want = {"target_tokens": target_valid.sum(1), "kept_tokens": (target_valid | nll_valid).sum(1),
            "nll_tokens": nll_valid.sum(1), "bad_target_ids": bad(target, target_valid),
            "bad_nll_ids": bad(nll_target, nll_valid),
            "one_pass_blockers": one_pass_blockers(target_ids, nll_ids, chosen_with_nll)}
    for column, name in enumerate(LABEL_STATS):
        assert stats[:, column].tolist() == want[name].tolist(), name
    blockers = stats[:, LABEL_STATS.index("one_pass_blockers")]
    assert blockers[0] == 0 and bool((blockers[1:batch // 2] > 0).all()) == compute_nll
    # every kept token has a row, one with an out-of-range id too (the call raises before using it)
    kept = kept_pair_order(target_valid | nll_valid)
    assert kept_order.tolist() == kept + [0] * (batch * seq - len(kept))


def poisoned_label_stats(*args, **kwargs):
    """``label_stats`` with its outputs allocated full of -7, so that an entry the kernel does not write shows."""
    empty = torch.empty
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(torch, "empty", lambda *shape, **kw: empty(*shape, **kw).fill_(-7))
        return label_stats(*args, **kwargs)


def kept_pair_order(kept):
    """Flattened indices of the kept tokens of a (B, T) mask, pairs in order (chosen i, then rejected i)."""
    batch, seq = kept.shape
    pair_order = torch.arange(batch * seq).view(2, batch // 2, seq).transpose(0, 1).reshape(-1)
    return pair_order[kept.reshape(-1)[pair_order]].tolist()


@pytest.mark.parametrize("pair_order", [True, False])
@pytest.mark.parametrize("batch, seq", [(2, 1), (4, 1100), (10, 300)])  # 1100: two blocks of positions
def test_kept_row_order(batch, seq, pair_order):
    """The kept tokens in pair order (or token order): each sequence placed after the kept tokens of those
    before it, in token order within it, across blocks of positions; a sequence with no kept token takes no
    place; the entries after them are 0, a row of hidden."""
    gen = torch.Generator().manual_seed(batch + seq)
    target = torch.randint(0, 30, (batch, seq), generator=gen)
    target[torch.rand(batch, seq, generator=gen) < 0.4] = -100
    nll_target = torch.randint(0, 30, (batch, seq), generator=gen)
    nll_target[torch.rand(batch, seq, generator=gen) < 0.5] = -100
    target[batch // 2] = -100  # a rejected sequence with nothing kept
    _, _, stats, kept_order = poisoned_label_stats(target, nll_target, 30, -100, True, pair_order=pair_order)
    kept = (target != -100) | ((nll_target != -100) & (torch.arange(batch) < batch // 2)[:, None])
    n = int(kept.sum())
    assert int(stats[:, 1].sum()) == n
    expected = kept_pair_order(kept) if pair_order else kept.reshape(-1).nonzero().view(-1).tolist()
    assert kept_order.tolist() == expected + [0] * (batch * seq - n)


def one_pass_blockers(target_ids, nll_ids, chosen_with_nll):
    """Per sequence: tokens the odds ratio counts whose NLL id differs (chosen half, NLL on), plus 1 if an
    NLL-only token comes after a token the odds ratio counts."""
    counted, nll_only = target_ids >= 0, (nll_ids >= 0) & (target_ids < 0)
    mismatches = (chosen_with_nll & counted & (nll_ids != target_ids)).sum(1)
    position = torch.arange(target_ids.shape[1])
    last_nll_only = torch.where(nll_only, position, -1).amax(1)
    first_counted = torch.where(counted, position, target_ids.shape[1]).amin(1)
    return mismatches + (last_nll_only > first_counted).long()


@pytest.mark.parametrize("seq", [7, 1100])  # one block of positions; two (BLOCK_T = 1024), the second partial
def test_one_pass_blockers_of_prompt_and_response_labels(seq):
    """TRL's labels (NLL on prompt + response, odds ratio on the response) block nothing; an NLL-only token
    after the response starts blocks once, however many there are; each response token the NLL counts with
    another id, or ignores, blocks once; the rejected half and a call without the NLL are never blocked."""
    ignore, prompt = -100, seq - 3
    gen = torch.Generator().manual_seed(7)
    ids = torch.randint(0, 50, (6, seq), generator=gen)
    target = ids.clone()
    target[:, :prompt] = ignore  # the odds ratio sees the last 3 tokens
    nll_target = ids.clone()
    nll_target[:, -1] = ignore  # padding, ignored by both
    target[:, -1] = ignore
    nll_target[1, prompt - 1], target[1, prompt - 1] = ignore, ids[1, prompt - 1]  # response starts a token early
    nll_target[2, prompt] = ids[2, prompt] + 1  # a response token whose NLL id differs
    target[2, 0] = ids[2, 0]  # ...and one counted by both before the prompt's NLL-only tokens
    nll_target[3:] = (ids[3:] + 1) % 50  # the rejected half: its NLL ids never count
    with_nll = label_stats(target, nll_target, 50, ignore, True)[2][:, LABEL_STATS.index("one_pass_blockers")]
    assert with_nll.tolist() == [0, 1, 2, 0, 0, 0]
    without = label_stats(target, nll_target, 50, ignore, False)[2][:, LABEL_STATS.index("one_pass_blockers")]
    assert without.tolist() == [0] * 6


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])  # float64 logits keep float64 statistics
@pytest.mark.parametrize("vocab,shift", [
    (1000, 0.0),  # no multiple of any block: a partial block at the end of each row
    (1024, 0.0),  # a multiple of the block: no partial block
    (1024, -150.0),  # and every logit so low that exp(-max) overflows float32
])
def test_row_kernels_give_the_gradient_of_the_logits(dtype, vocab, shift):
    """row_stats then row_grads turn a chunk into a·onehot(y) + b·onehot(y') - (a + b)·softmax."""
    rows, seq_len = 6, 3  # two sequences
    gen = torch.Generator().manual_seed(6)
    logits = torch.randn(rows, vocab, generator=gen, dtype=torch.float64) * 4
    logits[1, 7] = 60.0  # a near-certain target
    logits += shift
    target = torch.tensor([3, 7, -1, 999, 0, 512], dtype=torch.int32)
    nll_target = torch.tensor([3, 7, 5, -1, 998, -1], dtype=torch.int32)  # shared, own, absent columns
    token = torch.tensor([0, 1, 2, 3, 4, 5])
    seq_coef = torch.tensor([-0.3, 0.2], dtype=dtype)
    nll_tokens = 4  # each NLL token's dL/dlogp: -1/4
    logp, nll_logp, logit_sum, lse = (torch.zeros(rows, dtype=dtype) for _ in range(4))
    chunk = logits.to(dtype, copy=True)  # rewritten in place
    kernels.row_stats(chunk, target, nll_target, token, logp, nll_logp, logit_sum, lse)
    kernels.row_grads(chunk, target, nll_target, token, logp, nll_logp, lse, seq_coef, nll_tokens=nll_tokens,
                      seq_len=seq_len)
    tol = dict(rtol=1e-5, atol=1e-7) if dtype == torch.float32 else dict(rtol=1e-12, atol=1e-14)

    log_probs = logits.log_softmax(1)
    torch.testing.assert_close(lse, logits.logsumexp(1).to(dtype))
    torch.testing.assert_close(logit_sum, logits.sum(1).to(dtype), rtol=1e-5, atol=1e-2)
    assert logp[1] < 0  # kept, although exp of it rounds to 1
    a = torch.where(target >= 0, seq_coef.double()[token // seq_len], 0.0)
    b = torch.where(nll_target >= 0, -1 / nll_tokens, 0.0)
    want = -(a + b)[:, None] * log_probs.exp()
    want[torch.arange(rows)[target >= 0], target[target >= 0].long()] += a[target >= 0]
    want[torch.arange(rows)[nll_target >= 0], nll_target[nll_target >= 0].long()] += b[nll_target >= 0]
    torch.testing.assert_close(chunk.double(), want, **tol)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_row_logp_grads_give_onehot_minus_softmax(dtype):
    """The one-pass rewrite: d log p(y) / dlogits = onehot(y) - softmax on counted rows, 0 on the others,
    the target column exact where p ≈ 1."""
    rows, vocab = 5, 1000
    gen = torch.Generator().manual_seed(7)
    logits = torch.randn(rows, vocab, generator=gen, dtype=torch.float64) * 4
    logits[1, 7] = 60.0  # a near-certain target: 1 - p must not round to 0
    target = torch.tensor([3, 7, -1, 999, 0], dtype=torch.int32)
    token = torch.tensor([4, 0, 1, 2, 3])  # rows write the per-token statistics out of order
    logp, nll_logp, logit_sum, lse = (torch.zeros(rows, dtype=dtype) for _ in range(4))
    chunk = logits.to(dtype, copy=True)
    kernels.row_stats(chunk, target, target, token, logp, nll_logp, logit_sum, lse)
    kernels.row_logp_grads(chunk, target, token, logp, lse)

    counted = target >= 0
    want = -logits.softmax(1) * counted[:, None]
    want[torch.arange(rows)[counted], target[counted].long()] += 1.0
    want[1, 7] = -torch.expm1(logits[1].log_softmax(0)[7])
    tol = dict(rtol=1e-5, atol=1e-7) if dtype == torch.float32 else dict(rtol=1e-12, atol=1e-14)
    torch.testing.assert_close(chunk.double(), want, **tol)
    assert (chunk[2] == 0).all()


@pytest.mark.parametrize("accumulate", [False, True])
@pytest.mark.parametrize("out_dtype", [torch.float32, torch.float16])
def test_pair_sum_combines_the_two_sequences(accumulate, out_dtype):
    """out = c_chosen·chosen + c_rejected·rejected (+ out), formed in float32 and rounded once, at a size that
    is no multiple of the block; in place of chosen as well."""
    gen = torch.Generator().manual_seed(8)
    chosen, rejected = torch.randn(2, 10007, generator=gen)
    scales = torch.tensor([-0.37, 1.9])
    out = torch.randn(10007, generator=gen).to(out_dtype)
    want = (scales[0] * chosen + scales[1] * rejected + (out.float() if accumulate else 0.0)).to(out_dtype)
    assert kernels.pair_sum(chosen, rejected, scales, out=out, accumulate=accumulate) is out
    torch.testing.assert_close(out, want, rtol=1e-6 if out_dtype == torch.float32 else 1e-3, atol=1e-6)
    in_place = chosen.clone()
    kernels.pair_sum(in_place, rejected, scales, out=in_place, accumulate=False)
    torch.testing.assert_close(in_place, scales[0] * chosen + scales[1] * rejected, rtol=1e-6, atol=1e-6)
    with pytest.raises(ValueError, match="contiguous"):
        kernels.pair_sum(chosen[::2], rejected[::2], scales, out=torch.empty(5004), accumulate=False)
