"""FusedORPOTrainer in the process layouts TRL users train in, against stock ORPOTrainer in the same layout.

Two gloo processes on the CPU (``trainer_layout_run.py`` under torchrun) train each trainer from the same
seeded tiny Llama on the same global batch, with DDP, FSDP2 and DeepSpeed ZeRO-2 and ZeRO-3, plain and with a LoRA adapter
and two steps of gradient accumulation: the logged losses, gradient norms and the 11 metrics of every step, and
every parameter after three steps, gathered whole, agree. Each run also shows that its layout was real (the
wrapper, sharded or partitioned parameters). Calling the decoder outside the wrapper, as the trainer did in one
process, trains different weights under DDP without a word and fails under FSDP2.
"""

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("trl", reason="the trl extra: pip install -e .[trl]")
pytest.importorskip("peft", reason="the test extra: pip install -e .[test]")
pytest.importorskip("deepspeed", reason="the test extra: pip install -e .[test]")

from test_data_parallel import _free_port  # noqa: E402

RUN = Path(__file__).with_name("trainer_layout_run.py")
METRICS = ("rewards/chosen", "rewards/rejected", "rewards/accuracies", "rewards/margins", "logps/rejected",
           "logps/chosen", "logits/rejected", "logits/chosen", "nll_loss", "log_odds_ratio", "log_odds_chosen")
LAYOUT_SHOWN = {
    "ddp": lambda shown: shown["wrapper"] == "DistributedDataParallel",
    "fsdp2": lambda shown: shown["dtensor_params"] == shown["params"],
    "zero2": lambda shown: shown["wrapper"] == "DeepSpeedEngine" and shown["partitioned_params"] == 0,
    "zero3": lambda shown: shown["wrapper"] == "DeepSpeedEngine" and shown["partitioned_params"] == shown["params"],
}


@pytest.fixture(scope="module", params=list(LAYOUT_SHOWN))
def trained(request, tmp_path_factory):
    """The runs of one layout: {(case, trainer): saved run}."""
    out = tmp_path_factory.mktemp(request.param)
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2",
                           "--master_port", str(_free_port()), str(RUN), request.param, str(out)],
                          capture_output=True, text=True, timeout=900, env=env)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-6000:]
    runs = {tuple(path.stem.rsplit("-", 1)): torch.load(path) for path in out.glob("*.pt")}
    return request.param, runs


@pytest.mark.parametrize("case", ["plain", "lora-accumulation"])
def test_fused_trainer_equals_orpotrainer_in_the_same_layout(trained, case):
    layout, runs = trained
    stock, fused = runs[case, "ORPOTrainer"], runs[case, "FusedORPOTrainer"]
    for run in (stock, fused):
        assert run["layout"]["num_processes"] == 2 and LAYOUT_SHOWN[layout](run["layout"]), run["layout"]
    assert len(stock["steps"]) == len(fused["steps"]) == 3
    for ref, ours in zip(stock["steps"], fused["steps"]):
        for name in ("loss", "grad_norm", *METRICS):
            assert ours[name] == pytest.approx(ref[name], rel=2e-4, abs=1e-6), (name, ref, ours)
    assert stock["parameters"].keys() == fused["parameters"].keys()
    assert any("lora_" in name for name in stock["parameters"]) == (case == "lora-accumulation")
    for name, p in stock["parameters"].items():
        # (Adam moves a weight whose gradient is near zero by up to lr = 1e-3 a step, whatever the gradient's
        # rounding: 1e-5 is 1 % of one step)
        torch.testing.assert_close(fused["parameters"][name], p, rtol=1e-4, atol=1e-5)
