import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import orpo_lib


# Marks of a test module that needs a Hopper GPU (the Gluon kernels use wgmma).
ON_HOPPER = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
    pytest.mark.skipif(torch.cuda.is_available() and torch.cuda.get_device_capability()[0] != 9,
                       reason="needs compute capability 9.x (Hopper: wgmma)"),
]


def compile_in_fresh_process(module: str, call: str) -> dict:
    """``orpo_lib.kernels.<module>.<call>`` (a compile_for_target call) in a process of its own: its ttgir,
    PTX, warps and shared memory. Once the Triton interpreter has run kernels in a process (as the CPU tests
    do), compiling Gluon there can fail inside triton's own helpers."""
    code = (f"import json, torch; from orpo_lib.kernels import {module} as m; k = m.{call}; "
            "print(json.dumps({'ttgir': k.asm['ttgir'], 'ptx': k.asm['ptx'], 'num_warps': k.metadata.num_warps, "
            "'shared': k.metadata.shared}))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                          cwd=Path(__file__).resolve().parents[1])
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.splitlines()[-1])


def make_problem(batch=4, seq=7, hidden=48, vocab=517, *, dtype=torch.float32, device="cpu", seed=0,
                 ignore_index=-100, ignored_fraction=0.25, with_bias=False, with_nll_target=False, logit_scale=1.0):
    """Seeded random inputs with a ragged mask; every sequence keeps at least its first target token."""
    gen = torch.Generator().manual_seed(seed)
    hidden_t = torch.randn(batch, seq, hidden, generator=gen, dtype=torch.float64)
    weight = torch.randn(vocab, hidden, generator=gen, dtype=torch.float64) * (logit_scale / hidden ** 0.5)
    bias = torch.randn(vocab, generator=gen, dtype=torch.float64) * 0.5 if with_bias else None
    target = torch.randint(0, vocab, (batch, seq), generator=gen)
    ignored = torch.rand(batch, seq, generator=gen) < ignored_fraction
    ignored[:, -1] = False
    target[ignored] = ignore_index
    nll_target = None
    if with_nll_target:
        nll_target = torch.randint(0, vocab, (batch, seq), generator=gen)
        nll_target[torch.rand(batch, seq, generator=gen) < ignored_fraction] = ignore_index
        nll_target[0, 0] = vocab - 1
    cast = dict(dtype=dtype, device=device)
    return dict(hidden=hidden_t.to(**cast), weight=weight.to(**cast),
                bias=None if bias is None else bias.to(**cast),
                target=target.to(device), nll_target=None if nll_target is None else nll_target.to(device))


def with_trl_labels(problem, prompt_rows, padding, seed=0):
    """``problem`` with labels shaped as TRL's: random token ids, which the NLL counts on every position but
    each sequence's last ``padding[i]`` and the odds ratio only after its first ``prompt_rows[i]``."""
    batch, seq = problem["target"].shape
    ids = torch.randint(0, problem["weight"].shape[0], (batch, seq), generator=torch.Generator().manual_seed(seed))
    position = torch.arange(seq)[None]
    padded = position >= seq - torch.tensor(padding)[:, None]
    response = (position >= torch.tensor(prompt_rows)[:, None]) & ~padded
    device = problem["target"].device
    return {**problem, "target": torch.where(response, ids, -100).to(device),
            "nll_target": torch.where(padded, -100, ids).to(device)}


def plan_of(problem, chunk_size=None, *, compute_nll_loss=True, fp32_weight_grad=True):
    """The chunk plan the fused loss makes for ``problem`` with every gradient."""
    from orpo_lib.chunked import planning
    from orpo_lib.validation import count_tokens

    counts = count_tokens(problem["target"], problem["nll_target"], problem["weight"].shape[0], -100, compute_nll_loss)
    opts = planning.Options(0.1, compute_nll_loss, chunk_size, fp32_weight_grad, grad_hidden=True, grad_weight=True,
                           grad_bias=problem["bias"] is not None, single_block=False)
    return planning.make_plan(problem["hidden"], problem["weight"].shape[0], counts, opts)


def split_passes(plan):
    """Per split pair (a group of several blocks): 1 for one pass, 2 for two."""
    return [1 if g.one_pass else 2 for g in plan.groups if len(g.blocks) > 1]


def reference_with_grads(problem, **options):
    """Float64 reference loss, metrics and gradients of hidden, weight (and bias)."""
    leaves = {k: problem[k].detach().double().requires_grad_() for k in ("hidden", "weight")}
    if problem["bias"] is not None:
        leaves["bias"] = problem["bias"].detach().double().requires_grad_()
    out = orpo_lib.orpo_loss_reference(leaves["hidden"], leaves["weight"], problem["target"], leaves.get("bias"),
                                       nll_target=problem["nll_target"], **options)
    out["loss"].backward()
    return out, {k: v.grad for k, v in leaves.items()}


def run_with_grads(loss_fn, problem, upstream=1.0, **options):
    leaves = {k: problem[k].detach().clone().requires_grad_() for k in ("hidden", "weight")}
    if problem["bias"] is not None:
        leaves["bias"] = problem["bias"].detach().clone().requires_grad_()
    out = loss_fn(leaves["hidden"], leaves["weight"], problem["target"], leaves.get("bias"),
                  nll_target=problem["nll_target"], **options)
    (out.loss * upstream).backward()
    return out, {k: v.grad for k, v in leaves.items()}


def rel_err(actual, expected):
    actual, expected = torch.as_tensor(actual).double().cpu(), torch.as_tensor(expected).double().cpu()
    scale = expected.norm().clamp_min(1e-12)
    return ((actual - expected).norm() / scale).item()


@pytest.fixture
def problem():
    return make_problem()


@pytest.fixture(scope="session")
def runs(tmp_path_factory):
    """Every notebook executed once with papermill (the notebook and report tests share it)."""
    from orpo_lib.workbook.notebooks import execute, notebook_paths

    out = tmp_path_factory.mktemp("notebooks")
    sources = notebook_paths()
    before = {p: p.read_bytes() for p in sources}
    results = {p.stem: execute(p, out) for p in sources}
    assert {p: p.read_bytes() for p in sources} == before, "sources must never be overwritten"
    return results
