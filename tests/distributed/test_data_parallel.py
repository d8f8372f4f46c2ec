"""Data parallel (DDP over gloo, two CPU processes) needs nothing new from the fused loss.

Each rank takes different pairs of one seeded global batch, computes the fused loss on its local batch
and calls backward; DDP averages the gradients. The normalisation is TRL's: on each rank the odds-ratio
term is a mean over its pairs and the NLL term a mean over its chosen half's NLL tokens, and DDP takes the
mean of the ranks' gradients. With equal pairs and equal NLL token counts per rank, that mean is the
gradient of the one-process loss on the whole batch. With unequal NLL token counts it is not: the
one-process NLL weights rank r's local NLL by N_r / N, DDP by 1 / world size. Both are checked exactly.
"""

import gc
import importlib.util
import os
import socket
import time
from datetime import timedelta
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.nn.parallel import DistributedDataParallel

from orpo_lib import fused_linear_orpo_loss


def _shared_test_helpers():
    """tests/conftest.py, loaded by its path: the spawned ranks import this module with the parent's
    sys.path, where another folder's conftest.py (tests/ui's) may come first under the same name."""
    path = Path(__file__).resolve().parents[1] / "conftest.py"
    spec = importlib.util.spec_from_file_location("orpo_shared_test_helpers", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


make_problem, rel_err, with_trl_labels = (getattr(_shared_test_helpers(), name)
                                          for name in ("make_problem", "rel_err", "with_trl_labels"))

WORLD = 2
PAIRS, SEQ, HIDDEN, VOCAB = 4, 6, 16, 37
PROMPT = [2, 1, 3, 2, 1, 2, 2, 3]  # per row; TRL-style labels: the odds ratio sees the response after it
# The NLL (prompt + response) skips each row's padding, so the chosen rows' padding sets the NLL token
# counts: rank 0 holds pairs 0 and 2, rank 1 pairs 1 and 3.
PADDING = {"equal": [0, 1, 1, 0, 2, 0, 1, 1],   # chosen NLL tokens 6 + 5 | 5 + 6: 11 per rank
           "unequal": [0, 3, 0, 2, 2, 0, 1, 1]}  # 6 + 6 | 3 + 4: 12 and 7


def global_batch(case):
    problem = with_trl_labels(make_problem(2 * PAIRS, SEQ, HIDDEN, VOCAB, dtype=torch.float64, seed=3),
                              PROMPT, PADDING[case], seed=4)
    return problem["hidden"], problem["target"], problem["nll_target"]


def local_batch(case, rank):
    """Rank r's pairs r::WORLD, still chosen rows first and rejected rows after, as the loss expects."""
    pairs = torch.arange(rank, PAIRS, WORLD)
    rows = torch.cat([pairs, pairs + PAIRS])
    return tuple(t[rows] for t in global_batch(case))


class TinyLM(torch.nn.Module):
    """A residual tanh layer standing in for the decoder, then the LM head; float64, seeded."""

    def __init__(self):
        super().__init__()
        gen = torch.Generator().manual_seed(5)
        self.mix = torch.nn.Parameter(torch.randn(HIDDEN, HIDDEN, generator=gen, dtype=torch.float64) / HIDDEN ** 0.5)
        self.head = torch.nn.Parameter(make_problem(2, 1, HIDDEN, VOCAB, dtype=torch.float64, seed=6)["weight"])

    def forward(self, x, target, nll_target, compute_nll_loss=True):
        hidden = x + torch.tanh(x @ self.mix.T)
        return fused_linear_orpo_loss(hidden, self.head, target, nll_target=nll_target, beta=0.1,
                                      compute_nll_loss=compute_nll_loss).loss


def _ddp_grads(rank):
    model = DistributedDataParallel(TinyLM())
    grads = {}
    for case in PADDING:
        model.zero_grad()
        model(*local_batch(case, rank)).backward()  # DDP all-reduces and divides by WORLD here
        grads[case] = [p.grad.clone() for p in model.module.parameters()]
    return grads


def _worker(rank, port, out_dir):
    torch.set_num_threads(1)  # two ranks on two cores
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=WORLD, timeout=timedelta(seconds=60))
    try:
        torch.save(_ddp_grads(rank), os.path.join(out_dir, f"rank{rank}.pt"))
    finally:
        # The DDP model (built and dropped in _ddp_grads) holds the process group; were it still alive,
        # gloo's threads would be torn down at interpreter exit, which aborts about one run in ten.
        gc.collect()
        dist.destroy_process_group()


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_spawned(worker, world, args, out_dir, limit_s=180):
    """``worker(rank, *args)`` in ``world`` spawned processes, each saving ``rank<r>.pt`` in ``out_dir``; a
    child's exception re-raises here with its traceback, a hang fails. Returns what they saved."""
    ctx = mp.start_processes(worker, args=args, nprocs=world, join=False, start_method="spawn")
    deadline = time.monotonic() + limit_s
    try:
        while not ctx.join(timeout=1):
            if time.monotonic() > deadline:
                pytest.fail(f"ranks still running after {limit_s} s")
    finally:
        for p in ctx.processes:
            if p.is_alive():
                p.kill()
    return [torch.load(out_dir / f"rank{r}.pt") for r in range(world)]


def _run_ranks(out_dir):
    return run_spawned(_worker, WORLD, (_free_port(), str(out_dir)), out_dir)


def test_ddp_averaged_gradients_match_one_process(tmp_path):
    ranks = _run_ranks(tmp_path)
    model = TinyLM()

    def grads(batch, **options):
        model.zero_grad()
        model(*batch, **options).backward()
        return [p.grad.clone() for p in model.parameters()]

    def assert_close(actual, expected, tol=1e-10):
        for a, e in zip(actual, expected, strict=True):
            assert rel_err(a, e) < tol

    # Equal pairs and NLL tokens per rank: the mean of the local losses is the global loss.
    one_process = grads(global_batch("equal"))
    for rank in ranks:
        assert_close(rank["equal"], one_process)

    # Unequal NLL tokens: split each rank's local gradient into its odds-ratio part and its NLL part.
    one_process = grads(global_batch("unequal"))
    local = [local_batch("unequal", r) for r in range(WORLD)]
    odds = [grads(batch, compute_nll_loss=False) for batch in local]
    nll = [[full - o for full, o in zip(grads(batch), odds_r)] for batch, odds_r in zip(local, odds)]
    tokens = [(nll_target[:PAIRS // WORLD] != -100).sum().item() for *_, nll_target in local]  # chosen rows' N_r
    assert tokens == [12, 7]

    def combine(nll_weights):
        """Per parameter: the sum over ranks r of nll_weights[r] * NLL gradient + odds-ratio gradient / WORLD."""
        return [sum(w * nll[r][i] + odds[r][i] / WORLD for r, w in enumerate(nll_weights))
                for i in range(len(one_process))]

    assert_close(one_process, combine([n / sum(tokens) for n in tokens]))  # the whole batch: N_r / N
    for rank in ranks:
        assert_close(rank["unequal"], combine([1 / WORLD] * WORLD))  # DDP (TRL under DDP too): 1 / WORLD
        assert all(rel_err(a, e) > 1e-2 for a, e in zip(rank["unequal"], one_process))  # so the two really differ
