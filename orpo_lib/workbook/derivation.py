"""The derivation notebook's computations: the closed-form logit gradient, the checks built on it,
the log(1 - e^x) comparison and a toy ORPO training run.
"""

from __future__ import annotations

import time

import torch

from .. import fused_linear_orpo_loss, orpo_loss_reference
from ..pairs import log1mexp


def random_problem(batch=4, seq=24, hidden=48, vocab=517, *, ignored_fraction=0.25, seed=0, dtype=torch.float32):
    """A seeded ORPO problem with ignored positions (a prompt-like prefix and random holes)."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(batch, seq, hidden, generator=gen, dtype=torch.float64).to(dtype)
    w = (torch.randn(vocab, hidden, generator=gen, dtype=torch.float64) / hidden**0.5).to(dtype)
    target = torch.randint(0, vocab, (batch, seq), generator=gen)
    holes = torch.rand(batch, seq, generator=gen) < ignored_fraction
    holes[:, -1] = False  # every sequence keeps at least one counted token
    target[holes] = -100
    return x, w, target


def closed_form_logit_grad(hidden, weight, target, *, beta=0.1, ignore_index=-100, nll_target=None, compute_nll_loss=True):
    """dL/dlogits in float64 from the formula G_i = g_i (onehot(y_i) - p_i) + h_i (onehot(y'_i) - p_i)."""
    hidden, weight = hidden.double(), weight.double()
    pairs = hidden.shape[0] // 2
    log_probs = torch.log_softmax(hidden @ weight.T, dim=-1)
    probs = log_probs.exp()
    valid = target != ignore_index
    safe = torch.where(valid, target, 0)
    token_logps = torch.where(valid, log_probs.gather(-1, safe.unsqueeze(-1)).squeeze(-1), 0.0)
    counts = valid.sum(1)
    seq_logps = token_logps.sum(1) / counts
    c, r = seq_logps[:pairs], seq_logps[pairs:]
    log_odds = (c - r) - (log1mexp(c) - log1mexp(r))
    # d/dc of -beta·mean(logsigmoid(lo)) with d lo/dc = 1/(1 - e^c) and d lo/dr = -1/(1 - e^r)
    slope = -beta / pairs * torch.sigmoid(-log_odds)
    d_seq = torch.cat([slope / -torch.expm1(c), -slope / -torch.expm1(r)])
    g = (d_seq / counts)[:, None] * valid  # one scalar per token, shared by the pair
    onehot = torch.nn.functional.one_hot(safe, weight.shape[0]).double()
    grad = g[..., None] * (onehot - probs)
    if compute_nll_loss:
        nll_labels = target if nll_target is None else nll_target
        nll_valid = nll_labels != ignore_index
        nll_valid[pairs:] = False
        nll_safe = torch.where(nll_valid, nll_labels, 0)
        h = -nll_valid.double() / nll_valid.sum()
        grad = grad + h[..., None] * (torch.nn.functional.one_hot(nll_safe, weight.shape[0]).double() - probs)
    return grad


def _relative_error(value, expected) -> float:
    value, expected = value.double().cpu(), expected.double().cpu()
    return float((value - expected).abs().max() / expected.abs().max().clamp_min(1e-300))


def kernel_device() -> torch.device:
    """Where the fused loss's Triton kernels run: compiled on a GPU when there is one, interpreted on the CPU."""
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def gradient_check(batch=4, seq=24, hidden=48, vocab=517, *, beta=0.1, seed=0) -> dict:
    """Closed-form gradient vs autograd on the float64 reference, and the fused loss vs the reference.

    Errors are max-abs differences relative to the reference's largest entry.
    """
    x, w, target = random_problem(batch, seq, hidden, vocab, seed=seed)
    x64 = x.double().requires_grad_()
    w64 = w.double().requires_grad_()
    reference = orpo_loss_reference(x64, w64, target, beta=beta)
    reference["loss"].backward()
    logit_grad = closed_form_logit_grad(x, w, target, beta=beta)
    closed_dx = logit_grad @ w.double()
    closed_dw = logit_grad.reshape(-1, vocab).T @ x.double().reshape(-1, hidden)

    device = kernel_device()
    xf = x.to(device).requires_grad_()
    wf = w.to(device).requires_grad_()
    start = time.perf_counter()
    out = fused_linear_orpo_loss(xf, wf, target.to(device), beta=beta)
    out.loss.backward()
    fused_seconds = time.perf_counter() - start
    return {
        "closed_form_dx_error": _relative_error(closed_dx, x64.grad),
        "closed_form_dw_error": _relative_error(closed_dw, w64.grad),
        "fused_loss_error": abs(out.loss.item() - reference["loss"].item()) / abs(reference["loss"].item()),
        "fused_dx_error": _relative_error(xf.grad, x64.grad),
        "fused_dw_error": _relative_error(wf.grad, w64.grad),
        "fused_margin_error": abs(float(out.reward_margin) - float(reference["reward_margin"])),
        "fused_seconds": fused_seconds,
    }


def log1mexp_table(xs=(-1e-12, -1e-7, -1e-3, -0.5, -0.6931, -2.0, -20.0, -50.0)) -> list[dict]:
    """log(1 - e^x) in float32: the naive formula, the two-branch one the library uses, float64 truth."""
    x32 = torch.tensor(xs, dtype=torch.float32)
    naive = torch.log1p(-torch.exp(x32))
    stable = log1mexp(x32)
    exact = log1mexp(torch.tensor(xs, dtype=torch.float64))
    return [
        {"x": x, "naive_fp32": float(n), "stable_fp32": float(s), "float64": float(e)}
        for x, n, s, e in zip(xs, naive, stable, exact)
    ]


def toy_preference_batch(pairs=2, prompt=4, response=12, vocab=64, *, seed=0):
    """Chosen responses count upwards (token t+1 = token t + 1), rejected ones are random.

    Returns (inputs, target): (2·pairs, prompt+response) token ids; target is the next token,
    with the prompt positions ignored.
    """
    gen = torch.Generator().manual_seed(seed)
    length = prompt + response + 1
    starts = torch.randint(0, vocab, (pairs, 1), generator=gen)
    chosen = (starts + torch.arange(length)) % vocab
    rejected = torch.randint(0, vocab, (pairs, length), generator=gen)
    rejected[:, : prompt + 1] = chosen[:, : prompt + 1]  # the same prompt for both
    tokens = torch.cat([chosen, rejected])
    inputs, target = tokens[:, :-1], tokens[:, 1:].clone()
    target[:, :prompt] = -100
    return inputs, target


def toy_orpo_run(steps=25, *, pairs=2, prompt=4, response=12, vocab=64, hidden=32, lr=0.02, beta=0.1, seed=0) -> list[dict]:
    """Train an embedding + LM head (a bigram model) on one preference batch with the fused loss."""
    torch.manual_seed(seed)
    device = kernel_device()
    inputs, target = (t.to(device) for t in toy_preference_batch(pairs, prompt, response, vocab, seed=seed))
    embedding = torch.nn.Embedding(vocab, hidden).to(device)
    head = torch.nn.Linear(hidden, vocab, bias=False).to(device)
    optimizer = torch.optim.Adam([*embedding.parameters(), *head.parameters()], lr=lr)
    history = []
    for step in range(steps):
        out = fused_linear_orpo_loss(embedding(inputs), head.weight, target, beta=beta)
        optimizer.zero_grad()
        out.loss.backward()
        optimizer.step()
        history.append({
            "step": step,
            "loss": float(out.loss.detach()),
            "chosen_logps": float(out.chosen_logps.mean()),
            "rejected_logps": float(out.rejected_logps.mean()),
            "reward_margin": float(out.reward_margin),
            "reward_accuracy": float(out.reward_accuracy),
        })
    return history
