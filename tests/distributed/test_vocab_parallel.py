"""The loss over a vocabulary-sharded LM head (gloo, two and three CPU processes, the Triton interpreter):
the same loss, metrics, dX and (concatenated) dW as one process on the whole head, against float64, with
shards of unequal sizes; every rank gets the same bits; bad labels raise the same error on every rank."""

import os
from datetime import timedelta

import pytest
import torch
import torch.distributed as dist

import orpo_lib
from orpo_lib.chunked import steps
from orpo_lib.vocab_parallel import vocab_parallel_orpo_loss

from test_data_parallel import _free_port, _shared_test_helpers, run_spawned

make_problem, reference_with_grads, rel_err, with_trl_labels = (
    getattr(_shared_test_helpers(), name) for name in ("make_problem", "reference_with_grads", "rel_err",
                                                       "with_trl_labels"))

SHARDS = {2: [250, 267], 3: [100, 250, 167]}  # V = 517 in uneven slices, rank order
UPSTREAM = 2.5
METRICS = ["loss", "nll_loss", "or_loss", "chosen_logps", "rejected_logps", "log_odds_ratio", "chosen_logits_mean",
           "rejected_logits_mean"]


# labels, and the model's logits from the head's (a scale keeps the dropped tokens' logit sums linear; a cap
# makes each rank compute them)
CASES = {"nll on the target": ("nll on the target", {}), "trl": ("trl", {}),
         "scaled": ("nll on the target", dict(logit_scale=0.6)),
         "trl, scaled and capped": ("trl", dict(logit_scale=1.7, logit_softcap=2.5))}


def problem(labels):
    p = make_problem(4, 7, 48, 517, dtype=torch.float64, seed=11, ignored_fraction=0.25)
    return with_trl_labels(p, [2, 3, 1, 4], [0, 1, 2, 0], seed=12) if labels == "trl" else p


def _worker(rank, world, port, out_dir):
    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world, timeout=timedelta(seconds=120))
    try:
        results = {}
        start = sum(SHARDS[world][:rank])
        for case, (labels, logits) in CASES.items():
            p = problem(labels)
            hidden = p["hidden"].clone().requires_grad_()
            shard = p["weight"][start:start + SHARDS[world][rank]].clone().requires_grad_()
            out = vocab_parallel_orpo_loss(hidden, shard, p["target"], nll_target=p["nll_target"], chunk_size=10,
                                           **logits)
            (UPSTREAM * out.loss).backward(retain_graph=True)
            first_dx = hidden.grad.clone()
            (UPSTREAM * out.loss).backward()  # a second backward through the retained graph adds the same again
            assert torch.equal(hidden.grad, 2 * first_dx)
            hidden.grad /= 2
            shard.grad /= 2
            results[case] = {**{m: getattr(out, m).detach() for m in METRICS}, "dx": hidden.grad, "dw": shard.grad}
        rewrites = []
        real_row_grads, steps.row_grads = steps.row_grads, lambda *a, **k: rewrites.append(1)
        try:
            with torch.no_grad():  # no gradient pass, the same loss
                no_grad = vocab_parallel_orpo_loss(hidden, shard, p["target"], nll_target=p["nll_target"], chunk_size=10,
                                                   **logits)
        finally:
            steps.row_grads = real_row_grads
        assert torch.equal(no_grad.loss, out.loss.detach()) and rewrites == []
        bad = problem("nll on the target")["target"].clone()
        bad[0, 0] = 517  # out of the global vocabulary, though some rank's shard is smaller
        try:
            vocab_parallel_orpo_loss(hidden.detach(), shard.detach(), bad)
        except ValueError as e:
            results["error"] = str(e)
        torch.save(results, os.path.join(out_dir, f"rank{rank}.pt"))
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("world", [2, 3])
def test_sharded_head_matches_one_process(tmp_path, world):
    ranks = run_spawned(_worker, world, (world, _free_port(), str(tmp_path)), tmp_path)
    for case, (labels, logits) in CASES.items():
        p = problem(labels)
        ref, ref_grads = reference_with_grads(p, **logits)
        one = orpo_lib.fused_linear_orpo_loss(p["hidden"].clone().requires_grad_(), p["weight"], p["target"],
                                              nll_target=p["nll_target"], **logits)
        first = ranks[0][case]
        for r in ranks[1:]:  # the same bits everywhere, shards aside
            assert all(torch.equal(r[case][k], first[k]) for k in [*METRICS, "dx"]), case
        for m in METRICS:
            assert rel_err(first[m], ref[m]) < 1e-12 and rel_err(first[m], getattr(one, m)) < 1e-12, (case, m)
        assert rel_err(first["dx"], UPSTREAM * ref_grads["hidden"]) < 1e-12, case
        assert rel_err(torch.cat([r[case]["dw"] for r in ranks]), UPSTREAM * ref_grads["weight"]) < 1e-12, case
    assert all("outside [0, 517)" in r["error"] for r in ranks)


def test_needs_a_process_group():
    p = problem("nll on the target")
    with pytest.raises(RuntimeError, match="process group"):
        vocab_parallel_orpo_loss(p["hidden"], p["weight"], p["target"])
