"""End to end: AdamW steps of a random Llama (transformers) with the fused loss and with the baseline.

    python -m orpo_lib.workbook.training_bench [--batches 8,16] [--seq 1024] [--steps 10] [--out PATH]

One step = decoder forward, the ORPO loss on the LM head (``orpo_lib.causal_lm`` conventions: a prompt
of a quarter of each row masked, some rows padded), backward, optimizer step. Reports the median step
time and the peak memory over what was allocated before the step (weights, optimizer state, batch), and
the loss of each step from the same initial weights, so that the two losses' trajectories can be compared.
"""

import argparse
import statistics
import sys

import torch

from . import bench
from ..baseline import orpo_loss_baseline
from ..causal_lm import orpo_targets
from ..fused import fused_linear_orpo_loss

LOSSES = {"fused": fused_linear_orpo_loss, "baseline": orpo_loss_baseline}
# About 120M parameters: 2 × 24.6M in the embedding and the LM head, 10 layers of 7.1M.
MODEL = dict(vocab_size=32000, hidden_size=768, intermediate_size=2048, num_hidden_layers=10, num_attention_heads=12,
             num_key_value_heads=12, tie_word_embeddings=False)


def make_batch(batch: int, seq: int, vocab: int, device, seed=0):
    """A TRL-style concatenated batch: input ids, attention mask with padded rows, labels without the prompt."""
    gen = torch.Generator().manual_seed(seed)
    input_ids = torch.randint(0, vocab, (batch, seq), generator=gen)
    attention_mask = torch.ones_like(input_ids)
    for row in range(1, batch, 3):
        attention_mask[row, seq - seq // 8:] = 0  # padding
    labels = torch.where(attention_mask == 1, input_ids, -100)
    labels[:, : seq // 4] = -100  # the prompt
    return input_ids.to(device), attention_mask.to(device), labels.to(device)


def run_steps(loss_name: str, batch: int, seq: int, steps: int, warmup: int, device) -> dict:
    import transformers

    torch.manual_seed(0)
    config = transformers.LlamaConfig(**MODEL, max_position_embeddings=seq)
    model = transformers.LlamaForCausalLM(config).to(device, torch.bfloat16)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    input_ids, attention_mask, labels = make_batch(batch, seq, config.vocab_size, device)
    target, nll_target = orpo_targets(input_ids, attention_mask, labels)
    loss_fn = LOSSES[loss_name]

    def step():
        hidden = model.model(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
        out = loss_fn(hidden[:, :-1], model.lm_head.weight, target, nll_target=nll_target, beta=0.1)
        optimizer.zero_grad(set_to_none=True)
        out.loss.backward()
        optimizer.step()
        return out.loss.detach()

    losses = [step() for _ in range(warmup)]  # also creates the optimizer state
    torch.cuda.synchronize(device)
    before = torch.cuda.memory_allocated(device)
    torch.cuda.reset_peak_memory_stats(device)
    times = []
    for _ in range(steps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        losses.append(step())
        end.record()
        torch.cuda.synchronize(device)
        times.append(start.elapsed_time(end))
    peak = torch.cuda.max_memory_allocated(device) - before
    return {"loss": loss_name, "batch": batch, "seq": seq, "parameters": sum(p.numel() for p in model.parameters()),
            "median_step_ms": statistics.median(times), "min_step_ms": min(times), "max_step_ms": max(times),
            "steps": steps, "peak_over_step_inputs_gib": peak / 2**30, "losses": [x.item() for x in losses]}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", default="8,16", help="rows per step (chosen + rejected)")
    parser.add_argument("--seq", type=int, default=1024)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--out", default=None)
    parser.add_argument("--commit", default=None)
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        sys.exit("training_bench needs a CUDA device")
    device = torch.device("cuda")
    results = []
    for batch in (int(b) for b in args.batches.split(",")):
        for name in LOSSES:
            results.append(run_steps(name, batch, args.seq, args.steps, args.warmup, device))
            r = results[-1]
            print(f"{name:>9} B={batch} T={args.seq}: {r['median_step_ms']:.2f} ms/step, "
                  f"peak {r['peak_over_step_inputs_gib']:.2f} GiB, losses {r['losses'][0]:.4f} … {r['losses'][-1]:.4f}",
                  flush=True)
    import transformers
    record = {"provenance": {**bench.provenance(device, "python -m orpo_lib.workbook.training_bench " + " ".join(argv or sys.argv[1:]),
                                                args.commit), "transformers": transformers.__version__},
              "model": MODEL, "results": results}
    out = args.out or f"figures/data/training-{bench.provenance(device, '')['date'][:10]}-{bench.device_slug(device)}.json"
    print("wrote", bench.write_json(out, record))


if __name__ == "__main__":
    main()
