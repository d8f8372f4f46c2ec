"""The loss on CPU whatever imported triton before orpo_lib (TRL, torch._dynamo, a user's own ``import triton``)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytestmark = pytest.mark.skipif(torch.cuda.is_available(),
                                reason="only without CUDA does orpo_lib switch triton to its interpreter")

# A fresh process imports `first`, then orpo_lib, and prints the relative errors of the fused loss and its
# gradients against the float64 reference, on a small seeded problem with an ignored prompt.
SCRIPT = """
import json, sys, importlib
importlib.import_module(sys.argv[1])
import torch, orpo_lib

gen = torch.Generator().manual_seed(0)
hidden = torch.randn(2, 5, 16, generator=gen).requires_grad_()
weight = (torch.randn(37, 16, generator=gen) / 4).requires_grad_()
target = torch.randint(0, 37, (2, 5), generator=gen)
target[:, :2] = -100
out = orpo_lib.fused_linear_orpo_loss(hidden, weight, target)
out.loss.backward()
hidden64, weight64 = (t.detach().double().requires_grad_() for t in (hidden, weight))
ref = orpo_lib.orpo_loss_reference(hidden64, weight64, target)["loss"]
ref.backward()
rel = lambda a, b: ((a.double() - b).norm() / b.norm()).item()
print(json.dumps({"loss": rel(out.loss.detach(), ref.detach()), "hidden": rel(hidden.grad, hidden64.grad),
                  "weight": rel(weight.grad, weight64.grad)}))
"""


@pytest.mark.parametrize("first", ["trl.experimental.orpo", "triton", "torch._dynamo"])
def test_loss_after_triton_was_imported_first(first):
    if first.startswith("trl"):
        pytest.importorskip("trl", reason="the trl extra: pip install -e .[trl]")
    # This process's orpo_lib has set TRITON_INTERPRET; the fresh one must find it unset, as a user's would.
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    done = subprocess.run([sys.executable, "-c", SCRIPT, first], capture_output=True, text=True, timeout=300,
                          env=env, cwd=Path(__file__).resolve().parents[2])
    assert done.returncode == 0, done.stderr[-3000:]
    errors = json.loads(done.stdout.splitlines()[-1])
    assert max(errors.values()) < 1e-5, errors
